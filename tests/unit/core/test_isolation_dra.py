"""A DRA claim's memory limit: consumed memory, the requested memory, NVIDIA's MpsConfig
pinned limits, then the replica's share; and the pods it is reserved for."""

from __future__ import annotations

from typing import Any

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.dra.claims import ClaimRef, parse_claim
from gpuslice.core.dra.devices import GPU, DraDevice
from gpuslice.core.isolation import Limit, LimitRule, MemoryPolicy
from gpuslice.core.isolation_dra import claim_limits, claim_pods, requested_memory
from gpuslice.core.sharing import MPS, TIME_SLICING

DRIVER = "gpu.nvidia.com"
MIB = 1 << 20
SNAP = HardwareSnapshot((Gpu(0, "GPU-0", "A100", 0, 40960, (8, 0)),))
REF = ClaimRef("ml", "uid-1", "c")


def device(sharing: str = TIME_SLICING, replicas: int = 4) -> DraDevice:
    return DraDevice("gpu-0", "GPU-0", "GPU-0", GPU, "0", "nvidia.com/gpu", sharing, replicas, ())


def claim(result: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"uid": "uid-1"},
        "spec": {"devices": {"requests": extra.pop("requests", [])}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "n",
                            "device": "gpu-0",
                            **(result or {}),
                        }
                    ],
                    "config": extra.pop("config", []),
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }
    return body


def limits(obj: dict[str, Any], dev: DraDevice, policy: MemoryPolicy | None = None) -> Any:
    parsed = parse_claim(obj, REF, DRIVER)
    return claim_limits(obj, parsed, [dev], SNAP, policy or MemoryPolicy.of(True), DRIVER)


def test_consumed_memory_comes_first_then_the_request() -> None:
    requested = [{"name": "gpu", "exactly": {"capacity": {"requests": {"memory": "8Gi"}}}}]
    assert requested_memory(claim(requests=requested)) == {"gpu": 8 << 30}
    both = claim({"consumedCapacity": {"memory": "6Gi"}}, requests=requested)
    assert limits(both, device()) == {"GPU-0": Limit(6 << 30)}
    assert claim_pods(both) == ("pod-1",)


def test_mps_pinned_limits_are_honoured_per_device_then_by_default() -> None:
    def mps(**config: Any) -> list[dict[str, Any]]:
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                  "sharing": {"strategy": "MPS", "mpsConfig": config}}  # fmt: skip
        return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]

    per_device = claim(config=mps(defaultPerDevicePinnedMemoryLimit={"0": "5Gi"},
                                  defaultPinnedDeviceMemoryLimit="3Gi"))  # fmt: skip
    assert limits(per_device, device(MPS)) == {"GPU-0": Limit(5 << 30)}
    default = claim(config=mps(defaultPinnedDeviceMemoryLimit="3Gi"))
    assert limits(default, device(MPS)) == {"GPU-0": Limit(3 << 30)}


def test_a_replica_gets_its_share_and_shares_multiply_it() -> None:
    assert limits(claim(), device()) == {"GPU-0": Limit(40960 * MIB // 4)}
    two = claim({"consumedCapacity": {"shares": "2"}})
    assert limits(two, device()) == {"GPU-0": Limit(2 * 40960 * MIB // 4)}
    off = MemoryPolicy.of(True, {"nvidia.com/gpu": LimitRule(off=True)})
    assert limits(claim(), device(), off) == {}
    assert limits(claim(), device(replicas=1)) == {}  # a whole GPU
