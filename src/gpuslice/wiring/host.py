"""The one choice between the real host and the simulated one (core.ports.Host); every
builder asks the chosen host, never whether the hardware is simulated."""

from __future__ import annotations

from gpuslice.adapters.hosts import MACHINE_TYPE_MAX_BYTES
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.options import (
    DEFAULT_CGROUP_ROOT,
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_MPS_CONTROL,
    RunOptions,
)
from gpuslice.config.settings import Settings, settings_from
from gpuslice.core.ports import GpuBackend, Host, TimeSlicer

__all__ = [
    "MACHINE_TYPE_MAX_BYTES",
    "host",
    "imex_present",
    "machine_type",
    "open_backend",
    "plugin_settings",
    "time_slicer",
]


def host(opts: RunOptions) -> Host:
    """The simulated host when --fake-hardware names a node file, the real one otherwise."""
    if opts.fake_hardware:
        from gpuslice.adapters.hosts.simulated import SimulatedHost

        return SimulatedHost(
            opts.fake_hardware,
            opts.fake_events,
            opts.mps_control_binary,
            default_mps_control=DEFAULT_MPS_CONTROL,
            default_machine_type_file=DEFAULT_MACHINE_TYPE_FILE,
            default_cgroup_root=DEFAULT_CGROUP_ROOT,
        )
    from gpuslice.adapters.hosts.real import RealHost

    return RealHost(opts.driver_root_ctr_path, opts.proc_root, opts.mps_control_binary)


def open_backend(opts: RunOptions) -> GpuBackend:
    """The host's GPU backend (BackendError if it cannot start)."""
    return host(opts).open_backend()


def imex_present(opts: RunOptions) -> frozenset[int]:
    return host(opts).imex_present()


def plugin_settings(loaded: LoadedConfig, opts: RunOptions) -> Settings:
    """The settings of one loaded config under the device plugin's start-up rules."""
    return settings_from(loaded, opts, imex_present=imex_present(opts))


def machine_type(opts: RunOptions, path: str) -> str | None:
    """The machine type from `path` as the host reads it (None: the snapshot's own)."""
    return host(opts).machine_type(path)


def time_slicer(opts: RunOptions) -> TimeSlicer:
    return host(opts).time_slicer()
