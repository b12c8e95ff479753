"""Ports, networks and host paths from values: /metrics on its own port (bindable to the
loopback) with the probes alone on the status port, the NetworkPolicy that admits only the
scrapers to it, hostNetwork with its DNS policy, extra env vars, the kubelet's root directory,
and upgrades that start the successor before the old pod stops."""

from __future__ import annotations

from chart_kit import VALUE_SETS, container, env, rendered, the, tool

from gpuslice.config.flags import check_settings

CHART = tool().CHART


def ports(name: str) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(rendered(name))["ports"]}


def test_metrics_and_probes_have_ports_of_their_own() -> None:
    variables = env(rendered("defaults"))
    assert variables["GPUSLICE_STATUS_ADDRESS"] == ":8080"
    assert variables["GPUSLICE_METRICS_ADDRESS"] == ":8081"
    assert ports("defaults") == {"status": 8080, "metrics": 8081}
    agent = container(rendered("defaults"))
    probes = [agent[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert {p["port"] for p in probes} == {"status"}
    assert check_settings({}, {"GPUSLICE_STATUS_ADDRESS": ":8080"})["status-address"] == ":8080"


def test_metrics_bound_to_the_loopback_behind_a_network_policy() -> None:
    objects = rendered("metrics-policy")
    assert env(objects)["GPUSLICE_METRICS_ADDRESS"] == "127.0.0.1:9400"
    policy = the(objects, "NetworkPolicy")
    pod_labels = the(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    probes, scrape = spec["ingress"]
    assert probes == {"ports": [{"port": 8080, "protocol": "TCP"}]}  # from anywhere
    assert scrape["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert scrape["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    (service_port,) = the(objects, "Service")["spec"]["ports"]
    assert service_port["port"] == 9400
    assert service_port["targetPort"] == 9400


def test_no_network_policy_unless_asked() -> None:
    for name in set(VALUE_SETS) - {"metrics-policy"}:
        assert not [o for o in rendered(name) if o["kind"] == "NetworkPolicy"], name


def test_host_network_with_its_dns_policy_extra_env_and_the_kubelet_root() -> None:
    objects = rendered("host-network")
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container(objects)["env"][-1] == {
        "name": "HTTPS_PROXY",
        "value": "http://proxy.example:3128",
    }
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths["pod-resources"] == "/var/lib/k0s/kubelet/pod-resources"
    # the device-plugin directory is where the kubelet hard-codes it, whatever its root
    assert paths["device-plugins"] == "/var/lib/kubelet/device-plugins"
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"  # the agent's default
    defaults = the(rendered("defaults"), "DaemonSet")["spec"]["template"]["spec"]
    assert "hostNetwork" not in defaults
    assert "dnsPolicy" not in defaults


def test_upgrades_start_the_successor_before_the_old_pod_stops() -> None:
    strategy = the(rendered("defaults"), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # NVIDIA's values name only the type: the surge stays
    nvidia = the(rendered("nvidia-v020"), "DaemonSet")["spec"]["updateStrategy"]
    assert nvidia == strategy
    # OnDelete takes no rollingUpdate, which the API server would refuse
    assert the(rendered("on-delete"), "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
