"""Structured JSON logs (structlog) with a request id carried across services.

The request id lives in a contextvar: the server interceptor sets it from the incoming
`x-request-id` metadata (or makes a new one), every log line of that call carries it, and the
client base sends it on outgoing calls, so one id follows a write from explorer to buffer.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

REQUEST_ID_HEADER = "x-request-id"
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_configured = False


def current_request_id() -> str | None:
    return _request_id.get()


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


@contextmanager
def request_context(request_id: str | None = None) -> Iterator[str]:
    """Run a block under a request id (a new one unless given)."""
    rid = request_id or new_request_id()
    token = _request_id.set(rid)
    try:
        yield rid
    finally:
        _request_id.reset(token)


def set_request_id(request_id: str | None) -> contextvars.Token[str | None]:
    return _request_id.set(request_id)


def _add_request_id(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    rid = _request_id.get()
    if rid and "request_id" not in event:
        event["request_id"] = rid
    return event


LOG_FILE_ENV = "TRINITY_LOG_FILE"
"""Set by `trinity run`: the file the runner copies this process's output into; the process
appends to it itself once the runner's pipe is gone (see redirect_stdio)."""
_redirect_lock = threading.Lock()
_redirected = False


def redirect_stdio() -> None:
    """Point stdout and stderr (the file descriptors) at $TRINITY_LOG_FILE, or /dev/null without one.

    For a child of a runner that died: its pipes are broken, and a log line written to them would
    raise BrokenPipeError in whatever code logged it. Idempotent.
    """
    global _redirected
    with _redirect_lock:
        if _redirected:
            return
        try:
            sink = os.open(
                os.environ.get(LOG_FILE_ENV) or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
            )
        except OSError:
            sink = os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
        _redirected = True


class _Stderr:
    """sys.stderr for structlog's PrintLogger; a broken pipe (the runner died) moves the output to
    the log file (redirect_stdio) and the line is written again there, so logging never raises."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except BrokenPipeError:
            redirect_stdio()
            return sys.stderr.write(text)

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except BrokenPipeError:
            redirect_stdio()


def configure_logging(service: str, level: str = "INFO", *, json: bool = True) -> None:
    """JSON lines on stderr: {"event", "level", "timestamp", "service", "request_id", ...}."""
    global _configured
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s", force=True)
    _configure_structlog(numeric, json=json)
    structlog.contextvars.bind_contextvars(service=service)
    _configured = True
    quiet_third_party_warnings()


def _configure_structlog(numeric: int, *, json: bool = True) -> None:
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_request_id,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; `name` shows as "logger" in each line."""
    log = structlog.get_logger()
    return log.bind(logger=name) if name else log


# ---- benign third-party output: in the log file, off `trinity run`'s console ----------------------

THIRD_PARTY_EVENT = "third_party_output"
THIRD_PARTY_WHY_EVENT = "third_party_output_is_benign"
QUIET_EVENTS = frozenset({THIRD_PARTY_EVENT, THIRD_PARTY_WHY_EVENT})
"""Events recording third-party output known to be benign: the service's log file keeps them,
`trinity run` keeps them off its console (services/cli/progress.py; `--verbose` shows them)."""

QUIET_WARNING_CATEGORIES: tuple[type[Warning], ...] = (
    DeprecationWarning,
    PendingDeprecationWarning,
    FutureWarning,
    UserWarning,
)
WARNINGS_WHY = (
    "deprecation and user warnings raised inside third-party libraries (e.g. transformers announcing an "
    "API change for a later version) change nothing this run computes; they are kept in this log, off "
    "trinity run's console. Other warnings, warnings from this project's code and every error still "
    "reach the console"
)
_SERVICES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_explained: set[str] = set()
_explained_lock = threading.Lock()
_showwarning = warnings.showwarning


def log_benign(kind: str, why: str, **fields: Any) -> None:
    """Record one benign third-party message of `kind` in this process's log (event
    third_party_output); the first of each kind in a process is preceded by one line saying why
    such messages are benign (event third_party_output_is_benign)."""
    if not structlog.is_configured():  # e.g. an engine-core process vLLM spawned: JSON lines all the same
        _configure_structlog(logging.INFO)
    log = get_logger("third_party")
    with _explained_lock:
        first = kind not in _explained
        _explained.add(kind)
    if first:
        log.info(THIRD_PARTY_WHY_EVENT, kind=kind, why=why)
    log.info(THIRD_PARTY_EVENT, kind=kind, **fields)


def third_party_file(filename: str) -> bool:
    """A file of an installed library (site-packages / dist-packages), not of this project."""
    path = os.path.abspath(filename)
    parts = path.split(os.sep)
    return ("site-packages" in parts or "dist-packages" in parts) and not path.startswith(_SERVICES_DIR)


def _quiet_showwarning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    if file is None and issubclass(category, QUIET_WARNING_CATEGORIES) and third_party_file(filename):
        log_benign(
            "warning",
            WARNINGS_WHY,
            category=category.__name__,
            message=str(message),
            location=f"{filename}:{lineno}",
        )
        return
    _showwarning(message, category, filename, lineno, file, line)


def quiet_third_party_warnings() -> None:
    """Send the Python warnings of QUIET_WARNING_CATEGORIES that third-party files raise to this
    process's log as third_party_output events (not as stderr text, which `trinity run` would show);
    any other warning is shown as before. Idempotent; configure_logging calls it."""
    global _showwarning
    if warnings.showwarning is not _quiet_showwarning:
        _showwarning = warnings.showwarning
        warnings.showwarning = _quiet_showwarning
