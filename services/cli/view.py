"""`trinity view RUN_DIR` (or `--config F`): the run and its experiences in the browser (services/view/)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

DEFAULT_PORT = 8765


def _token(args: argparse.Namespace) -> str | None:
    from services.common.config import load_config
    from services.common.config.services import AuthConfig
    from services.common.security import load_token

    if args.token_file or args.token_env:
        return load_token(AuthConfig(token_file=args.token_file, token_env=args.token_env))
    if args.config:
        return load_token(load_config(args.config).services.auth)
    return None


def cmd_view(args: argparse.Namespace) -> int:
    from services.common.errors import TrinityError
    from services.view.server import ViewServer
    from services.view.viewer import Viewer

    try:
        token = _token(args)
        viewer = Viewer(args.run_dir, config=args.config, index_path=args.index, tokenizer=args.tokenizer)
        print(f"trinity view: indexing {viewer.run.root} into {viewer.index.path} ...", flush=True)
        report = viewer.refresh()
    except (TrinityError, OSError) as exc:
        print(f"trinity view: {exc}", file=sys.stderr)
        return 2
    try:
        server = ViewServer(viewer, host=args.host, port=args.port, token=token, refresh_s=args.refresh)
    except TrinityError as exc:
        print(f"trinity view: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"trinity view: cannot listen on {args.host}:{args.port}: {exc.strerror} (try --port 0)",
            file=sys.stderr,
        )
        return 2
    for error in report.errors:
        print(f"trinity view: warning: {error}", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        suffix = f"/?token={token}" if token else "/"
        print(
            f"trinity view: {report.rows} experiences indexed; open {server.url}{suffix} (Ctrl-C stops)",
            flush=True,
        )
        stop.wait()
    return 0


def add_view_parser(sub: argparse._SubParsersAction) -> None:
    view = sub.add_parser(
        "view",
        help="a local web page of a run: progress, learning curve, experiences with filters, groups, evals",
    )
    view.add_argument("run_dir", nargs="?", help="the run directory (<checkpoint_root_dir>/<project>/<name>)")
    view.add_argument("--config", default=None, help="the run's config file instead of RUN_DIR")
    view.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need a token)"
    )
    view.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    view.add_argument(
        "--index", default=None, help="the viewer's index file (default RUN_DIR/view/index.sqlite)"
    )
    view.add_argument(
        "--tokenizer", default=None, help="tokenizer to decode tokens with (default the stage's model)"
    )
    view.add_argument(
        "--token-file", default=None, help="file holding the token a non-loopback viewer requires"
    )
    view.add_argument("--token-env", default=None, help="environment variable holding that token")
    view.add_argument(
        "--refresh", type=float, default=2.0, help="seconds between index refreshes (default 2)"
    )
    view.set_defaults(func=cmd_view)
