"""The node's state for /metrics, read on the loop at each scrape: what each resource
advertises, which GPUs are healthy, which config is in force."""

from __future__ import annotations

from gpuslice.core.metrics import GpuState, NodeState, ResourceState
from gpuslice.services.node import Node

MIB = 1024 * 1024


def node_state(node: Node) -> NodeState:
    agent = node.agent
    registered = agent.manager.registered()
    resources = tuple(
        ResourceState(
            name,
            advertised=len(handler.devices()),
            healthy=sum(1 for _, ok in handler.devices() if ok),
            registered=registered.get(name, False),
        )
        for name, handler in sorted(agent.manager.handlers.items())
    )
    if not agent.ready.is_set():
        return NodeState(resources, config=None, config_ok=False)
    bad = agent.monitor.unhealthy if agent.monitor is not None else frozenset()
    gpus = tuple(
        GpuState(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_mib * MIB,
            healthy=gpu.uuid not in bad and not any(m.uuid in bad for m in gpu.mig_devices),
        )
        for gpu in agent.snapshot.gpus
    )
    if node.manager is not None:
        status = node.manager.status
        return NodeState(resources, gpus, config=status.config, config_ok=status.ok)
    return NodeState(resources, gpus, config=agent.settings.shown, config_ok=not agent.rejected)
