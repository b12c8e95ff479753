"""`gpuslice run` as a process refuses --config-name with per-node configs in one line."""

from __future__ import annotations

from pathlib import Path

from process_harness import run_once


def test_run_refuses_config_name_with_a_config_directory(tmp_path: Path) -> None:
    (tmp_path / "a100.yaml").write_text("version: v1\n")
    result = run_once(
        "run",
        "--fake-hardware",
        "dgx-a100",
        "--kubelet-socket",
        "",
        "--labels",
        "false",
        "--config-file",
        str(tmp_path),
        "--config-name",
        "a100",
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1:] == [
        f'gpuslice: error: --config-name "a100": not used with the per-node configs of '
        f"{tmp_path}; name the config with --default-config (DEFAULT_CONFIG) or the node "
        "label nvidia.com/device-plugin.config"
    ]
    assert "Traceback" not in result.stderr
