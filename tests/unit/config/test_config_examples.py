"""Every file in examples/ loads; every file in examples/invalid/ fails with the one-line
message written in its first line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.config.loader import load_config_file, load_configmap
from gpuslice.config.summary import describe
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
VALID = sorted(p for p in EXAMPLES.glob("*.yaml") if "configmap" not in p.name)
INVALID = sorted((EXAMPLES / "invalid").glob("*.yaml"))


def replicas(config: Config) -> dict[str, int]:
    """Advertised resource name -> replicas of the block in force."""
    block = config.sharing.replicated
    return {r.advertised_name: r.replicas for r in block.resources} if block else {}


def replicas_in(path: Path) -> dict[str, int]:
    return replicas(load_config_file(path).config)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_example_loads_without_warnings(path: Path) -> None:
    loaded = load_config_file(path)
    assert loaded.warnings == ()
    assert describe(loaded.config)


def test_the_examples_say_what_their_names_say() -> None:
    assert replicas_in(EXAMPLES / "time-slicing.yaml") == {"nvidia.com/gpu": 4}
    assert replicas_in(EXAMPLES / "time-slicing-renamed.yaml") == {"nvidia.com/gpu.shared": 4}
    assert replicas_in(EXAMPLES / "dgx-a100-demo.yaml") == {"nvidia.com/gpu": 4}
    mps = load_config_file(EXAMPLES / "mps.yaml").config.sharing
    assert (mps.strategy, mps.fail_requests_greater_than_one) == ("mps", True)
    assert load_config_file(EXAMPLES / "mig-single.yaml").config.flags.mig_strategy == "single"
    assert load_config_file(EXAMPLES / "mig-mixed.yaml").config.flags.mig_strategy == "mixed"


def test_gpu_operator_style_configmap_has_both_entries() -> None:
    path = EXAMPLES / "time-slicing-configmap.yaml"
    configs = load_configmap(path.read_text(), source=str(path))
    assert sorted(configs) == ["a100-40gb", "tesla-t4"]
    a100 = configs["a100-40gb"].config
    assert a100.flags.mig_strategy == "mixed"
    assert replicas(a100) == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-7g.40gb": 7,
    }
    t4 = configs["tesla-t4"].config
    assert (t4.flags.mig_strategy, replicas(t4)) == ("none", {"nvidia.com/gpu": 4})
    assert load_config_file(path, name="tesla-t4").config == t4


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_fails_with_its_documented_message(path: Path) -> None:
    expected = path.read_text().splitlines()[0].removeprefix("# error: ")
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    assert str(caught.value) == f"{path}: {expected}"


def test_there_are_examples_of_each_kind() -> None:
    assert len(VALID) >= 6
    assert len(INVALID) >= 4
