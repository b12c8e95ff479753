"""The node's state for /metrics, read on the loop at each scrape: what each resource
advertises (from the front-ends), which GPUs are healthy, which config is in force."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuslice.core.metrics import GpuState, NodeSummary, ResourceState
from gpuslice.services.node import Node

MIB = 1024 * 1024

Resources = Callable[[], Sequence[ResourceState]]  # a front-end's resources, as served now


def node_state(node: Node, resources: Resources) -> NodeSummary:
    served = tuple(resources())
    if not node.agent.ready.is_set():
        return NodeSummary(served, config=None, config_ok=False)
    devices = node.devices
    bad = devices.health_marks
    gpus = tuple(
        GpuState(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_mib * MIB,
            healthy=gpu.uuid not in bad and not any(m.uuid in bad for m in gpu.mig_devices),
        )
        for gpu in devices.snapshot.gpus
    )
    manager = node.manager
    if manager.one_config:
        ok = manager.rejected is None
        return NodeSummary(served, gpus, config=devices.settings.shown, config_ok=ok)
    status = manager.status
    return NodeSummary(served, gpus, config=status.config, config_ok=status.ok)
