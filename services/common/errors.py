"""Domain errors shared by every service.

Cores raise these; the server interceptor (services/common/server.py) maps them to gRPC status
codes in one place, and the client base maps status codes back to them. No grpc import here, so
cores and their tests stay free of grpc.
"""

from __future__ import annotations


class TrinityError(Exception):
    """Base class. `field` names the offending input (e.g. "experiences[2].logprobs")."""

    kind = "internal"

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidArgument(TrinityError):
    """The request is malformed; retrying it unchanged will fail again."""

    kind = "invalid_argument"


class NotFound(TrinityError):
    """A named thing (buffer, lease, member, checkpoint) does not exist."""

    kind = "not_found"


class AlreadyExists(TrinityError):
    """A thing of that name exists with a different definition."""

    kind = "already_exists"


class ResourceExhausted(TrinityError):
    """A capacity or size limit was hit (full queue past its deadline, oversize batch)."""

    kind = "resource_exhausted"


class FailedPrecondition(TrinityError):
    """The system is not in a state that allows the call (e.g. a lease already acked)."""

    kind = "failed_precondition"


class DeadlineExceeded(TrinityError):
    """A wait ran past its deadline (sync_timeout, read wait)."""

    kind = "deadline_exceeded"


class Unavailable(TrinityError):
    """A dependency is down or shutting down; retrying later may succeed."""

    kind = "unavailable"


class Unauthenticated(TrinityError):
    """Missing or wrong credentials."""

    kind = "unauthenticated"


class Unimplemented(TrinityError):
    """The RPC exists in the contract but this server does not serve it yet."""

    kind = "unimplemented"


class ConfigError(TrinityError):
    """The configuration is invalid; `field` is the dotted key path of the first error and the
    message already names every offending path."""

    kind = "invalid_argument"

    def __str__(self) -> str:
        return self.message


ERROR_KINDS: dict[str, type[TrinityError]] = {
    cls.kind: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        DeadlineExceeded,
        Unavailable,
        Unauthenticated,
        Unimplemented,
    )
}
