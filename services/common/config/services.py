"""`services:` — where each service listens and how the services authenticate (not in Trinity)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from services.common.config.base import Section

ServiceName = Literal["buffer", "synchronizer", "trainer", "explorer"]
SERVICE_NAMES: tuple[ServiceName, ...] = ("buffer", "synchronizer", "trainer", "explorer")


class Endpoint(Section):
    host: str = "127.0.0.1"
    """Address clients connect to; the server binds it too unless `bind` is set."""
    port: int = Field(0, ge=0, le=65535)
    """TCP port; 0 lets the OS choose (tests) — then clients must be told the port."""
    bind: str | None = None
    """Interface the server binds (e.g. 0.0.0.0 in a container); defaults to `host`."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Prometheus metrics of this service as plain HTTP at `http://<bind or host>:<metrics_port>/metrics`
    (no TLS, no token: the gRPC interface's reach); null (default): none; 0 lets the OS choose
    (logged as `metrics_listening`). What is exported: docs/metrics.md."""

    @field_validator("metrics_port")
    @classmethod
    def _not_the_grpc_port(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and value == info.data.get("port"):
            raise ValueError(
                f"{value} is this service's gRPC `port` too; give the metrics a port of their own"
            )
        return value

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def bind_address(self) -> str:
        return f"{self.bind_host}:{self.port}"

    @property
    def bind_host(self) -> str:
        """The interface the gRPC server and the metrics endpoint bind."""
        return self.bind or self.host


class TLSConfig(Section):
    cert_file: str | None = None
    """PEM certificate of this server; setting it turns TLS on."""
    key_file: str | None = None
    """PEM private key of `cert_file`."""
    ca_file: str | None = None
    """PEM CA bundle: clients verify servers with it; servers verify client certs (mTLS) with it."""
    require_client_cert: bool = False
    """mTLS: servers reject clients without a certificate signed by `ca_file`."""
    client_cert_file: str | None = None
    """PEM certificate clients present under mTLS."""
    client_key_file: str | None = None
    """PEM private key of `client_cert_file`."""
    server_name_override: str | None = None
    """Host name to check the server certificate against (tests, IP addresses)."""

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None or self.ca_file is not None


class AuthConfig(Section):
    token_file: str | None = None
    """File holding the bearer token every call must carry (never put the token in the YAML)."""
    token_env: str | None = None
    """Environment variable holding the bearer token (used when token_file is not set)."""

    @property
    def enabled(self) -> bool:
        return bool(self.token_file or self.token_env)


class ServicesConfig(Section):
    buffer: Endpoint = Endpoint(port=50051)
    """Buffer service endpoint."""
    synchronizer: Endpoint = Endpoint(port=50052)
    """Synchronizer service endpoint."""
    trainer: Endpoint = Endpoint(port=50053)
    """Trainer service endpoint."""
    explorer: Endpoint = Endpoint(port=50054)
    """Explorer service endpoint."""
    max_message_mb: int = Field(64, ge=1, le=2047)
    """Largest gRPC message sent or received, in MiB. A bigger request gets RESOURCE_EXHAUSTED whose
    error detail names this key, the limit and how to split the call (a server reads requests up
    to twice this size to say so; beyond that gRPC's own RESOURCE_EXHAUSTED answers). Raise it on
    the servers and their clients alike."""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """On SIGTERM, the seconds a service's whole stop may take: in-flight calls, shutdown hooks, and
    the trainer's step in progress (one that cannot end in time, less the last checkpoint's write
    time, is abandoned before its optimizer step and its rows go back to the buffer). A process whose
    stop still overruns it ends 1 s later (services.common.hard_stop)."""
    call_timeout_s: float = Field(30.0, gt=0)
    """Default deadline of an outgoing call, in seconds."""
    max_retries: int = Field(5, ge=0, le=100)
    """Retries of a call that failed with UNAVAILABLE (exponential backoff)."""
    tls: TLSConfig = TLSConfig()
    """Transport security; off by default (loopback)."""
    auth: AuthConfig = AuthConfig()
    """Bearer-token authentication; off by default."""
    health_wait_s: float = Field(120.0, gt=0)
    """`trinity run`: seconds to wait for each service to report SERVING."""

    def endpoint(self, name: ServiceName) -> Endpoint:
        return getattr(self, name)
