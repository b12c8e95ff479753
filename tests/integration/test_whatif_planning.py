"""`inspect` and `labels` plan through the agent's own path (core.serving.plan_serving), so
a config the agent refuses on this hardware is refused by them too, in the same one line:
here a memory limit larger than the GPU, which only the hardware can show."""

from __future__ import annotations

from pathlib import Path

import pytest
from process_harness import run_once

TOO_LARGE = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
memoryIsolation:
  resources:
    nvidia.com/gpu:
      hardLimit: 20Gi
"""


@pytest.mark.parametrize(
    "command",
    [
        ("inspect",),
        ("labels", "--oneshot", "--use-node-feature-api=false", "--output-file", ""),
    ],
    ids=["inspect", "labels"],
)
def test_a_limit_larger_than_the_gpu_is_refused_as_the_agent_refuses_it(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    config = tmp_path / "too-large.yaml"
    config.write_text(TOO_LARGE)
    result = run_once(*command, "--fake-hardware", "t4", "--config-file", str(config))
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "memoryIsolation.resources[nvidia.com/gpu]: hardLimit" in lines[0]
    assert "is more than GPU 0 has" in lines[0]
