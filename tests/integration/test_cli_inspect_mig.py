"""`gpuslice inspect --mig-parted-config F --mig-config NAME` as a user runs it on a
simulated node: per GPU the instances the layout would destroy, create and keep, exactly
those the layout planner's steps leave when they run on the simulated GPUs, and the
resources the device plugin would then advertise. Every bad input is one error line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from process_harness import run_once

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.config.mig_parted import load_mig_parted_file
from gpuslice.core.mig_layout import Create, Destroy, MigGpu, SetMode, plan_layout

CONFIG = """version: v1
mig-configs:
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  first-only:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
  h100-halves:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
  all-disabled:
    - devices: all
      mig-enabled: false
  unknown-profile:
    - devices: all
      mig-enabled: true
      mig-devices: {"5g.25gb": 1}
  too-many-slices:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 2, "2g.10gb": 1}
"""


@pytest.fixture
def parted(tmp_path: Path) -> Path:
    path = tmp_path / "mig-parted.yaml"
    path.write_text(CONFIG)
    return path


def inspect(profile: str, parted: Path, name: str, *more: str) -> dict[str, Any]:
    done = run_once("inspect", "--fake-hardware", profile, "--mig-parted-config",
                    str(parted), "--mig-config", name, "--mig-strategy", "mixed",
                    "--output", "json", *more)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def made(profile: str, parted: Path, name: str) -> FakeBackend:
    """The simulated node once the planner's steps have run on it."""
    backend = FakeBackend(load_spec(profile))
    mig = backend.mig_control()
    entries = load_mig_parted_file(parted).entries(name)
    gpus = [
        MigGpu(g, mig.profiles(g.uuid), mig.instances(g.uuid) if g.mig_enabled else ())
        for g in backend.snapshot().gpus
    ]
    for plan in plan_layout(entries, gpus):
        for step in plan.steps:
            if isinstance(step, Destroy):
                mig.destroy(plan.uuid, step.gi)
            elif isinstance(step, SetMode):
                mig.set_mig_mode(plan.uuid, step.enabled)
            elif isinstance(step, Create):
                mig.create(plan.uuid, step.profile, step.placement.start)
    return backend


@pytest.mark.parametrize(
    ("profile", "name"),
    [
        ("a100-40gb-mig-mixed", "all-1g.5gb"),
        ("a100-40gb-mig-mixed", "balanced"),
        ("a100-40gb-mig-mixed", "all-disabled"),
        ("a100-40gb-mig-mixed", "first-only"),
    ],
)
def test_what_inspect_says_a_layout_creates_is_what_running_it_makes(
    profile: str, parted: Path, name: str
) -> None:
    report = inspect(profile, parted, name)
    backend = made(profile, parted, name)
    after = backend.snapshot().gpus
    mig = backend.mig_control()
    wanted: Counter[str] = Counter()
    for shown, gpu in zip(report["gpus"], after, strict=True):
        assert shown["migEnabledAfter"] == gpu.mig_enabled
        now = mig.instances(gpu.uuid) if gpu.mig_enabled else ()
        said = shown["create"] + shown["unchanged"]
        assert sorted((i["profile"], i["start"], i["size"]) for i in said) == sorted(
            (i.profile, i.placement.start, i.placement.size) for i in now
        )
        kept = {i["uuid"] for i in shown["unchanged"]}
        assert kept <= {i.uuid for i in now}  # kept where they are, same device
        wanted.update(f"nvidia.com/mig-{i.profile}" for i in now)
        if not gpu.mig_enabled:
            wanted["nvidia.com/gpu"] += 1
    assert report["resources"] == dict(wanted)


def test_the_table_names_each_change_and_the_resources(parted: Path) -> None:
    done = run_once("inspect", "--fake-hardware", "a100-40gb-mig-mixed",
                    "--mig-parted-config", str(parted), "--mig-config", "all-1g.5gb",
                    "--mig-strategy", "mixed")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"mig-parted config all-1g.5gb of {parted}:",
        "GPU 0 (NVIDIA A100-SXM4-40GB): new layout",
        "  destroy 2g.10gb at {0,2}, GPU instance 3",
        "  destroy 3g.20gb at {4,4}, GPU instance 2",
        "  create 1g.5gb at {0,1}",
        "  create 1g.5gb at {1,1}",
        "  create 1g.5gb at {4,1}",
        "  create 1g.5gb at {5,1}",
        "  create 1g.5gb at {6,1}",
        "  unchanged 1g.5gb at {2,1}, GPU instance 9",
        "  unchanged 1g.5gb at {3,1}, GPU instance 10",
        "GPU 1 (NVIDIA A100-SXM4-40GB): MIG on, resetting the GPU",
        *[f"  create 1g.5gb at {{{s},1}}" for s in range(7)],
        "",
        "the device plugin would then advertise:",
        "  nvidia.com/mig-1g.5gb  14",
    ]


def test_on_hopper_the_mode_changes_without_a_reset(parted: Path) -> None:
    (gpu,) = inspect("h100-80gb", parted, "h100-halves")["gpus"]
    assert (gpu["migEnabled"], gpu["migEnabledAfter"], gpu["modeChangeResets"]) == (
        False,
        True,
        False,
    )


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("unknown-profile", "GPU 0 (NVIDIA A100-SXM4-40GB): no MIG profile 5g.25gb (the GPU has: "),
        ("too-many-slices", "GPU 0 (NVIDIA A100-SXM4-40GB): 1 x 2g.10gb, 2 x 3g.20gb is 8 slices"),
        ("all-1g.10gb", 'mig-parted.yaml: mig-configs: no config "all-1g.10gb"; did you mean'),
    ],
)
def test_a_layout_that_cannot_be_made_is_one_error_line(
    parted: Path, name: str, error: str
) -> None:
    done = run_once("inspect", "--fake-hardware", "a100-40gb-mig-mixed",
                    "--mig-parted-config", str(parted), "--mig-config", name)  # fmt: skip
    assert (done.returncode, done.stdout) == (1, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuslice: error: ")
    assert error in line


@pytest.mark.parametrize(
    ("text", "args", "error"),
    [
        ("version: v2\n", ["--mig-config", "x"], 'version: got "v2"; expected v1'),
        ("[1, 2\n", ["--mig-config", "x"], "mig-parted.yaml"),
        (CONFIG, [], "--mig-parted-config and --mig-config go together"),
    ],
)
def test_a_bad_file_or_a_missing_name_is_one_error_line(
    tmp_path: Path, text: str, args: list[str], error: str
) -> None:
    path = tmp_path / "mig-parted.yaml"
    path.write_text(text)
    done = run_once("inspect", "--fake-hardware", "t4", "--mig-parted-config", str(path), *args)
    assert (done.returncode, done.stdout) == (1, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuslice: error: ")
    assert error in line


def test_a_change_waits_for_the_processes_on_the_gpu(parted: Path) -> None:
    gpus = inspect("dgx-a100", parted, "first-only")["gpus"]
    assert gpus[0]["held"].endswith(" (the whole GPU) by pid 40211, pid 40212")
    assert [g["held"] for g in gpus[1:]] == [""] * 7
    done = run_once("inspect", "--fake-hardware", "dgx-a100", "--mig-parted-config", str(parted),
                    "--mig-config", "first-only")  # fmt: skip
    assert done.stdout.splitlines()[2].startswith("  waits for: GPU-")
    assert done.stdout.splitlines()[2].endswith(" (the whole GPU) by pid 40211, pid 40212")
