"""MIG layouts by node label (--mig-parted-config): the follower of nvidia.com/mig.config
over the node's devices, the kubelet's PodResources for who holds what, and the agent's
live path to serve the devices a new layout makes."""

from __future__ import annotations

from gpuslice.config.options import NO_API_FOR_MIG, RunOptions
from gpuslice.core.errors import ConfigError
from gpuslice.services.agent import Agent
from gpuslice.services.config_selector import NodeLabelSource
from gpuslice.services.mig_manager import MigManager
from gpuslice.services.node_devices import NodeDevices
from gpuslice.wiring.agent import held_back_by, watch


def mig_manager(
    opts: RunOptions, source: NodeLabelSource | None, agent: Agent[NodeDevices]
) -> MigManager | None:
    """None without --mig-parted-config; ConfigError when there is no Node to follow (the
    options' checks refuse the flags that cannot work together)."""
    if not opts.device_plugin.mig_parted_config:
        return None
    if source is None or not opts.api.node_name:
        raise ConfigError(NO_API_FOR_MIG)

    async def refresh() -> None:  # the settings in force, on the hardware as it is now
        latest = agent.desired.latest
        if latest is not None:
            await agent.apply_settings(latest)

    return MigManager(
        opts.device_plugin.mig_parted_config,
        opts.api.node_name,
        source,
        agent.node,
        lambda: held_back_by(opts),
        refresh,
        watch=watch,
    )
