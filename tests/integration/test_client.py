"""The client base against real grpc.aio servers on loopback: bounded retries on UNAVAILABLE (a server
that comes up late, one that never does) and the bearer token read from `services.auth.token_file`."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from services.common import errors
from services.common.client import ServiceClient
from services.common.config.services import AuthConfig, Endpoint, ServicesConfig
from services.common.procs import free_port
from services.common.server import ServiceServer
from trinity_grpc.buffer.v1 import buffer_pb2, buffer_pb2_grpc


class WriteServicer(buffer_pb2_grpc.BufferServiceServicer):
    async def Write(self, request, context):  # noqa: N802
        return buffer_pb2.WriteResponse(written=len(request.experiences))


class CountingStub:
    """The real stub, with the time of every attempt recorded (one entry per call the client makes)."""

    def __init__(self, channel) -> None:  # type: ignore[no-untyped-def]
        self._stub = buffer_pb2_grpc.BufferServiceStub(channel)
        self.attempts: list[float] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        rpc = getattr(self._stub, name)

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.attempts.append(time.monotonic())
            return rpc(*args, **kwargs)

        return call


class CountingClient(ServiceClient):
    stub_class = CountingStub


async def start_server(cfg: ServicesConfig, port: int = 0) -> ServiceServer:
    server = ServiceServer("buffer", cfg, Endpoint(host="127.0.0.1", port=port))
    server.add(
        buffer_pb2_grpc.add_BufferServiceServicer_to_server,
        WriteServicer(),
        "trinity_grpc.buffer.v1.BufferService",
    )
    await server.start()
    return server


def one_experience() -> buffer_pb2.WriteRequest:
    request = buffer_pb2.WriteRequest(buffer="b")
    request.experiences.add()
    return request


async def test_client_retries_until_a_late_server_comes_up() -> None:
    # The default budget (5 retries, ~1.5-3 s of sleeps) must outlast the channel's own reconnect
    # backoff after a refused connect (gRPC's default ~1 s, x1.6; the client shortens it).
    port = free_port()
    client = await CountingClient.connect(f"127.0.0.1:{port}", timeout=2)
    assert client.max_retries == 5
    server = None
    try:
        call = asyncio.create_task(client._call("Write", one_experience()))
        while not client._stub.attempts:  # the first attempt is made against a closed port
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not call.done(), "the client gave up after its first UNAVAILABLE"
        server = await start_server(ServicesConfig(), port)
        reply = await asyncio.wait_for(call, 30)
        assert reply.written == 1
        assert 2 <= len(client._stub.attempts) <= client.max_retries + 1
    finally:
        await client.close()
        if server is not None:
            await server.stop()


async def test_client_gives_up_after_max_retries_plus_one_attempts() -> None:
    port = free_port()  # nothing ever listens here
    client = await CountingClient.connect(f"127.0.0.1:{port}", max_retries=3, timeout=2)
    started = time.monotonic()
    try:
        with pytest.raises(errors.Unavailable):
            await asyncio.wait_for(client._call("Write", one_experience()), 20)
    finally:
        await client.close()
    elapsed = time.monotonic() - started
    assert len(client._stub.attempts) == 4
    # jittered backoff 0.05·(1..2), doubling: at most 0.1 + 0.2 + 0.4 s of sleeps between 4 attempts
    assert elapsed < 10, f"gave up after {elapsed:.1f}s"


async def test_client_does_not_retry_when_asked_not_to() -> None:
    client = await CountingClient.connect(f"127.0.0.1:{free_port()}", max_retries=3, timeout=2)
    try:
        with pytest.raises(errors.Unavailable):
            await client._call("Write", one_experience(), retry=False)
    finally:
        await client.close()
    assert len(client._stub.attempts) == 1


async def test_bearer_token_from_token_file(tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-s3cret\n")  # a trailing newline, as editors and `echo` leave it
    cfg = ServicesConfig(auth=AuthConfig(token_file=str(token_file)))
    server = await start_server(cfg)
    address = f"127.0.0.1:{server.port}"
    try:
        right = await CountingClient.connect(address, services_cfg=cfg, max_retries=0)
        assert (await right._call("Write", one_experience())).written == 1
        await right.close()

        wrong_file = tmp_path / "wrong-token"
        wrong_file.write_text("not-the-token")
        wrong_cfg = ServicesConfig(auth=AuthConfig(token_file=str(wrong_file)))
        wrong = await CountingClient.connect(address, services_cfg=wrong_cfg, max_retries=3)
        with pytest.raises(errors.Unauthenticated):
            await wrong._call("Write", one_experience())
        await wrong.close()
        assert len(wrong._stub.attempts) == 1, "UNAUTHENTICATED is not retried"

        anonymous = await CountingClient.connect(address, max_retries=0)
        with pytest.raises(errors.Unauthenticated):
            await anonymous._call("Write", one_experience())
        await anonymous.close()
    finally:
        await server.stop()


def test_unreadable_or_empty_token_file_is_a_config_error(tmp_path: pathlib.Path) -> None:
    from services.common.security import load_token

    with pytest.raises(errors.ConfigError) as info:
        load_token(AuthConfig(token_file=str(tmp_path / "absent")))
    assert info.value.field == "services.auth.token_file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(errors.ConfigError, match="empty"):
        load_token(AuthConfig(token_file=str(tmp_path / "empty")))
