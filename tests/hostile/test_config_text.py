"""Hostile config text: explicit tags with bad values, unknown tags, alias bombs, a
config larger than a ConfigMap, a FIFO in the config's place. `config validate` answers
each with one line and no traceback; a running agent given one on SIGHUP keeps serving
the last good config (the invariant) and says why in one line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from node_harness import time_slicing
from process_harness import GPUSLICE, clean_env

from gpuslice.config.loader import MAX_BYTES, load_config
from gpuslice.core.errors import ConfigError
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import AgentUnderAttack, Invariant

GPU = "nvidia.com/gpu"
GOOD = time_slicing(4)
# Nine levels of nine aliases: 9**9 (387 million) strings from 400 bytes of text.
BOMB = "version: v1\nx: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"x{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)
BAD_TAGS = {
    "bool": GOOD.replace("replicas: 4", "replicas: 4\n      renameByDefault: !!bool maybe"),
    "timestamp": GOOD + "extra: !!timestamp 2024-01-01x\n",
    "int": GOOD.replace("replicas: 4", "replicas: !!int ''"),
    "unknown": GOOD + "flags: !python/object/apply:os.system ['true']\n",
    "set": GOOD + "flags: !!set {a, b}\n",
}


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUSLICE, "config", "validate", str(path)],
        capture_output=True, text=True, env=clean_env(), timeout=30, check=False,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuslice: error: "), line
    return line


@pytest.mark.parametrize("name", sorted(BAD_TAGS))
def test_a_bad_or_unknown_tag_is_one_line_with_its_place(tmp_path: Path, name: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BAD_TAGS[name])
    line = one_error_line(validate(path))
    assert f"{path}: line " in line
    assert "is not allowed in a config" in line or "not a valid" in line


def test_an_alias_bomb_under_1_kib_fails_fast_with_one_line(tmp_path: Path) -> None:
    assert len(BOMB) < 1024
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    line = one_error_line(validate(path))
    assert time.monotonic() - started < 10  # a process start; unbounded it takes minutes
    assert "once its aliases are expanded" in line


def test_aliases_that_refer_to_themselves_are_refused() -> None:
    with pytest.raises(ConfigError, match="an alias refers to the node that holds it"):
        load_config("version: v1\nflags: &a {x: *a}\n")


def test_a_config_above_the_configmap_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "#" * MAX_BYTES)
    assert f"larger than {MAX_BYTES} bytes" in one_error_line(validate(path))


def test_a_fifo_in_the_configs_place_is_refused_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    assert "not a regular file" in one_error_line(validate(path))


async def _agent(plugin_dir: str, config: Path, agents: list[AgentUnderAttack]) -> AgentUnderAttack:
    agent = await AgentUnderAttack.attack(plugin_dir, "--config-file", str(config))
    agents.append(agent)
    return agent


@pytest.mark.parametrize("hostile", ["bad-tag", "alias-bomb", "fifo", "too-large"])
async def test_a_running_agent_keeps_the_last_good_config(
    plugin_dir: str,
    kubelet: KubeletStandin,
    agents: list[AgentUnderAttack],
    tmp_path: Path,
    hostile: str,
) -> None:
    """A SIGHUP reload of a hostile config: one line, the last good config served."""
    config = tmp_path / "config.yaml"
    config.write_text(GOOD)
    agent = await _agent(plugin_dir, config, agents)
    invariant = await Invariant.baseline(agent, kubelet, {GPU: 4})
    config.unlink()
    if hostile == "fifo":
        os.mkfifo(config)
    else:
        text = {"bad-tag": BAD_TAGS["bool"], "alias-bomb": BOMB}.get(hostile)
        config.write_text(text or GOOD + "#" * MAX_BYTES)
    agent.signal(signal.SIGHUP)
    line = await agent.wait_for_line("config_rejected_keeping_last_good")
    assert "Traceback" not in agent.log
    assert str(config) in line
    await invariant.check()
    assert await agent.stop() == 0


async def test_allocate_is_answered_while_a_1_mib_config_is_read(
    plugin_dir: str, kubelet: KubeletStandin, agents: list[AgentUnderAttack], tmp_path: Path
) -> None:
    """Reading and parsing happen off the event loop: Allocates during a reload of a
    config at the size limit are answered within the invariant's bound."""
    config = tmp_path / "config.yaml"
    config.write_text(GOOD)
    agent = await _agent(plugin_dir, config, agents)
    invariant = await Invariant.baseline(agent, kubelet, {GPU: 4})
    entry = "    - name: nvidia.com/gpu\n      replicas: 4\n      devices: all\n"
    body = GOOD.split("    - name")[0] + entry * ((MAX_BYTES - 200) // len(entry))
    config.write_text(body)
    agent.signal(signal.SIGHUP)
    for _ in range(5):
        await invariant.check()
        await asyncio.sleep(0.05)
    await agent.wait_for_line("config_rejected_keeping_last_good", timeout_s=30)
    await invariant.check()
