"""MPS: each device advertised as N replicas whose containers are clients of one
control daemon per resource (core.mps plans them), with pinned memory limits. It
cannot share a MIG-enabled GPU, as upstream."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuslice.core.devices import Gpu
from gpuslice.core.dra.fields import json_object, only_fields, quantity_mib
from gpuslice.core.errors import ConfigError, HardwareError
from gpuslice.core.response import Mount
from gpuslice.core.strategies.base import Strategy, Warn


class Mps(Strategy):
    name = "mps"
    config_key = "mps"
    config_attr = "mps"
    precedence = 1  # upstream: mps whenever it is present
    dra_config_field = "mpsConfig"
    dra_name = "MPS"
    shares = True
    fail_requests_default = True
    uniform_replicas = True  # the daemon's limits are per resource
    product_suffix = "SHARED"
    daemon = True
    pinned_memory = True
    capable_label = "nvidia.com/mps.capable"

    def check_flags(
        self, mps_root: str | None, mig_mixed: bool, show: Callable[[object], str]
    ) -> None:
        if not mps_root:
            raise ConfigError(
                f"flags.mpsRoot: got {show(mps_root)}; expected the host directory of the "
                "MPS daemons' pipes while sharing.mps is in force (--mps-root or MPS_ROOT; "
                "NVIDIA's Helm chart uses /run/nvidia/mps)"
            )
        if mig_mixed:
            raise ConfigError(
                f"flags.migStrategy: got {show('mixed')}; expected none or single "
                "while sharing.mps is in force (MPS cannot share MIG devices, as upstream)"
            )

    def check_gpus(self, gpus: Sequence[Gpu]) -> None:
        for gpu in gpus:
            if gpu.mig_enabled:
                raise HardwareError(
                    f"sharing.mps: GPU {gpu.index} ({gpu.uuid}) has MIG enabled, and MPS cannot "
                    "share a MIG-enabled GPU (as upstream); disable MIG on it or share with "
                    "timeSlicing"
                )

    def capable(self, gpus: Sequence[Gpu], warn: Warn) -> bool:
        enabled = [str(g.index) for g in gpus if g.mig_enabled]
        if enabled:
            # Upstream's labeller fails here (and GFD restarts); we label false and say why.
            warn(
                f"MPS sharing is not supported with MIG enabled (GPU {', '.join(enabled)}); "
                "mps.capable is false"
            )
            return False
        return True

    def add_container_edits(
        self, resource: str, mps_root: str, envs: dict[str, str], mounts: list[Mount]
    ) -> None:
        if not mps_root:
            return
        # Upstream's container paths; the host directories are this resource's daemon's,
        # and /dev/shm is a directory private to the resource, not one node-wide tmpfs.
        host = posixpath.join(mps_root, resource)
        for name, env in (("pipe", "CUDA_MPS_PIPE_DIRECTORY"), ("log", "CUDA_MPS_LOG_DIRECTORY")):
            envs[env] = f"/mps/{resource}/{name}"
            mounts.append(Mount(envs[env], posixpath.join(host, name)))
        mounts.append(Mount("/dev/shm", posixpath.join(host, "shm")))

    def dra_fields(self, sharing: Mapping[str, object], at: str) -> dict[str, Any]:
        if sharing.get(self.dra_config_field) is None:
            return {}
        at = f"{at}.mpsConfig"
        mps = json_object(sharing[self.dra_config_field], at)
        only_fields(mps, at, "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
                    "defaultPerDevicePinnedMemoryLimit", "multiUser")  # fmt: skip
        multi = mps.get("multiUser", False)
        if multi is not False:
            raise ConfigError(
                f"{at}.multiUser: {multi!r}; only false: the node's managed MPS control daemons "
                "do not run in multi-user mode"
            )
        threads = mps.get("defaultActiveThreadPercentage")
        if threads is not None and (
            not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 100
        ):
            raise ConfigError(f"{at}.defaultActiveThreadPercentage: {threads!r}; allowed: 1 to 100")
        pinned = mps.get("defaultPinnedDeviceMemoryLimit")
        per = mps.get("defaultPerDevicePinnedMemoryLimit")
        per_device = {
            str(k): quantity_mib(v, f"{at}.defaultPerDevicePinnedMemoryLimit[{k}]")
            for k, v in json_object(per or {}, f"{at}.defaultPerDevicePinnedMemoryLimit").items()
        }
        return {
            "thread_percentage": threads,
            "pinned_mib": None
            if pinned is None
            else quantity_mib(pinned, f"{at}.defaultPinnedDeviceMemoryLimit"),
            "pinned_per_device_mib": per_device,
        }

    def claim_problem(self, node: Strategy, device: str, mps_root: str) -> str:
        if node is self and mps_root:
            return ""
        return f"this node does not share {device} with MPS (sharing.mps in its config)"


MPS = Mps()
