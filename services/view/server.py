"""The HTTP server of `trinity view`: the standard library's threading server around App, and a
thread that brings the index up to date every `refresh_s` seconds while it runs.

Loopback by default. Bound to any other address the server refuses to start without a token
(`--token-file`, `--token-env`, or the config's services.auth), so a run's prompts and answers
are never served to the network unauthenticated.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.view.app import App
from services.view.viewer import Viewer

log = get_logger("view")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_binding(host: str, token: str | None) -> None:
    if token is None and not is_loopback(host):
        raise InvalidArgument(
            f"--host {host} serves the run beyond this machine: give a token (--token-file FILE or "
            "--token-env VAR, or services.auth in --config), or keep the default 127.0.0.1",
            field="host",
        )


def _handler(app: App) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "trinity-view"

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            response = app.handle(self.path, {k: v for k, v in self.headers.items()})
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("request", line=format % args)

    return Handler


class ViewServer:
    """`with ViewServer(...) as server:` serves in a thread; `server.url` is where."""

    def __init__(
        self,
        viewer: Viewer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        refresh_s: float = 2.0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        check_binding(host, token)
        self.viewer = viewer
        self.refresh_s = refresh_s
        self.httpd = ThreadingHTTPServer((host, port), _handler(App(viewer, token)))
        self.httpd.daemon_threads = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._on_error = on_error

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}"

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.viewer.refresh()
            except Exception as exc:  # a half-written file must not stop the loop; it is logged
                log.warning("index_refresh_failed", error=f"{type(exc).__name__}: {exc}")
                if self._on_error is not None:
                    self._on_error(exc)

    def start(self) -> ViewServer:
        for target, name in ((self.httpd.serve_forever, "view-http"), (self._refresh_loop, "view-refresh")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self.viewer.index.close()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
