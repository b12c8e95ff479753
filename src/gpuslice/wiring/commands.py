"""The other commands' compositions: `gpuslice labels`, `advise` and the simulated
models' MIG profiles it proposes from."""

from __future__ import annotations

import asyncio

from gpuslice.config.loader import LoadedConfig
from gpuslice.config.options import RunOptions
from gpuslice.config.prometheus_access import PrometheusAccess
from gpuslice.config.settings import Settings, load_config, settings_from
from gpuslice.core.advice import Series, SeriesFacts
from gpuslice.core.mig import MigProfileSpec
from gpuslice.core.ports import NodeApi
from gpuslice.services.config_manager import ConfigChoice, ConfigInputs, ConfigManager, NoCluster
from gpuslice.services.config_source import FileEntries
from gpuslice.services.labels_node import LabelsNode
from gpuslice.services.node import Apply
from gpuslice.services.node_devices import NodeDevices
from gpuslice.wiring.host import host
from gpuslice.wiring.node import label_output, node_api


def labels_node(opts: RunOptions, api: NodeApi | None) -> LabelsNode:
    """`gpuslice labels`: the labeller over the node's backend and the config file,
    without a front-end. Raises ConfigError for a bad config or flag (read here, once)."""
    machine = host(opts)
    loaded = load_config(opts)
    first = settings_from(loaded, opts)
    entries = FileEntries(loaded.source, lambda: load_config(opts), first=loaded)

    def to_settings(loaded_now: LoadedConfig) -> Settings:
        return first if loaded_now is loaded else settings_from(loaded_now, opts)

    def manager(apply: Apply) -> ConfigManager[Settings]:
        return ConfigManager(
            ConfigInputs(NoCluster(), opts.api.node_name, entries, to_settings),
            apply,
            ConfigChoice(label=None),
        )

    devices = NodeDevices(machine.open_backend)
    output = label_output(opts, machine, api, first.labels)
    pinned = opts.mps.pinned_memory_limit_mib
    return LabelsNode(devices, manager, output, first, pinned_limit_mib=pinned)


async def run_labels(
    opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event | None = None
) -> None:
    """Label until `stop` (once when oneshot). Raises GpusliceError for a bad config or
    flag, a backend that cannot start (unless failOnInitError is false) and, in oneshot
    mode, a labelling or output that fails."""
    api = node_api(opts)
    try:
        await labels_node(opts, api).run(stop, reload)
    finally:
        if api is not None:
            await api.aclose()


def prometheus_facts(
    access: PrometheusAccess, *, end: float, window_s: float, step_s: float, namespace: str = ""
) -> dict[Series, SeriesFacts]:
    """The agent's per-container series over the window, read from Prometheus' API
    (`gpuslice advise`); a GpusliceError when it cannot be read."""
    from gpuslice.adapters.prometheus import PrometheusApi, gather

    return gather(PrometheusApi(access), end, window_s, step_s, namespace)


def mig_profiles() -> dict[str, dict[str, int]]:
    """GPU model name -> MIG profile -> memory (MiB), from the simulated models."""
    from gpuslice.adapters.fake.models import MODELS

    return {
        m.name: {name: p.memory_mib for name, p in m.mig_profiles.items()}
        for m in MODELS.values()
        if m.mig_profiles
    }


def mig_tables() -> dict[str, tuple[MigProfileSpec, ...]]:
    """GPU model name -> its GPU-instance profiles and placements, from the simulated
    models (the MIG user guide's tables)."""
    from gpuslice.adapters.fake.models import MODELS

    return {m.name: m.mig_table for m in MODELS.values() if m.mig_table}
