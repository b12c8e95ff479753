"""The committed protobuf modules are current and match the kubelet's wire format."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpuslice.adapters.kubelet._proto.deviceplugin.v1beta1 import api_pb2 as dp
from gpuslice.adapters.kubelet._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2 as dra
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2_grpc as dra_grpc
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2 as dra_b
from gpuslice.adapters.kubelet._proto.drahealth.v1alpha1 import api_pb2 as health
from gpuslice.adapters.kubelet._proto.pluginregistration.v1 import api_pb2 as reg
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2 as pr

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gen_protos.py"
F = FieldDescriptor
PREF = dp.ContainerPreferredAllocationRequest


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_stubs_changes_nothing() -> None:
    pytest.importorskip("grpc_tools")
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date (24 files)" in proc.stdout


def test_check_names_every_file_that_differs() -> None:
    tool = _load_tool()
    a, b, c = Path("x/a_pb2.py"), Path("x/b_pb2.pyi"), Path("x/c_pb2_grpc.py")
    lines = tool.differences({a: b"one\n", b: b"same\n"}, {b: b"same\n", c: b"old\n", a: b"two\n"})
    assert "differs: x/a_pb2.py" in lines
    assert "stale (no longer generated): x/c_pb2_grpc.py" in lines
    assert not any("b_pb2.pyi" in line for line in lines)
    assert any(line.strip() == "+one" for line in lines)


def _field(message: type, name: str) -> tuple[int, int, bool]:
    fd = message.DESCRIPTOR.fields_by_name[name]  # type: ignore[attr-defined]
    return fd.number, fd.type, fd.is_repeated


@pytest.mark.parametrize(
    ("message", "name", "expected"),
    [
        (dp.RegisterRequest, "version", (1, F.TYPE_STRING, False)),
        (dp.RegisterRequest, "endpoint", (2, F.TYPE_STRING, False)),
        (dp.RegisterRequest, "resource_name", (3, F.TYPE_STRING, False)),
        (dp.RegisterRequest, "options", (4, F.TYPE_MESSAGE, False)),
        (dp.DevicePluginOptions, "pre_start_required", (1, F.TYPE_BOOL, False)),
        (dp.DevicePluginOptions, "get_preferred_allocation_available", (2, F.TYPE_BOOL, False)),
        (dp.Device, "ID", (1, F.TYPE_STRING, False)),
        (dp.Device, "health", (2, F.TYPE_STRING, False)),
        (dp.Device, "topology", (3, F.TYPE_MESSAGE, False)),
        (dp.NUMANode, "ID", (1, F.TYPE_INT64, False)),
        (dp.ContainerAllocateRequest, "devices_ids", (1, F.TYPE_STRING, True)),
        (dp.PreStartContainerRequest, "devices_ids", (1, F.TYPE_STRING, True)),
        (PREF, "available_deviceIDs", (1, F.TYPE_STRING, True)),
        (PREF, "must_include_deviceIDs", (2, F.TYPE_STRING, True)),
        (PREF, "allocation_size", (3, F.TYPE_INT32, False)),
        (dp.ContainerPreferredAllocationResponse, "deviceIDs", (1, F.TYPE_STRING, True)),
        (dp.ContainerAllocateResponse, "envs", (1, F.TYPE_MESSAGE, True)),
        (dp.ContainerAllocateResponse, "mounts", (2, F.TYPE_MESSAGE, True)),
        (dp.ContainerAllocateResponse, "devices", (3, F.TYPE_MESSAGE, True)),
        (dp.ContainerAllocateResponse, "annotations", (4, F.TYPE_MESSAGE, True)),
        (dp.ContainerAllocateResponse, "cdi_devices", (5, F.TYPE_MESSAGE, True)),
        (dp.CDIDevice, "name", (1, F.TYPE_STRING, False)),
        (dp.Mount, "read_only", (3, F.TYPE_BOOL, False)),
        (dp.DeviceSpec, "permissions", (3, F.TYPE_STRING, False)),
        (pr.ContainerDevices, "device_ids", (2, F.TYPE_STRING, True)),
        (pr.ContainerDevices, "topology", (3, F.TYPE_MESSAGE, False)),
        (pr.ContainerResources, "dynamic_resources", (5, F.TYPE_MESSAGE, True)),
        (pr.ContainerMemory, "size", (2, F.TYPE_UINT64, False)),
        (pr.DynamicResource, "claim_name", (2, F.TYPE_STRING, False)),
        (pr.ClaimResource, "device_name", (4, F.TYPE_STRING, False)),
        (pr.AllocatableResourcesResponse, "cpu_ids", (2, F.TYPE_INT64, True)),
        (pr.GetPodResourcesRequest, "pod_namespace", (2, F.TYPE_STRING, False)),
        (pr.GetPodResourcesResponse, "pod_resources", (1, F.TYPE_MESSAGE, False)),
        (reg.PluginInfo, "type", (1, F.TYPE_STRING, False)),
        (reg.PluginInfo, "name", (2, F.TYPE_STRING, False)),
        (reg.PluginInfo, "endpoint", (3, F.TYPE_STRING, False)),
        (reg.PluginInfo, "supported_versions", (4, F.TYPE_STRING, True)),
        (reg.RegistrationStatus, "plugin_registered", (1, F.TYPE_BOOL, False)),
        (reg.RegistrationStatus, "error", (2, F.TYPE_STRING, False)),
        *(
            case
            for m in (dra, dra_b)
            for case in (
                (m.NodePrepareResourcesRequest, "claims", (1, F.TYPE_MESSAGE, True)),
                (m.NodePrepareResourcesResponse, "claims", (1, F.TYPE_MESSAGE, True)),
                (m.NodePrepareResourceResponse, "devices", (1, F.TYPE_MESSAGE, True)),
                (m.NodePrepareResourceResponse, "error", (2, F.TYPE_STRING, False)),
                (m.Device, "request_names", (1, F.TYPE_STRING, True)),
                (m.Device, "pool_name", (2, F.TYPE_STRING, False)),
                (m.Device, "device_name", (3, F.TYPE_STRING, False)),
                (m.Device, "cdi_device_ids", (4, F.TYPE_STRING, True)),
                (m.Device, "share_id", (5, F.TYPE_STRING, False)),
                (m.NodeUnprepareResourcesRequest, "claims", (1, F.TYPE_MESSAGE, True)),
                (m.NodeUnprepareResourcesResponse, "claims", (1, F.TYPE_MESSAGE, True)),
                (m.NodeUnprepareResourceResponse, "error", (1, F.TYPE_STRING, False)),
                (m.Claim, "namespace", (1, F.TYPE_STRING, False)),
                (m.Claim, "uid", (2, F.TYPE_STRING, False)),
                (m.Claim, "name", (3, F.TYPE_STRING, False)),
            )
        ),
        (health.NodeWatchResourcesResponse, "devices", (1, F.TYPE_MESSAGE, True)),
        (health.DeviceIdentifier, "pool_name", (1, F.TYPE_STRING, False)),
        (health.DeviceIdentifier, "device_name", (2, F.TYPE_STRING, False)),
        (health.DeviceHealth, "device", (1, F.TYPE_MESSAGE, False)),
        (health.DeviceHealth, "health", (2, F.TYPE_ENUM, False)),
        (health.DeviceHealth, "last_updated_time", (3, F.TYPE_INT64, False)),
        (health.DeviceHealth, "health_check_timeout_seconds", (4, F.TYPE_INT64, False)),
        (health.DeviceHealth, "message", (5, F.TYPE_STRING, False)),
    ],
)
def test_field_numbers_and_types_match_the_kubelet(
    message: type, name: str, expected: tuple[int, int, bool]
) -> None:
    assert _field(message, name) == expected


def test_maps_are_string_to_string() -> None:
    for name in ("envs", "annotations"):
        entry = dp.ContainerAllocateResponse.DESCRIPTOR.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert [f.type for f in entry.fields] == [F.TYPE_STRING, F.TYPE_STRING]


def test_packages_are_the_kubelets() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert dra.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert dra_b.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert health.DESCRIPTOR.package == "v1alpha1"


def test_dra_maps_are_keyed_by_claim_uid_and_share_id_is_optional() -> None:
    for m in (dra, dra_b):
        for message in (m.NodePrepareResourcesResponse, m.NodeUnprepareResourcesResponse):
            entry = message.DESCRIPTOR.fields_by_name["claims"].message_type
            assert entry is not None
            assert entry.GetOptions().map_entry
            assert entry.fields_by_name["key"].type == F.TYPE_STRING
        assert m.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


def test_health_status_values() -> None:
    assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def _paths(module: ModuleType, service: str) -> dict[str, tuple[str, str, bool]]:
    svc = module.DESCRIPTOR.services_by_name[service]
    return {
        f"/{svc.full_name}/{m.name}": (
            m.input_type.full_name,
            m.output_type.full_name,
            m.server_streaming,
        )
        for m in svc.methods
    }


def test_device_plugin_method_paths() -> None:
    assert _paths(dp, "Registration") == {
        "/v1beta1.Registration/Register": ("v1beta1.RegisterRequest", "v1beta1.Empty", False)
    }
    assert _paths(dp, "DevicePlugin") == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": (
            "v1beta1.Empty",
            "v1beta1.DevicePluginOptions",
            False,
        ),
        "/v1beta1.DevicePlugin/ListAndWatch": (
            "v1beta1.Empty",
            "v1beta1.ListAndWatchResponse",
            True,
        ),
        "/v1beta1.DevicePlugin/GetPreferredAllocation": (
            "v1beta1.PreferredAllocationRequest",
            "v1beta1.PreferredAllocationResponse",
            False,
        ),
        "/v1beta1.DevicePlugin/Allocate": (
            "v1beta1.AllocateRequest",
            "v1beta1.AllocateResponse",
            False,
        ),
        "/v1beta1.DevicePlugin/PreStartContainer": (
            "v1beta1.PreStartContainerRequest",
            "v1beta1.PreStartContainerResponse",
            False,
        ),
    }


def test_dra_method_paths() -> None:
    assert _paths(reg, "Registration") == {
        "/pluginregistration.Registration/GetInfo": (
            "pluginregistration.InfoRequest",
            "pluginregistration.PluginInfo",
            False,
        ),
        "/pluginregistration.Registration/NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
            False,
        ),
    }
    for version, module in (("v1", dra), ("v1beta1", dra_b)):
        pkg = f"k8s.io.kubelet.pkg.apis.dra.{version}"
        assert _paths(module, "DRAPlugin") == {
            f"/{pkg}.DRAPlugin/NodePrepareResources": (
                f"{pkg}.NodePrepareResourcesRequest",
                f"{pkg}.NodePrepareResourcesResponse",
                False,
            ),
            f"/{pkg}.DRAPlugin/NodeUnprepareResources": (
                f"{pkg}.NodeUnprepareResourcesRequest",
                f"{pkg}.NodeUnprepareResourcesResponse",
                False,
            ),
        }
    assert _paths(health, "DRAResourceHealth") == {
        "/v1alpha1.DRAResourceHealth/NodeWatchResources": (
            "v1alpha1.NodeWatchResourcesRequest",
            "v1alpha1.NodeWatchResourcesResponse",
            True,
        )
    }


def test_prepare_response_bytes_match_hand_encoding() -> None:
    """A map entry (key 1, value 2) holding a Device with device_name (3) and a CDI ID (4)."""
    device = dra.Device(device_name="g", cdi_device_ids=["c"])
    msg = dra.NodePrepareResourcesResponse(
        claims={"u": dra.NodePrepareResourceResponse(devices=[device])}
    )
    value = b"\x0a\x06\x1a\x01g\x22\x01c"
    entry = b"\x0a\x01u\x12" + bytes([len(value)]) + value
    assert msg.SerializeToString() == b"\x0a" + bytes([len(entry)]) + entry
    claim = dra.Claim(namespace="n", uid="u", name="c")
    assert claim.SerializeToString() == b"\x0a\x01n\x12\x01u\x1a\x01c"


def test_pod_resources_method_paths() -> None:
    assert set(_paths(pr, "PodResourcesLister")) == {
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    }


class _RecordingChannel:
    """Stands in for a grpc channel: records the method paths a stub binds."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def _bind(self, path: str, *args: object, **kwargs: object) -> str:
        self.paths.append(path)
        return path

    unary_unary = unary_stream = stream_unary = stream_stream = _bind


def test_generated_stubs_call_the_kubelet_paths() -> None:
    channel = _RecordingChannel()
    dp_grpc.RegistrationStub(channel)  # type: ignore[call-overload]
    dp_grpc.DevicePluginStub(channel)  # type: ignore[call-overload]
    dra_grpc.DRAPluginStub(channel)  # type: ignore[call-overload]
    assert channel.paths == [
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ]


def test_allocate_request_bytes_match_hand_encoding() -> None:
    """Field 1 (container_requests) holding field 1 (devices_ids) strings, as the kubelet sends."""
    msg = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["a"])])
    assert msg.SerializeToString() == b"\x0a\x03\x0a\x01a"
    pref = dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=["x"], must_include_deviceIDs=["y"], allocation_size=2
    )
    assert pref.SerializeToString() == b"\x0a\x01x\x12\x01y\x18\x02"
