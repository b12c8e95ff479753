"""The chart's admission policy (admissionPolicies.enabled) is what `gpuslice admission render`
makes from the same configs: the policy text comes from the package, and the names the
chart computes from config.map's text match the package's rules on every config shape.
Off by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_kit import CHART, NAMESPACE, RELEASE, rendered, tool

from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import load_config
from gpuslice.core.admission import CappedNames, admission_objects, capped_names

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
FULLNAME = f"{RELEASE}-gpuslice"


def ts(*entries: str, head: str = "") -> str:
    body = "".join(f"    - {e}\n" for e in entries)
    return f"version: v1\nsharing:\n  timeSlicing:\n{head}    resources:\n{body}"


def example_configs() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "ConfigMap":
            out.update({f"{path.stem}-{k}": v for k, v in doc["data"].items()})
        else:
            out[path.stem] = path.read_text()
    return out


FAIL = "    failRequestsGreaterThanOne: true\n"
CASES: dict[str, dict[str, str]] = {
    "examples": example_configs(),
    "renamed-and-whole": {
        "renamed": ts("{name: gpu, replicas: 4}", head=FAIL + "    renameByDefault: true\n"),
        "mps": "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n",
        "plain": "version: v1\n",
    },
    "mps-uncapped": {
        "mps": "version: v1\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n"
        "    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
        "ts": ts("{name: nvidia.com/gpu, replicas: 2}", head=FAIL),
    },
    "per-gpu": {
        "split": ts(
            "{name: gpu, rename: gpu-small, replicas: 4, devices: [0, 1]}",
            "{name: mig-1g.5gb, replicas: 2}",
            head=FAIL,
        ),
        "count": ts("{name: nvidia.com/gpu, replicas: 3, devices: 2}", head=FAIL),
    },
    "repeated-entry": {
        "dup": ts("{name: gpu, replicas: 4}", "{name: gpu, replicas: 8, rename: gpu.x}", head=FAIL),
    },
    "mps-null": {
        "ts": "version: v1\nsharing:\n  mps: null\n  timeSlicing:\n"
        + FAIL
        + "    resources:\n    - {name: mig-2g.10gb.me, replicas: 2}\n",
    },
}


def chart_objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    gen = tool()
    objects = gen.objects(gen.render(CHART, values, release=RELEASE, namespace=NAMESPACE))
    return [o for o in objects if o["kind"] in KINDS or "-admission-" in o["metadata"]["name"]]


def without_labels(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        meta = {k: v for k, v in obj["metadata"].items() if k != "labels"}
        out.append({**obj, "metadata": meta})
    return sorted(out, key=lambda o: (o["kind"], o["metadata"]["name"]))


def package_capped(configs: dict[str, str]) -> CappedNames:
    return capped_names(resource_settings(load_config(t).config) for t in configs.values())


@pytest.mark.parametrize("case", CASES)
def test_the_chart_renders_what_the_package_renders_from_the_same_configs(case: str) -> None:
    configs = CASES[case]
    default = next(iter(configs))
    values = {
        "config": {"map": configs, "default": default},
        "admissionPolicies": {"enabled": True},
    }
    expected = admission_objects(package_capped(configs), name=FULLNAME, namespace=NAMESPACE)
    assert without_labels(chart_objects(values)) == without_labels(expected)


def test_the_cases_cover_deny_and_warn() -> None:
    """The comparison above would prove little if every case capped nothing."""
    found = [package_capped(c) for c in CASES.values()]
    assert any(c.deny for c in found)
    assert any(c.warn for c in found)
    assert any(c.deny and c.warn for c in found)


def test_names_listed_in_values_are_added_and_deny_wins() -> None:
    configs = {"ts": ts("{name: gpu, replicas: 4}", head=FAIL), "plain": "version: v1\n"}
    values = {
        "config": {"map": configs, "default": "plain"},
        "admissionPolicies": {
            "enabled": True,
            "deny": ["nvidia.com/gpu", "example.com/fpga"],
            "warn": ["nvidia.com/gpu.tiny"],
        },
    }
    data = {
        o["data"]["nodes"]: o["data"]["resources"]
        for o in chart_objects(values)
        if o["kind"] == "ConfigMap"
    }
    assert data == {"every": "example.com/fpga,nvidia.com/gpu", "some": "nvidia.com/gpu.tiny"}


def test_with_an_existing_configmap_only_the_listed_names_are_used() -> None:
    values = {
        "config": {"name": "my-configs"},
        "admissionPolicies": {"enabled": True, "deny": ["nvidia.com/gpu.shared"]},
    }
    data = {
        o["data"]["nodes"]: o["data"]["resources"] for o in chart_objects(values) if "data" in o
    }
    assert data == {"every": "nvidia.com/gpu.shared", "some": ""}


def test_off_by_default_and_on_in_the_values_matrix() -> None:
    assert not [o for o in rendered("defaults") if o["kind"] in KINDS]
    kinds = sorted(o["kind"] for o in rendered("admission") if o["kind"] in KINDS)
    assert kinds == ["ValidatingAdmissionPolicy", *["ValidatingAdmissionPolicyBinding"] * 2]


def test_a_misspelt_admission_value_fails_at_install() -> None:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart, pytest.raises(Exception, match="enabeld"):
        chart.validate_schema({"admissionPolicies": {"enabled": True, "enabeld": True}})
