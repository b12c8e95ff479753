"""The hand-over's two signals over real sockets, files and processes: the kubelet
stand-in hanging up on a plugin whose streams ended (its connection closes before the
resource turns unhealthy, as the kubelet's Disconnect does), and the streams lock that
a successor takes only once the old agent lets go or dies."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from kubelet_fakes import FakeHandler, exists, make_resource, read_json

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.deviceplugin import server as server_module
from gpuslice.adapters.deviceplugin.decoy import DECOY_SOCKET, register_decoys
from gpuslice.adapters.deviceplugin.dirlock import HOLDER_FILE, DirLock, Holder
from gpuslice.adapters.deviceplugin.handover import DirClaim
from gpuslice.adapters.deviceplugin.streamlock import STREAMS_FILE
from gpuslice.testing.kubelet import KubeletStandin

GPU = "nvidia.com/gpu"


async def _serve(kubelet: KubeletStandin, socket_name: str) -> DevicePluginServer:
    srv = DevicePluginServer(FakeHandler(make_resource()), kubelet.plugin_dir, socket_name)
    await srv.start()
    await srv.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: k.endpoint(GPU) == socket_name and k.updates(GPU) > 0)
    return srv


def _claim(plugin_dir: str, pid: int) -> DirClaim:
    return DirClaim(DirLock(plugin_dir, Holder(pid)))


async def test_a_plugin_knows_when_the_kubelet_dropped_it_after_its_streams_ended(
    kubelet: KubeletStandin,
) -> None:
    """The current client's stream ends: the kubelet closes the connection (which the
    plugin sees) and marks every device unhealthy; a registration made after that
    is served and never dropped."""
    old = await _serve(kubelet, "nvidia-gpu.sock")
    assert await old.end_streams(timeout_s=30)
    (dropped,) = kubelet.disconnects
    assert dropped.ended == dropped.dropped == "nvidia-gpu.sock"
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0)

    new = await _serve(kubelet, "nvidia-gpu-2.sock")
    await old.stop(0)
    await kubelet.admit("pod", {"main": {GPU: 1}})
    assert kubelet.stale_streams == []
    assert len(kubelet.disconnects) == 1
    await new.stop(0)


async def test_a_plugin_the_kubelet_replaced_waits_only_its_bound_for_a_hang_up(
    kubelet: KubeletStandin,
) -> None:
    """A newer client registered first: the kubelet drops that one when the old stream
    ends and leaves the old connection open, so the old plugin has no hang-up to see."""
    old = await _serve(kubelet, "nvidia-gpu.sock")
    new = await _serve(kubelet, "nvidia-gpu-2.sock")
    assert not await old.end_streams(timeout_s=0.2)
    (stale,) = kubelet.stale_streams
    assert (stale.old_endpoint, stale.new_endpoint) == ("nvidia-gpu.sock", "nvidia-gpu-2.sock")
    for srv in (old, new):
        await srv.stop(0)


async def test_a_plugin_the_kubelet_never_dialled_ends_its_streams_at_once(
    plugin_dir: str,
) -> None:
    srv = DevicePluginServer(FakeHandler(make_resource()), plugin_dir)
    await srv.start()
    assert await asyncio.wait_for(srv.end_streams(timeout_s=30), 5)
    await srv.stop(0)


async def test_the_streams_pass_to_a_successor_only_when_the_old_agent_lets_go(
    plugin_dir: str,
) -> None:
    old, new = _claim(plugin_dir, 1), _claim(plugin_dir, 2)
    assert old.take_streams()
    assert not new.take_streams()
    assert not await new.wait_streams(take_s=0.05)  # bounded: then it registers anyway
    taking = asyncio.create_task(new.wait_streams())
    await asyncio.sleep(0.02)  # several polls, all refused
    assert not taking.done()
    old.release()
    assert await asyncio.wait_for(taking, 5)
    assert not old.take_streams()
    new.release()


async def test_a_streams_file_a_kubelet_start_deleted_is_taken_afresh_before_a_hand_over(
    plugin_dir: str,
) -> None:
    """The kubelet deletes files in the directory when it starts: a successor that
    found no file would take a new one at once, so the holder takes one in place first."""
    lock = DirLock(plugin_dir, Holder(1))
    old, new = DirClaim(lock), _claim(plugin_dir, 2)
    assert lock.try_acquire()
    assert old.take_streams()
    os.unlink(os.path.join(plugin_dir, STREAMS_FILE))
    assert not await old.hand_over(arrive_s=0.01)  # no successor waits
    assert not new.take_streams()
    old.release()
    assert new.take_streams()
    new.release()


async def test_a_predecessor_that_died_holds_no_streams(plugin_dir: str) -> None:
    """A process that holds the streams lock and is killed leaves it to the next one."""
    code = (
        "import sys, time\n"
        "from gpuslice.adapters.deviceplugin.streamlock import StreamsLock\n"
        "assert StreamsLock(sys.argv[1]).try_take()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, plugin_dir, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"held\n"
        claim = _claim(plugin_dir, 2)
        assert not claim.take_streams()
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert claim.take_streams()
        claim.release()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_streams_end_for_a_successor_only_in_a_pause_between_calls(
    kubelet: KubeletStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the kubelet's calls come back to back the old agent keeps its streams, so
    no call is cut when the kubelet drops it; they end once the calls pause."""
    monkeypatch.setattr(server_module, "QUIET_GAP_S", 1.0)  # far above a loaded call's
    monkeypatch.setattr(server_module, "QUIET_LIMIT_S", 60.0)
    srv = await _serve(kubelet, "nvidia-gpu.sock")
    dev = min(kubelet.devices(GPU))
    answered: list[float] = []
    for _ in range(3):
        await kubelet.allocate(GPU, [[dev]])
        answered.append(time.monotonic())
    ending = asyncio.create_task(srv.end_streams(timeout_s=30))
    for _ in range(10):
        await kubelet.allocate(GPU, [[dev]])
        answered.append(time.monotonic())
    assert not ending.done()
    assert kubelet.disconnects == []
    assert await ending
    (dropped,) = kubelet.disconnects
    assert dropped.at > answered[-1]
    await srv.stop(0)


async def test_the_old_agent_serves_until_the_successor_says_it_registered(
    plugin_dir: str,
) -> None:
    """The successor marks the holder file once its registrations returned; until then
    the file carries only the fields an earlier release reads (it refuses others)."""
    old_lock, new_lock = DirLock(plugin_dir, Holder(1)), DirLock(plugin_dir, Holder(2))
    old, new = DirClaim(old_lock), DirClaim(new_lock)
    assert old_lock.try_acquire()
    old_lock.release()
    assert new_lock.try_acquire()
    new.serving()
    assert not await old.wait_registered(wait_s=0.05)
    waiting = asyncio.create_task(old.wait_registered(wait_s=60))
    await asyncio.sleep(0.05)  # several polls, none answered
    assert not waiting.done()
    holder = os.path.join(plugin_dir, HOLDER_FILE)
    assert set(read_json(holder)) == {"pid", "pod", "node", "host", "token", "serving"}
    new.registered()
    assert await asyncio.wait_for(waiting, 5)
    assert read_json(holder)["registered"] is True
    new.release()


@pytest.mark.parametrize("after_connect", [False, True])
async def test_the_decoy_is_refused_and_leaves_the_old_endpoint_serving(
    plugin_dir: str, after_connect: bool
) -> None:
    """The kubelet refuses the decoy (either way it makes clients current); its socket is
    gone after. Where the kubelet made it current first, the old plugin's stream then
    ends with nothing done and its endpoint still allocates; else the old one is dropped."""
    async with KubeletStandin(plugin_dir, register_after_connect=after_connect) as kubelet:
        old = await _serve(kubelet, "nvidia-gpu.sock")
        assert await register_decoys(plugin_dir, kubelet.socket_path, [GPU])
        assert not exists(os.path.join(plugin_dir, DECOY_SOCKET))
        (_, decoy) = kubelet.registrations
        assert (decoy.endpoint, decoy.accepted) == (DECOY_SOCKET, False)
        assert await old.end_streams(timeout_s=0.3) is after_connect
        if after_connect:
            await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0)
        else:
            await kubelet.admit("pod", {"main": {GPU: 1}})
            assert kubelet.disconnects == []
        await old.stop(0)
