"""The shared server runner on real loopback ports: error mapping, auth, TLS/mTLS, request ids,
message limits and graceful drain. The servicers here are test doubles of a service; the gRPC
server, interceptors, credentials and clients are the real ones."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from services.common import errors
from services.common.client import ServiceClient
from services.common.config.services import AuthConfig, Endpoint, ServicesConfig, TLSConfig
from services.common.health import check_health
from services.common.logging import current_request_id, request_context
from services.common.server import ServiceServer
from trinity_grpc.buffer.v1 import buffer_pb2, buffer_pb2_grpc
from trinity_grpc.common.v1 import common_pb2


class EchoServicer(buffer_pb2_grpc.BufferServiceServicer):
    """GetInfo echoes the request id; Write counts; Stats raises the domain error named by `buffer`."""

    async def GetInfo(self, request, context):  # noqa: N802
        await asyncio.sleep(0.3)
        return buffer_pb2.GetInfoResponse(
            info=common_pb2.ServiceInfo(service="buffer", state=current_request_id() or "")
        )

    writes = 0  # Write calls that reached the servicer

    async def Write(self, request, context):  # noqa: N802
        EchoServicer.writes += 1
        return buffer_pb2.WriteResponse(written=len(request.experiences))

    async def Stats(self, request, context):  # noqa: N802
        raise {
            "missing": errors.NotFound("no buffer named 'missing'", field="buffer"),
            "bad": errors.InvalidArgument("lengths disagree", field="experiences[3].logprobs"),
            "full": errors.ResourceExhausted("queue full"),
        }[request.buffer]


class BufferTestClient(ServiceClient):
    stub_class = buffer_pb2_grpc.BufferServiceStub


async def start_server(cfg: ServicesConfig) -> ServiceServer:
    server = ServiceServer("buffer", cfg, Endpoint(host="127.0.0.1", port=0))
    server.add(
        buffer_pb2_grpc.add_BufferServiceServicer_to_server,
        EchoServicer(),
        "trinity_grpc.buffer.v1.BufferService",
    )
    await server.start()
    return server


async def test_domain_errors_map_to_status_codes_with_the_field() -> None:
    server = await start_server(ServicesConfig())
    client = await BufferTestClient.connect(f"127.0.0.1:{server.port}", max_retries=0)
    try:
        for name, cls, field in [
            ("missing", errors.NotFound, "buffer"),
            ("bad", errors.InvalidArgument, "experiences[3].logprobs"),
            ("full", errors.ResourceExhausted, ""),
        ]:
            with pytest.raises(cls) as info:
                await client._call("Stats", buffer_pb2.StatsRequest(buffer=name))
            assert info.value.field == field
        with pytest.raises(errors.Unimplemented) as info:
            await client._call("Ack", buffer_pb2.AckRequest(lease_id="x"))
        assert "Ack" in str(info.value)
    finally:
        await client.close()
        await server.stop()


async def test_request_id_travels_in_metadata() -> None:
    server = await start_server(ServicesConfig())
    client = await BufferTestClient.connect(f"127.0.0.1:{server.port}")
    try:
        with request_context("rid-4242"):
            reply = await client._call("GetInfo", buffer_pb2.GetInfoRequest())
        assert reply.info.state == "rid-4242"
    finally:
        await client.close()
        await server.stop()


def write_of(mib: float) -> buffer_pb2.WriteRequest:
    request = buffer_pb2.WriteRequest(buffer="b")
    request.experiences.add().tokens.raw = b"\0" * int(mib * 1024 * 1024)
    return request


async def test_oversize_message_is_rejected_with_resource_exhausted_naming_limit_and_split() -> None:
    """Up to twice the limit the server reads an over-size request and answers with an ErrorDetail
    naming the limit, its key and the split; beyond that gRPC-core answers, and our client adds
    the same advice. The servicer never sees an over-size request."""
    cfg = ServicesConfig(max_message_mb=1)
    server = await start_server(cfg)
    address = f"127.0.0.1:{server.port}"
    client = await BufferTestClient.connect(address, max_retries=0)  # default config: sends up to 64 MiB
    same_limit = await BufferTestClient.connect(address, services_cfg=cfg, max_retries=0)
    EchoServicer.writes = 0
    try:
        with pytest.raises(errors.ResourceExhausted) as by_server:
            await client._call("Write", write_of(1.5))
        assert by_server.value.field == "services.max_message_mb"  # from the server's ErrorDetail
        assert "over the limit of 1,048,576 bytes (services.max_message_mb = 1)" in by_server.value.message
        assert "split the experiences over several Write calls" in by_server.value.message
        for sender, mib, words in [(client, 3, "2,097,152"), (same_limit, 1.5, "1,048,576")]:
            with pytest.raises(errors.ResourceExhausted) as by_core:  # the server's core, then the client's
                await sender._call("Write", write_of(mib))
            assert by_core.value.field == "services.max_message_mb"
            assert f"over gRPC's limit of {words} bytes: split the experiences" in by_core.value.message
        assert EchoServicer.writes == 0
        assert (await client._call("Write", write_of(0.5))).written == 1
    finally:
        await client.close()
        await same_limit.close()
        await server.stop()


async def test_graceful_stop_finishes_in_flight_calls() -> None:
    server = await start_server(ServicesConfig(shutdown_grace_s=5))
    client = await BufferTestClient.connect(f"127.0.0.1:{server.port}", max_retries=0)
    try:
        in_flight = asyncio.create_task(client._call("GetInfo", buffer_pb2.GetInfoRequest()))
        await asyncio.sleep(0.1)
        await server.stop()
        assert (await in_flight).info.service == "buffer"
        assert await check_health(f"127.0.0.1:{server.port}", timeout=1) == "UNREACHABLE"
    finally:
        await client.close()


async def test_bearer_token_required_except_for_health(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRINITY_TEST_TOKEN", "s3cret-token")
    cfg = ServicesConfig(auth=AuthConfig(token_env="TRINITY_TEST_TOKEN"))
    server = await start_server(cfg)
    address = f"127.0.0.1:{server.port}"
    try:
        assert await check_health(address) == "SERVING"
        anonymous = await BufferTestClient.connect(address, max_retries=0)
        with pytest.raises(errors.Unauthenticated):
            await anonymous._call("Write", buffer_pb2.WriteRequest(buffer="b"))
        await anonymous.close()
        monkeypatch.setenv("TRINITY_TEST_TOKEN", "wrong-token")
        wrong = await BufferTestClient.connect(address, services_cfg=cfg, max_retries=0)
        with pytest.raises(errors.Unauthenticated):
            await wrong._call("Write", buffer_pb2.WriteRequest(buffer="b"))
        await wrong.close()
        monkeypatch.setenv("TRINITY_TEST_TOKEN", "s3cret-token")
        right = await BufferTestClient.connect(address, services_cfg=cfg, max_retries=0)
        assert (await right._call("Write", buffer_pb2.WriteRequest(buffer="b"))).written == 0
        await right.close()
    finally:
        await server.stop()


async def test_tls_server_rejects_plaintext_and_accepts_verified_clients(certs: pathlib.Path) -> None:
    tls = TLSConfig(
        cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"), ca_file=str(certs / "ca.pem")
    )
    server = await start_server(ServicesConfig(tls=tls))
    address = f"127.0.0.1:{server.port}"
    try:
        plain = await BufferTestClient.connect(address, max_retries=0, timeout=3)
        with pytest.raises(errors.Unavailable):
            await plain._call("Write", buffer_pb2.WriteRequest(buffer="b"))
        await plain.close()
        secure = await BufferTestClient.connect(address, services_cfg=ServicesConfig(tls=tls), max_retries=0)
        assert (await secure._call("Write", buffer_pb2.WriteRequest(buffer="b"))).written == 0
        await secure.close()
        assert await check_health(address, services_cfg=ServicesConfig(tls=tls)) == "SERVING"
    finally:
        await server.stop()


async def test_mtls_requires_a_client_certificate(certs: pathlib.Path) -> None:
    server_tls = TLSConfig(
        cert_file=str(certs / "server.pem"),
        key_file=str(certs / "server.key"),
        ca_file=str(certs / "ca.pem"),
        require_client_cert=True,
    )
    server = await start_server(ServicesConfig(tls=server_tls))
    address = f"127.0.0.1:{server.port}"
    try:
        no_cert = ServicesConfig(tls=TLSConfig(ca_file=str(certs / "ca.pem")))
        client = await BufferTestClient.connect(address, services_cfg=no_cert, max_retries=0, timeout=3)
        with pytest.raises(errors.Unavailable):
            await client._call("Write", buffer_pb2.WriteRequest(buffer="b"))
        await client.close()
        with_cert = ServicesConfig(
            tls=TLSConfig(
                ca_file=str(certs / "ca.pem"),
                client_cert_file=str(certs / "client.pem"),
                client_key_file=str(certs / "client.key"),
            )
        )
        client = await BufferTestClient.connect(address, services_cfg=with_cert, max_retries=0)
        assert (await client._call("Write", buffer_pb2.WriteRequest(buffer="b"))).written == 0
        await client.close()
    finally:
        await server.stop()


async def test_shutdown_hooks_run_within_the_grace_and_a_stuck_one_is_cut_off() -> None:
    """Grace 1 s: a hook that would take 30 s is cancelled at the deadline; the next still runs."""
    server = await start_server(ServicesConfig(shutdown_grace_s=1))
    ran: list[str] = []

    async def stuck() -> None:
        ran.append("stuck")
        await asyncio.sleep(30)
        ran.append("stuck finished")

    async def quick() -> None:
        ran.append("quick")

    server.on_shutdown(stuck)
    server.on_shutdown(quick)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await server.stop()
    took = loop.time() - started
    assert ran == ["stuck", "quick"]
    assert took < 1 + 0.5 + 1.0, took  # the grace, the last hook's minimum, slack for a busy machine
