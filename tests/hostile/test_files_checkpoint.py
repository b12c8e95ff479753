"""The kubelet's device checkpoint as a hostile file: wrong types, deep nesting, a FIFO,
/dev/zero, a huge file. Reading it never blocks, never reads without bound and never
raises anything but a one-line BackendError; in a running agent the sample says why
(the sampler's one line), and the agent, its NVML worker and Allocate carry on."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_harness import time_slicing

from gpuslice.adapters.podresources import CHECKPOINT_MAX_BYTES, read_checkpoint
from gpuslice.core.errors import BackendError
from gpuslice.core.usage import CheckpointEntry
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import AgentUnderAttack, Invariant

GPU = "nvidia.com/gpu"
ENTRY = {"PodUID": "u", "ContainerName": "c", "ResourceName": GPU, "DeviceIDs": {"0": ["a"]}}
WRONG_TYPES = {
    "entries-not-a-list": {"Data": {"PodDeviceEntries": {"a": 1}}},
    "data-a-list": {"Data": [1, 2]},
    "ids-a-number": {"Data": {"PodDeviceEntries": [{**ENTRY, "DeviceIDs": 7}]}},
    "ids-a-map-of-numbers": {"Data": {"PodDeviceEntries": [{**ENTRY, "DeviceIDs": {"0": 3}}]}},
    "uid-an-object": {"Data": {"PodDeviceEntries": [{**ENTRY, "PodUID": {"x": 1}}]}},
    "top-a-string": "checkpoint",
}


def outcome(path: Path) -> tuple[CheckpointEntry, ...] | str:
    """The entries read, or the one-line error up to its parenthesised detail."""
    try:
        return read_checkpoint(str(path))
    except BackendError as exc:
        message = str(exc)
    assert "\n" not in message
    return message.split(" (")[0]


def write(path: Path, doc: object) -> None:
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", sorted(WRONG_TYPES))
def test_wrong_types_are_skipped_or_one_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    write(path, WRONG_TYPES[name])
    assert outcome(path) in ((), f"kubelet checkpoint {path}: not a device checkpoint")


def test_a_good_entry_beside_a_bad_one_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    write(path, {"Data": {"PodDeviceEntries": [ENTRY, {**ENTRY, "DeviceIDs": [1]}, "x"]}})
    assert read_checkpoint(str(path)) == (CheckpointEntry("u", "c", GPU, ("a",)),)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(BackendError, match="not a device checkpoint"):
        read_checkpoint(str(path))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_special_and_huge_files_are_refused_without_reading_them(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as fh:
            fh.truncate(CHECKPOINT_MAX_BYTES * 64)  # sparse: costs no disk
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        read_checkpoint(str(path))
    assert time.monotonic() - started < 5  # blocked for good on a FIFO before
    message = str(caught.value)
    assert "\n" not in message
    assert ("not a regular file" in message) == (kind != "huge")
    assert (f"larger than {CHECKPOINT_MAX_BYTES} bytes" in message) == (kind == "huge")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["Data", "PodDeviceEntries", "PodUID", "ContainerName",
                         "ResourceName", "DeviceIDs", "x"]), inner, max_size=4),
    max_leaves=20,
).map(lambda doc: json.dumps({"Data": doc}).encode()))  # fmt: skip
def test_any_bytes_give_entries_or_one_line(data: bytes) -> None:
    """Property: whatever the file holds, the reader returns entries or raises a
    one-line BackendError, nothing else."""
    path = Path(f"/tmp/gsh-checkpoint-{os.getpid()}")
    path.write_bytes(data)
    try:
        result = outcome(path)
    finally:
        path.unlink()
    if isinstance(result, str):
        assert result.startswith(f"kubelet checkpoint {path}: ")
    else:
        assert all(isinstance(e, CheckpointEntry) for e in result)


@pytest.fixture
async def kubelet_with_pods(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    """The stand-in serving PodResources too, where AgentUnderAttack reads it."""
    os.makedirs(os.path.join(plugin_dir, "pr"), exist_ok=True)
    socket = os.path.join(plugin_dir, "pr", "kubelet.sock")
    async with KubeletStandin(plugin_dir, socket) as kubelet:
        yield kubelet


async def test_a_fifo_checkpoint_in_a_running_agent(
    plugin_dir: str, kubelet_with_pods: KubeletStandin, agents: list[AgentUnderAttack]
) -> None:
    """The sample fails with one line naming the file; the NVML worker is not blocked
    (samples and a SIGHUP reload go on) and SIGTERM still stops the agent."""
    config = Path(plugin_dir) / "config.yaml"
    config.write_text(time_slicing(2))
    agent = await AgentUnderAttack.attack(
        plugin_dir, "--sample-interval", "100ms", "--config-file", str(config)
    )
    agents.append(agent)
    kubelet = kubelet_with_pods
    invariant = await Invariant.baseline(agent, kubelet, {GPU: 2})
    checkpoint = Path(plugin_dir) / "kubelet_internal_checkpoint"
    checkpoint.unlink(missing_ok=True)
    os.mkfifo(checkpoint)
    line = await agent.wait_for_line("sample_failed")
    assert "kubelet checkpoint" in line
    assert "not a regular file" in line
    await invariant.check()
    config.write_text(time_slicing(3))
    agent.signal(signal.SIGHUP)  # read on the same worker: must not wait behind a FIFO
    await kubelet.wait_for(lambda k: k.serves({GPU: 3}))
    checkpoint.unlink()
    await agent.wait_for_line("sample_recovered")
    assert await agent.stop() == 0
