"""The health policies the environment asks for: upstream's XID variables and our
GPUSLICE_HEALTH_* recovery variables.

XID lists (upstream's semantics): DP_DISABLE_HEALTHCHECKS adds a comma list of XIDs to
the skipped set; "all" or "xids" as any entry turns XID health checking off.
DP_ENABLE_HEALTHCHECKS names XIDs that always count, over the defaults and the disables;
"all" makes every XID count. Entries are trimmed and case-insensitive; malformed ones are
ignored and reported in the policy's `warnings`, as upstream ignores them.

Recovery: an unset or empty variable keeps the default. Durations are Go-style strings
("30s", "1m30s") or "infinite": never re-probe (hold-down) or count recoveries forever
(flap window). A bad value is a one-line ConfigError naming the variable. The hold-down
has a floor: a transient mark re-probed every nanosecond would spin a core.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuslice.config.checks import duration_seconds, show
from gpuslice.core.errors import ConfigError
from gpuslice.core.health import DEFAULT_SKIPPED_XIDS, XidPolicy
from gpuslice.core.health_state import RecoveryPolicy

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
HOLDDOWN_ENV = "GPUSLICE_HEALTH_HOLDDOWN"
MAX_FLAPS_ENV = "GPUSLICE_HEALTH_MAX_FLAPS"
FLAP_WINDOW_ENV = "GPUSLICE_HEALTH_FLAP_WINDOW"
FATAL_XIDS_ENV = "GPUSLICE_HEALTH_FATAL_XIDS"

_ALL = frozenset({"all", "xids"})
_DIGITS = re.compile(r"[0-9]+")
_MAX_XID = 2**64 - 1  # upstream parses entries as unsigned 64-bit integers
_DURATION = 'a positive duration such as "30s", "2m" or "1m30s", or "infinite"'
_COUNT = "a whole number, 0 or more (0: never recover)"
_XIDS = 'a comma list of XID numbers such as "48,79,95", or "none"'
_NUMBER = re.compile(r"[0-9]{1,9}")
HOLDDOWN_FLOOR_S = 0.05  # at most 20 re-probes a second: more only burns a core


def xid_policy_from_env(env: Mapping[str, str]) -> XidPolicy:
    """Which XIDs count, from DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS."""
    skip_all, skipped, skip_warnings = _xid_list(DISABLE_ENV, env.get(DISABLE_ENV, ""))
    force_all, forced, force_warnings = _xid_list(ENABLE_ENV, env.get(ENABLE_ENV, ""))
    return XidPolicy(
        skipped=DEFAULT_SKIPPED_XIDS | skipped,
        forced=forced,
        skip_all=skip_all,
        force_all=force_all,
        warnings=skip_warnings + force_warnings,
    )


def recovery_from_env(env: Mapping[str, str]) -> RecoveryPolicy:
    """The recovery policy the env vars ask for. Raises ConfigError naming the variable."""
    default = RecoveryPolicy()
    return RecoveryPolicy(
        holddown_s=_holddown(env, default.holddown_s),
        max_flaps=_count(env, MAX_FLAPS_ENV, default.max_flaps),
        flap_window_s=_duration(env, FLAP_WINDOW_ENV, default.flap_window_s),
        fatal_xids=_xids(env, FATAL_XIDS_ENV, default.fatal_xids),
    )


def _xid_list(name: str, value: str) -> tuple[bool, frozenset[int], tuple[str, ...]]:
    """(everything, XIDs, warnings) for one env var. Any "all"/"xids" entry means
    everything. "0" is upstream's own marker for everything, so it means that too."""
    xids: set[int] = set()
    warnings: list[str] = []
    for raw in value.lower().split(","):
        entry = raw.strip()
        if entry in _ALL:
            return True, frozenset(), tuple(warnings)
        if not entry:
            continue
        if not _DIGITS.fullmatch(entry) or int(entry) > _MAX_XID:
            warnings.append(f"{name}: ignoring {entry!r}: not an XID number, 'all' or 'xids'")
            continue
        if int(entry) == 0:
            warnings.append(f"{name}: XID 0 does not exist; read as 'all', as upstream does")
            return True, frozenset(), tuple(warnings)
        xids.add(int(entry))
    return False, frozenset(xids), tuple(warnings)


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


def _holddown(env: Mapping[str, str], default: float | None) -> float | None:
    seconds = _duration(env, HOLDDOWN_ENV, default)
    if seconds is not None and seconds < HOLDDOWN_FLOOR_S:
        raise _fail(
            HOLDDOWN_ENV,
            env,
            f'a duration of at least {HOLDDOWN_FLOOR_S * 1000:g}ms, or "infinite"',
        )
    return seconds


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
