"""Recovery settings from GPUSLICE_HEALTH_* env vars, with one-line errors.

An unset or empty variable keeps the default. Durations are Go-style strings
("30s", "1m30s") or "infinite": never re-probe (hold-down) or count recoveries
forever (flap window).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuslice.config.checks import duration_seconds, show
from gpuslice.core.errors import ConfigError
from gpuslice.core.health_state import RecoveryPolicy

HOLDDOWN_ENV = "GPUSLICE_HEALTH_HOLDDOWN"
MAX_FLAPS_ENV = "GPUSLICE_HEALTH_MAX_FLAPS"
FLAP_WINDOW_ENV = "GPUSLICE_HEALTH_FLAP_WINDOW"
FATAL_XIDS_ENV = "GPUSLICE_HEALTH_FATAL_XIDS"

_DURATION = 'a positive duration such as "30s", "2m" or "1m30s", or "infinite"'
_COUNT = "a whole number, 0 or more (0: never recover)"
_XIDS = 'a comma list of XID numbers such as "48,79,95", or "none"'
_NUMBER = re.compile(r"[0-9]{1,9}")


def recovery_from_env(env: Mapping[str, str]) -> RecoveryPolicy:
    """The recovery policy the env vars ask for. Raises ConfigError naming the variable."""
    default = RecoveryPolicy()
    return RecoveryPolicy(
        holddown_s=_duration(env, HOLDDOWN_ENV, default.holddown_s),
        max_flaps=_count(env, MAX_FLAPS_ENV, default.max_flaps),
        flap_window_s=_duration(env, FLAP_WINDOW_ENV, default.flap_window_s),
        fatal_xids=_xids(env, FATAL_XIDS_ENV, default.fatal_xids),
    )


def _value(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def _fail(name: str, env: Mapping[str, str], expected: str) -> ConfigError:
    return ConfigError(f"{name}: got {show(env[name])}; expected {expected}")


def _duration(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    text = _value(env, name)
    if not text:
        return default
    try:
        return duration_seconds(text)
    except ValueError:
        raise _fail(name, env, _DURATION) from None


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    text = _value(env, name)
    if not text:
        return default
    if not _NUMBER.fullmatch(text):
        raise _fail(name, env, _COUNT)
    return int(text)


def _xids(env: Mapping[str, str], name: str, default: frozenset[int]) -> frozenset[int]:
    text = _value(env, name)
    if not text:
        return default
    if text.lower() == "none":
        return frozenset()
    entries = [e.strip() for e in text.split(",")]
    if not all(_NUMBER.fullmatch(e) and int(e) > 0 for e in entries):
        raise _fail(name, env, _XIDS)
    return frozenset(int(e) for e in entries)
