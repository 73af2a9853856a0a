"""A real serve-mode stack for the integration tests: buffer, synchronizer and the explorer as the
OpenAI-compatible proxy, each its own process on loopback, plus plain-HTTP helpers and a buffer reader."""

from __future__ import annotations

import asyncio
import json
import pathlib
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import yaml

from services.buffer.client import BufferClient
from services.common.config import load_config
from services.common.experience import Experience
from services.common.procs import free_port, start_service, stop_process, wait_healthy

EXPERIENCE_BUFFER = "exp"


def serve_config(root: pathlib.Path, **sections: Any) -> dict[str, Any]:
    """A mode-serve config on the builtin tiny model (GRPO groups of 2 sessions), every service on a
    free port; `sections` replace or extend the top-level sections."""
    cfg: dict[str, Any] = {
        "mode": "serve",
        "checkpoint_root_dir": str(root / "runs"),
        "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 48, "max_response_tokens": 6},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "synchronizer": {"sync_method": "checkpoint", "sync_style": "dynamic_by_trainer"},
        "explorer": {
            "proxy_port": 0,
            "service_status_check_interval": 0.5,
            "serve": {"max_request_bytes": 4096, "max_n": 4},
        },
        "buffer": {
            "batch_size": 2,
            "trainer_input": {"experience_buffer": {"name": EXPERIENCE_BUFFER, "storage_type": "queue"}},
        },
        "monitor": {"monitor_type": "none"},
        "services": {
            **{svc: {"port": free_port()} for svc in ("buffer", "synchronizer", "trainer", "explorer")},
            "shutdown_grace_s": 3,
        },
    }
    for key, value in sections.items():
        cfg[key] = (
            {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        )
    return cfg


@dataclass
class Stack:
    """The processes of one serve-mode run and how to reach its proxy."""

    root: pathlib.Path
    config: pathlib.Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    token: str | None = None
    ca: str | None = None

    @property
    def cfg(self) -> Any:
        return load_config(str(self.config))

    @property
    def run_dir(self) -> pathlib.Path:
        return pathlib.Path(self.cfg.run_dir)

    def start(self, name: str, *overrides: str) -> subprocess.Popen[bytes]:
        args = [a for o in overrides for a in ("--set", o)]
        log = str(self.root / f"{name}-{len(self.procs)}.log")
        proc = start_service(name, str(self.config), log_path=log, extra_args=args)
        proc.log_path = log  # type: ignore[attr-defined]
        self.procs[name] = proc
        return proc

    def start_healthy(self, name: str) -> None:
        """Start the buffer or the synchronizer and wait until it is SERVING."""
        cfg = self.cfg
        self.start(name)
        asyncio.run(wait_healthy(cfg.services.endpoint(name).address, 60, services_cfg=cfg.services))

    def start_infra(self) -> None:
        for name in ("buffer", "synchronizer"):
            self.start_healthy(name)

    def start_proxy(self, timeout: float = 120) -> str:
        url_file = self.run_dir / "serve" / "proxy_url"
        url_file.unlink(missing_ok=True)
        proc = self.start("explorer")
        deadline = time.monotonic() + timeout
        while not url_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = pathlib.Path(proc.log_path).read_text()[-3000:]  # type: ignore[attr-defined]
                raise AssertionError(f"the proxy did not start (exit {proc.poll()}):\n{log}")
            time.sleep(0.1)
        self.url = url_file.read_text().strip()
        return self.url

    def stop(self, name: str, sig: int | None = None) -> int:
        proc = self.procs.pop(name)
        return stop_process(proc, sig) if sig is not None else stop_process(proc)

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name)

    # --- HTTP ------------------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca) if self.ca else None

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict | None = None,
    ) -> tuple[int, Any]:
        """(status, JSON body) of one request; `raw` sends those bytes as they are."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(headers or {})}
        if self.token and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=60, context=self._context()) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kwargs)

    def stats(self) -> dict[str, Any]:
        status, body = self.call("GET", "/stats")
        assert status == 200, body
        return body

    def client(self, **kwargs: Any) -> Any:
        import openai

        if self.ca:
            kwargs.setdefault(
                "http_client", openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=self.ca))
            )
        kwargs.setdefault("api_key", self.token or "EMPTY")
        return openai.OpenAI(base_url=f"{self.url}/v1", **kwargs)

    def read(self, count: int, wait: float = 20.0) -> list[Experience]:
        """Lease and ack up to `count` rows of the experience buffer (what a trainer would read)."""

        async def go() -> list[Experience]:
            cfg = self.cfg
            async with await BufferClient.connect(
                cfg.services.buffer.address, services_cfg=cfg.services
            ) as buf:
                got: list[Experience] = []
                deadline = time.monotonic() + wait
                while len(got) < count and time.monotonic() < deadline:
                    batch = await buf.read(EXPERIENCE_BUFFER, count - len(got), max_wait=1.0)
                    got += batch.experiences
                    if batch.lease_id:
                        await buf.ack(batch.lease_id)
                return got

        return asyncio.run(go())


def make_stack(root: pathlib.Path, cfg: dict[str, Any]) -> Stack:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return Stack(root, path)
