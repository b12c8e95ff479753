"""What the kernel and the kubelet hand the agent: /proc/<pid>/cgroup with any bytes,
a PodResources answer that does not decode, and `--kubelet-socket ""` (do not
register), which must leave the node's device-plugin directory alone."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from agent_harness import short_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.adapters.cgroups import CgroupOwners
from gpuslice.adapters.deviceplugin.api import unix_target
from gpuslice.adapters.podresources import PodResourcesClient
from gpuslice.config.options import DEFAULT_PLUGIN_DIR
from gpuslice.core.errors import BackendError
from gpuslice.core.usage import ProcessOwner

from .invariant import AgentUnderAttack

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
CONTAINER = "ab" * 32
POD_LINE = f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n".encode()


def proc_root(tmp_path: Path, pid: int, data: bytes) -> Path:
    (tmp_path / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp_path / str(pid) / "cgroup").write_bytes(data)
    (tmp_path / str(pid) / "stat").write_text(f"{pid} (python3) S {' '.join(['0'] * 18)} 42 0\n")
    return tmp_path


def test_a_cgroup_file_with_non_utf8_bytes_is_read(tmp_path: Path) -> None:
    """The agent exited on a UnicodeDecodeError before."""
    root = proc_root(tmp_path, 7, b"1:name=\xff\xfe/x\n" + POD_LINE)
    assert CgroupOwners(root).owners([7]) == {7: ProcessOwner(UID, CONTAINER)}


def test_a_cgroup_fifo_is_skipped_not_waited_on(tmp_path: Path) -> None:
    (tmp_path / "8").mkdir()
    os.mkfifo(tmp_path / "8" / "cgroup")
    assert CgroupOwners(tmp_path).owners([8]) == {}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_any_cgroup_bytes_give_an_owner_or_none(data: bytes, with_pod: bool) -> None:
    """Property: whatever bytes the file holds, owners() answers without raising."""
    root = Path(short_dir("gsh-"))
    try:
        proc_root(root, 9, data + (POD_LINE if with_pod else b""))
        owners = CgroupOwners(root).owners([9])
        assert set(owners) <= {9}
        if with_pod and b"\n" in data[-1:]:
            assert owners[9].pod_uid == UID
    finally:
        for p in sorted(root.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        root.rmdir()


@pytest.fixture
async def garbage_pod_resources() -> AsyncIterator[str]:
    """A PodResources server whose answers do not decode as its messages."""
    directory = short_dir("gsh-")
    socket = os.path.join(directory, "kubelet.sock")

    async def garbage(request: bytes, context: object) -> bytes:
        return b"\x0a\x05\x0a\x03\xff\xfe\xfd"  # a field whose length runs past the end

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(garbage),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(garbage),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(unix_target(socket))
    await server.start()
    try:
        yield socket
    finally:
        await server.stop(0)
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_pod_resources_answer_that_does_not_decode_is_one_line(
    garbage_pod_resources: str,
) -> None:
    """The sampler's path raised AttributeError (the agent exited) before."""
    client = PodResourcesClient(garbage_pod_resources, "/nonexistent", timeout_s=5)
    try:
        with pytest.raises(BackendError, match="the answer is not a ListPodResourcesResponse"):
            await client.list()
        with pytest.raises(BackendError, match="not a AllocatableResourcesResponse"):
            await client.allocatable()
    finally:
        await client.aclose()


@pytest.mark.skipif(os.path.exists(DEFAULT_PLUGIN_DIR), reason="a kubelet runs here")
async def test_not_registering_leaves_the_nodes_plugin_directory_alone(
    agents: list[AgentUnderAttack], tmp_path: Path
) -> None:
    """`--kubelet-socket ""` waited for the node's device-plugin directory (logging
    plugin_dir_missing where it does not exist), then locked it and bound sockets there."""
    agent = await AgentUnderAttack.attack(str(tmp_path), "--kubelet-socket", "")
    agents.append(agent)
    await agent.wait_for_line("agent_started")
    assert agent.count("plugin_dir_missing") == 0
    assert not Path(DEFAULT_PLUGIN_DIR).parent.exists() or agent.count("plugin_dir") == 0
    assert await agent.stop() == 0
