"""Configs the device plugin refuses or warns about, end to end: `gpuslice run` as a
process (one error line at start-up), the agent in process (what a container gets, what
the log says), `gpuslice inspect` and `gpuslice config validate`."""

from __future__ import annotations

import json
from pathlib import Path

from agent_harness import GPU, AgentLauncher
from conftest import Logged
from process_harness import run_once

from gpuslice.testing.kubelet import KubeletStandin

IMEX = "version: v1\nimex: {channelIDs: [0], required: %s}\n"
MPS = "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n"


def run_args(tmp_path: Path) -> tuple[str, ...]:
    """`gpuslice run` with no kubelet yet, on an existing plugin directory."""
    return ("run", "--kubelet-socket", str(tmp_path / "kubelet.sock"), "--labels", "false")


def last_error(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert lines, "no error line"
    return lines[-1]


def config_file(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_run_refuses_config_name_with_a_config_directory(tmp_path: Path) -> None:
    (tmp_path / "a100.yaml").write_text("version: v1\n")
    result = run_once(
        *run_args(tmp_path), "--fake-hardware", "dgx-a100", "--config-file", str(tmp_path),
        "--config-name", "a100",
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1:] == [
        f'gpuslice: error: --config-name "a100": not used with the per-node configs of '
        f"{tmp_path}; name the config with --default-config (DEFAULT_CONFIG) or the node "
        "label nvidia.com/device-plugin.config"
    ]
    assert "Traceback" not in result.stderr


def test_run_fails_start_up_when_a_required_imex_channel_is_missing(tmp_path: Path) -> None:
    """As documented and as upstream: no channel device, no start (no NVIDIA_IMEX_CHANNELS=0
    handed to every container)."""
    imex = ("--imex-channel-ids", "0", "--imex-required")
    result = run_once(*run_args(tmp_path), "--fake-hardware", "t4", *imex)
    assert result.returncode == 1
    assert last_error(result.stderr) == (
        "gpuslice: error: imex.required: IMEX channel 0 is required but "
        "/dev/nvidia-caps-imex-channels/channel0 does not exist on this node; start the IMEX "
        "daemon that creates it, or set imex.required (--imex-required, IMEX_REQUIRED) to false"
    )


def test_run_refuses_mps_without_an_mps_root(tmp_path: Path) -> None:
    config = config_file(tmp_path, MPS)
    result = run_once(*run_args(tmp_path), "--fake-hardware", "t4", "--config-file", config)
    assert result.returncode == 1
    assert last_error(result.stderr).startswith('gpuslice: error: flags.mpsRoot: got ""; ')


def test_run_refuses_mps_on_a_mig_enabled_gpu(tmp_path: Path) -> None:
    config = config_file(tmp_path, MPS + "flags: {mpsRoot: /run/nvidia/mps}\n")
    hardware = ("--fake-hardware", "a100-40gb-mig-single")
    result = run_once(*run_args(tmp_path), *hardware, "--config-file", config)
    assert result.returncode == 1
    error = last_error(result.stderr)
    assert error.startswith("gpuslice: error: sharing.mps: GPU 0 (GPU-")
    assert error.endswith(
        ") has MIG enabled, and MPS cannot share a MIG-enabled GPU (as "
        "upstream); disable MIG on it or share with timeSlicing"
    )


async def test_a_present_imex_channel_reaches_every_container(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """The simulated node says which channel device nodes exist (`imex_channels`)."""
    node = config_file(tmp_path, "name: imex\ngpus: [{model: h100-80gb}]\nimex_channels: [0]\n")
    running = await launcher.start(node, config=config_file(tmp_path, IMEX % "true", "c.yaml"))
    await running.registered(kubelet)
    (admitted,) = await kubelet.admit("pod", {"main": {GPU: 1}})
    assert admitted.allocation.envs["NVIDIA_IMEX_CHANNELS"] == "0"


async def test_a_missing_imex_channel_not_required_is_left_out_and_logged(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, logged: Logged
) -> None:
    running = await launcher.start("t4", config=config_file(tmp_path, IMEX % "false"))
    await running.registered(kubelet)
    (admitted,) = await kubelet.admit("pod", {"main": {GPU: 1}})
    assert "NVIDIA_IMEX_CHANNELS" not in admitted.allocation.envs
    details = [e["detail"] for e in logged if e["event"] == "config_warning"]
    assert any("/dev/nvidia-caps-imex-channels/channel0 does not exist" in d for d in details)


async def test_the_run_log_warns_about_a_rule_that_matches_no_device(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, logged: Logged
) -> None:
    """A MIG rule on T4s shares nothing: the node serves 4 whole GPUs and says why."""
    text = "version: v1\nsharing: {timeSlicing: {resources: [{name: mig-1g.5gb, replicas: 4}]}}\n"
    running = await launcher.start("t4x4", config=config_file(tmp_path, text))
    await running.registered(kubelet)
    assert running.served == {GPU: 4}
    details = [e["detail"] for e in logged if e["event"] == "hardware_layout_warning"]
    assert details == [
        "sharing: nvidia.com/mig-1g.5gb matches no device of this node (migStrategy none; "
        "it has nvidia.com/gpu); nothing is shared under that name"
    ]


def test_inspect_warns_about_a_rule_that_matches_no_device(tmp_path: Path) -> None:
    text = "version: v1\nsharing: {timeSlicing: {resources: [{name: mig-1g.5gb, replicas: 4}]}}\n"
    result = run_once(
        "inspect", "--fake-hardware", "t4", "--config-file", config_file(tmp_path, text),
        "--output", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["resources"] == {GPU: 1}
    assert any("nvidia.com/mig-1g.5gb matches no device" in w for w in report["warnings"])
    table = run_once(
        "inspect", "--fake-hardware", "t4", "--config-file", config_file(tmp_path, text)
    )
    assert table.returncode == 0, table.stderr
    # Warnings come first, above the tables a reader would otherwise stop at.
    assert table.stdout.splitlines()[0].startswith("warning: sharing: nvidia.com/mig-1g.5gb")


def test_validate_refuses_a_resource_name_typo_with_a_suggestion(tmp_path: Path) -> None:
    """Hardware-free: the typo is an error on every node, so validate catches it."""
    rule = "{name: nvidia.com/gpus, replicas: 4}"
    path = config_file(
        tmp_path, f"version: v1\nsharing: {{timeSlicing: {{resources: [{rule}]}}}}\n"
    )
    result = run_once("config", "validate", path)
    assert result.returncode == 1
    error = last_error(result.stderr)
    assert f'{path}: sharing.timeSlicing.resources[0].name: got "nvidia.com/gpus"' in error
    assert error.endswith("(did you mean nvidia.com/gpu?)")
