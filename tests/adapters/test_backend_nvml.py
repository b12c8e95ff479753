"""NvmlBackend translation, events and host files, over a stand-in NVML library."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import FakeNvml, host_tree, open_backend

import gpuslice.adapters.nvml as nvml_package
from gpuslice.adapters.fake import load_spec, profile_names
from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.adapters.nvml.host import read_mig_minors, read_numa_node, read_pcie_root
from gpuslice.adapters.nvml.inventory import profile_from_size
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError

XID = pynvml.nvmlEventTypeXidCriticalError
DOUBLE_BIT = pynvml.nvmlEventTypeDoubleBitEccError
SINGLE_BIT = pynvml.nvmlEventTypeSingleBitEccError
SWITCH_LINKS = {"dgx-a100": 12, "dgx-h100": 18}


@pytest.mark.parametrize("profile", profile_names())
def test_the_snapshot_reproduces_what_nvml_and_the_host_report(
    profile: str, tmp_path: Path
) -> None:
    expected = load_spec(profile)
    backend = open_backend(FakeNvml(expected, switch_links=SWITCH_LINKS.get(profile, 0)), tmp_path)
    assert backend.snapshot() == expected
    assert backend.watched_gpus == tuple(g.uuid for g in expected.gpus)


def test_each_gpu_reports_the_pcie_root_its_sysfs_link_names(tmp_path: Path) -> None:
    t4s = load_spec("t4x4")
    roots = ("pci0000:00", "pci0000:00", "pci0000:80", "")
    rooted = replace(
        t4s, gpus=tuple(replace(g, pcie_root=r) for g, r in zip(t4s.gpus, roots, strict=True))
    )
    assert open_backend(FakeNvml(rooted), tmp_path).snapshot() == rooted


def test_direct_nvlinks_are_counted_per_peer(tmp_path: Path) -> None:
    t4s = load_spec("t4x4")
    a, b, c, d = (g.uuid for g in t4s.gpus)
    links = {a: ((b, 4),), b: ((a, 4),), c: ((d, 2),), d: ((c, 2),)}
    wired = replace(t4s, gpus=tuple(replace(g, nvlinks=links[g.uuid]) for g in t4s.gpus))
    assert open_backend(FakeNvml(wired), tmp_path).snapshot() == wired


def test_mig_profiles_are_named_from_their_size_without_gpu_instance_access(tmp_path: Path) -> None:
    expected = load_spec("a100-40gb-mig-mixed")
    backend = open_backend(FakeNvml(expected, name_gi_profiles=False), tmp_path)
    assert backend.snapshot() == expected


@pytest.mark.parametrize(
    ("slices", "mig_mib", "gpu_mib", "name"),
    [
        (1, 4864, 40960, "1g.5gb"),
        (2, 9984, 40960, "2g.10gb"),
        (3, 20096, 40960, "3g.20gb"),
        (4, 20096, 40960, "4g.20gb"),
        (7, 40537, 40960, "7g.40gb"),
        (1, 9984, 81559, "1g.10gb"),
        (3, 40448, 81559, "3g.40gb"),
    ],
)
def test_profile_from_size_matches_nvidia_names(
    slices: int, mig_mib: int, gpu_mib: int, name: str
) -> None:
    assert profile_from_size(slices, mig_mib, gpu_mib) == name


def test_a_missing_mig_capability_line_is_an_error(tmp_path: Path) -> None:
    fake = FakeNvml(load_spec("a100-40gb-mig-single"))
    backend = open_backend(fake, tmp_path)
    minors = tmp_path / "proc/driver/nvidia-caps/mig-minors"
    minors.write_text("\n".join(minors.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(
        BackendError, match=r"MIG device MIG-\S+: no gi13/ci0 access in .*mig-minors"
    ):
        backend.snapshot()


def test_the_pcie_root_is_read_from_the_device_link_text_not_followed(tmp_path: Path) -> None:
    devices = tmp_path / "bus/pci/devices"
    devices.mkdir(parents=True)
    (devices / "0001:8a:00.0").symlink_to("../../../devices/pci0001:80/0001:80:02.0/0001:8a:00.0")
    assert read_pcie_root(tmp_path, "00000001:8A:00.0") == "pci0001:80"  # target never made
    (devices / "0000:07:00.0").mkdir()  # a directory, not sysfs's link: no root named
    assert read_pcie_root(tmp_path, "00000000:07:00.0") == ""
    assert read_pcie_root(tmp_path, "00000000:3b:00.0") == ""


def test_host_files_numa_node_and_mig_minors(tmp_path: Path) -> None:
    device = tmp_path / "bus/pci/devices/0001:8a:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("2\n")
    assert read_numa_node(tmp_path, "00000001:8A:00.0") == 2
    (device / "numa_node").write_text("-1\n")
    assert read_numa_node(tmp_path, "00000001:8A:00.0") is None
    assert read_numa_node(tmp_path, "00000000:07:00.0") is None
    minors = tmp_path / "driver/nvidia-caps/mig-minors"
    minors.parent.mkdir(parents=True)
    minors.write_text("config 1\nmonitor 2\ngpu1/gi3/access 147\ngpu1/gi3/ci0/access 148\nbogus\n")
    assert read_mig_minors(tmp_path) == {
        "config": 1,
        "monitor": 2,
        "gpu1/gi3/access": 147,
        "gpu1/gi3/ci0/access": 148,
    }


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_open_without_a_driver_is_a_one_line_backend_error(code: int) -> None:
    with pytest.raises(BackendError) as caught:
        NvmlBackend.open(lib=FakeNvml(load_spec("t4"), init_error=code))
    message = str(caught.value)
    assert "\n" not in message
    assert "no NVIDIA driver or GPU is visible" in message


@pytest.fixture
def dgx(tmp_path: Path) -> tuple[FakeNvml, NvmlBackend, HardwareSnapshot]:
    snapshot = load_spec("dgx-a100")
    fake = FakeNvml(snapshot, switch_links=12)
    return fake, open_backend(fake, tmp_path), snapshot


def test_xid_and_ecc_events_become_health_events(
    dgx: tuple[FakeNvml, NvmlBackend, HardwareSnapshot],
) -> None:
    fake, backend, snapshot = dgx
    fake.fire(2, XID, 79)
    fake.fire(3, SINGLE_BIT)
    fake.fire(4, DOUBLE_BIT)
    fake.fire(5, XID, 31, gi=1, ci=0)
    events = [backend.wait_event(2.0) for _ in range(3)]
    assert events == [
        HealthEvent(snapshot.gpus[2].uuid, "xid", xid=79),
        HealthEvent(snapshot.gpus[4].uuid, "xid", xid=48, detail="ecc=double-bit"),
        HealthEvent(snapshot.gpus[5].uuid, "xid", xid=31, detail="gi=1 ci=0"),
    ]
    assert backend.wait_event(0.1) is None


def test_a_lost_gpu_is_reported_once_and_fails_probe(
    dgx: tuple[FakeNvml, NvmlBackend, HardwareSnapshot],
) -> None:
    fake, backend, snapshot = dgx
    fake.lose(6)
    assert backend.wait_event(2.0) == HealthEvent(
        snapshot.gpus[6].uuid, "lost", detail="GPU is lost"
    )
    started = time.monotonic()
    assert backend.wait_event(0.3) is None
    assert time.monotonic() - started >= 0.25, "waits out the timeout instead of spinning"
    assert not backend.probe(snapshot.gpus[6].uuid)
    assert all(backend.probe(g.uuid) for g in snapshot.gpus if g.index != 6)


def test_gpus_that_cannot_register_are_left_or_reported(tmp_path: Path) -> None:
    snapshot = load_spec("t4x4")
    codes = {1: pynvml.NVML_ERROR_NOT_SUPPORTED, 2: pynvml.NVML_ERROR_UNKNOWN}
    backend = open_backend(FakeNvml(snapshot, register_errors=codes), tmp_path)
    uuids = [g.uuid for g in snapshot.gpus]
    assert backend.watched_gpus == (uuids[0], uuids[3])
    event = backend.wait_event(1.0)
    assert event is not None
    assert (event.gpu_uuid, event.kind) == (uuids[2], "lost")
    assert event.detail.startswith("health event registration failed")
    assert backend.wait_event(0.05) is None


def test_close_frees_the_event_set_and_shuts_down_once(
    dgx: tuple[FakeNvml, NvmlBackend, HardwareSnapshot],
) -> None:
    fake, backend, snapshot = dgx
    waiter = threading.Thread(target=backend.wait_event, args=(30.0,))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), "the wait should still be blocked"
    backend.close()
    backend.close()
    waiter.join(timeout=5.0)
    assert not waiter.is_alive()
    assert (fake.inits, fake.shutdowns, fake.event_sets[0].freed) == (1, 1, True)
    assert not backend.probe(snapshot.gpus[0].uuid)
    with pytest.raises(BackendError, match="after close"):
        backend.snapshot()


def test_only_the_mig_control_calls_nvml_functions_that_change_a_gpu() -> None:
    package = Path(nvml_package.__file__).parent
    changing: dict[str, set[str]] = {}
    for source in package.glob("*.py"):
        for name in re.findall(r"\bnvml[A-Z]\w*", source.read_text()):
            if re.search(r"Set(?!Create|Free|Wait)|Reset|Clear|Destroy|Create", name):
                changing.setdefault(source.name, set()).add(name)
    # A pod cgroup's memory limit (--memory-isolation) changes no GPU setting and goes with
    # the cgroup (adapters.nvml.limits); MIG layouts change only through the MigControl port.
    assert changing == {
        "events.py": {"nvmlEventSetCreate"},
        "limits.py": {"nvmlDeviceSetMemoryLimits_v1"},
        "mig.py": {
            "nvmlDeviceSetMigMode",
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            "nvmlGpuInstanceCreateComputeInstance",
            "nvmlGpuInstanceDestroy",
            "nvmlComputeInstanceDestroy",
        },
    }


def test_host_tree_round_trips_cap_paths(tmp_path: Path) -> None:
    """The stand-in host files carry exactly the profile's capability minors."""
    snapshot = load_spec("a100-40gb-mig-single")
    _, proc_root = host_tree(snapshot, tmp_path)
    minors = read_mig_minors(proc_root)
    assert minors["gpu0/gi7/access"] == 66
    assert minors["gpu0/gi13/ci0/access"] == 121
