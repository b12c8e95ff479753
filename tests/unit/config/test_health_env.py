"""recovery_from_env: GPUSLICE_HEALTH_* variables, defaults and one-line errors."""

from __future__ import annotations

import pytest

from gpuslice.config.health_env import recovery_from_env
from gpuslice.core.errors import ConfigError
from gpuslice.core.health_state import FATAL_XIDS, RecoveryPolicy


def test_no_variables_give_the_defaults() -> None:
    policy = recovery_from_env({})
    assert policy == RecoveryPolicy()
    assert (policy.holddown_s, policy.max_flaps, policy.flap_window_s) == (30.0, 3, 600.0)
    assert policy.fatal_xids == FATAL_XIDS


def test_empty_values_keep_the_defaults() -> None:
    env = dict.fromkeys(("HOLDDOWN", "MAX_FLAPS", "FLAP_WINDOW", "FATAL_XIDS"), " ")
    assert recovery_from_env({f"GPUSLICE_HEALTH_{k}": v for k, v in env.items()}) == (
        RecoveryPolicy()
    )


def test_each_variable_is_read() -> None:
    policy = recovery_from_env(
        {
            "GPUSLICE_HEALTH_HOLDDOWN": "1m30s",
            "GPUSLICE_HEALTH_MAX_FLAPS": "5",
            "GPUSLICE_HEALTH_FLAP_WINDOW": "1h",
            "GPUSLICE_HEALTH_FATAL_XIDS": "79, 48",
        }
    )
    assert policy == RecoveryPolicy(
        holddown_s=90.0, max_flaps=5, flap_window_s=3600.0, fatal_xids=frozenset({48, 79})
    )


def test_infinite_and_none_have_their_meanings() -> None:
    policy = recovery_from_env(
        {
            "GPUSLICE_HEALTH_HOLDDOWN": "infinite",
            "GPUSLICE_HEALTH_FLAP_WINDOW": "infinite",
            "GPUSLICE_HEALTH_FATAL_XIDS": "NONE",
            "GPUSLICE_HEALTH_MAX_FLAPS": "0",
        }
    )
    assert policy == RecoveryPolicy(
        holddown_s=None, max_flaps=0, flap_window_s=None, fatal_xids=frozenset()
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "GPUSLICE_HEALTH_HOLDDOWN",
            "30",
            'GPUSLICE_HEALTH_HOLDDOWN: got "30"; expected a positive duration such as '
            '"30s", "2m" or "1m30s", or "infinite"',
        ),
        ("GPUSLICE_HEALTH_HOLDDOWN", "0s", None),
        (
            "GPUSLICE_HEALTH_HOLDDOWN",
            "1ns",
            'GPUSLICE_HEALTH_HOLDDOWN: got "1ns"; expected a duration of at least 50ms, '
            'or "infinite"',
        ),
        ("GPUSLICE_HEALTH_HOLDDOWN", "49ms", None),
        ("GPUSLICE_HEALTH_HOLDDOWN", "-5s", None),
        ("GPUSLICE_HEALTH_FLAP_WINDOW", "ten minutes", None),
        (
            "GPUSLICE_HEALTH_MAX_FLAPS",
            "-1",
            'GPUSLICE_HEALTH_MAX_FLAPS: got "-1"; expected a whole number, 0 or more '
            "(0: never recover)",
        ),
        ("GPUSLICE_HEALTH_MAX_FLAPS", "2.5", None),
        ("GPUSLICE_HEALTH_MAX_FLAPS", "9" * 40, None),
        (
            "GPUSLICE_HEALTH_FATAL_XIDS",
            "48,x",
            'GPUSLICE_HEALTH_FATAL_XIDS: got "48,x"; expected a comma list of XID numbers '
            'such as "48,79,95", or "none"',
        ),
        ("GPUSLICE_HEALTH_FATAL_XIDS", "48,,79", None),
        ("GPUSLICE_HEALTH_FATAL_XIDS", "0", None),
    ],
)
def test_bad_values_raise_one_line_errors_naming_the_variable(
    name: str, value: str, message: str | None
) -> None:
    with pytest.raises(ConfigError) as err:
        recovery_from_env({name: value})
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{name}: got ")
    if message is not None:
        assert text == message
