"""Time-slicing: each device advertised as N replicas that containers share, the GPU
switching between their contexts; a DRA claim may ask for a time-slice interval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice.core.dra.fields import json_object, only_fields
from gpuslice.core.errors import ConfigError
from gpuslice.core.strategies.base import Strategy

INTERVALS = ("Default", "Short", "Medium", "Long")


class TimeSlicing(Strategy):
    name = "time-slicing"
    config_key = "timeSlicing"
    config_attr = "time_slicing"
    dra_config_field = "timeSlicingConfig"
    dra_name = "TimeSlicing"
    shares = True
    product_suffix = "SHARED"

    def dra_fields(self, sharing: Mapping[str, object], at: str) -> dict[str, Any]:
        if sharing.get(self.dra_config_field) is None:
            return {}
        ts = json_object(sharing[self.dra_config_field], f"{at}.timeSlicingConfig")
        only_fields(ts, f"{at}.timeSlicingConfig", "interval")
        given = ts.get("interval", "Default")
        if given not in INTERVALS:
            raise ConfigError(
                f"{at}.timeSlicingConfig.interval: {given!r}; allowed: {', '.join(INTERVALS)}"
            )
        return {"interval": str(given)}

    def claim_problem(self, node: Strategy, device: str, mps_root: str) -> str:
        return f"this node shares {device} with {node.dra_name}" if node.daemon else ""


TIME_SLICING = TimeSlicing()
