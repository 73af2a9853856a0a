"""Server runner shared by the four services.

`ServiceServer` wraps grpc.aio.server with what every service needs: health checking and
reflection (v1 and v1alpha), one interceptor that carries the request id, checks the bearer token, maps domain
errors to status codes and counts every call in the server's Prometheus metrics (served at `/metrics`
when `services.<name>.metrics_port` is set: services/common/metrics.py), message-size limits from
config, TLS/mTLS, and graceful shutdown on SIGTERM/SIGINT (stop accepting, let in-flight calls finish
within shutdown_grace_s, run the service's shutdown hooks, exit 0).
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import errors, hard_stop, sdnotify
from services.common.config.services import Endpoint, ServicesConfig
from services.common.limits import Oversize, limit_bytes, oversize_error, server_receive_bytes, size_checked
from services.common.logging import REQUEST_ID_HEADER, get_logger, new_request_id, set_request_id
from services.common.metrics import ServiceMetrics
from services.common.metrics_http import MetricsEndpoint
from services.common.reflection import enable_reflection
from services.common.security import load_token, server_credentials, tokens_match
from trinity_grpc.common.v1 import common_pb2

log = get_logger("server")
HOOK_MIN_S = 0.5  # a shutdown hook gets at least this long, even after a drain that used the grace


def _name(hook: Callable[[], Awaitable[None]]) -> str:
    return str(getattr(hook, "__qualname__", None) or repr(hook))


ERROR_TRAILER = "trinity-error-bin"
STATUS_OF_KIND: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "already_exists": grpc.StatusCode.ALREADY_EXISTS,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "unimplemented": grpc.StatusCode.UNIMPLEMENTED,
    "internal": grpc.StatusCode.INTERNAL,
}
_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def grpc_options(services: ServicesConfig, *, receive_bytes: int | None = None) -> list[tuple[str, Any]]:
    """Channel and server options; `receive_bytes`: a server's transport limit (services/common/limits.py)."""
    limit = limit_bytes(services.max_message_mb)
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", receive_bytes or limit),
        # Without this Linux lets a second server bind the same port silently.
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ]


async def _abort_with(context: grpc.aio.ServicerContext, exc: errors.TrinityError) -> None:
    detail = common_pb2.ErrorDetail(kind=exc.kind, field=exc.field, message=exc.message)
    context.set_trailing_metadata(((ERROR_TRAILER, detail.SerializeToString()),))
    await context.abort(STATUS_OF_KIND.get(exc.kind, grpc.StatusCode.INTERNAL), str(exc))


_Guard = Callable[[grpc.aio.ServicerContext, Any], Awaitable[None]]  # (context, request or iterator)
_Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]  # a servicer method (unary or streaming)


class _Interceptor(grpc.aio.ServerInterceptor):
    """Request id + bearer token + domain-error mapping + metrics for every RPC of our services."""

    def __init__(self, service: str, token: str | None, limit: int, metrics: ServiceMetrics) -> None:
        self._service = service
        self._token = token
        self._limit = limit  # request bytes; bigger unary requests get oversize_error
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Any:  # a grpc.RpcMethodHandler (typed as Any: its stubs lack the behaviour attributes)
        handler: Any = await continuation(details)
        if handler is None or details.method.startswith(_EXEMPT_PREFIXES):
            return handler
        metadata = dict(details.invocation_metadata or ())
        method = details.method
        guard = self._guard(method, metadata)
        # Request streams (Heartbeat) carry tiny messages: only the transport's limit applies to them.
        checked = size_checked(handler.request_deserializer, self._limit)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, guard, method, "unary"),
                checked,
                handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, guard, method, "server_stream"),
                checked,
                handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(handler.stream_unary, guard, method, "client_stream"),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(handler.stream_stream, guard, method, "bidi_stream"),
            handler.request_deserializer,
            handler.response_serializer,
        )

    def _guard(self, method: str, metadata: dict[str, Any]) -> _Guard:
        async def guard(context: grpc.aio.ServicerContext, request: Any) -> None:
            set_request_id(metadata.get(REQUEST_ID_HEADER) or new_request_id())
            if self._token is not None:
                given = str(metadata.get("authorization", ""))
                if not given.startswith("Bearer ") or not tokens_match(given[7:], self._token):
                    await _abort_with(context, errors.Unauthenticated("missing or wrong bearer token"))
            if isinstance(request, Oversize):
                await _abort_with(context, oversize_error(method, request.size, self._limit))

        return guard

    async def _abort_for(self, context: Any, method: str, exc: Exception) -> None:
        """The status a handler's exception becomes: a domain error's own, UNIMPLEMENTED for a
        base-class method, INTERNAL (logged with its traceback) for anything else."""
        if isinstance(exc, errors.TrinityError):
            await _abort_with(context, exc)
        elif isinstance(exc, NotImplementedError):
            await _abort_with(context, self._unimplemented(method))
        else:
            log.exception("rpc_failed", method=method)
            await _abort_with(context, errors.TrinityError(f"internal error in {method}: {exc!r}"))

    def _unimplemented(self, method: str) -> errors.Unimplemented:
        return errors.Unimplemented(
            f"{method} is declared in the protos but this {self._service} server does not serve it yet"
        )

    def _wrap_unary(self, behavior: _Behavior, guard: _Guard, method: str, rpc_type: str) -> _Behavior:
        async def wrapped(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._metrics.rpc(method, rpc_type, context):
                await guard(context, request_or_iterator)
                try:
                    result = behavior(request_or_iterator, context)
                    return await result if inspect.isawaitable(result) else result
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await self._abort_for(context, method, exc)

        return wrapped

    def _wrap_stream(self, behavior: _Behavior, guard: _Guard, method: str, rpc_type: str) -> _Behavior:
        async def wrapped(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with self._metrics.rpc(method, rpc_type, context):
                await guard(context, request_or_iterator)
                try:
                    result = behavior(request_or_iterator, context)
                    if inspect.isasyncgen(result) or hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    else:  # a base-class (unimplemented) method or a sync iterator
                        for item in result:
                            yield item
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await self._abort_for(context, method, exc)

        return wrapped


class ServiceServer:
    """One gRPC server for one service (see the module docstring)."""

    def __init__(self, name: str, services: ServicesConfig, endpoint: Endpoint | None = None) -> None:
        self.name = name
        self.services = services
        self.endpoint = endpoint or services.endpoint(name)  # type: ignore[arg-type]
        self.started_at = time.time()
        self.port: int | None = None
        self._service_names: list[str] = []
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []
        self.stop_requested_at: float | None = None  # time.monotonic() of the first stop request
        self._stop_event = asyncio.Event()
        self._health = health.aio.HealthServicer()
        self.metrics = ServiceMetrics(name)
        self.metrics_port: int | None = None  # bound port of /metrics (services.<name>.metrics_port)
        self._metrics_endpoint = MetricsEndpoint(self.metrics.registry)
        self._server = grpc.aio.server(
            interceptors=[
                _Interceptor(
                    name, load_token(services.auth), limit_bytes(services.max_message_mb), self.metrics
                )
            ],
            options=grpc_options(services, receive_bytes=server_receive_bytes(services.max_message_mb)),
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    def add(self, add_fn: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        """Register a servicer, e.g. add(add_BufferServiceServicer_to_server, s, "trinity_grpc.buffer.v1.BufferService")."""
        add_fn(servicer, self._server)
        self._service_names.append(full_name)
        self.metrics.declare(full_name)

    def on_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` after in-flight calls finished (flush SQLite, close clients)."""
        self._shutdown_hooks.append(hook)

    async def start(self) -> int:
        """Bind, start, mark every service SERVING; returns the bound port."""
        creds = server_credentials(self.services.tls)
        address = self.endpoint.bind_address
        try:
            if creds is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, creds)
        except RuntimeError as exc:
            raise errors.Unavailable(
                f"cannot bind {address}: {exc}", field=f"services.{self.name}.port"
            ) from exc
        await self._start_metrics()
        enable_reflection([*self._service_names, health.SERVICE_NAME], self._server)
        # Handlers go in before the server is reachable, so an early SIGTERM still drains gracefully.
        self.install_signal_handlers()
        await self._server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for service_name in ["", *self._service_names]:
            await self._health.set(service_name, serving)
        log.info("server_started", service=self.name, address=address, port=self.port, tls=creds is not None)
        sdnotify.ready(f"serving {self.name} on {address}")
        return self.port

    async def _start_metrics(self) -> None:
        """`/metrics` on the gRPC server's interface, when services.<name>.metrics_port is set."""
        port = self.endpoint.metrics_port
        if port is None:
            return
        host = self.endpoint.bind_host
        try:
            self.metrics_port = await self._metrics_endpoint.start(host, port)
        except OSError as exc:
            raise errors.Unavailable(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
                field=f"services.{self.name}.metrics_port",
            ) from exc
        log.info(
            "metrics_listening", service=self.name, address=f"{host}:{self.metrics_port}", path="/metrics"
        )

    def request_stop(self) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            hard_stop.arm(self.name, self.services.shutdown_grace_s)
        self._stop_event.set()

    @property
    def stop_deadline(self) -> float:
        """time.monotonic() by which a requested stop must be over: request + shutdown_grace_s."""
        requested = self.stop_requested_at if self.stop_requested_at is not None else time.monotonic()
        return requested + self.services.shutdown_grace_s

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT request a graceful stop (no-op outside the main thread, e.g. in tests)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (RuntimeError, ValueError):
                return
        self._signals_installed = True

    async def wait(self) -> None:
        """Serve until SIGTERM/SIGINT or request_stop(), then stop gracefully."""
        await self._stop_event.wait()
        await self.stop()

    async def stop(self) -> None:
        """Drain in-flight calls, then run the shutdown hooks, within shutdown_grace_s in all: a hook
        still running at the deadline (each gets at least HOOK_MIN_S) is cancelled and logged."""
        grace = self.services.shutdown_grace_s
        deadline = asyncio.get_running_loop().time() + grace
        log.info("server_stopping", service=self.name, grace_s=grace)
        sdnotify.stopping()
        if getattr(self, "_signals_installed", False):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self._signals_installed = False
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        for hook in self._shutdown_hooks:
            left = max(deadline - asyncio.get_running_loop().time(), HOOK_MIN_S)
            try:
                await asyncio.wait_for(hook(), timeout=left)
            except asyncio.TimeoutError:
                log.warning(
                    "shutdown_hook_timed_out", service=self.name, hook=_name(hook), after_s=round(left, 2)
                )
            except Exception:
                log.exception("shutdown_hook_failed", service=self.name)
        await self._metrics_endpoint.close()  # last: a scrape during the drain still answers
        log.info("server_stopped", service=self.name)

    def info(
        self, version: str, stats: dict[str, float] | None = None, state: str = "serving"
    ) -> common_pb2.ServiceInfo:
        """The ServiceInfo every GetInfo returns."""
        return common_pb2.ServiceInfo(
            service=self.name,
            version=version,
            uptime_s=time.time() - self.started_at,
            stats=stats or {},
            state=state,
        )
