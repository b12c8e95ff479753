"""`gpuslice admission render`: the policy, bindings and params from a config file, a
ConfigMap manifest or a config directory, as YAML or JSON; the rendered objects pass
Kubernetes' strict schemas from 1.30 on; a bad config or missing option is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from gpuslice.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGMAP = ROOT / "examples" / "time-slicing-configmap.yaml"
RENAMED = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: gpu\n      replicas: 4\n"  # noqa: E501
MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n"


def render(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["admission", "render", *args])
    return result.exit_code, result.stdout, result.stderr


def objects(text: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(text) if o]


def params(objs: list[dict[str, Any]]) -> dict[str, str]:
    """Each params ConfigMap's nodes key to its resource list."""
    return {o["data"]["nodes"]: o["data"]["resources"] for o in objs if o["kind"] == "ConfigMap"}


def test_a_configmap_of_configs_renders_the_union_of_their_capped_names(tmp_path: Path) -> None:
    """The example ConfigMap caps nothing (time-slicing defaults to no cap); capped entries
    added beside a whole-GPU one are split into deny and warn."""
    code, out, _ = render("--config-file", str(CONFIGMAP))
    assert code == 0
    assert params(objects(out)) == {"every": "", "some": ""}
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "configs"},
        "data": {"renamed": RENAMED, "mps": MPS, "plain": "version: v1\n"},
    }
    path = tmp_path / "configs.yaml"
    path.write_text(yaml.safe_dump(manifest))
    code, out, _ = render("--config-file", str(path), "--name", "gs", "--namespace", "gpu")
    assert code == 0
    objs = objects(out)
    assert params(objs) == {"every": "nvidia.com/gpu.shared", "some": "nvidia.com/gpu"}
    assert {o["metadata"]["name"] for o in objs} == {
        "gs-shared-gpu-requests",
        "gs-shared-gpu-requests-deny",
        "gs-shared-gpu-requests-warn",
        "gs-admission-deny",
        "gs-admission-warn",
    }
    code, out, _ = render("--config-file", str(path), "--config-name", "mps")
    assert params(objects(out)) == {"every": "nvidia.com/gpu", "some": ""}


def test_a_config_directory_and_json_output(tmp_path: Path) -> None:
    (tmp_path / "renamed.yaml").write_text(RENAMED)
    (tmp_path / "..data").mkdir()
    code, out, _ = render("--config-file-srcdir", str(tmp_path), "--output", "json")
    assert code == 0
    listing = json.loads(out)
    assert listing["kind"] == "List"
    assert params(listing["items"]) == {"every": "nvidia.com/gpu.shared", "some": ""}


def test_the_rendered_objects_pass_every_kubernetes_schema_from_1_30(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MPS)
    _, out, _ = render("--config-file", str(path))
    versions = [v for v in all_versions() if Version(v) >= Version("1.30")]
    assert len(versions) >= 8
    for version in versions:
        for obj in objects(out):
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "give one of --config-file PATH or --config-file-srcdir DIR"),
        (("--config-file", "a", "--config-file-srcdir", "b"), "give one of"),
        (("--config-file", "/nonexistent.yaml"), "/nonexistent.yaml: cannot read"),
        (("--output", "xml", "--config-file", "x"), "'xml' is not one of 'yaml', 'json'"),
        (("--config-file", "x", "--name", "a" * 229), "--name: 'aaaa"),
        (("--config-file", "x", "--name", "GPU"), "--name: 'GPU' cannot prefix object names"),
        (("--config-file", "x", "--name", "a..b"), "--name: 'a..b'"),
        (("--config-file", "x", "--namespace", "a" * 64), "--namespace: 'aaaa"),
        (("--config-file", "x", "--namespace", "kube.system"), "is not a namespace name"),
        (("--config-file", "x", "--namespace", "-x"), "--namespace: '-x'"),
    ],
)
def test_mistakes_end_in_one_line(args: tuple[str, ...], expected: str) -> None:
    code, out, err = render(*args)
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert expected in err


def test_the_longest_accepted_prefix_makes_names_the_api_server_accepts() -> None:
    code, out, err = render("--config-file", str(CONFIGMAP), "--name", "a" * 228)
    assert code == 0, err
    names = [o["metadata"]["name"] for o in objects(out)]
    assert max(len(n) for n in names) == 253
    assert render("--config-file", str(CONFIGMAP), "--name", "a" * 229)[0] != 0


def test_a_bad_config_refuses_the_whole_render(tmp_path: Path) -> None:
    """A policy made from some of the configs could deny what another node serves."""
    (tmp_path / "good.yaml").write_text(MPS)
    (tmp_path / "bad.yaml").write_text("version: v1\nsharing: {timeSlicing: {resources: []}}\n")
    code, out, err = render("--config-file-srcdir", str(tmp_path))
    assert code == 1
    assert out == ""
    assert "bad.yaml" in err
    assert len(err.strip().splitlines()) == 1
