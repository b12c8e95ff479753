"""Which named config a node uses: its label, else a default, else the fallbacks.

The rules are upstream config-manager's: a label value must name an existing config; with
no label the default config (which must exist) is used; with neither, the fallback
strategies are tried in order: `named` (an entry literally called "default"), `single`
(the only entry) and `empty` (no config file at all). Entries whose names start with `..`
(the bookkeeping of a mounted ConfigMap) never count. Pure: no I/O.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from gpuslice.core.errors import ConfigError

DEFAULT_LABEL = "nvidia.com/device-plugin.config"
NAMED = "named"
SINGLE = "single"
EMPTY_FALLBACK = "empty"
FALLBACKS = (NAMED, SINGLE, EMPTY_FALLBACK)
DEFAULT_FALLBACKS = (NAMED, SINGLE)  # what upstream's Helm chart sets
NAMED_CONFIG = "default"  # the entry the `named` fallback looks for
EMPTY: Final = None  # Choice.name of the empty config


@dataclass(frozen=True, slots=True)
class Choice:
    """The config to use and why (for logs and the readiness detail)."""

    name: str | None  # an entry of the directory, or EMPTY for the empty config
    reason: str

    @property
    def is_empty(self) -> bool:
        return self.name is EMPTY

    @property
    def shown(self) -> str:
        return "(empty)" if self.name is None else self.name


def check_fallbacks(fallbacks: Sequence[str]) -> tuple[str, ...]:
    """The fallback strategies, checked; raises ConfigError naming an unknown one."""
    for name in fallbacks:
        if name not in FALLBACKS:
            allowed = ", ".join(FALLBACKS)
            raise ConfigError(f"fallback strategy {_q(name)} is unknown; allowed: {allowed}")
    return tuple(fallbacks)


def choose_config(
    label_value: str | None,
    available: Collection[str],
    *,
    default: str | None,
    fallbacks: Sequence[str],
    label: str = DEFAULT_LABEL,
) -> Choice:
    """The config a node with `label_value` uses among `available`. Raises ConfigError."""
    tried = check_fallbacks(fallbacks)
    names = sorted(n for n in available if not n.startswith(".."))
    if label_value:
        found = find_entry(label_value, names)
        return Choice(found, f"label {label}={label_value}")
    if default:
        return Choice(find_entry(default, names), f"label {label} unset; default config")
    for strategy in tried:
        if strategy == NAMED and NAMED_CONFIG in names:
            return Choice(NAMED_CONFIG, f"label {label} unset, no default; fallback named")
        if strategy == SINGLE and len(names) == 1:
            return Choice(names[0], f"label {label} unset, no default; fallback single")
        if strategy == EMPTY_FALLBACK:
            return Choice(EMPTY, f"label {label} unset, no default; fallback empty")
    attempts = f"fallbacks {', '.join(tried)} all failed" if tried else "no fallbacks are set"
    raise ConfigError(
        f"no config selected: label {label} is unset, no default config is set, and "
        f"{attempts}; available: {_listing(names)}"
    )


def find_entry(wanted: str, names: Collection[str]) -> str:
    """The entry `wanted` names: exactly, or a file name without its extension (a100 ->
    a100.yaml). Raises ConfigError listing what is available."""
    if wanted in names:
        return wanted
    stems = sorted(n for n in names if os.path.splitext(n)[0] == wanted)
    if len(stems) == 1:
        return stems[0]
    problem = "is ambiguous" if stems else "does not exist"
    raise ConfigError(f"specified config {_q(wanted)} {problem}; available: {_listing(names)}")


def _listing(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _q(value: str) -> str:
    return json.dumps(value, ensure_ascii=True)
