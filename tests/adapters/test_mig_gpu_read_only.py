"""The GPU tests of MIG only read: run here against a recording MIG control over the
simulated GPUs, they read profiles, placements, the mode and instances, and never create,
destroy or change a mode; no test under tests/gpu names a call that changes MIG."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.nodefile import parse_node
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.mig import GpuInstance, MigProfileSpec
from gpuslice.core.ports import MigControl

GPU_TESTS = Path(__file__).parents[1] / "gpu"
READS = {"profiles", "instances", "mig_mode"}
# MigControl's changes, and the NVML calls behind them
CHANGES = {
    "create", "destroy", "set_mig_mode",
    "nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "nvmlGpuInstanceDestroy",
    "nvmlComputeInstanceDestroy", "nvmlDeviceResetGpu",
}  # fmt: skip
# an A100 with MIG on and instances, an H100 with MIG off, a GPU that cannot do MIG
NODE = """name: lent
gpus:
  - model: a100-40gb
    mig_enabled: true
    mig_devices: [{profile: 3g.20gb, gi: 1}, {profile: 1g.5gb, gi: 13}]
  - {model: h100-80gb}
  - {model: t4}
"""


class Recording:
    """A MigControl that records each call and refuses every change."""

    def __init__(self, inner: MigControl) -> None:
        self.inner, self.calls = inner, list[str]()

    def profiles(self, gpu_uuid: str) -> tuple[MigProfileSpec, ...]:
        self.calls.append("profiles")
        return self.inner.profiles(gpu_uuid)

    def instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        self.calls.append("instances")
        return self.inner.instances(gpu_uuid)

    def mig_mode(self, gpu_uuid: str) -> tuple[bool, bool]:
        self.calls.append("mig_mode")
        return self.inner.mig_mode(gpu_uuid)

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        self.calls.append("set_mig_mode")
        raise AssertionError("a GPU test changed a MIG mode")

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        self.calls.append("create")
        raise AssertionError("a GPU test created a MIG instance")

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        self.calls.append("destroy")
        raise AssertionError("a GPU test destroyed a MIG instance")


class LentGpus:
    """The backend the GPU tests take, over simulated GPUs, with a recording control."""

    def __init__(self) -> None:
        self.fake = FakeBackend(parse_node(NODE, "lent"))
        control = self.fake.mig_control()
        assert control is not None
        self.mig = Recording(control)

    def snapshot(self) -> HardwareSnapshot:
        return self.fake.snapshot()

    def mig_control(self) -> Recording:
        return self.mig


@pytest.fixture
def lent() -> Iterator[LentGpus]:
    backend = LentGpus()
    yield backend
    backend.fake.close()


def gpu_tests() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mig_gpu_tests", GPU_TESTS / "test_mig_gpu.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mig_gpu_tests_only_read(lent: LentGpus) -> None:
    module = gpu_tests()
    tests = [
        f for name, f in inspect.getmembers(module, inspect.isfunction) if name.startswith("test_")
    ]
    assert len(tests) >= 2
    layout = [lent.mig.inner.instances(g.uuid) for g in lent.snapshot().gpus[:2]]
    for test in tests:
        test(lent)
    assert set(lent.mig.calls) == READS  # each kind of read, and nothing else
    assert [lent.mig.inner.instances(g.uuid) for g in lent.snapshot().gpus[:2]] == layout


@pytest.mark.parametrize("path", sorted(GPU_TESTS.glob("*.py")), ids=lambda p: p.name)
def test_no_gpu_test_names_a_call_that_changes_mig(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    named = {
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.Name)
    }
    assert not named & CHANGES, f"{path.name} names {sorted(named & CHANGES)}"
