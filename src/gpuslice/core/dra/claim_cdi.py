"""The CDI spec of one prepared claim (CDI 0.5.0, JSON), named by the claim's UID.

Kind `k8s.<driver>/claim` and device names `<claimUID>-<device>`, as NVIDIA's DRA driver
writes them, so a runtime's cache can never resolve a stale spec of an earlier claim.
Each device injects its own nodes (a MIG device its parent's node and capability nodes);
the spec's common edits inject the driver's control nodes, NVIDIA_VISIBLE_DEVICES=void
(no second injection by a legacy hook) and what sharing needs: under MPS the control
daemon's pipe and log directories and its private /dev/shm, as the device-plugin path
mounts them, plus the claim's own client limits (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), which a client may set below the daemon's defaults.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence

from gpuslice.core.cdi import CONTROL_NODE, VOID, render
from gpuslice.core.dra.claims import ClaimSharing, cdi_device_name
from gpuslice.core.dra.devices import DraDevice, DraOptions, Json
from gpuslice.core.response import Mount
from gpuslice.core.strategies import MPS

CDI_VERSION = "0.5.0"  # device names may start with a digit (a UID)
BIND = ["rw", "nosuid", "nodev", "bind"]
MAX_UID = 128  # a Kubernetes UID is 36 characters


def spec_file_name(opts: DraOptions, claim_uid: str) -> str:
    """k8s.gpu.nvidia.com-claim_<uid>.json: CDI's transient spec name for the claim."""
    return f"{opts.cdi_kind.replace('/', '-')}_{claim_uid}.json"


def claim_spec_name(opts: DraOptions, claim_uid: str) -> str | None:
    """spec_file_name for a UID the kubelet sent; None for one no spec of ours could be
    named after (a path separator, a control character, too long): nothing to remove."""
    plain = 0 < len(claim_uid) <= MAX_UID and claim_uid.isprintable() and "/" not in claim_uid
    return spec_file_name(opts, claim_uid) if plain else None


def spec_claim_uid(opts: DraOptions, file_name: str) -> str | None:
    """The claim UID a spec file of ours is named after; None for any other file."""
    prefix = spec_file_name(opts, "").removesuffix(".json")
    if not (file_name.startswith(prefix) and file_name.endswith(".json")):
        return None
    return file_name[len(prefix) : -len(".json")] or None


def claim_spec(
    claim_uid: str,
    devices: Sequence[DraDevice],
    sharing: ClaimSharing,
    opts: DraOptions,
    *,
    mps_root: str = "",
    dev_root: str = "/",
    control_devices: Sequence[str] = (),
) -> str:
    """The spec's JSON text."""
    entries: dict[str, Json] = {}
    for device in devices:
        name = cdi_device_name(claim_uid, device.name)
        entries[name] = {
            "name": name,
            "containerEdits": {"deviceNodes": _nodes(device.paths, dev_root)},
        }
    env = list(VOID)
    common: Json = {}
    if sharing.mps_resource and mps_root:
        envs: dict[str, str] = {}
        mounts: list[Mount] = []  # the MPS strategy's, as a device plugin's Allocate gives
        MPS.add_container_edits(sharing.mps_resource, mps_root, envs, mounts)
        env += [f"{k}={v}" for k, v in envs.items()]
        common["mounts"] = [_mount(m.host_path, m.container_path) for m in mounts]
        if sharing.thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={sharing.thread_percentage}")
        if sharing.pinned_mib:
            limits = ",".join(f"{i}={mib}M" for i, mib in sharing.pinned_mib)
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
    common["env"] = env
    common["deviceNodes"] = _nodes(dict.fromkeys((CONTROL_NODE, *control_devices)), dev_root)
    spec: Json = {
        "cdiVersion": CDI_VERSION,
        "kind": opts.cdi_kind,
        "devices": list(entries.values()),
        "containerEdits": common,
    }
    return render(spec)


def _nodes(paths: Iterable[str], dev_root: str) -> list[Json]:
    root = dev_root.rstrip("/")
    return [
        {"path": p, **({"hostPath": posixpath.join(root, p.lstrip("/"))} if root else {})}
        for p in paths
    ]


def _mount(host: str, container: str) -> Json:
    return {"hostPath": host, "containerPath": container, "options": list(BIND)}
