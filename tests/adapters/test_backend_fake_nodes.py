"""Built-in profiles and YAML node files of the simulated backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.adapters.fake import FakeBackend, load_spec, profile_names, profile_text
from gpuslice.core.errors import ConfigError

REQUIRED = {
    "t4", "t4x4", "a100-40gb", "dgx-a100", "a100-40gb-mig-mixed", "a100-40gb-mig-single",
    "h100-80gb", "dgx-h100",
}  # fmt: skip
A100 = ("NVIDIA A100-SXM4-40GB", 40960, (8, 0), 108)
H100 = ("NVIDIA H100 80GB HBM3", 81559, (9, 0), 132)
T4 = ("Tesla T4", 15360, (7, 5), 40)


def test_every_required_profile_is_built_in() -> None:
    assert set(profile_names()) >= REQUIRED


@pytest.mark.parametrize(
    ("profile", "count", "facts"),
    [
        ("t4", 1, T4),
        ("t4x4", 4, T4),
        ("a100-40gb", 1, A100),
        ("dgx-a100", 8, A100),
        ("a100-40gb-mig-mixed", 2, A100),
        ("a100-40gb-mig-single", 1, A100),
        ("h100-80gb", 1, H100),
        ("dgx-h100", 8, H100),
    ],
)
def test_profiles_report_what_nvml_reports_for_the_product(
    profile: str, count: int, facts: tuple[str, int, tuple[int, int], int]
) -> None:
    gpus = load_spec(profile).gpus
    assert len(gpus) == count
    assert {(g.name, g.memory_mib, g.compute_capability, g.multiprocessors) for g in gpus} == {
        facts
    }


def test_dgx_a100_layout() -> None:
    snapshot = load_spec("dgx-a100")
    assert [g.numa_node for g in snapshot.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert snapshot.gpus[3].pci_bus_id == "00000000:4E:00.0"
    for gpu in snapshot.gpus:
        assert sorted(p for p, _ in gpu.nvlinks) == sorted(
            g.uuid for g in snapshot.gpus if g is not gpu
        )
        assert {count for _, count in gpu.nvlinks} == {12}
    assert snapshot.cuda_driver_version == 12040
    assert snapshot.driver_version == "550.54.15"


def test_dgx_h100_layout() -> None:
    gpus = load_spec("dgx-h100").gpus
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(len(g.nvlinks) == 7 and {c for _, c in g.nvlinks} == {18} for g in gpus)


def test_mig_profiles_carry_real_mig_sizes() -> None:
    mixed = load_spec("a100-40gb-mig-mixed").gpus
    assert [(m.profile, m.gi, m.memory_mib, m.multiprocessors) for m in mixed[0].mig_devices] == [
        ("3g.20gb", 2, 20096, 42),
        ("2g.10gb", 3, 9984, 28),
        ("1g.5gb", 9, 4864, 14),
        ("1g.5gb", 10, 4864, 14),
    ]
    assert not mixed[1].mig_enabled
    assert mixed[1].mig_devices == ()
    single = load_spec("a100-40gb-mig-single").gpus[0].mig_devices
    assert [(m.profile, m.gi, m.memory_mib) for m in single] == [
        ("1g.5gb", gi, 4864) for gi in range(7, 14)
    ]
    assert single[0].cap_paths == ("/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")


def test_uuids_are_stable_across_runs_and_distinct_across_profiles() -> None:
    here = [g.uuid for name in profile_names() for g in load_spec(name).gpus]
    code = (
        "from gpuslice.adapters.fake import load_spec, profile_names\n"
        "print(' '.join(g.uuid for n in profile_names() for g in load_spec(n).gpus))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert other == here
    migs = [m.uuid for n in profile_names() for g in load_spec(n).gpus for m in g.mig_devices]
    assert len(set(here)) == len(here)
    assert len(set(migs)) == len(migs)


GOOD_NODE = """
name: lab-node
machine: workstation
driver_version: "560.35.03"
gpus:
  - model: t4
    count: 2
    numa_node: 0
    pcie_root: pci0000:00
  - name: NVIDIA L4
    memory_mib: 23034
    compute_capability: "8.9"
    uuid: GPU-11111111-2222-3333-4444-555555555555
    minor: 7
    pci_bus_id: "00000000:c1:00.0"
  - model: a100-40gb
    mig_enabled: true
    mig_devices:
      - {profile: 1c.3g.20gb, gi: 1, ci: 0}
      - profile: 4g.20gb
        gi: 2
        memory_mib: 20000
        cap_paths: [/dev/nvidia-caps/nvidia-cap9, /dev/nvidia-caps/nvidia-cap10]
    processes: [{pid: 77, used_mib: 512}]
nvlink:
  - {gpus: [0, 1], links: 4}
  - {gpus: [0, 1, 2], links: 2}
"""


def test_a_node_file_with_compact_and_explicit_gpus(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(GOOD_NODE)
    snapshot = FakeBackend.from_spec(str(path)).snapshot()
    t4a, t4b, l4, a100 = snapshot.gpus
    assert (t4a.name, t4b.name, t4a.numa_node, t4b.minor) == ("Tesla T4", "Tesla T4", 0, 1)
    assert (t4a.pcie_root, t4b.pcie_root, l4.pcie_root) == ("pci0000:00", "pci0000:00", "")
    assert t4a.uuid != t4b.uuid
    assert t4a.pci_bus_id != t4b.pci_bus_id
    assert (l4.uuid, l4.minor, l4.pci_bus_id) == (
        "GPU-11111111-2222-3333-4444-555555555555",
        7,
        "00000000:C1:00.0",
    )
    assert (l4.compute_capability, l4.memory_mib, l4.mig_capable) == ((8, 9), 23034, False)
    ci_slice, four = a100.mig_devices
    assert (ci_slice.profile, ci_slice.memory_mib, ci_slice.multiprocessors) == (
        "1c.3g.20gb",
        20096,
        14,
    )
    assert (four.memory_mib, four.cap_paths[1]) == (20000, "/dev/nvidia-caps/nvidia-cap10")
    assert [p.pid for p in a100.processes] == [77]
    assert dict(t4a.nvlinks) == {t4b.uuid: 6, l4.uuid: 2}
    assert dict(l4.nvlinks) == {t4a.uuid: 2, t4b.uuid: 2}
    assert (snapshot.machine, snapshot.driver_version, snapshot.cuda_driver_version) == (
        "workstation",
        "560.35.03",
        0,
    )


def test_a_profile_text_is_a_valid_node_file(tmp_path: Path) -> None:
    path = tmp_path / "copy.yaml"
    path.write_text(profile_text("dgx-a100"))
    assert load_spec(str(path)) == load_spec("dgx-a100")


T4_GPU = "name: n\ngpus:\n  - model: t4\n"
A100_MIG = "name: n\ngpus:\n  - model: a100-40gb\n    mig_enabled: true\n    mig_devices: "
H100_MIG = "name: n\ngpus:\n  - model: h100-80gb\n    mig_enabled: true\n    mig_devices: "


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: []\n", "name: missing"),
        ("name: n\n", "gpus: missing"),
        ("- a\n- b\n", "expected a mapping, got a list"),
        ("name: n\ngpus: [}\n", "not valid YAML at line 2"),
        ("name: n\ncolour: red\ngpus: []\n", "colour: unknown key (allowed: name, machine"),
        (T4_GPU + "    vram: 3\n", "gpus[0].vram: unknown key"),
        ("name: n\ngpus:\n  - memory_mib: 5\n", "gpus[0].name: missing (give it, or name a model)"),
        (
            T4_GPU + "    memory_mib: lots\n",
            "gpus[0].memory_mib: expected an integer >= 1, got string 'lots'",
        ),
        (T4_GPU + "    memory_mib: 0\n", "gpus[0].memory_mib: expected an integer >= 1, got 0"),
        (T4_GPU + "    minor: true\n", "gpus[0].minor: expected an integer >= 0, got boolean true"),
        (
            T4_GPU + "    compute_capability: 7.5\n",
            'expected a string "major.minor" (quote it), got number 7.5',
        ),
        (
            T4_GPU + '    compute_capability: "seven"\n',
            'compute_capability: expected "major.minor"',
        ),
        (
            "name: n\ngpus:\n  - model: v100\n",
            "gpus[0].model: unknown model 'v100' (known: t4, a100-40gb",
        ),
        (T4_GPU + "    mig_enabled: true\n", "gpus[0].mig_enabled: true needs a MIG-capable GPU"),
        (T4_GPU + "    mig_devices: []\n", "gpus[0].mig_devices: given but mig_enabled is false"),
        (T4_GPU + "    uuid: GPU-1234\n", "gpus[0].uuid: expected GPU-xxxxxxxx"),
        (T4_GPU + '    pci_bus_id: "07:00.0"\n', 'gpus[0].pci_bus_id: expected "DDDDDDDD:BB:DD.F"'),
        (T4_GPU + "    count: 2\n    minor: 0\n", "gpus[0].minor: not allowed with count > 1"),
        (
            T4_GPU + "    processes: [{pid: 0, used_mib: 1}]\n",
            "gpus[0].processes[0].pid: expected an integer >= 1",
        ),
        (T4_GPU + "  - model: t4\n    minor: 0\n", "gpus: GPU 1 repeats minor 0 (used by GPU 0)"),
        (
            A100_MIG + "[{profile: 1g.5gb}]\n",
            "gpus[0].mig_devices[0].gi: missing",
        ),
        (
            A100_MIG + "[{profile: big, gi: 1}]\n",
            'gpus[0].mig_devices[0].profile: expected "<g>g.<m>gb"',
        ),
        (
            H100_MIG + "[{profile: 1g.12gb, gi: 1}]\n",
            "gpus[0].mig_devices[0].memory_mib: missing (no built-in size for '1g.12gb'",
        ),
        (
            A100_MIG + "[{profile: 1g.5gb, gi: 7}, {profile: 1g.5gb, gi: 7}]\n",
            "gpus: GPU 0 has two MIG devices with gi 7, ci 0",
        ),
        (
            "name: n\ngpus:\n  - model: t4\n    uuid: GPU-11111111-2222-3333-4444-555555555555\n"
            "  - model: t4\n    uuid: GPU-11111111-2222-3333-4444-555555555555\n",
            "gpus: GPU 1 repeats uuid GPU-11111111-2222-3333-4444-555555555555 (used by GPU 0)",
        ),
        (
            T4_GPU + "nvlink: [{gpus: [0, 3], links: 2}]\n",
            "nvlink[0].gpus[1]: expected a distinct GPU index 0..0",
        ),
        (
            T4_GPU + "nvlink: [{gpus: [0], links: 2}]\n",
            "nvlink[0].gpus: expected at least two GPU indexes",
        ),
        (T4_GPU + "  - model: t4\nnvlink: [{gpus: [0, 1]}]\n", "nvlink[0].links: missing"),
    ],
)
def test_a_bad_node_file_gets_one_line_naming_the_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_spec(str(path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"node file {path}: ")
    assert expected in message


def test_an_unknown_spec_names_the_profiles(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a built-in profile \(a100-40gb, .*t4x4\)"):
        FakeBackend.from_spec(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="unknown profile 'dgx-b200'"):
        profile_text("dgx-b200")


def test_the_documented_node_file_example_loads(tmp_path: Path) -> None:
    doc = Path(__file__).parents[2] / "docs" / "hardware.md"
    example = doc.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    snapshot = load_spec(str(path))
    assert [g.name for g in snapshot.gpus] == ["Tesla T4", "Tesla T4", "NVIDIA L4", A100[0]]
    assert [m.profile for m in snapshot.gpus[3].mig_devices] == ["3g.20gb", "1c.3g.20gb", "1g.5gb"]
