"""Opaque device config in NVIDIA's format (resource.nvidia.com/v1beta1), accepted as it is.

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig            # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing    # or MPS
      timeSlicingConfig: {interval: Default}        # Default | Short | Medium | Long
      mpsConfig:
        defaultActiveThreadPercentage: 50
        defaultPinnedDeviceMemoryLimit: 10Gi
        defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}   # GPU index or UUID -> limit
        multiUser: false

The parameters arrive already decoded (the claim's JSON); every error is one line naming
the field and what it allows. Unknown fields are refused, as NVIDIA's driver decodes
strictly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuslice.core import strategies
from gpuslice.core.dra.fields import json_object, only_fields
from gpuslice.core.errors import ConfigError
from gpuslice.core.strategies import MIG, WHOLE

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG, MIG_CONFIG = WHOLE.dra_config_kind, MIG.dra_config_kind


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """One device config: its kind and sharing (strategy None: not set)."""

    kind: str = GPU_CONFIG
    strategy: str | None = None
    interval: str = "Default"
    thread_percentage: int | None = None
    pinned_mib: int | None = None
    pinned_per_device_mib: Mapping[str, int] = field(default_factory=dict)


def parse_config(params: object, where: str = "parameters") -> SharingConfig:
    """A GpuConfig or MigDeviceConfig; raises ConfigError. Each strategy reads its own
    settings (core.strategies)."""
    obj = json_object(params, where)
    only_fields(obj, where, "apiVersion", "kind", "sharing")
    if obj.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{where}.apiVersion: {obj.get('apiVersion')!r}, want {API_VERSION!r}")
    kind = obj.get("kind")
    if kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ConfigError(
            f"{where}.kind: {kind!r} is not supported here; use {GPU_CONFIG} or {MIG_CONFIG}"
        )
    if obj.get("sharing") is None:
        return SharingConfig(kind)
    at = f"{where}.sharing"
    sharing = json_object(obj["sharing"], at)
    own = (s.dra_config_field for s in strategies.STRATEGIES if s.dra_config_field)
    only_fields(sharing, at, "strategy", *own)
    strategy = strategies.by_dra_name(sharing.get("strategy"))
    if strategy is None:
        allowed = ", ".join(s.dra_name for s in strategies.STRATEGIES if s.dra_name)
        raise ConfigError(f"{at}.strategy: {sharing.get('strategy')!r}; allowed: {allowed}")
    return SharingConfig(kind, strategy.dra_name, **strategy.dra_fields(sharing, at))
