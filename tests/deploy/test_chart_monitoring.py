"""What the chart ships for accounting and monitoring: the accounting mounts and the
watchdog's settings reach the agent as it reads them; the Service, ServiceMonitor,
PrometheusRule and dashboard have the shape Prometheus Operator and Grafana read (no
Kubernetes schema has these CRDs); the alerts and right-sizing records pass `promtool check
rules` and each alert has a `promtool test rules` file that fires it and one case that does not
(the records' values are tested there too); every metric and label the rules and the dashboard
query is one a running agent really exports, or one a record makes."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_kit import CHART, NAMESPACE, RELEASE, VALUE_SETS, container, env, rendered, the, tool

from gpuslice.config.flags import FLAGS_BY_NAME
from gpuslice.config.options import parse_budgets

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # the scraped-agent harness

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))
REQUIRED = os.environ.get("GPUSLICE_REQUIRE_PROMETHEUS_TEST") == "1"
MONITORING_KINDS = {"Service", "ServiceMonitor", "PrometheusRule"}
# Labels a series gets from the scrape rather than the agent: the ServiceMonitor's relabeling
# writes the node's name into hostname, which the agent's own series lack.
TARGET_LABELS = {"hostname"}
METRIC = re.compile(r"(?<![\w:])gpuslice_[a-z0-9_]+(?![\w:])")
RECORDED = re.compile(r"\b[a-z_]+:gpuslice_[a-z0-9_]+:[a-z0-9_]+")
MADE = re.compile(r'label_replace\([^"]*"(\w+)"')  # a label a rule's expression adds


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recorded_labels() -> dict[str, set[str]]:
    """Each recorded series' labels: its expression's `by`, else those of the records it
    divides or multiplies."""
    out: dict[str, set[str]] = {}
    for rule in (r for r in rules() if "record" in r):
        by = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", rule["expr"])
        if by:
            out[rule["record"]] = {label.strip() for label in by.group(1).split(",")}
        else:
            out[rule["record"]] = set().union(*(out[n] for n in RECORDED.findall(rule["expr"])))
    return out


def host_paths(objects: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, bool]]:
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    return {
        v["hostPath"]["path"]: (
            mounts[v["name"]]["mountPath"],
            mounts[v["name"]].get("readOnly", False),
        )
        for v in pod["volumes"]
        if "hostPath" in v
    }


# --- accounting and the watchdog --------------------------------------------------------


def test_accounting_mounts_the_pod_resources_socket_and_the_hosts_proc_read_only() -> None:
    objects = rendered("defaults")
    socket_dir = posixpath.dirname(FLAGS_BY_NAME["pod-resources-socket"].default_text)
    paths = host_paths(objects)
    assert paths[socket_dir] == (socket_dir, True)
    assert paths["/proc"] == ("/host/proc", True)
    variables = env(objects)
    assert variables["GPUSLICE_ACCOUNTING"] == "true"
    assert variables["GPUSLICE_PROC_ROOT"] == "/host/proc"
    assert variables["GPUSLICE_MEMORY_BUDGET_POLICY"] == "report"
    assert "GPUSLICE_MEMORY_BUDGET" not in variables
    assert "hostPID" not in the(objects, "DaemonSet")["spec"]["template"]["spec"]


def test_accounting_off_mounts_no_proc_and_turns_sampling_off() -> None:
    """The PodResources socket stays: holding back moved GPUs reads it too."""
    objects = rendered("accounting-off")
    assert set(host_paths(objects)) == {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
    }
    variables = env(objects)
    assert variables["GPUSLICE_ACCOUNTING"] == "false"
    assert not {"GPUSLICE_PROC_ROOT", "GPUSLICE_MEMORY_BUDGET_POLICY"} & set(variables)
    assert "hostPID" not in the(objects, "DaemonSet")["spec"]["template"]["spec"]


def test_terminate_runs_in_the_hosts_pid_namespace_with_the_budgets_given() -> None:
    objects = rendered("memory-budget-terminate")
    assert the(objects, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is True
    variables = env(objects)
    assert variables["GPUSLICE_MEMORY_BUDGET_POLICY"] == "terminate"
    assert parse_budgets(variables["GPUSLICE_MEMORY_BUDGET"]) == {
        "nvidia.com/gpu": 4 * 1024**3,
        "nvidia.com/gpu.shared": 10 * 1024**3,
        "nvidia.com/mig-1g.5gb": 512 * 10**6,
    }


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"memoryBudget": {"policy": "kill"}}, "at '/memoryBudget/policy'"),
        ({"memoryBudget": {"budgets": {"nvidia.com/gpu": "lots"}}}, "/memoryBudget/budgets"),
        ({"memoryBudget": {"budgets": {"gpu": "1Gi"}}}, "/memoryBudget/budgets"),
        ({"accounting": {"enabled": "yes"}}, "at '/accounting/enabled'"),
        ({"monitoring": {"serviceMonitor": {"interval": "30"}}}, "/monitoring/serviceMonitor"),
        ({"monitoring": {"dashbord": {"enabled": True}}}, "at '/monitoring'"),
    ],
)
def test_a_bad_monitoring_value_fails_at_install_naming_its_path(
    values: dict[str, Any], path: str
) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError) as caught:
        tool().render(CHART, values)
    assert path in str(caught.value)


# --- the monitoring objects -------------------------------------------------------------


def test_monitoring_is_off_by_default() -> None:
    objects = rendered("defaults")
    assert not MONITORING_KINDS & {o["kind"] for o in objects}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"] == []


def test_the_service_monitor_scrapes_every_agent_with_the_workloads_labels() -> None:
    objects = rendered("monitoring")
    daemonset = the(objects, "DaemonSet")
    service = the(objects, "Service")
    monitor = the(objects, "ServiceMonitor")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    metrics = next(p for p in container(objects)["ports"] if p["name"] == "metrics")

    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port == {"name": "metrics", "port": metrics["containerPort"],
                    "targetPort": metrics["containerPort"], "protocol": "TCP"}  # fmt: skip

    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"  # monitoring.labels
    spec = monitor["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "honorLabels": True,
        # metrics.auth kubernetes (the default): Prometheus's own token
        "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "hostname"}
        ],
    }


def test_a_service_monitor_alone_brings_its_service() -> None:
    values = {"monitoring": {"serviceMonitor": {"enabled": True, "interval": "1m"}}}
    gen = tool()
    kinds = [o["kind"] for o in gen.objects(gen.render(CHART, values))]
    assert kinds.count("Service") == 1
    assert kinds.count("ServiceMonitor") == 1


def test_values_yaml_names_the_value_the_services_port_is() -> None:
    """The comment on monitoring.service names the value its port is rendered from."""
    text = (CHART / "values.yaml").read_text()
    said = re.search(r"A Service selecting the agents, port `metrics` on (\S+) ", text)
    assert said, "values.yaml no longer describes monitoring.service"
    named = said.group(1).strip("`")
    head, *rest = named.split(".")  # statusPort or metrics.port
    values = {"monitoring": {"service": {"enabled": True}}, head: {rest[0]: 9555} if rest else 9555}
    gen = tool()
    (port,) = the(tuple(gen.objects(gen.render(CHART, values))), "Service")["spec"]["ports"]
    assert port["port"] == 9555, f"the Service's port is not {named}"


def test_the_prometheus_rule_is_the_alerts_file() -> None:
    rule = the(rendered("monitoring"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    duration = re.compile(r"^([0-9]+(ms|s|m|h))+$")
    for alert in alert_rules():
        assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}, alert
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description"} <= set(alert["annotations"])
        assert duration.match(alert.get("for", "0s")), alert


def test_the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar() -> None:
    objects = rendered("monitoring")
    configmap = next(o for o in objects if o["metadata"]["name"] == f"{RELEASE}-gpuslice-dashboard")
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = configmap["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text())


# --- promtool ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "no promtool on PATH (apt-get install prometheus)"
        if REQUIRED:
            pytest.fail(f"{why}; GPUSLICE_REQUIRE_PROMETHEUS_TEST=1 needs it")
        pytest.skip(why)
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_alerts_file(promtool: str) -> None:
    done = run(promtool, "check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_every_alert_has_a_promtool_test_that_fires_it_and_a_case_that_does_not() -> None:
    fired: dict[str, set[str]] = {}
    quiet: dict[str, set[str]] = {}
    for path in PROMTOOL_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test["alert_rule_test"]:
                found = fired if case["exp_alerts"] else quiet
                found.setdefault(case["alertname"], set()).add(path.name)
    names = {rule["alert"] for rule in alert_rules()}
    assert len(names) == 6
    assert set(fired) == names
    assert set(quiet) == names
    # one file per alert
    assert all(len(fired[n]) == 1 and fired[n] == quiet[n] for n in names)


@pytest.mark.parametrize("path", PROMTOOL_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests_pass(promtool: str, path: Path) -> None:
    done = run(promtool, "test", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("expr", ["vector(1) == 0", "vector(1)"], ids=["never", "always"])
@pytest.mark.parametrize("path", PROMTOOL_TESTS, ids=lambda p: p.stem)
def test_a_promtool_test_fails_when_its_alert_never_or_always_fires(
    promtool: str, path: Path, expr: str, tmp_path: Path
) -> None:
    test = yaml.safe_load(path.read_text())
    names = {c["alertname"] for t in test["tests"] for c in t["alert_rule_test"]}
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in names:
                rule["expr"] = expr
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    test["rule_files"] = ["alerts.yaml"]
    (tmp_path / path.name).write_text(yaml.safe_dump(test))
    done = run(promtool, "test", "rules", tmp_path / path.name)
    assert done.returncode != 0, done.stdout


# --- queries against what the agent exports ---------------------------------------------


def queries() -> dict[str, list[str]]:
    """Each PromQL expression of the alerts and the dashboard (its panels and variables),
    with the labels its legend shows."""
    out: dict[str, list[str]] = {rule["expr"]: [] for rule in rules()}
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            legend = re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", ""))
            out.setdefault(target["expr"], []).extend(legend)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            out[variable["query"]["query"]] = []
    return out


def test_the_dashboard_queries_every_panel_it_shows() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    assert all(
        p["targets"] and all(METRIC.search(t["expr"]) or RECORDED.search(t["expr"])
                             for t in p["targets"])
        for p in panels
    )  # fmt: skip
    text = DASHBOARD.read_text()
    for metric in ("allocated_ratio", "memory_budget_bytes", "gpu_healthy", "duration_seconds"):
        assert metric in text


async def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from /metrics of `gpuslice run` on the simulated t4x4 (ts-4)
    after pods were admitted through the kubelet stand-in (one with five containers, so two
    share a GPU), processes started in them and on no pod, one over its memory budget, and
    an XID."""
    from agent_harness import GPU, remove_dir, serving, short_dir
    from metrics_harness import scrape, scraped_node

    from gpuslice.core.devices import physical_id
    from gpuslice.testing.kubelet import KubeletStandin

    plugin_dir = short_dir()
    try:
        socket_path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
        async with KubeletStandin(plugin_dir, socket_path) as kubelet:
            flags = ["--pod-resources-socket", socket_path, "--sample-interval", "100ms"]
            async with scraped_node(plugin_dir, Path(plugin_dir), 0, flags) as node:
                await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
                (train,) = await kubelet.admit("ml/train", {"main": {GPU: 1}})
                infer = await kubelet.admit("ml/infer", {f"c{i}": {GPU: 1} for i in range(5)})
                gpus = [physical_id(c.device_ids[0]) for c in infer]
                shared = next(g for g in gpus if gpus.count(g) > 1)
                node.inject(
                    {"process": {"pid": 101, "gpu": physical_id(train.device_ids[0]),
                                 "memory_mib": 5000, "sm_util": 40, "pod_uid": train.pod_uid}},
                    {"process": {"pid": 102, "gpu": shared, "memory_mib": 100,
                                 "pod_uid": infer[0].pod_uid}},
                    {"process": {"pid": 103, "gpu": 3, "memory_mib": 100}},
                    {"gpu": 2, "xid": 79},
                )  # fmt: skip
                await node.proc.wait_for_line("memory_budget_exceeded")
                names: dict[str, set[str]] = {}
                wanted = {"gpuslice_pod_gpu_shared_memory_bytes",
                          "gpuslice_memory_budget_actions_total"}  # fmt: skip
                for _ in range(50):
                    names = {}
                    for (name, labels), _value in (await scrape(node.port)).items():
                        names.setdefault(name, set()).update(k for k, _ in labels)
                    if wanted <= set(names):
                        break
                return names
    finally:
        remove_dir(plugin_dir)


async def test_every_metric_and_label_queried_is_one_the_agent_exports() -> None:
    series = await exported()
    assert "gpuslice_container_gpu_memory_used_bytes" in series  # the scrape saw the pods
    problems = []
    records = recorded_labels()
    for expr, legend in queries().items():
        metrics = set(METRIC.findall(expr))
        recorded = set(RECORDED.findall(expr))
        assert metrics or recorded, expr
        missing = metrics - set(series)
        problems += [f"{expr}: {m} is not exported" for m in sorted(missing)]
        problems += [f"{expr}: {r} is not recorded" for r in sorted(recorded - set(records))]
        known = TARGET_LABELS.union(*(series.get(m, set()) for m in metrics))
        known |= set().union(*(records.get(r, set()) for r in recorded)) | set(MADE.findall(expr))
        matchers = re.findall(r"\{([^}]*)\}", re.sub(r"\{\{[^}]*\}\}", "", expr))
        used = {m for group in matchers for m in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", group)}
        used |= {
            label.strip()
            for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr)
            for label in clause.split(",")
        }
        used |= set(legend)
        used |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", expr))
        problems += [f"{expr}: label {label} is on none of {sorted(metrics)}"
                     for label in sorted(used - known)]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_the_query_check_catches_a_misspelt_metric_and_label() -> None:
    expr = 'sum by (namespce) (gpuslice_container_gpu_memory_usage_bytes{pod=~"$pod"})'
    assert METRIC.findall(expr) == ["gpuslice_container_gpu_memory_usage_bytes"]
    recorded = "namespace_workload:gpuslice_gpu_replicas:recommended"
    assert METRIC.findall(recorded) == []
    assert RECORDED.findall(recorded) == [recorded]
    assert re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr) == ["namespce"]


def test_value_sets_cover_the_monitoring_values() -> None:
    assert VALUE_SETS["monitoring"]["monitoring"]["prometheusRule"]["enabled"] is True
    assert VALUE_SETS["accounting-off"] == {"accounting": {"enabled": False}}
