"""What serving a set of resources on a node's hardware needs: the one planning path of the
agent (NodeView.plan_devices, for each front-end) and of the what-if commands (`inspect`,
`labels`), so that they refuse exactly the configs the agent refuses."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.isolation import MemoryPolicy, check_policy
from gpuslice.core.mps import DaemonPlan, plan_daemons
from gpuslice.core.resources import Resource


def plan_serving(
    snapshot: HardwareSnapshot,
    resources: Sequence[Resource],
    memory: MemoryPolicy,
    mps_root: str,
    *,
    pinned_limit_mib: int = 0,
) -> tuple[DaemonPlan, ...]:
    """The MPS daemons `resources` need on this hardware, once their memory limits are
    checked. Raises ConfigError (limits the resources cannot carry) and HardwareError (an
    MPS setting this hardware refuses)."""
    check_policy(resources, memory)
    return plan_daemons(resources, snapshot.gpus, mps_root, pinned_limit_mib=pinned_limit_mib)
