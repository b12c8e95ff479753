"""The mig.config protocol's decisions: which GPUs change now, which wait and why, the
state published; who holds which device; which GPUs are busy."""

from __future__ import annotations

import dataclasses

from gpuslice.core.devices import HardwareSnapshot, MigDevice
from gpuslice.core.mig import Placement
from gpuslice.core.mig_layout import Create, GpuPlan, SetMode, Wanted
from gpuslice.core.mig_reconcile import (
    PENDING,
    STATE_LABEL,
    SUCCESS,
    busy_gpus,
    decide,
    holders,
    state_labels,
)
from gpuslice.core.usage import (
    ContainerDevices,
    DeviceProcesses,
    GpuSample,
    ProcessSample,
    ProcessUse,
)

from .test_mig_layout import gpu

WANTED = Wanted(True, ("7g.40gb",))
MODE_ON = SetMode(True, resets=True)
CREATE = Create("7g.40gb", Placement(0, 8))


def plan(index: int, *steps: object, held: str = "") -> GpuPlan:
    return GpuPlan(index, f"GPU-{index}", WANTED, steps, held)  # type: ignore[arg-type]


def test_gpus_without_steps_are_success_and_untouched() -> None:
    verdict = decide([plan(0), GpuPlan(1, "GPU-1", None)])
    assert verdict.run == ()
    assert verdict.state == SUCCESS
    assert verdict.reason == ""


def test_gpus_that_change_run_in_index_order_and_the_state_is_pending() -> None:
    verdict = decide([plan(1, CREATE), plan(0, MODE_ON, CREATE)])
    assert [p.index for p in verdict.run] == [0, 1]
    assert verdict.state == PENDING
    assert verdict.reason == ""


def test_a_held_gpu_waits_with_its_reason_while_the_others_run() -> None:
    held = "GPU 0 (A100): the layout must change, but its devices are in use: MIG-a by pod ml/x"
    verdict = decide([plan(0, CREATE, held=held), plan(1, CREATE)])
    assert [p.index for p in verdict.run] == [1]
    assert verdict.state == PENDING
    assert verdict.reason == held


def test_a_mode_change_that_resets_waits_for_an_idle_gpu_one_that_does_not_runs() -> None:
    hopper = plan(1, SetMode(True, resets=False), CREATE)
    verdict = decide(
        [plan(0, MODE_ON, CREATE), hopper, plan(2, CREATE)], busy={"GPU-0", "GPU-1", "GPU-2"}
    )
    assert [p.index for p in verdict.run] == [1, 2]
    assert verdict.reason.startswith("GPU 0: the MIG mode change resets the GPU")
    assert decide([plan(0, MODE_ON)], busy={"GPU-9"}).run == (plan(0, MODE_ON),)


def test_holders_name_pods_per_device_in_any_id_form_and_ignore_other_devices() -> None:
    mig = MigDevice("MIG-a", 0, "3g.20gb", 1, 0, 19968)
    snapshot = HardwareSnapshot(
        gpus=(dataclasses.replace(gpu(0, mig=True), mig_devices=(mig,)), gpu(1))
    )
    listed = [
        ContainerDevices("ml", "train", "main", "nvidia.com/mig-3g.20gb", ("MIG-a",)),
        ContainerDevices("ml", "train", "side", "nvidia.com/mig-3g.20gb", ("0:0",)),
        ContainerDevices("web", "a", "main", "nvidia.com/gpu", ("GPU-1::3",)),
        ContainerDevices("web", "b", "main", "nvidia.com/gpu", ("1",)),
        ContainerDevices("x", "y", "main", "example.com/fpga", ("fpga-0",)),
    ]
    assert holders(listed, snapshot.gpus) == {
        "MIG-a": ("pod ml/train",),
        "GPU-1": ("pod web/a", "pod web/b"),
    }


def test_busy_gpus_are_those_with_a_process_on_them_or_their_mig_devices() -> None:
    use = (ProcessUse(7, 1024),)
    sample = ProcessSample(
        gpus=(
            GpuSample("GPU-0", (DeviceProcesses("MIG-a"), DeviceProcesses("MIG-b", use))),
            GpuSample("GPU-1", (DeviceProcesses("GPU-1"),)),
        )
    )
    assert busy_gpus(sample) == {"GPU-0"}


def test_the_state_label_appears_once_a_config_is_named() -> None:
    assert state_labels(None) == {}
    assert state_labels(PENDING) == {STATE_LABEL: "pending"}
