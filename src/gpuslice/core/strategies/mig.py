"""A MIG device: a slice of a GPU whose memory the hardware isolates, so the driver
limits none, and whose DRA config is a MigDeviceConfig. A claim asking for MPS on one
gets a control daemon of its own (the node's daemons serve whole GPUs only)."""

from __future__ import annotations

from gpuslice.core.strategies.base import Strategy


class Mig(Strategy):
    name = "mig"
    dra_config_kind = "MigDeviceConfig"
    memory_limits = False
    claim_daemon = True


MIG = Mig()
