"""The gpuslice-only memoryIsolation block: loaded into the settings' policy, described by
`config validate`, absent from a config without it (NVIDIA's format unchanged)."""

from __future__ import annotations

from pathlib import Path

from gpuslice.config.loader import load_config_file
from gpuslice.config.options import resolve_options
from gpuslice.config.settings import settings_from
from gpuslice.config.summary import describe, to_dict
from gpuslice.core.isolation import LimitRule, MemoryPolicy

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_block_becomes_the_policy_and_the_flag_turns_it_on() -> None:
    loaded = load_config_file(EXAMPLES / "memory-isolation.yaml")
    on = settings_from(loaded, resolve_options({"memory-isolation": "true"}))
    assert on.memory == MemoryPolicy.of(
        True, {"nvidia.com/gpu": LimitRule(hard=3 << 30, soft=1 << 30)}
    )
    assert not settings_from(loaded, resolve_options({})).memory.enabled
    assert "  nvidia.com/gpu: hardLimit 3Gi, softLimit 1Gi" in describe(loaded.config)


def test_a_config_without_the_block_stays_nvidias_format() -> None:
    loaded = load_config_file(EXAMPLES / "time-slicing.yaml")
    assert loaded.config.memory_isolation is None
    assert "memoryIsolation" not in to_dict(loaded.config)
    assert "memoryIsolation" not in describe(loaded.config)
    policy = settings_from(loaded, resolve_options({"memory-isolation": "true"})).memory
    assert policy == MemoryPolicy.of(True)  # every replica: its GPU's memory / replicas
