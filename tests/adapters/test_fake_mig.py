"""Simulated MIG control: the profile tables, creation and destruction at placements,
refusals with NVML's error names, the mode and its reset rule, failures injected through
the events file, and every change visible in the snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_backend_fake import append

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.mig import GpuInstance, MigError, MigProfileSpec, Placement
from gpuslice.core.ports import MigControl

NODE = """name: lab
gpus:
  - {model: a100-40gb}
  - {model: a100-80gb}
  - {model: h100-80gb}
  - {model: h200}
  - {model: t4}
"""


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def lab(tmp_path: Path, events: Path) -> Iterator[FakeBackend]:
    (tmp_path / "lab.yaml").write_text(NODE)
    backend = FakeBackend.from_spec(str(tmp_path / "lab.yaml"), str(events))
    yield backend
    backend.close()


def control(backend: FakeBackend) -> MigControl:
    found = backend.mig_control()
    assert found is not None
    return found


def table(profiles: tuple[MigProfileSpec, ...]) -> dict[str, tuple[int, int, int, int, str]]:
    return {
        p.name: (p.gi_profile_id, p.memory_mib, p.multiprocessors, p.slices, _starts(p))
        for p in profiles
    }


def _starts(p: MigProfileSpec) -> str:
    return ",".join(str(x.start) for x in p.placements) + f":{p.placements[0].size}"


def test_each_model_has_the_mig_user_guides_profiles_and_placements(lab: FakeBackend) -> None:
    a100, a100_80, h100, h200, t4 = lab.snapshot().gpus
    mig = control(lab)
    assert table(mig.profiles(a100.uuid)) == {
        "1g.5gb": (19, 4864, 14, 1, "0,1,2,3,4,5,6:1"),
        "1g.5gb+me": (20, 4864, 14, 1, "0,1,2,3,4,5,6:1"),
        "1g.10gb": (15, 9856, 14, 1, "0,2,4,6:2"),
        "2g.10gb": (14, 9856, 28, 2, "0,2,4:2"),
        "3g.20gb": (9, 19968, 42, 3, "0,4:4"),
        "4g.20gb": (5, 19968, 56, 4, "0:4"),
        "7g.40gb": (0, 40192, 98, 7, "0:8"),
    }
    assert list(table(mig.profiles(a100_80.uuid))) == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ]  # fmt: skip
    h100_sms = {n: v[2] for n, v in table(mig.profiles(h100.uuid)).items()}
    assert h100_sms == {
        "1g.10gb": 16, "1g.10gb+me": 16, "1g.20gb": 26, "2g.20gb": 32, "3g.40gb": 60,
        "4g.40gb": 64, "7g.80gb": 132,
    }  # fmt: skip
    h200_mib = {n: v[1] for n, v in table(mig.profiles(h200.uuid)).items()}
    assert (h200_mib["1g.18gb"], h200_mib["3g.71gb"]) == (16 * 1024, 69.5 * 1024)
    plus_me = {p.name: p.instance_count for p in mig.profiles(h200.uuid)}["1g.18gb+me"]
    assert plus_me == 1
    ids = [g.pci_device_id for g in lab.snapshot().gpus]
    assert ids == [0x20B010DE, 0x20B210DE, 0x233010DE, 0x233510DE, 0]
    with pytest.raises(MigError, match="not MIG capable: NOT_SUPPORTED"):
        mig.profiles(t4.uuid)


def test_a_node_files_instances_are_placed_where_their_gpu_instance_ids_say() -> None:
    backend = FakeBackend(load_spec("a100-40gb-mig-mixed"))
    gpu = backend.snapshot().gpus[0]
    assert [(i.profile, i.placement, i.gi) for i in control(backend).instances(gpu.uuid)] == [
        ("2g.10gb", Placement(0, 2), 3),
        ("1g.5gb", Placement(2, 1), 9),
        ("1g.5gb", Placement(3, 1), 10),
        ("3g.20gb", Placement(4, 4), 2),
    ]
    assert {i.uuid for i in control(backend).instances(gpu.uuid)} == {
        m.uuid for m in gpu.mig_devices
    }


def test_a_created_instance_is_a_mig_device_of_the_next_snapshot(lab: FakeBackend) -> None:
    h100 = lab.snapshot().gpus[2]
    mig = control(lab)
    mig.set_mig_mode(h100.uuid, True)
    made = mig.create(h100.uuid, "1c.3g.40gb", 4)
    assert (made.profile, made.placement, made.ci) == ("1c.3g.40gb", Placement(4, 4), 0)
    after = lab.snapshot().gpus[2]
    assert after.mig_enabled
    (device,) = after.mig_devices
    assert (device.uuid, device.gi, device.profile) == (made.uuid, made.gi, "1c.3g.40gb")
    assert (device.gi_slices, device.ci_slices, device.multiprocessors) == (3, 1, 20)
    assert device.memory_mib == 40448
    assert device.cap_paths
    mig.destroy(h100.uuid, made.gi)
    again = mig.create(h100.uuid, "1c.3g.40gb", 4)
    assert again.uuid != made.uuid  # a new instance is a new device
    assert [m.uuid for m in lab.snapshot().gpus[2].mig_devices] == [again.uuid]


def test_an_occupied_or_overlapping_placement_is_refused_and_changes_nothing(
    lab: FakeBackend,
) -> None:
    a100 = lab.snapshot().gpus[0]
    mig = control(lab)
    mig.set_mig_mode(a100.uuid, True)
    mig.create(a100.uuid, "3g.20gb", 4)
    mig.create(a100.uuid, "1g.5gb+me", 0)
    before = lab.snapshot()
    with pytest.raises(
        MigError, match=r"create 1g.5gb at 6: GPU instance 2 \(3g.20gb at \{4,4\}\)"
    ):
        mig.create(a100.uuid, "1g.5gb", 6)
    with pytest.raises(MigError) as caught:
        mig.create(a100.uuid, "1g.5gb+me", 1)
    assert caught.value.code == "INSUFFICIENT_RESOURCES"
    with pytest.raises(MigError, match=r"not a placement of 2g\.10gb: INVALID_ARGUMENT"):
        mig.create(a100.uuid, "2g.10gb", 1)
    assert lab.snapshot() == before


def test_a_device_with_processes_is_in_use(lab: FakeBackend, events: Path) -> None:
    a100 = lab.snapshot().gpus[0]
    mig = control(lab)
    mig.set_mig_mode(a100.uuid, True)
    made = mig.create(a100.uuid, "7g.40gb", 0)
    append(events, '{"process": {"pid": 77, "gpu": 0, "mig": 0, "memory_mib": 100}}\n')
    with pytest.raises(MigError, match="destroy GPU instance 0: processes run there: IN_USE"):
        mig.destroy(a100.uuid, made.gi)
    append(events, '{"process_exit": 77}\n')
    mig.destroy(a100.uuid, made.gi)
    assert mig.instances(a100.uuid) == ()


def test_a_mode_change_needs_an_idle_gpu_and_is_left_pending_only_where_it_resets(
    lab: FakeBackend, events: Path
) -> None:
    a100, _, h100, *_ = lab.snapshot().gpus
    mig = control(lab)
    append(events, '{"process": {"pid": 5, "gpu": 0, "memory_mib": 1}}\n')
    append(events, '{"process": {"pid": 6, "gpu": 2, "memory_mib": 1}}\n')
    for gpu in (a100, h100):
        with pytest.raises(MigError, match="processes run on the GPU: IN_USE"):
            mig.set_mig_mode(gpu.uuid, True)
    assert mig.mig_mode(a100.uuid) == (False, True)  # Ampere: waits for its reset
    assert mig.mig_mode(h100.uuid) == (False, False)  # Hopper: nothing pending
    append(events, '{"process_exit": 5}\n')
    mig.set_mig_mode(a100.uuid, True)
    assert mig.mig_mode(a100.uuid) == (True, True)
    assert lab.snapshot().gpus[0].mig_enabled
    mig.create(a100.uuid, "1g.5gb", 0)
    with pytest.raises(MigError, match="still has GPU instances: IN_USE"):
        mig.set_mig_mode(a100.uuid, False)


def test_failures_are_injected_through_the_events_file(lab: FakeBackend, events: Path) -> None:
    a100 = lab.snapshot().gpus[0]
    mig = control(lab)
    append(
        events,
        '{"mig_fault": {"gpu": 0, "call": "set_mode", "error": "RESET_REQUIRED"}}\n'
        '{"mig_fault": {"gpu": 0, "call": "create", "error": "NO_PERMISSION"}}\n'
        '{"mig_fault": {"gpu": 9, "call": "create", "error": "IN_USE"}}\n'
        '{"mig_fault": {"gpu": 0, "call": "reset", "error": "IN_USE"}}\n',
    )
    with pytest.raises(MigError, match="set_mode \\(injected\\): RESET_REQUIRED"):
        mig.set_mig_mode(a100.uuid, True)
    assert mig.mig_mode(a100.uuid) == (False, True)  # taken; the reset failed
    mig.set_mig_mode(a100.uuid, True)  # the next reset works
    with pytest.raises(MigError, match="NO_PERMISSION"):
        mig.create(a100.uuid, "1g.5gb", 0)
    assert mig.create(a100.uuid, "1g.5gb", 0) == GpuInstance(
        "1g.5gb", Placement(0, 1), 7, 0, mig.instances(a100.uuid)[0].uuid
    )
    assert [w.split(": ", 1)[1] for w in lab.warnings] == [
        "mig_fault: no GPU 9 on this node; line skipped",
        'mig_fault: "call" is one of profiles, instances, create, destroy, set_mode, got '
        "'reset'; line skipped",
    ]
