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
    assert "up to date (8 files)" in proc.stdout


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
    assert channel.paths == [
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    ]


def test_allocate_request_bytes_match_hand_encoding() -> None:
    """Field 1 (container_requests) holding field 1 (devices_ids) strings, as the kubelet sends."""
    msg = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["a"])])
    assert msg.SerializeToString() == b"\x0a\x03\x0a\x01a"
    pref = dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=["x"], must_include_deviceIDs=["y"], allocation_size=2
    )
    assert pref.SerializeToString() == b"\x0a\x01x\x12\x01y\x18\x02"
