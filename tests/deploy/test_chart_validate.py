"""The chart passes Helm's lint and every rendered object passes Kubernetes' strict schemas
of every version from 1.28 on (the admission policy, rendered from 1.30 only, from 1.30 on),
for the default values and each set of the values matrix; the generated files and static
manifests are in step with their sources; a misspelt or invalid value fails at install time
naming its path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chart_kit import (
    CHART,
    MANIFESTS,
    POLICY_KUBE,
    VALUE_SETS,
    kube_versions,
    rendered,
    schema_errors,
    tool,
)
from packaging.version import Version

from gpuslice.adapters.kube import rbac

ERROR, WARNING = 3, 2


def test_every_kubernetes_version_from_1_28_is_checked() -> None:
    versions = kube_versions()
    assert versions[0] == "1.28"
    assert len(versions) >= 10  # 1.28 to 1.37 with kubernetes-validate 1.37


def test_the_chart_has_no_kubernetes_floor_and_the_policy_needs_1_30() -> None:
    assert "kubeVersion" not in yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = VALUE_SETS["admission"]
    for version, policy in (("1.28.0", False), ("1.29.9", False), ("1.30.0", True)):
        out = tool().render(CHART, values, kube_version=version, notes=True)
        templates = {k: v for k, v in out.items() if not k.endswith("NOTES.txt")}
        kinds = {o["kind"] for o in tool().objects(templates)}
        assert ("ValidatingAdmissionPolicy" in kinds) is policy, version
        assert "DaemonSet" in kinds
        notes = " ".join(out["gpuslice/templates/NOTES.txt"].split())
        assert ("needs 1.30 or later, so it was not installed" in notes) is not policy


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_finds_no_error_or_warning(name: str) -> None:
    report = helm.lint(str(CHART), VALUE_SETS[name], strict=True, namespace="gpu-system")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert not problems, problems
    assert not report["errors"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_passes_every_kubernetes_schema(name: str) -> None:
    objects = rendered(name)
    assert {o["kind"] for o in objects} >= {"DaemonSet", "ServiceAccount", "ClusterRole"}
    policy = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    errors = [
        e
        for v in kube_versions()
        for o in objects
        if Version(v) >= POLICY_KUBE or o["kind"] not in policy  # not rendered there
        for e in schema_errors(o, v)
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    daemonset = next(o for o in rendered("defaults") if o["kind"] == "DaemonSet")
    broken = json.loads(json.dumps(daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUsr"] = 0
    broken["spec"]["updateStrategy"] = "RollingUpdate"
    errors = schema_errors(broken, "1.30")
    assert any("runAsUsr" in e for e in errors), errors
    assert any("updateStrategy" in e for e in errors), errors


def test_static_manifests_pass_kubernetes_validate_on_every_version() -> None:
    objects = [o for o in yaml.safe_load_all(MANIFESTS.read_text()) if o]
    assert [o["kind"] for o in objects][:2] == ["Namespace", "ServiceAccount"]
    for version in kube_versions():
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_static_manifests_are_the_chart_rendered_with_default_values() -> None:
    gen = tool()
    objects = [o for o in yaml.safe_load_all(MANIFESTS.read_text()) if o]
    chart = gen.objects(gen.render(CHART))
    assert [o for o in objects if o["kind"] != "Namespace"] == sorted(
        chart, key=lambda o: gen.KIND_ORDER.index(o["kind"])
    )
    namespace = objects[0]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {o["metadata"].get("namespace") for o in chart} == {"gpuslice", None}


def test_regenerating_changes_nothing() -> None:
    assert tool().main(["--check"]) == 0


def test_check_names_the_file_that_is_out_of_step() -> None:
    gen = tool()
    rel = Path("deploy/helm/gpuslice/Chart.yaml")
    stale = (CHART / "Chart.yaml").read_text().replace("version: ", "version: 9", 1)
    lines = gen.differences({rel: stale})
    assert lines[0] == f"differs: {rel}"
    assert any(line.strip().startswith("+version: 9") for line in lines), lines


def test_a_rule_added_to_RULES_reaches_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespaced rule added to RULES lands in the namespace Role with no change to the
    chart's templates."""
    extra = rbac.Rule(("coordination.k8s.io",), ("leases",), ("get",), rbac.Scope.NAMESPACE, "x")
    monkeypatch.setattr(rbac, "RULES", (*rbac.RULES, extra))
    gen = tool()
    chart = tmp_path / "gpuslice"
    shutil.copytree(CHART, chart)
    (chart / gen.GENERATED_TPL).write_text(gen.generated_template())
    objects = gen.objects(gen.render(chart))
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "gpuslice")
    assert role["rules"][-1] == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get"],
    }


def _install_error(values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        tool().render(CHART, values)
    return str(caught.value)


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"simulat": "t4"}, 'values: unknown key "simulat"; did you mean "simulate"?'),
        ({"migStrateg": "mixed"}, 'unknown key "migStrateg"; did you mean "migStrategy"?'),
        ({"compatWithCpuManager": True}, 'did you mean "compatWithCPUManager"?'),
        ({"nodeselector": {}}, 'did you mean "nodeSelector"?'),
        ({"gfd": {"enabled": True}, "nfd": {"x": 1}, "gpu": {}}, 'did you mean "gfd"?'),
        ({"config": {"defualt": "x"}}, "at '/config': additional properties 'defualt'"),
        ({"image": {"tagg": "v1"}}, "at '/image': additional properties 'tagg'"),
        ({"migStrategy": "mix"}, "at '/migStrategy'"),
        ({"deviceListStrategy": "cdi"}, "at '/deviceListStrategy'"),
        ({"deviceIDStrategy": "serial"}, "at '/deviceIDStrategy'"),
        ({"failOnInitError": "yes"}, "at '/failOnInitError'"),
        ({"simulate": "v100"}, "at '/simulate'"),
        ({"labels": {"output": "nfd"}}, "at '/labels/output'"),
        ({"config": {"fallbackStrategies": ["first"]}}, "at '/config/fallbackStrategies/0'"),
        ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]}, "at '/tolerations/0'"),
        ({"resources": {"limit": {"memory": "1Gi"}}}, "at '/resources'"),
        ({"affinity": {"nodeAfinity": {}}}, "at '/affinity'"),
        ({"updateStrategy": {"type": "OnDelete", "rolling": {}}}, "at '/updateStrategy'"),
        ({"statusPort": 0}, "at '/statusPort'"),
        ({"nvidiaDriverRoot": "run/nvidia/driver"}, "at '/nvidiaDriverRoot'"),
    ],
)
def test_a_bad_value_fails_at_install_naming_its_path(values: dict[str, Any], path: str) -> None:
    assert path in _install_error(values)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"map": {"a": "version: v1"}, "name": "existing"},
            "config.map and config.name are both set",
        ),
        ({"default": "a100"}, 'config.default is "a100" but there are no configs'),
        (
            {"map": {"a.yaml": "version: v1", "b": "version: v1"}, "default": "c"},
            'config.default is "c", which is not an entry of config.map (a.yaml, b)',
        ),
        (
            {"map": {"a": "version: v1", "b": "version: v1"}},
            "config.map has entries a, b and none is chosen for unlabelled nodes",
        ),
    ],
)
def test_a_config_the_agent_could_not_start_with_fails_at_install(
    config: dict[str, Any], message: str
) -> None:
    error = _install_error({"config": config})
    assert message in error
    assert "\n" not in error.strip()


@pytest.mark.parametrize(
    "config",
    [
        {"map": {"a.yaml": "version: v1", "b": "version: v1"}, "default": "a"},
        {"map": {"default": "version: v1", "b": "version: v1"}},
        {"map": {"only": "version: v1"}},
        {"map": {"a": "version: v1", "b": "version: v1"}, "fallbackStrategies": ["empty"]},
    ],
)
def test_a_config_the_agent_can_choose_from_renders(config: dict[str, Any]) -> None:
    assert tool().render(CHART, {"config": config})


def test_values_yaml_sets_every_value_the_schema_allows() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])
    for key, spec in schema["properties"].items():
        if spec.get("type") == "object" and "properties" in spec:
            assert set(values[key]) == set(spec["properties"]), key


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the values, stopping at Kubernetes-typed and free-form maps."""
    free = {"config.map", "nodeSelector", "affinity", "resources", "podAnnotations"}
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in free | {"updateStrategy"}:
            out += _leaves(value, f"{path}.")
        else:
            out.append(path)
    return out


def test_install_doc_has_a_row_for_every_value() -> None:
    doc = (CHART.parents[2] / "docs" / "install.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines() if line[:3] == "| `"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(_leaves(values)) == rows
