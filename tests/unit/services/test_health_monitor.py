"""HealthMonitor: events -> marks -> every affected list, re-probes, recovery, logs."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
from health_fakes import FakeClock, Node, ScriptedBackend, mixed_node, serve

from gpuslice.adapters.fake import FakeBackend
from gpuslice.config.health_env import xid_policy_from_env
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError
from gpuslice.core.health import XidPolicy
from gpuslice.core.health_state import FATAL, LOST, TRANSIENT, WAIT_FAILED, RecoveryPolicy
from gpuslice.services.health_monitor import HealthMonitor

T = TypeVar("T")
HOLD = RecoveryPolicy(holddown_s=30.0, max_flaps=2, flap_window_s=600.0)


Logs = list[MutableMapping[str, Any]]


@pytest.fixture
def logs() -> Iterator[Logs]:
    """Every log entry at every level, whatever another test configured."""
    saved = structlog.get_config()
    with structlog.testing.capture_logs() as captured:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
        yield captured
    structlog.configure(**saved)


async def inline(fn: Callable[[], T]) -> T:
    """Runs the blocking call at once (the test backend never blocks)."""
    return fn()


class Rig:
    """A served node, its scripted backend and a monitor on a fake clock (no thread)."""

    def __init__(self, node: Node, policy: XidPolicy, recovery: RecoveryPolicy) -> None:
        self.node = node
        self.backend = ScriptedBackend(node.snapshot)
        self.clock = FakeClock()
        self.monitor = HealthMonitor(
            self.backend,
            policy,
            node.on_change,
            recovery=recovery,
            call=inline,
            clock=self.clock,
        )
        self.monitor.set_hardware(node.snapshot, node.resources)
        gpus = node.snapshot.gpus
        self.gpu0, self.gpu1 = gpus[0].uuid, gpus[1].uuid
        self.migs = [m.uuid for m in gpus[0].mig_devices]

    def xid(self, code: int, gpu: str | None = None, detail: str = "") -> None:
        uuid = self.gpu0 if gpu is None else gpu
        self.monitor.handle_event(HealthEvent(uuid, "xid", xid=code, detail=detail))

    def on(self, uuid: str) -> set[str]:
        """Kubelet IDs of every device on this GPU or MIG device, in every resource."""
        return self.node.ids_on(lambda d: uuid in (d.gpu_uuid, d.physical_id))

    async def after(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.monitor.probe_due()


async def rig(policy: XidPolicy | None = None, recovery: RecoveryPolicy = HOLD, **env: str) -> Rig:
    node = await serve(*mixed_node())
    return Rig(node, policy or xid_policy_from_env(env), recovery)


async def test_a_gpu_fault_marks_every_replica_and_mig_device_in_every_resource() -> None:
    r = await rig()
    handlers = r.node.manager.handlers
    seen = {name: h.generation for name, h in handlers.items()}
    r.xid(79)
    on_gpu0 = r.on(r.gpu0)
    assert len(on_gpu0) == 1 + 1 + 2 * 3  # 3g, 2g and two 1g devices three times each
    assert r.node.unhealthy_ids() == on_gpu0
    moved = {name for name, h in handlers.items() if h.generation != seen[name]}
    assert moved == {"nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb"}
    for name in moved:  # every affected ListAndWatch stream wakes at once
        await asyncio.wait_for(handlers[name].wait_changed(seen[name]), 1)
    assert r.monitor.unhealthy == {r.gpu0}
    assert r.monitor.reasons[r.gpu0].severity == FATAL


async def test_every_replica_of_a_whole_gpu_is_marked() -> None:
    r = await rig()
    r.xid(48, r.gpu1, "ecc=double-bit")
    assert r.node.unhealthy_ids() == r.on(r.gpu1)
    assert len(r.on(r.gpu1)) == 3
    assert all(i.startswith(f"{r.gpu1}::") for i in r.on(r.gpu1))


async def test_a_gpu_read_only_in_part_is_unhealthy_with_no_event_until_read_in_full() -> None:
    """The backend could not read everything about GPU 1 (its snapshot says why):
    it is not vouched for from the moment the monitor learns of it, and a probe
    clears it once it answers (here: the next full read)."""
    r = await rig()
    gpus = r.node.snapshot.gpus
    partial = replace(gpus[1], read_error="memory: GPU is lost")
    r.monitor.set_hardware(replace(r.node.snapshot, gpus=(gpus[0], partial)), r.node.resources)
    assert r.node.unhealthy_ids() == r.on(r.gpu1)
    assert r.monitor.reasons[r.gpu1].cause == LOST
    assert "memory: GPU is lost" in r.monitor.reasons[r.gpu1].detail

    r.monitor.set_hardware(r.node.snapshot, r.node.resources)  # read in full again
    await r.after(HOLD.holddown_s)
    assert r.node.unhealthy_ids() == set()


async def test_a_mig_scoped_event_marks_only_that_mig_device_and_its_replicas() -> None:
    r = await rig()
    r.xid(31, detail="gi=9 ci=0")  # 31 is skipped by default
    assert r.node.unhealthy_ids() == set()
    r.xid(94, detail="gi=9 ci=0")
    assert r.node.unhealthy_ids() == r.on(r.migs[2])
    assert len(r.on(r.migs[2])) == 3
    assert r.monitor.unhealthy == {r.migs[2]}


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68, 109])
async def test_skipped_xids_change_nothing(code: int) -> None:
    r = await rig()
    r.xid(code)
    assert r.node.unhealthy_ids() == set()
    assert r.node.changes.empty()


async def test_disable_env_var_skips_more_xids_and_enable_forces_them() -> None:
    r = await rig(DP_DISABLE_HEALTHCHECKS="79", DP_ENABLE_HEALTHCHECKS="13")
    r.xid(79)
    assert r.node.unhealthy_ids() == set()
    r.xid(13)
    assert r.node.unhealthy_ids() == r.on(r.gpu0)


async def test_enable_all_counts_even_default_skipped_xids() -> None:
    r = await rig(DP_ENABLE_HEALTHCHECKS="all")
    r.xid(31, r.gpu1)
    assert r.node.unhealthy_ids() == r.on(r.gpu1)


async def test_disable_all_starts_no_watching_at_all() -> None:
    r = await rig(DP_DISABLE_HEALTHCHECKS="all")
    threads = threading.active_count()
    await r.monitor.start()
    assert threading.active_count() == threads
    assert r.backend.waits == 0
    await r.monitor.stop()


async def test_malformed_policy_entries_are_logged_when_watching_starts(logs: Logs) -> None:
    r = await rig(DP_DISABLE_HEALTHCHECKS="48,4 8", DP_ENABLE_HEALTHCHECKS="x")
    await r.monitor.start()
    await r.monitor.stop()
    assert [e["detail"] for e in logs if e["event"] == "health_policy_warning"] == [
        "DP_DISABLE_HEALTHCHECKS: ignoring '4 8': not an XID number, 'all' or 'xids'",
        "DP_ENABLE_HEALTHCHECKS: ignoring 'x': not an XID number, 'all' or 'xids'",
    ]


async def test_an_event_without_a_gpu_marks_every_gpu() -> None:
    r = await rig()
    r.xid(94, gpu="")
    assert r.node.unhealthy_ids() == set(r.node.health())


async def test_unknown_gpus_and_kinds_are_ignored() -> None:
    r = await rig()
    r.xid(79, gpu="GPU-not-here")
    r.monitor.handle_event(HealthEvent(r.gpu0, "thermal"))
    assert r.node.unhealthy_ids() == set()


async def test_transient_mark_recovers_after_the_holddown_when_probe_answers() -> None:
    r = await rig()
    r.xid(94, r.gpu1)
    await r.after(29.0)
    assert r.backend.probed == []
    assert r.node.unhealthy_ids() == r.on(r.gpu1)
    await r.after(1.0)
    assert r.backend.probed == [r.gpu1]
    assert r.node.unhealthy_ids() == set()
    assert r.monitor.reasons == {}


async def test_transient_mark_stays_while_probe_fails_and_recovers_later() -> None:
    r = await rig()
    r.backend.answer(r.migs[1], False)
    r.xid(94, detail="gi=3 ci=0")
    await r.after(30.0)
    await r.after(30.0)
    assert r.backend.probed == [r.migs[1], r.migs[1]]
    assert r.node.unhealthy_ids() == r.on(r.migs[1])
    r.backend.answer(r.migs[1], True)
    await r.after(30.0)
    assert r.node.unhealthy_ids() == set()


async def test_a_probe_that_raises_counts_as_not_answering() -> None:
    class Broken(ScriptedBackend):
        def probe(self, gpu_uuid: str) -> bool:
            raise BackendError("NVML call failed")

    r = await rig()
    r.monitor = HealthMonitor(
        Broken(r.node.snapshot), XidPolicy(), r.node.on_change, call=inline, clock=r.clock
    )
    r.monitor.set_hardware(r.node.snapshot, r.node.resources)
    r.xid(94, r.gpu1)
    await r.after(30.0)
    assert r.monitor.unhealthy == {r.gpu1}


async def test_fatal_mark_never_recovers() -> None:
    r = await rig()
    r.xid(79, r.gpu1)
    await r.after(3600.0)
    r.monitor.handle_event(HealthEvent(r.gpu1, "recovered"))
    assert r.backend.probed == []
    assert r.node.unhealthy_ids() == r.on(r.gpu1)
    assert r.monitor.reasons[r.gpu1].held


async def test_flap_cap_holds_a_device_down_until_restart() -> None:
    r = await rig()
    for _ in range(2):
        r.xid(94, r.gpu1)
        await r.after(30.0)
        assert r.node.unhealthy_ids() == set()
    r.xid(94, r.gpu1)
    reason = r.monitor.reasons[r.gpu1]
    assert reason.flapping
    assert reason.held
    await r.after(600.0)
    r.monitor.handle_event(HealthEvent(r.gpu1, "recovered"))
    assert r.node.unhealthy_ids() == r.on(r.gpu1)


async def test_recovered_event_clears_a_transient_mark_at_once() -> None:
    r = await rig()
    r.monitor.handle_event(HealthEvent(r.gpu1, "lost", detail="GPU is lost"))
    assert r.monitor.reasons[r.gpu1].cause == LOST
    assert r.node.unhealthy_ids() == r.on(r.gpu1)
    r.monitor.handle_event(HealthEvent(r.gpu1, "recovered"))
    assert r.node.unhealthy_ids() == set()


async def test_recovered_event_on_a_gpu_clears_its_mig_devices() -> None:
    r = await rig()
    r.xid(94, detail="gi=2 ci=0")
    r.xid(94, detail="gi=10 ci=0")
    r.monitor.handle_event(HealthEvent(r.gpu0, "recovered"))
    assert r.node.unhealthy_ids() == set()


async def test_a_lost_gpu_that_answers_again_recovers_after_the_holddown() -> None:
    r = await rig()
    r.backend.answer(r.gpu1, False)
    r.monitor.handle_event(HealthEvent(r.gpu1, "lost"))
    await r.after(30.0)
    assert r.monitor.unhealthy == {r.gpu1}
    r.backend.answer(r.gpu1, True)
    await r.after(30.0)
    assert r.monitor.unhealthy == frozenset()


async def test_a_wait_error_marks_every_gpu_until_probes_answer() -> None:
    r = await rig()
    r.monitor.handle_wait_error(BackendError("NVML event wait failed", transient=True))
    assert r.node.unhealthy_ids() == set(r.node.health())
    assert {x.cause for x in r.monitor.reasons.values()} == {WAIT_FAILED}
    await r.after(20.0)
    r.monitor.handle_wait_error(BackendError("again", transient=True))  # re-arms
    await r.after(20.0)
    assert r.backend.probed == []
    r.backend.answer(r.gpu0, False)
    await r.after(10.0)
    assert r.monitor.unhealthy == {r.gpu0}


async def test_reasons_are_a_read_only_view() -> None:
    r = await rig()
    r.xid(94, r.gpu1)
    reasons = r.monitor.reasons
    with pytest.raises(TypeError):
        reasons[r.gpu0] = reasons[r.gpu1]  # type: ignore[index]
    assert reasons[r.gpu1].severity == TRANSIENT


async def test_new_hardware_drops_marks_of_devices_that_vanished() -> None:
    r = await rig()
    r.xid(94, detail="gi=2 ci=0")
    r.xid(94, r.gpu1)
    r.monitor.set_hardware(HardwareSnapshot(gpus=(r.node.snapshot.gpus[1],)))
    assert r.monitor.unhealthy == {r.gpu1}
    assert r.node.drain() == [{r.migs[0]}, {r.migs[0], r.gpu1}, {r.gpu1}]


async def test_each_change_is_logged_with_xid_gpu_class_and_resources(logs: Logs) -> None:
    r = await rig()
    r.xid(94, detail="gi=9 ci=0")
    await r.after(30.0)
    r.xid(79, r.gpu1)
    marked, recovered, fatal = (e for e in logs if e["event"].startswith("device_"))
    assert marked["event"] == "device_marked"
    assert (marked["xid"], marked["gpu_index"], marked["fault_class"]) == (94, 0, TRANSIENT)
    assert marked["resources"] == ["nvidia.com/mig-1g.5gb"]
    assert marked["held_until"] == "probe answers"
    assert (recovered["event"], recovered["via"]) == ("device_recovered", "probe")
    assert recovered["unhealthy_for_s"] == 30.0
    assert (fatal["xid"], fatal["gpu_index"], fatal["fault_class"]) == (79, 1, FATAL)
    assert fatal["resources"] == ["nvidia.com/gpu.shared"]
    assert fatal["held_until"] == "agent restart"


# The monitor running for real: its thread, its timer and the real clock.


@pytest.fixture
async def running() -> AsyncIterator[tuple[Node, ScriptedBackend, HealthMonitor]]:
    node = await serve(*mixed_node())
    backend = ScriptedBackend(node.snapshot)
    threads = threading.active_count()
    recovery = RecoveryPolicy(holddown_s=0.05)
    monitor = HealthMonitor(backend, XidPolicy(), node.on_change, recovery=recovery, call=inline)
    monitor.set_hardware(node.snapshot, node.resources)
    async with monitor:
        yield node, backend, monitor
    assert threading.active_count() == threads


async def test_events_arrive_from_the_thread_and_recover_on_the_timer(
    running: tuple[Node, ScriptedBackend, HealthMonitor],
) -> None:
    node, backend, _monitor = running
    gpu1 = node.snapshot.gpus[1].uuid
    backend.push(HealthEvent(gpu1, "xid", xid=94))
    assert await node.next_change() == {gpu1}
    assert await node.next_change() == frozenset()  # the timer re-probed after 50 ms
    assert backend.probed == [gpu1]


async def test_a_failing_wait_marks_everything_then_probes_bring_it_back(
    running: tuple[Node, ScriptedBackend, HealthMonitor],
) -> None:
    node, backend, monitor = running
    backend.push(BackendError("NVML event wait failed: Unknown Error", transient=True))
    assert await node.next_change() == {g.uuid for g in node.snapshot.gpus}
    while await node.next_change():  # each GPU returns as its probe answers
        pass
    assert monitor.unhealthy == frozenset()


async def test_stopping_is_quick_and_never_blocks_the_loop() -> None:
    node = await serve(*mixed_node())
    backend = ScriptedBackend(node.snapshot)
    monitor = HealthMonitor(backend, XidPolicy(), node.on_change, call=inline)
    await monitor.start()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    loop = asyncio.get_running_loop()
    started = loop.time()
    await monitor.stop()
    elapsed = loop.time() - started
    ticker.cancel()
    assert elapsed < 0.5
    assert ticks > 1  # the loop kept running while the thread wound down


async def test_with_the_simulated_backend_and_an_events_file(tmp_path: Path) -> None:
    """FakeBackend follows a real events file; XID 79 fails its probe until recovered."""
    snapshot, settings = mixed_node()
    node = await serve(snapshot, settings)
    events = tmp_path / "events.jsonl"
    backend = FakeBackend(snapshot, events)
    recovery = RecoveryPolicy(holddown_s=0.05)
    monitor = HealthMonitor(backend, XidPolicy(), node.on_change, recovery=recovery)
    monitor.set_hardware(snapshot, node.resources)
    gpu0, gpu1 = (g.uuid for g in snapshot.gpus)
    mig = snapshot.gpus[0].mig_devices[3].uuid
    async with monitor:
        with events.open("a") as fh:
            fh.write('{"gpu": 0, "mig": 3, "xid": 94}\n')
        assert await node.next_change() == {mig}
        assert await node.next_change() == frozenset()
        with events.open("a") as fh:
            fh.write('{"gpu": 1, "lost": true}\n{"gpu": 0, "xid": 79}\n')
        assert await node.next_change() == {gpu1}
        assert await node.next_change() == {gpu0, gpu1}
        with events.open("a") as fh:
            fh.write('{"gpu": 1, "recovered": true}\n{"gpu": 0, "recovered": true}\n')
        assert await node.next_change() == {gpu0}
    assert monitor.reasons[gpu0].severity == FATAL
    backend.close()
