"""The DRA plugin's gRPC side over real unix sockets: registration answers, both DRA
versions, the request cap, sockets left alone when another process serves them and
removed on stop, and the health stream's complete lists."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence

import grpc
import pytest
from kubelet_fakes import short_dir

from gpuslice.adapters.deviceplugin.api import unix_target
from gpuslice.adapters.dra.server import MAX_CLAIMS, SERVICES, DraServer
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuslice.core.dra.claims import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.core.dra.health import DeviceHealth
from gpuslice.core.ports import SocketTaken
from gpuslice.testing.kubelet.dra import DraKubeletStandin

DRIVER = "gpu.example.com"


class Handler:
    """Prepares every claim onto one device; health it can flip."""

    driver = DRIVER

    def __init__(self) -> None:
        self.healthy = True
        self.health_generation = 0
        self._changed = asyncio.Condition()
        self.calls: list[str] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.calls += [f"prepare {c.uid}" for c in claims]
        device = PreparedDevice(("r",), "pool", "dev", ("k8s.x/claim=1",), None)
        return {c.uid: PrepareResult((device,)) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.calls += [f"unprepare {c.uid}" for c in claims]
        return {c.uid: "" for c in claims}

    def health(self) -> tuple[DeviceHealth, ...]:
        return (DeviceHealth("pool", "dev", self.healthy, 7, "" if self.healthy else "xid 79"),
                DeviceHealth("pool", "other", True, 3))  # fmt: skip

    async def flip(self) -> None:
        async with self._changed:
            self.healthy = not self.healthy
            self.health_generation += 1
            self._changed.notify_all()

    async def wait_health_changed(self, seen: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.health_generation != seen)
        return self.health_generation


def present(path: str) -> bool:
    return os.path.lexists(path)


@pytest.fixture
def root() -> Iterator[str]:
    yield from short_dir()


@pytest.fixture
async def served(root: str) -> AsyncIterator[tuple[DraServer, Handler]]:
    handler = Handler()
    server = DraServer(handler, registry_dir=f"{root}/reg", plugin_dir=f"{root}/plugins/{DRIVER}")
    await server.start()
    yield server, handler
    await server.stop()


async def test_registration_names_the_socket_and_services(
    served: tuple[DraServer, Handler], root: str
) -> None:
    server, _ = served
    async with DraKubeletStandin(f"{root}/reg") as kubelet:
        plugin = await kubelet.discover(DRIVER)
        assert plugin.endpoint == server.service_path == f"{root}/plugins/{DRIVER}/dra.sock"
        assert plugin.service == SERVICES[0] == "v1.DRAPlugin"
        await asyncio.wait_for(asyncio.shield(_registered(server)), 5)


async def _registered(server: DraServer) -> None:
    while not server.registered():
        await server.status_changed.wait()


async def test_v1beta1_is_served_too_and_every_claim_gets_an_entry(
    served: tuple[DraServer, Handler],
) -> None:
    server, handler = served
    async with grpc.aio.insecure_channel(unix_target(server.service_path)) as channel:
        stub = v1beta1_grpc.DRAPluginStub(channel)
        claims = [v1beta1.Claim(namespace="n", uid=f"u{i}", name="c") for i in range(3)]
        resp = await stub.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(claims=claims))
        assert sorted(resp.claims) == ["u0", "u1", "u2"]
        assert list(resp.claims["u0"].devices[0].cdi_device_ids) == ["k8s.x/claim=1"]
        assert not resp.claims["u0"].devices[0].HasField("share_id")
        resp = await stub.NodeUnprepareResources(
            v1beta1.NodeUnprepareResourcesRequest(claims=claims[:1])
        )
        assert dict(resp.claims) == {"u0": v1beta1.NodeUnprepareResourceResponse()}
        too_many = [claims[0]] * (MAX_CLAIMS + 1)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(claims=too_many))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert handler.calls == ["prepare u0", "prepare u1", "prepare u2", "unprepare u0"]


async def test_health_stream_sends_complete_lists_on_every_change(
    served: tuple[DraServer, Handler], root: str
) -> None:
    _, handler = served
    async with DraKubeletStandin(f"{root}/reg") as kubelet:
        await kubelet.discover(DRIVER)
        first = await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)
        assert first[("pool", "dev")] == (1, "")
        await handler.flip()
        health = await kubelet.wait_health(DRIVER, lambda h: h[("pool", "dev")][0] == 2)
        assert health == {("pool", "dev"): (2, "xid 79"), ("pool", "other"): (1, "")}


async def test_sockets_are_removed_on_stop_and_left_alone_when_taken(root: str) -> None:
    server = DraServer(Handler(), registry_dir=f"{root}/reg", plugin_dir=f"{root}/p")
    await server.start()
    assert server.sockets_present()
    await server.stop()
    assert not present(server.service_path)
    assert not present(server.registration_path)
    other = DraServer(Handler(), registry_dir=f"{root}/reg", plugin_dir=f"{root}/p")
    await other.start()  # a live DRA plugin answers on both sockets
    try:
        with pytest.raises(SocketTaken, match="another process serves"):
            await server.start()
        assert other.sockets_present()
    finally:
        await other.stop()
    assert not server.sockets_present()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()
    writer.close()


@pytest.mark.parametrize("which", ["service", "registration"])
async def test_a_socket_that_does_not_answer_the_api_is_replaced(root: str, which: str) -> None:
    """Accepting connections is not serving: a squatter on either path that says
    nothing is no plugin, and its file is replaced."""
    server = DraServer(Handler(), registry_dir=f"{root}/reg", plugin_dir=f"{root}/p")
    path = server.service_path if which == "service" else server.registration_path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    squatter = await asyncio.start_unix_server(_silent, path)
    try:
        theirs = os.lstat(path).st_ino
        await server.start()
        try:
            assert server.sockets_present()
            assert os.lstat(path).st_ino != theirs
        finally:
            await server.stop()
    finally:
        squatter.close()
