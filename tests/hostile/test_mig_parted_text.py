"""Hostile mig-parted files (the text the mig.config label's layouts come from): an alias
bomb, unknown or bad tags, binary bytes, more than a ConfigMap holds, a FIFO. `inspect
--mig-parted-config` answers each with one line and no traceback, as the layout follower
refuses it (state failed, nothing changed: tests/integration/test_node_mig_manager.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from process_harness import GPUSLICE, clean_env

from gpuslice.config.loader import MAX_BYTES

GOOD = 'version: v1\nmig-configs:\n  one:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {"1g.5gb": 7}\n'  # noqa: E501
BOMB = "version: v1\nx: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"x{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)
TEXTS = {
    "alias bomb": BOMB.encode(),
    "unknown tag": (GOOD + "x: !python/object/apply:os.system ['true']\n").encode(),
    "bad int": GOOD.replace('{"1g.5gb": 7}', '{"1g.5gb": !!int ""}').encode(),
    "binary": b"version: v1\n\x00\xff\xfe" + os.urandom(64),
    "larger than a ConfigMap": b"version: v1\n" + b"#" * MAX_BYTES,
    "deep": ("version: v1\nmig-configs: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
}


def inspect(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUSLICE, "inspect", "--fake-hardware", "a100-40gb", "--mig-parted-config", str(path),
         "--mig-config", "one"],
        capture_output=True, text=True, env=clean_env(), timeout=30, check=False,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuslice: error: "), line
    return line


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_a_hostile_file_is_one_line_naming_it(tmp_path: Path, name: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(TEXTS[name])
    assert str(path) in one_line(inspect(path))


def test_a_fifo_in_the_files_place_is_one_line_and_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # nothing writes it: a blocking read would never return
    assert "not a regular file" in one_line(inspect(fifo))


def test_the_good_file_passes(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    assert inspect(path).returncode == 0
