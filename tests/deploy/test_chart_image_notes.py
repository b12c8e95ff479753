"""The chart says at install time when the image is still its local default, which no
registry serves: NOTES.txt, rendered by Helm's engine as `helm install` prints it, opens with
a warning naming the value to set. A warning, not a refusal: a kind cluster or a node with the
image imported (and the static manifests, rendered from the defaults) use the local name on
purpose."""

from __future__ import annotations

from typing import Any

import pytest
from chart_kit import CHART, tool

WARNING = "WARNING: image.repository is the chart's local default, localhost/gpuslice"


def notes(values: dict[str, Any]) -> str:
    out = tool().render(CHART, values, release="gpuslice", namespace="gpuslice", notes=True)
    return " ".join(out["gpuslice/templates/NOTES.txt"].split())


@pytest.mark.parametrize(
    "values",
    [{}, {"simulate": "t4x4", "affinity": None}, {"image": {"tag": "0.1.0"}}],
    ids=["defaults", "simulate", "tag-only"],
)
def test_the_local_default_image_is_named_first_with_the_fix(values: dict[str, Any]) -> None:
    text = notes(values)
    assert text.startswith(WARNING), text[:200]
    assert "--set image.repository=REGISTRY/gpuslice" in text


def test_an_image_from_a_registry_gets_no_warning() -> None:
    text = notes({"image": {"repository": "registry.example.com/gpuslice"}})
    assert "WARNING" not in text
    assert text.startswith("gpuslice ")
