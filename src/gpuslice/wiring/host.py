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
from gpuslice.core.ports import Host

__all__ = ["MACHINE_TYPE_MAX_BYTES", "host", "plugin_settings"]


def host(opts: RunOptions) -> Host:
    """The simulated host when --fake-hardware names a node file, the real one otherwise.
    Built once per command (wiring.agent.parts for a node) and handed on."""
    if opts.fake_hardware:
        from gpuslice.adapters.hosts.simulated import SimulatedHost

        return SimulatedHost(
            opts.fake_hardware,
            opts.fake_events,
            opts.mps.control_binary,
            default_mps_control=DEFAULT_MPS_CONTROL,
            default_machine_type_file=DEFAULT_MACHINE_TYPE_FILE,
            default_cgroup_root=DEFAULT_CGROUP_ROOT,
        )
    from gpuslice.adapters.hosts.real import RealHost

    return RealHost(
        opts.device_plugin.driver_root_ctr_path, opts.accounting.proc_root, opts.mps.control_binary
    )


def plugin_settings(loaded: LoadedConfig, opts: RunOptions, machine: Host) -> Settings:
    """The settings of one loaded config under the device plugin's start-up rules, with
    the IMEX channels `machine` has."""
    return settings_from(loaded, opts, imex_present=machine.imex_present())
