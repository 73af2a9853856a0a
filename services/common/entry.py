"""`python -m services.<name> --config F` and `trinity serve <name>`: load config, log, serve.

Heavy imports (torch, transformers) happen inside each service's `serve`, so `--help` is fast.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from services.common import hard_stop
from services.common.config import TrinityConfig, load_config
from services.common.errors import ConfigError, InvalidArgument, TrinityError
from services.common.logging import configure_logging, get_logger, redirect_stdio
from services.common.parent_watch import watch_parent

SERVICE_PROTOS = {
    "buffer": ("trinity_grpc.buffer.v1", "buffer", "BufferService"),
    "synchronizer": ("trinity_grpc.synchronizer.v1", "synchronizer", "SynchronizerService"),
    "trainer": ("trinity_grpc.trainer.v1", "trainer", "TrainerService"),
    "explorer": ("trinity_grpc.explorer.v1", "explorer", "ExplorerService"),
}


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", "-c", default=None, help="YAML config (default: the embedded demo config)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set services.buffer.port=6000 (repeatable)",
    )


def resolve_serve(service: str) -> Callable[[TrinityConfig], Coroutine[Any, Any, None]]:
    """`services.<service>.server.serve`, imported only now (it pulls the service's heavy modules)."""
    module = importlib.import_module(f"services.{service}.server")
    serve: Callable[[TrinityConfig], Coroutine[Any, Any, None]] = module.serve
    return serve


def _parent_event(event: str, fields: dict[str, Any]) -> None:
    """The runner died: our stdout/stderr were pipes to it, so from here on they append to the log
    file it kept for us (services.common.logging), and the shutdown stays on record."""
    redirect_stdio()
    get_logger("entry").warning(event, **fields)


def run_service(service: str, config: str | None, overrides: Sequence[str] = ()) -> int:
    """Load the config and run one service until it stops; returns the process exit code."""
    try:
        cfg = load_config(config, overrides)
    except TrinityError as exc:
        print(f"trinity {service}: invalid config: {exc}", file=sys.stderr)
        return 2
    configure_logging(service, cfg.log.level)
    hard_stop.enable()  # a stop that overruns shutdown_grace_s ends the process (services.common.hard_stop)
    watch_parent(service, cfg.services.shutdown_grace_s, _parent_event)
    try:
        asyncio.run(resolve_serve(service)(cfg))
    except KeyboardInterrupt:
        return 0
    except TrinityError as exc:
        get_logger("entry").error("service_failed", service=service, error=str(exc), field=exc.field)
        # 2: the config is wrong (restarting cannot help); 1: anything else.
        return 2 if isinstance(exc, (ConfigError, InvalidArgument)) else 1
    finally:
        # Served and shut down (files closed by the shutdown hooks): keep the interpreter's final
        # garbage collections off the millions of objects torch and transformers loaded. Exiting
        # took ~1.5 s after the last log line of a trainer or explorer, ~0.3 s with this; the
        # services of a dead runner stop one after the other, so each second counts once per service.
        gc.freeze()
    return 0


def main(service: str, argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m services.{service}", description=f"Run the {service} service."
    )
    add_serve_args(parser)
    args = parser.parse_args(argv)
    sys.exit(run_service(service, args.config, args.overrides))
