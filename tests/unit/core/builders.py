"""Small builders for core values: GPUs, MIG devices, snapshots, settings."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.sharing import (
    MIG_NONE,
    NONE,
    TIME_SLICING,
    ReplicaRule,
    ResourceSettings,
    SharingPlan,
)

A100 = "NVIDIA A100-SXM4-40GB"

# Memory per MIG profile on an A100-40GB, enough for the tests' profiles.
_MIG_MEMORY = {"1g.5gb": 4864, "1g.10gb+me": 9856, "2g.10gb": 9856, "3g.20gb": 19968}


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-2222-3333-444444444444"


def mig_uuid(gpu_index: int, mig_index: int) -> str:
    return f"MIG-{gpu_index:04x}{mig_index:04x}-aaaa-bbbb-cccc-dddddddddddd"


def mig(gpu_index: int, mig_index: int, profile: str = "1g.5gb") -> MigDevice:
    """MIG device `mig_index` of GPU `gpu_index`, with two capability nodes."""
    cap = 100 * (gpu_index + 1) + 2 * mig_index
    return MigDevice(
        uuid=mig_uuid(gpu_index, mig_index),
        index=mig_index,
        profile=profile,
        gi=mig_index + 1,
        ci=0,
        memory_mib=_MIG_MEMORY.get(profile, 1024),
        cap_paths=(f"/dev/nvidia-caps/nvidia-cap{cap}", f"/dev/nvidia-caps/nvidia-cap{cap + 1}"),
    )


def gpu(
    index: int,
    *,
    profiles: Sequence[str] | None = None,
    mig_enabled: bool | None = None,
    nvlinks: Sequence[tuple[int, int]] = (),
    numa_node: int | None = None,
    memory_mib: int = 40960,
    name: str = A100,
) -> Gpu:
    """GPU `index`; `profiles` lists its MIG devices (MIG is enabled when given),
    `nvlinks` holds (peer GPU index, link count) pairs."""
    migs = tuple(mig(index, i, p) for i, p in enumerate(profiles or ()))
    return Gpu(
        index=index,
        uuid=gpu_uuid(index),
        name=name,
        minor=index,
        memory_mib=memory_mib,
        compute_capability=(8, 0),
        pci_bus_id=f"00000000:{index + 7:02X}:00.0",
        numa_node=numa_node,
        mig_capable=True,
        mig_enabled=profiles is not None if mig_enabled is None else mig_enabled,
        mig_devices=migs,
        nvlinks=tuple((gpu_uuid(peer), count) for peer, count in nvlinks),
    )


def gpus(count: int) -> tuple[Gpu, ...]:
    return tuple(gpu(i) for i in range(count))


def snapshot(*items: Gpu) -> HardwareSnapshot:
    return HardwareSnapshot(gpus=tuple(items), driver_version="550.54.15")


def settings(
    mig_strategy: str = MIG_NONE,
    *rules: ReplicaRule,
    strategy: str | None = None,
    fail_requests_greater_than_one: bool = False,
) -> ResourceSettings:
    """Settings with `rules`; the sharing strategy defaults to time-slicing
    when there are rules and to none otherwise."""
    return ResourceSettings(
        mig_strategy=mig_strategy,
        sharing=SharingPlan(
            strategy=strategy or (TIME_SLICING if rules else NONE),
            rules=rules,
            fail_requests_greater_than_one=fail_requests_greater_than_one,
        ),
    )


def by_name(resources: Sequence[Resource]) -> dict[str, Resource]:
    return {r.name: r for r in resources}


def only(resources: Sequence[Resource]) -> Resource:
    """The single resource of a build; fails the test when there are more."""
    assert len(resources) == 1, [r.name for r in resources]
    return resources[0]


def build(mig_strategy: str, *items: Gpu, rules: Sequence[ReplicaRule] = ()) -> dict[str, Resource]:
    return by_name(build_resources(snapshot(*items), settings(mig_strategy, *rules)))


def replicated_gpus(count: int, replicas: int, *, strategy: str = TIME_SLICING) -> Resource:
    """nvidia.com/gpu over `count` GPUs with `replicas` shares each."""
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=replicas)
    return only(
        build_resources(snapshot(*gpus(count)), settings(MIG_NONE, rule, strategy=strategy))
    )
