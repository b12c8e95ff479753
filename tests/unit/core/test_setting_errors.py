"""The core says what is wrong with a setting, in words; the command line says which flag
(config.flags.explain), with the message it always had."""

from __future__ import annotations

import pytest

from gpuslice.config.flags import explain
from gpuslice.core.admission import check_names
from gpuslice.core.errors import ConfigError, HardwareError, SettingError

from . import builders as b
from .test_mps import plans


def test_a_refused_namespace_is_named_by_the_flag_only_at_the_command_line() -> None:
    with pytest.raises(ConfigError) as err:
        check_names("gs", "kube.system")
    assert "--" not in str(err.value)
    assert str(err.value).startswith("the namespace: 'kube.system' is not a namespace name")
    assert explain(err.value).startswith("--namespace: 'kube.system' is not a namespace name")


def test_a_refused_name_prefix_is_named_by_the_flag_only_at_the_command_line() -> None:
    with pytest.raises(ConfigError) as err:
        check_names("GPU", "ns")
    assert "--" not in str(err.value)
    assert explain(err.value).startswith("--name: 'GPU' cannot prefix object names")


def test_a_pinned_limit_above_the_gpus_memory_is_named_by_the_flag_only_there() -> None:
    with pytest.raises(HardwareError) as err:
        plans(2, b.gpu(0, memory_mib=15360), pinned=20000)
    assert isinstance(err.value, SettingError)
    assert "--" not in str(err.value)
    assert explain(err.value).startswith("--mps-pinned-memory-limit 20000 (MiB) for nvidia.com/gpu")
    assert explain(err.value).endswith("has: 15360 MiB")


def test_other_errors_are_said_as_they_are() -> None:
    assert explain(ConfigError("sharing.mps: bad")) == "sharing.mps: bad"
