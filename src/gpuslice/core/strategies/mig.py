"""A MIG device: a slice of a GPU whose memory the hardware isolates, so the driver
limits none, and whose DRA config is a MigDeviceConfig."""

from __future__ import annotations

from gpuslice.core.strategies.base import Strategy


class Mig(Strategy):
    name = "mig"
    dra_config_kind = "MigDeviceConfig"
    memory_limits = False


MIG = Mig()
