"""Consumable capacity of a shared DRA device: every capacity has a request policy the API
accepts (a default within its range and a multiple of its step) and N default charges fit
the capacity, so the scheduler places N claims on a GPU replicated N times."""

from __future__ import annotations

import pytest

from gpuslice.core.dra.capacity import charged_memory_mib, shared_capacity
from gpuslice.core.dra.devices import DraDevice
from gpuslice.core.errors import ConfigError
from gpuslice.testing.dra_allocator import charge, quantity


def device(replicas: int, **capacity: str) -> DraDevice:
    return DraDevice(
        name="gpu-0", uuid="GPU-0", gpu_uuid="GPU-0", kind="gpu", index="0",
        resource="nvidia.com/gpu", sharing="time-slicing", replicas=replicas, paths=(),
        capacity=capacity,
    )  # fmt: skip


@pytest.mark.parametrize("replicas", [1, 2, 3, 7, 48])
def test_n_default_charges_fit_and_policies_are_valid(replicas: int) -> None:
    cap = shared_capacity(device(replicas, memory="15360Mi", multiprocessors="40", encoders="1"))
    assert set(cap) == {"memory", "multiprocessors", "encoders", "shares"}
    for name, entry in cap.items():
        policy = entry["requestPolicy"]
        assert isinstance(policy, dict)
        default = quantity(policy["default"])
        if "validRange" in policy:
            bounds = policy["validRange"]
            low, high, step = (quantity(bounds[k]) for k in ("min", "max", "step"))
            assert low <= default <= high <= quantity(entry["value"]), name
            assert default % step == 0, name
            assert high % step == 0, name
        else:
            assert policy["default"] in policy["validValues"], name
        charged = charge(entry, None)
        assert charged is not None
        # N sharers fit, but at most 40 of one multiprocessor each
        fits = min(replicas, 40) if name == "multiprocessors" else replicas
        assert charged * fits <= quantity(entry["value"]), name


def test_the_charge_read_back_is_the_consumed_memory() -> None:
    assert charged_memory_mib({"memory": "4Gi"}, "r") == 4096
    assert charged_memory_mib({"shares": "1"}, "r") is None
    with pytest.raises(ConfigError, match=r"^r.consumedCapacity.memory: 'x' is not a memory"):
        charged_memory_mib({"memory": "x"}, "r")
