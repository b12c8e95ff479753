"""The GPU's compute-policy time slice: nvidia-smi's command line as NVIDIA's DRA driver
runs it (here against a stand-in executable, never a real GPU's setting), its failure in
one line, and the simulated GPUs' setting shared through a file beside the events file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.adapters.fake.time_slices import FakeTimeSlices
from gpuslice.adapters.nvml.time_slices import NvidiaSmiTimeSlices
from gpuslice.core.errors import BackendError


def stand_in(tmp_path: Path, exit_code: int) -> tuple[str, Path]:
    record = tmp_path / "args"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {record}\necho "Insufficient Permissions\n for GPU" >&2\n'
        f"exit {exit_code}\n"
    )
    os.chmod(script, 0o755)
    return str(script), record


def test_the_interval_is_set_with_nvidia_smi_compute_policy(tmp_path: Path) -> None:
    binary, record = stand_in(tmp_path, 0)
    slices = NvidiaSmiTimeSlices(binary)
    slices.set_time_slice("GPU-1", "Long")
    assert record.read_text().split() == ["compute-policy", "-i", "GPU-1", "--set-timeslice=3"]
    assert slices.time_slice("GPU-1") == "Long"


def test_a_refusal_is_one_line(tmp_path: Path) -> None:
    binary, _ = stand_in(tmp_path, 4)
    slices = NvidiaSmiTimeSlices(binary)
    with pytest.raises(BackendError) as err:
        slices.set_time_slice("GPU-1", "Short")
    assert str(err.value).endswith("exit 4: Insufficient Permissions for GPU")
    assert slices.time_slice("GPU-1") is None
    with pytest.raises(BackendError, match="not one of Default, Short, Medium, Long"):
        slices.set_time_slice("GPU-1", "Fast")


def test_simulated_settings_are_shared_beside_the_events_file(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    FakeTimeSlices(events).set_time_slice("GPU-1", "Short")
    assert FakeTimeSlices(events).time_slice("GPU-1") == "Short"  # another process's view
    assert FakeTimeSlices().time_slice("GPU-1") is None
