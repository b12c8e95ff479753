"""The chart's DRA parts (dra.enabled), checked against the agent: env vars it accepts, the
plugin directories mounted where the kubelet dials them, exactly the DRA RBAC rules, the
DeviceClasses selecting the devices the agent publishes (their CEL evaluated), and the
admission policy that keeps each agent to its own node's ResourceSlices."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest
from cel_expr_python import cel
from chart_kit import CHART, NAMESPACE, RELEASE, ROOT, container, env, rendered, tool

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.kube.rbac import DRA_RULES
from gpuslice.config.flags import check_settings
from gpuslice.core.dra.devices import DraOptions, build_devices
from gpuslice.core.dra.partitions import partition_node
from gpuslice.core.dra.slices import published
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_MIXED, ResourceSettings


def _load_cel() -> ModuleType:
    """The unit tests' CEL evaluator (tests/unit/core/k8s_cel.py), loaded by path."""
    path = ROOT / "tests" / "unit" / "core" / "k8s_cel.py"
    spec = importlib.util.spec_from_file_location("k8s_cel", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("k8s_cel", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


CEL = _load_cel()
DEVICE_ENV = cel.NewEnv(variables={"device": cel.Type.DYN})  # a DeviceClass selector's


def selects(expression: str, device: dict[str, Any]) -> bool:
    result = DEVICE_ENV.compile(expression).eval(data={"device": device})
    assert result.type() == cel.Type.BOOL, result.value()
    return bool(result.plain_value())


KUBELET = "/var/lib/k0s/kubelet"  # the value set's kubeletRootDir
AGENT = f"system:serviceaccount:{NAMESPACE}:gpu-gpuslice"


def of_kind(objects: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_the_agent_gets_dra_flags_it_accepts_and_the_plugin_directories() -> None:
    objects = rendered("dra")
    literal = {k: v for k, v in env(objects).items() if isinstance(v, str)}
    dra = {k: v for k, v in literal.items() if k.startswith("GPUSLICE_DRA")}
    assert dra == {
        "GPUSLICE_DRA": "true",
        "GPUSLICE_DRA_DRIVER_NAME": "gpu.nvidia.com",
        "GPUSLICE_DRA_DEVICE_PLUGIN_RESOURCES": "nvidia.com/gpu",
        "GPUSLICE_DRA_CONSUMABLE_SHARES": "true",
        "GPUSLICE_DRA_TAINT_UNHEALTHY": "false",
        "GPUSLICE_DRA_MIG_DEVICES": "true",
        "GPUSLICE_DRA_PLUGINS_DIR": f"{KUBELET}/plugins",
        "GPUSLICE_DRA_REGISTRY_DIR": f"{KUBELET}/plugins_registry",
    }
    values = check_settings({}, dra)
    assert values["dra"] is True
    assert values["dra-device-plugin-resources"] == ("nvidia.com/gpu",)
    mounts = {m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert {f"{KUBELET}/plugins", f"{KUBELET}/plugins_registry", "/var/run/cdi"} <= mounts
    assert "/etc/cdi" in mounts  # read for the toolkit's spec
    pod = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    hosts = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {f"{KUBELET}/plugins", f"{KUBELET}/plugins_registry"} <= hosts


def test_without_dra_nothing_of_it_is_rendered() -> None:
    objects = rendered("defaults")
    assert not [k for k in env(objects) if k.startswith("GPUSLICE_DRA")]
    assert not [o for o in objects if o["apiVersion"].startswith("resource.k8s.io")]


def test_the_dra_role_is_exactly_dra_rules_bound_to_the_agent() -> None:
    objects = rendered("dra")
    (role,) = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-dra")]
    assert role["rules"] == [rule.policy_rule() for rule in DRA_RULES]
    (binding,) = [
        b
        for b in of_kind(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-gpuslice", "namespace": NAMESPACE}
    ]


def published_devices() -> list[dict[str, Any]]:
    backend = FakeBackend.from_spec("a100-40gb-mig-mixed")
    snapshot = backend.snapshot()
    backend.close()
    resources = build_resources(snapshot, ResourceSettings(mig_strategy=MIG_MIXED))
    return published(build_devices(snapshot, resources), frozenset(), DraOptions())


def cel_device(entry: dict[str, Any], driver: str) -> dict[str, Any]:
    """A published device as DRA's CEL sees it: attributes by domain (unqualified names
    in the driver's), each value plain."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in entry["attributes"].items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[short] = next(iter(value.values()))
    return {"driver": driver, "attributes": attributes}


def test_the_device_classes_select_the_published_gpus_and_mig_devices() -> None:
    classes = {c["metadata"]["name"]: c for c in of_kind(rendered("dra"), "DeviceClass")}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com"}
    devices = published_devices()
    for name, cls in classes.items():
        (selector,) = cls["spec"]["selectors"]
        chosen = {
            d["name"]
            for d in devices
            if selects(selector["cel"]["expression"], cel_device(d, "gpu.nvidia.com"))
        }
        want = {d["name"] for d in devices if ("-mig-" in d["name"]) == (name == "mig.nvidia.com")}
        assert chosen == want, name
        assert chosen
        other_driver = cel_device(devices[0], "gpu.example.com")
        assert not selects(selector["cel"]["expression"], other_driver)


def test_no_device_class_where_its_name_is_empty() -> None:
    gen = tool()
    values = {"dra": {"enabled": True, "gpuClass": "", "migClass": "mig.example.com"}}
    objects = tuple(gen.objects(gen.render(CHART, values)))
    assert [c["metadata"]["name"] for c in of_kind(objects, "DeviceClass")] == ["mig.example.com"]


def test_with_dynamic_mig_the_mig_class_selects_every_partition_and_the_agent_is_told() -> None:
    gen = tool()
    values = {"dra": {"enabled": True, "dynamicMig": True}}
    objects = tuple(gen.objects(gen.render(CHART, values, release=RELEASE, namespace=NAMESPACE)))
    told = {k: v for k, v in env(objects).items() if k == "GPUSLICE_DRA_DYNAMIC_MIG"}
    assert told == {"GPUSLICE_DRA_DYNAMIC_MIG": "true"}
    assert check_settings({}, told)["dra-dynamic-mig"] is True
    classes = {c["metadata"]["name"]: c for c in of_kind(objects, "DeviceClass")}
    backend = FakeBackend.from_spec("h100-80gb")
    snapshot, control = backend.snapshot(), backend.mig_control()
    gpu = snapshot.gpus[0]
    tables = {gpu.uuid: control.profiles(gpu.uuid)}
    parted = partition_node(snapshot, [gpu], tables, ResourceSettings(), ())
    backend.close()
    devices = published(parted.served([]), frozenset(), DraOptions(dynamic_mig=True))
    for name, kind in (("mig.nvidia.com", "mig"), ("gpu.nvidia.com", "gpu")):
        (selector,) = classes[name]["spec"]["selectors"]
        chosen = {
            d["name"]
            for d in devices
            if selects(selector["cel"]["expression"], cel_device(d, "gpu.nvidia.com"))
        }
        want = {p.device.name for p in parted.by_name.values() if p.device.kind == kind}
        assert chosen == want, name
    assert len(want) == 1  # the whole GPU, beside its partitions


def slice_request(user: str, user_node: str | None, node: str, operation: str) -> dict[str, Any]:
    extra = {} if user_node is None else {"authentication.kubernetes.io/node-name": [user_node]}
    obj = {"spec": {"nodeName": node, "driver": "gpu.nvidia.com"}}
    return {
        "request": {"operation": operation, "userInfo": {"username": user, "extra": extra}},
        "object": None if operation == "DELETE" else obj,
        "oldObject": obj if operation != "CREATE" else None,
    }


def verdict(spec: dict[str, Any], data: dict[str, Any]) -> tuple[bool, str]:
    """(allowed, message) of the policy for one request, as the API server decides."""
    for condition in spec["matchConditions"]:
        if not CEL.evaluate(condition["expression"], data):
            return True, "not matched"
    variables: dict[str, Any] = {}
    data = {**data, "variables": variables}
    for variable in spec["variables"]:
        variables[variable["name"]] = CEL.evaluate(variable["expression"], data)
    for check in spec["validations"]:
        if not CEL.evaluate(check["expression"], data):
            return False, check.get("message") or CEL.evaluate(check["messageExpression"], data)
    return True, ""


@pytest.mark.parametrize(
    ("user", "user_node", "node", "operation", "allowed"),
    [
        (AGENT, "n1", "n1", "CREATE", True),
        (AGENT, "n1", "n1", "UPDATE", True),
        (AGENT, "n1", "n1", "DELETE", True),
        (AGENT, "n1", "n2", "CREATE", False),
        (AGENT, "n1", "n2", "DELETE", False),
        (AGENT, None, "n1", "CREATE", False),
        ("system:serviceaccount:other:driver", None, "n2", "CREATE", True),  # not the agent
    ],
)
def test_an_agent_writes_only_its_own_nodes_slices(
    user: str, user_node: str | None, node: str, operation: str, allowed: bool
) -> None:
    (policy,) = of_kind(rendered("dra"), "ValidatingAdmissionPolicy")
    (binding,) = of_kind(rendered("dra"), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    ok, message = verdict(policy["spec"], slice_request(user, user_node, node, operation))
    assert ok is allowed, message
    if user_node and not ok:
        assert message == (
            f"the agent on node {user_node} may write only its own ResourceSlices, "
            f"not those of node {node}"
        )


def test_before_1_34_dra_is_left_out_and_notes_say_so() -> None:
    gen = tool()
    out = gen.render(CHART, {"dra": {"enabled": True}}, kube_version="1.33.0", notes=True)
    templates = {k: v for k, v in out.items() if not k.endswith("NOTES.txt")}
    objects = tuple(gen.objects(templates))
    assert not [o for o in objects if o["apiVersion"].startswith("resource.k8s.io")]
    assert not [k for k in env(objects) if k.startswith("GPUSLICE_DRA")]
    notes = " ".join(out["gpuslice/templates/NOTES.txt"].split())
    assert "DRA's resource.k8s.io/v1 needs 1.34 or later" in notes


def test_a_bad_driver_name_fails_at_install_naming_its_path() -> None:
    with pytest.raises(Exception, match="at '/dra/driverName': 'GPU!' does not match pattern"):
        tool().render(CHART, {"dra": {"enabled": True, "driverName": "GPU!"}})


def classes_of(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    gen = tool()
    objects = tuple(gen.objects(gen.render(CHART, {"dra": {"enabled": True, **values}})))
    return {c["metadata"]["name"]: c["spec"] for c in of_kind(objects, "DeviceClass")}


def test_unchanged_pods_asking_nvidia_com_gpu_are_served_through_dra() -> None:
    """KEP-5004: the GPU class names nvidia.com/gpu where the device plugin does not keep
    it, so the scheduler serves `nvidia.com/gpu: 1` from the slices; never the MIG class."""
    classes = classes_of({})
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]
    kept = classes_of({"devicePluginResources": ["nvidia.com/gpu"]})
    assert "extendedResourceName" not in kept["gpu.nvidia.com"]
    off = classes_of({"extendedResourceName": ""})
    assert "extendedResourceName" not in off["gpu.nvidia.com"]


def test_a_shared_class_serves_the_renamed_shared_resource() -> None:
    classes = classes_of({"sharedClass": "gpu-shared.nvidia.com"})
    shared = classes["gpu-shared.nvidia.com"]
    assert shared["extendedResourceName"] == "nvidia.com/gpu.shared"
    (selector,) = shared["selectors"]
    devices = published_devices()
    whole = next(d for d in devices if "-mig-" not in d["name"])
    as_shared = {**whole, "attributes": {**whole["attributes"], "sharing": {"string": "mps"}}}
    assert not selects(selector["cel"]["expression"], cel_device(whole, "gpu.nvidia.com"))
    assert selects(selector["cel"]["expression"], cel_device(as_shared, "gpu.nvidia.com"))
