"""The NVML adapter's per-cgroup memory limits, over a pynvml stand-in that models the two
r615 calls as the driver documents them (a limit per cgroup path and GPU; soft 0 and hard
NVML_DEVICE_MEMORY_LIMIT_MAX clear it; not for MIG). The structs are pynvml's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import Dev, FakeNvml, open_backend

from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import UNLIMITED, Limit

CGROUP = "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice"


class LimitsNvml(FakeNvml):
    c_nvmlSetMemoryLimits_v1_t = pynvml.c_nvmlSetMemoryLimits_v1_t  # noqa: N815 - pynvml's
    c_nvmlGetMemoryLimits_v1_t = pynvml.c_nvmlGetMemoryLimits_v1_t  # noqa: N815

    def __init__(self, *args: object, calls: bool = True, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.calls = calls
        self.limits: dict[tuple[str, str], tuple[int, int]] = {}

    def _nvmlGetFunctionPointer(self, name: str) -> object:
        if not self.calls:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return object()

    def nvmlDeviceSetMemoryLimits_v1(self, dev: Dev, value: object) -> None:
        if dev.gpu.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert isinstance(value, pynvml.c_nvmlSetMemoryLimits_v1_t)
        key = (dev.gpu.uuid, _text(value.nameSpace))
        if value.softLimit == 0 and value.hardLimit == UNLIMITED:
            self.limits.pop(key, None)
        else:
            self.limits[key] = (value.softLimit, value.hardLimit)

    def nvmlDeviceGetMemoryLimits_v1(self, dev: Dev, value: object) -> None:
        assert isinstance(value, pynvml.c_nvmlGetMemoryLimits_v1_t)
        soft, hard = self.limits.get((dev.gpu.uuid, _text(value.nameSpace)), (0, UNLIMITED))
        value.softLimit, value.hardLimit, value.currentUsed = soft, hard, 123


def snapshot(driver: str = "615.10") -> object:
    return dataclasses.replace(load_spec("t4"), driver_version=driver)


def test_a_limit_is_set_read_back_and_cleared(tmp_path: Path) -> None:
    fake = LimitsNvml(snapshot())
    backend = open_backend(fake, tmp_path)
    gpu = fake.snap.gpus[0].uuid
    assert backend.limit_problem() == ""
    backend.set_memory_limit(gpu, CGROUP, Limit(4 << 30, 1 << 30))
    reading = backend.memory_limit(gpu, CGROUP)
    assert (reading.soft, reading.hard, reading.used) == (1 << 30, 4 << 30, 123)
    backend.clear_memory_limit(gpu, CGROUP)
    assert not backend.memory_limit(gpu, CGROUP).limited
    assert fake.limits == {}


@pytest.mark.parametrize(
    ("driver", "calls", "said"),
    [("580.65.06", True, "driver 580.65.06 is older than r615"),
     ("615.10", False, "lacks nvmlDeviceSetMemoryLimits_v1")],
)  # fmt: skip
def test_a_driver_that_cannot_set_limits_says_why(
    tmp_path: Path, driver: str, calls: bool, said: str
) -> None:
    backend = open_backend(LimitsNvml(snapshot(driver), calls=calls), tmp_path)
    assert said in backend.limit_problem()


def test_a_refused_call_is_one_backend_error_line(tmp_path: Path) -> None:
    fake = LimitsNvml(load_spec("a100-40gb-mig-mixed"))
    backend = open_backend(fake, tmp_path)
    mig_gpu = next(g for g in fake.snap.gpus if g.mig_enabled).uuid
    with pytest.raises(BackendError, match="nvmlDeviceSetMemoryLimits_v1 on GPU-") as caught:
        backend.set_memory_limit(mig_gpu, CGROUP, Limit(1 << 30))
    assert "\n" not in str(caught.value)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
