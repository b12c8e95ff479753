"""The driver's per-cgroup memory limits on a real GPU (driver r615 and later, cgroup v2,
root): detect support, set and read back a limit on a scratch cgroup of the test's own,
then remove it. Nothing else on the GPU is touched; skipped where it cannot run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.cgroup_tree import PodCgroupTree
from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.isolation import ENFORCING, Limit, detect

pytestmark = pytest.mark.gpu
CGROUP_ROOT = Path("/sys/fs/cgroup")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A cgroup of this test's own under the root, removed afterwards."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        pytest.skip("cgroup v2 is not mounted at /sys/fs/cgroup")
    path = CGROUP_ROOT / f"gpuslice-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"no scratch cgroup can be made here ({exc.strerror}): run as root")
    yield path
    os.rmdir(path)  # removing the cgroup also drops any limit left on it


def test_support_is_detected_with_what_is_missing(backend: NvmlBackend) -> None:
    snapshot = backend.snapshot()
    problem = backend.limit_problem()
    facts = PodCgroupTree(CGROUP_ROOT).facts(problem)
    modes = detect(snapshot, facts)
    assert [m.uuid for m in modes] == [g.uuid for g in snapshot.gpus]
    for gpu, mode in zip(snapshot.gpus, modes, strict=True):
        can = not problem and facts.cgroup_v2 and not gpu.mig_enabled
        assert (mode.mode in ENFORCING) is can, mode
        if problem:
            assert problem in mode.missing  # said in one line: the driver version or call


def test_a_limit_is_set_read_back_and_removed_on_a_scratch_cgroup(
    backend: NvmlBackend, scratch: Path
) -> None:
    problem = backend.limit_problem()
    if problem:
        pytest.skip(problem)
    gpu = next((g for g in backend.snapshot().gpus if not g.mig_enabled), None)
    if gpu is None:
        pytest.skip("every GPU has MIG enabled: the driver limits no MIG device")
    limit = Limit(hard=min(1 << 30, gpu.memory_mib << 19), soft=64 << 20)
    backend.set_memory_limit(gpu.uuid, str(scratch), limit)
    try:
        reading = backend.memory_limit(gpu.uuid, str(scratch))
        assert (reading.hard, reading.soft) == (limit.hard, limit.soft)
        assert reading.used == 0  # no process of this cgroup holds memory there
    finally:
        backend.clear_memory_limit(gpu.uuid, str(scratch))
    assert not backend.memory_limit(gpu.uuid, str(scratch)).limited
