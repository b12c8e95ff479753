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

from gpuslice.core.errors import ConfigError
from gpuslice.core.quantity import parse_bytes

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG, MIG_CONFIG = "GpuConfig", "MigDeviceConfig"
TIME_SLICING, MPS = "TimeSlicing", "MPS"
INTERVALS = ("Default", "Short", "Medium", "Long")
MIB = 2**20


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
    """A GpuConfig or MigDeviceConfig; raises ConfigError."""
    obj = _object(params, where)
    _only(obj, where, "apiVersion", "kind", "sharing")
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
    sharing = _object(obj["sharing"], at)
    _only(sharing, at, "strategy", "timeSlicingConfig", "mpsConfig")
    strategy = sharing.get("strategy")
    if strategy not in (TIME_SLICING, MPS):
        raise ConfigError(f"{at}.strategy: {strategy!r}; allowed: {TIME_SLICING}, {MPS}")
    interval = "Default"
    if strategy == TIME_SLICING and sharing.get("timeSlicingConfig") is not None:
        ts = _object(sharing["timeSlicingConfig"], f"{at}.timeSlicingConfig")
        _only(ts, f"{at}.timeSlicingConfig", "interval")
        given = ts.get("interval", "Default")
        if given not in INTERVALS:
            raise ConfigError(
                f"{at}.timeSlicingConfig.interval: {given!r}; allowed: {', '.join(INTERVALS)}"
            )
        interval = str(given)
    if strategy == MPS and sharing.get("mpsConfig") is not None:
        return _mps(kind, _object(sharing["mpsConfig"], f"{at}.mpsConfig"), f"{at}.mpsConfig")
    return SharingConfig(kind, str(strategy), interval)


def _mps(kind: str, mps: Mapping[str, object], at: str) -> SharingConfig:
    _only(mps, at, "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
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
        for k, v in _object(per or {}, f"{at}.defaultPerDevicePinnedMemoryLimit").items()
    }
    return SharingConfig(
        kind,
        MPS,
        thread_percentage=threads,
        pinned_mib=None
        if pinned is None
        else quantity_mib(pinned, f"{at}.defaultPinnedDeviceMemoryLimit"),
        pinned_per_device_mib=per_device,
    )


def quantity_mib(value: object, where: str) -> int:
    """A memory Quantity (10Gi, 512Mi, 1G, 1073741824) in whole MiB, at least 1."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    try:
        mib = parse_bytes(text) // MIB
    except ValueError:
        raise ConfigError(
            f"{where}: {value!r} is not a memory quantity such as 10Gi or 512Mi"
        ) from None
    if mib < 1:
        raise ConfigError(f"{where}: {value!r} is below 1Mi")
    return mib


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _only(obj: Mapping[str, object], where: str, *allowed: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
