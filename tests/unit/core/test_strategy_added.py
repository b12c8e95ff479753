"""A new way of sharing is one module and one line in core.strategies.STRATEGIES: a toy
strategy listed there (in time-slicing's place, so it takes the timeSlicing block of the
config schema) is picked up by the config, Allocate, the labels and DRA unchanged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import load_config
from gpuslice.core import strategies
from gpuslice.core.allocation import validate_allocate
from gpuslice.core.container_spec import container_allocation
from gpuslice.core.devices import Gpu
from gpuslice.core.dra.devices import build_devices
from gpuslice.core.dra.opaque import API_VERSION, parse_config
from gpuslice.core.errors import ConfigError, InvalidRequest
from gpuslice.core.labels import node_labels
from gpuslice.core.resources import build_resources
from gpuslice.core.response import AllocateOptions, Mount
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.strategies.base import Strategy, Warn

from . import builders as b


class Rotation(Strategy):
    """The toy: replicas handed out in turn, with an env var and a label of its own."""

    name = "rotation"
    config_key = "timeSlicing"
    config_attr = "time_slicing"
    dra_name = "Rotation"
    dra_config_field = "rotationConfig"
    shares = True
    product_suffix = "ROTATED"
    capable_label = "nvidia.com/rotation.capable"

    def capable(self, gpus: Sequence[Gpu], warn: Warn) -> bool:
        return len(gpus) > 1

    def add_container_edits(
        self, resource: str, mps_root: str, envs: dict[str, str], mounts: list[Mount]
    ) -> None:
        envs["ROTATION_RESOURCE"] = resource
        mounts.append(Mount("/rotation", f"/run/rotation/{resource}"))

    def dra_fields(self, sharing: Mapping[str, object], at: str) -> dict[str, Any]:
        own = sharing.get(self.dra_config_field)
        return {"interval": str(own.get("every", "Default"))} if isinstance(own, dict) else {}


@pytest.fixture(autouse=True)
def listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line: the toy listed in time-slicing's place."""
    swapped = (Rotation() if s is strategies.TIME_SLICING else s for s in strategies.STRATEGIES)
    monkeypatch.setattr(strategies, "STRATEGIES", tuple(swapped))
    return


NODE = b.snapshot(b.gpu(0), b.gpu(1))


def settings() -> ResourceSettings:
    text = (
        "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n"
        "    resources: [{name: gpu, replicas: 2}]\n"
    )
    return resource_settings(load_config(text, source="c.yaml").config)


def test_the_config_and_allocate_serve_the_new_strategy() -> None:
    assert settings().sharing.strategy == "rotation"
    (resource,) = build_resources(NODE, settings())
    assert (resource.sharing, len(resource.devices)) == ("rotation", 4)
    ids = [d.id for d in resource.devices[:2]]
    with pytest.raises(InvalidRequest, match=r"set sharing\.timeSlicing\.failRequestsGreater"):
        validate_allocate(resource, ids)
    got = container_allocation(
        resource, validate_allocate(resource, ids[:1]), AllocateOptions(), token="t"
    )
    assert got.envs["ROTATION_RESOURCE"] == "nvidia.com/gpu"
    assert got.mounts[0] == Mount("/rotation", "/run/rotation/nvidia.com/gpu")


def test_the_labels_carry_the_new_strategy() -> None:
    labels = node_labels(NODE, settings())
    assert labels["nvidia.com/gpu.sharing-strategy"] == "rotation"
    assert labels["nvidia.com/gpu.product"].endswith("-ROTATED")
    assert labels["nvidia.com/rotation.capable"] == "true"
    assert labels["nvidia.com/mps.capable"] == "false"


def test_dra_publishes_and_accepts_the_new_strategy() -> None:
    devices = build_devices(NODE, build_resources(NODE, settings()))
    assert [(d.sharing, d.shared) for d in devices] == [("rotation", True)] * 2
    params = {"apiVersion": API_VERSION, "kind": "GpuConfig"}
    asked = {"strategy": "Rotation", "rotationConfig": {"every": "Long"}}
    config = parse_config({**params, "sharing": asked})
    assert (config.strategy, config.interval) == ("Rotation", "Long")
    with pytest.raises(ConfigError, match=r"'TimeSlicing'; allowed: Rotation, MPS$"):
        parse_config({**params, "sharing": {"strategy": "TimeSlicing"}})
