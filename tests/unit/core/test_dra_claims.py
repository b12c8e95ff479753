"""core.dra.opaque and claims: NVIDIA's config accepted as it is, one-line refusals,
devices held by another claim refused unless shared, the claim's CDI spec."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.dra.claim_cdi import claim_spec, claim_spec_name, spec_file_name
from gpuslice.core.dra.claims import (
    ClaimError,
    ClaimRef,
    PreparedClaim,
    PreparedDevice,
    allocated_here,
    check_devices,
    claim_daemon,
    parse_claim,
    prepared_devices,
    sharing_for,
)
from gpuslice.core.dra.devices import DraOptions, build_devices
from gpuslice.core.dra.fields import quantity_mib
from gpuslice.core.dra.opaque import parse_config
from gpuslice.core.errors import ConfigError
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, ReplicaRule
from gpuslice.core.sharing import MPS as NODE_MPS
from gpuslice.core.strategies import MPS as MPS_SHARING
from gpuslice.core.strategies import TIME_SLICING as TIME_SLICED

from . import builders as b

TIME_SLICING, MPS = TIME_SLICED.dra_name, MPS_SHARING.dra_name

DRIVER = "gpu.nvidia.com"
OPTS = DraOptions()
REF = ClaimRef("ns", "uid-1", "claim")
GPU0, GPU1 = "gpu-0000-07-00-0", "gpu-0000-08-00-0"


def gpu_config(**sharing: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    if sharing:
        cfg["sharing"] = sharing
    return cfg


def claim_obj(
    *devices: str, uid: str = "uid-1", config: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": d, **extra}
        for d in devices
    ]
    return {
        "metadata": {"namespace": "ns", "name": "claim", "uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def node_devices(*rules: ReplicaRule, strategy: str | None = None, mig: str = MIG_NONE) -> Any:
    snap = b.snapshot(b.gpu(0), b.gpu(1))
    if mig != MIG_NONE:
        snap = b.snapshot(b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, mig_enabled=False))
    found = build_devices(snap, build_resources(snap, b.settings(mig, *rules, strategy=strategy)))
    return {d.name: d for d in found}


def opaque(params: Any, source: str = "FromClaim", **extra: Any) -> dict[str, Any]:
    return {"source": source, "opaque": {"driver": DRIVER, "parameters": params}, **extra}


def test_nvidias_gpu_config_parses_unchanged() -> None:
    ts = parse_config(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"}))
    assert (ts.strategy, ts.interval) == (TIME_SLICING, "Long")
    mps = parse_config(
        gpu_config(
            strategy="MPS",
            mpsConfig={
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                "multiUser": False,
            },
        )
    )
    assert (mps.strategy, mps.thread_percentage, mps.pinned_mib) == (MPS, 50, 10240)
    assert dict(mps.pinned_per_device_mib) == {"0": 5120}
    assert parse_config(gpu_config()).strategy is None
    assert quantity_mib("1G", "x") == 953
    assert quantity_mib(2**21, "x") == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"apiVersion": "v9", "kind": "GpuConfig"}, "parameters.apiVersion: 'v9', want"),
        (
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"},
            "parameters.kind: 'VfioDeviceConfig' is not supported here",
        ),
        (gpu_config(strategy="Magic"), "parameters.sharing.strategy: 'Magic'; allowed:"),
        (
            gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Fast"}),
            "parameters.sharing.timeSlicingConfig.interval: 'Fast'; allowed: Default,",
        ),
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 101}),
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage: 101; allowed: 1 to 100",
        ),
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "lots"}),
            "parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 'lots' is not",
        ),
        (gpu_config(strategy="MPS", extra=1), "parameters.sharing: unknown field 'extra'"),
        (
            gpu_config(strategy="MPS", mpsConfig={"multiUser": True}),
            "parameters.sharing.mpsConfig.multiUser: True; only false",
        ),
        ("text", "parameters: expected an object, got str"),
    ],
)
def test_bad_configs_are_one_line_errors_naming_the_field(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(params)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_claim_configs_apply_class_first_then_claim_later_wins() -> None:
    config = [
        opaque(gpu_config(strategy="TimeSlicing"), requests=["gpu"]),
        opaque(gpu_config(), "FromClass"),
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": 1}},
    ]
    claim = parse_claim(claim_obj(GPU0, config=config), REF, DRIVER)
    assert [c.strategy for _, c in claim.configs] == [None, TIME_SLICING]
    assert [d.device for d in claim.devices] == [GPU0]


def test_a_claim_that_is_not_the_one_named_or_not_allocated_is_refused() -> None:
    with pytest.raises(ClaimError, match="its UID is 'uid-2' now"):
        parse_claim(claim_obj(GPU0, uid="uid-2"), REF, DRIVER)
    with pytest.raises(ClaimError, match="not allocated"):
        parse_claim({"metadata": {"uid": "uid-1"}, "status": {}}, REF, DRIVER)
    with pytest.raises(ClaimError, match=r"^claim ns/claim: config FromClaim\[0\]"):
        parse_claim(claim_obj(GPU0, config=[opaque({"kind": 1})]), REF, DRIVER)


def held(uid: str, device: str, share_id: str | None = None) -> dict[str, PreparedClaim]:
    ref = ClaimRef("ns", uid, "other")
    return {
        uid: PreparedClaim(ref, (PreparedDevice(("gpu",), "node-a", device, (), share_id),), "")
    }


def test_a_device_another_claim_holds_is_refused_unless_shared() -> None:
    exclusive = node_devices()
    claim = parse_claim(claim_obj(GPU0), REF, DRIVER)
    kw: dict[str, Any] = {"pool": "node-a", "unhealthy": frozenset()}
    with pytest.raises(ClaimError, match=f"device {GPU0} is prepared for claim ns/other"):
        check_devices(claim, exclusive, prepared=held("uid-9", GPU0), **kw)
    # the same claim again (idempotent prepare) and another device are fine
    assert check_devices(claim, exclusive, prepared=held("uid-1", GPU0), **kw)
    assert check_devices(claim, exclusive, prepared=held("uid-9", GPU1), **kw)
    shared = node_devices(ReplicaRule(name="nvidia.com/gpu", replicas=2))
    assert check_devices(claim, shared, prepared=held("uid-9", GPU0), **kw)
    with_share = parse_claim(claim_obj(GPU0, shareID="s1"), REF, DRIVER)
    assert check_devices(with_share, exclusive, prepared=held("uid-9", GPU0, "s0"), **kw)


def test_unknown_and_unhealthy_devices_are_refused() -> None:
    found = node_devices()
    claim = parse_claim(claim_obj("gpu-0000-99-00-0"), REF, DRIVER)
    with pytest.raises(ClaimError, match="is not on this node"):
        check_devices(claim, found, pool="node-a", unhealthy=frozenset(), prepared={})
    claim = parse_claim(claim_obj(GPU0), REF, DRIVER)
    with pytest.raises(ClaimError, match=f"device {GPU0} is unhealthy"):
        check_devices(claim, found, pool="node-a", unhealthy={b.gpu_uuid(0)}, prepared={})


def test_mps_per_claim_uses_the_nodes_daemon_and_puts_the_claims_limits_in_its_spec() -> None:
    found = node_devices(ReplicaRule(name="nvidia.com/gpu", replicas=4), strategy=NODE_MPS)
    mps = gpu_config(
        strategy="MPS",
        mpsConfig={"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "4Gi"},
    )
    claim = parse_claim(claim_obj(GPU1, GPU0, config=[opaque(mps)]), REF, DRIVER)
    devs = check_devices(claim, found, pool="node-a", unhealthy=frozenset(), prepared={})
    sharing = sharing_for(claim, devs, mps_root="/run/nvidia/mps")
    assert sharing.mps_resource == "nvidia.com/gpu"
    assert sharing.pinned_mib == ((0, 4096), (1, 4096))
    spec = json.loads(claim_spec(REF.uid, devs, sharing, OPTS, mps_root="/run/nvidia/mps"))
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"uid-1-{GPU1}", f"uid-1-{GPU0}"]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    env = spec["containerEdits"]["env"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=4096M" in env
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/dev/shm"] == "/run/nvidia/mps/nvidia.com/gpu/shm"
    assert spec_file_name(OPTS, REF.uid) == "k8s.gpu.nvidia.com-claim_uid-1.json"


def test_mps_on_a_device_the_node_does_not_share_with_mps_is_refused() -> None:
    claim = parse_claim(claim_obj(GPU0, config=[opaque(gpu_config(strategy="MPS"))]), REF, DRIVER)
    devs = check_devices(claim, node_devices(), pool="node-a", unhealthy=(), prepared={})
    with pytest.raises(ClaimError, match=f"asks for MPS, but this node does not share {GPU0}"):
        sharing_for(claim, devs, mps_root="/run/nvidia/mps")


def test_a_gpu_config_on_a_mig_device_is_refused() -> None:
    found = node_devices(mig=MIG_MIXED)
    mig = next(n for n in found if "-mig-" in n)
    claim = parse_claim(claim_obj(mig, config=[opaque(gpu_config())]), REF, DRIVER)
    devs = check_devices(claim, found, pool="node-a", unhealthy=(), prepared={})
    with pytest.raises(ClaimError, match=r"GpuConfig does not apply to mig device .*; use Mig"):
        sharing_for(claim, devs, mps_root="")


def mig_config(**mps: Any) -> dict[str, Any]:
    sharing = {"strategy": "MPS", "mpsConfig": mps}
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
            "sharing": sharing}  # fmt: skip


def test_mps_on_a_mig_device_is_the_claims_own_daemon_bound_to_it() -> None:
    found = node_devices(mig=MIG_MIXED)
    name = next(n for n in found if "-mig-" in n)
    claim = parse_claim(
        claim_obj(
            name,
            config=[
                opaque(
                    mig_config(
                        defaultActiveThreadPercentage=30, defaultPinnedDeviceMemoryLimit="1Gi"
                    )
                )
            ],
        ),
        REF,
        DRIVER,
    )
    devs = check_devices(claim, found, pool="node-a", unhealthy=(), prepared={})
    sharing = sharing_for(claim, devs, mps_root="", claims_root="/run/mps")
    assert sharing.mps_resource == "dra-claims/uid-1"
    plan = claim_daemon(REF.uid, sharing, devs, "/run/mps")
    assert plan is not None
    assert (plan.root, plan.gpu_uuids) == ("/run/mps/dra-claims/uid-1", (found[name].uuid,))
    assert (plan.pinned_mib, plan.thread_percentage) == ((1024,), 30)
    spec = json.loads(claim_spec(REF.uid, devs, sharing, OPTS, mps_root="/run/mps"))
    assert "CUDA_MPS_PIPE_DIRECTORY=/mps/dra-claims/uid-1/pipe" in spec["containerEdits"]["env"]
    unlimited = parse_claim(claim_obj(name, config=[opaque(mig_config())]), REF, DRIVER)
    plan = claim_daemon(REF.uid, sharing_for(unlimited, devs, mps_root="", claims_root="/r"),
                        devs, "/r")  # fmt: skip
    assert plan is not None
    memory = quantity_mib(found[name].capacity["memory"], "memory")
    assert (plan.pinned_mib, plan.thread_percentage) == ((memory,), 100)


@pytest.mark.parametrize(
    ("limit", "root", "why"),
    [
        ("64Gi", "/run/mps", "with a pinned memory limit of 65536 MiB, but .* has \\d+ MiB"),
        (None, "", "asks for MPS, but this node has no MPS root"),
    ],
)
def test_mps_on_a_mig_device_that_cannot_be_served_is_refused(
    limit: str | None, root: str, why: str
) -> None:
    found = node_devices(mig=MIG_MIXED)
    name = next(n for n in found if "-mig-" in n)
    mps = {} if limit is None else {"defaultPinnedDeviceMemoryLimit": limit}
    claim = parse_claim(claim_obj(name, config=[opaque(mig_config(**mps))]), REF, DRIVER)
    devs = check_devices(claim, found, pool="node-a", unhealthy=(), prepared={})
    with pytest.raises(ClaimError, match=why):
        sharing_for(claim, devs, mps_root="", claims_root=root)


def test_prepared_devices_carry_the_claim_spec_id_and_the_toolkits_own() -> None:
    found = node_devices()
    claim = parse_claim(claim_obj(GPU0, GPU1), REF, DRIVER)
    devs = check_devices(claim, found, pool="node-a", unhealthy=(), prepared={})
    toolkit = ToolkitDevices(frozenset({b.gpu_uuid(0), "1", "all"}), "nvidia.yaml", None)
    out = prepared_devices(claim, devs, OPTS, toolkit)
    assert out[0].cdi_ids == (
        f"k8s.gpu.nvidia.com/claim=uid-1-{GPU0}",
        f"nvidia.com/gpu={b.gpu_uuid(0)}",
    )
    assert out[1].cdi_ids == (f"k8s.gpu.nvidia.com/claim=uid-1-{GPU1}", "nvidia.com/gpu=1")
    none = prepared_devices(claim, devs, OPTS, ToolkitDevices())
    assert none[0].cdi_ids == (f"k8s.gpu.nvidia.com/claim=uid-1-{GPU0}",)
    assert (out[0].pool, out[0].device, out[0].requests) == ("node-a", GPU0, ("gpu",))


def _allocated(**result: str) -> dict[str, Any]:
    base = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
    return {
        "metadata": {"namespace": "ml", "name": "a", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": [{**base, **result}]}}},
    }


def test_a_claim_is_allocated_here_only_for_this_driver_and_this_nodes_pool() -> None:
    assert allocated_here(_allocated(), "gpu.nvidia.com", "node-a") == ClaimRef("ml", "u-1", "a")
    assert allocated_here(_allocated(pool="node-b"), "gpu.nvidia.com", "node-a") is None
    assert allocated_here(_allocated(driver="other.io"), "gpu.nvidia.com", "node-a") is None
    unnamed = _allocated()
    del unnamed["metadata"]["uid"]
    assert allocated_here(unnamed, "gpu.nvidia.com", "node-a") is None
    assert allocated_here({"status": "x"}, "gpu.nvidia.com", "node-a") is None


@pytest.mark.parametrize("uid", ["", "a/b", "a\x00b", "x" * 129])
def test_a_uid_no_spec_could_be_named_after_names_none(uid: str) -> None:
    assert claim_spec_name(DraOptions(), uid) is None


def test_a_plain_uid_names_its_spec() -> None:
    uid = "0b9f1c1e-6f0a-4d5e-9a3b-2c1d0e9f8a7b"
    assert claim_spec_name(DraOptions(), uid) == spec_file_name(DraOptions(), uid)
