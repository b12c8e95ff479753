"""Value rules of the v1 schema: allowed values, their one-line descriptions, the checks.

Every check raises FieldError, which names the field, the value and what is allowed; the
decoder and the flag resolver turn it into a ConfigError that also names where it came from.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable

from gpuslice.core.resources import RESOURCE_PREFIX
from gpuslice.core.response import DISTRIBUTED, ID_INDEX, ID_UUID, LIST_STRATEGIES, PACKED
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, MIG_SINGLE

MIG_STRATEGIES = (MIG_NONE, MIG_SINGLE, MIG_MIXED)
ID_STRATEGIES = (ID_UUID, ID_INDEX)
ALLOCATION_POLICIES = (DISTRIBUTED, PACKED)
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
INFINITE = "infinite"
MAX_NAME_LENGTH = 63
MAX_REPLICAS = 1024  # beyond this a ListAndWatch answer outgrows gRPC's default message size

_NAME_TEXT = (
    f"a resource name: {RESOURCE_PREFIX} followed by a DNS subdomain (lowercase letters, "
    f"digits, '-' and '.'), {MAX_NAME_LENGTH} characters at most in all"
)
_REPLICATED_TEXT = "a non-empty list of {name, replicas} entries (no resources specified)"

# What a field accepts, keyed by its name in the file; used for every message about it.
EXPECTED: dict[str, str] = {
    "version": "v1 (or empty, meaning v1)",
    "migStrategy": "one of " + ", ".join(MIG_STRATEGIES),
    "deviceDiscoveryStrategy": "one of " + ", ".join(DISCOVERY_STRATEGIES),
    "deviceListStrategy": "one of " + ", ".join(LIST_STRATEGIES) + ", or a list of them",
    "deviceIDStrategy": " or ".join(ID_STRATEGIES),
    "sharedDevicesAllocationPolicy": " or ".join(ALLOCATION_POLICIES),
    "sleepInterval": (
        'a duration string such as "60s", "1m30s", "500ms" or "infinite" '
        "(a bare number is refused: upstream reads it as nanoseconds)"
    ),
    "name": _NAME_TEXT,
    "rename": _NAME_TEXT + ", or empty",
    "replicas": f"an integer from 2 to {MAX_REPLICAS}",
    "devices": (
        '"all", a positive count, or a list of GPU indexes (0), MIG indexes ("0:1") or '
        "UUIDs (GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>; <uuid> is "
        "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hex)"
    ),
    "timeSlicing.resources": _REPLICATED_TEXT,
    "mps.resources": _REPLICATED_TEXT,
    "pattern": "a non-empty glob in which * matches anything",
    "channelIDs": "[] or [0]",
}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# Upstream's device references: a GPU index, a MIG index, a GPU UUID, a MIG UUID in its
# current (MIG-<uuid>) or pre-R470 (MIG-GPU-<uuid>/<gi>/<ci>) form.
_DEVICE_REF = re.compile(
    rf"[0-9]+|[0-9]+:[0-9]+|GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/[0-9]+/[0-9]+"
)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_UNIT_SECONDS.update(dict.fromkeys(("us", "µs", "μs"), 1e-6))


class FieldError(ValueError):
    """`field` (its name in the file, maybe with an index: "devices[2]") holds `value`."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        super().__init__(f"{field}: got {show(value)}; expected {expected}")
        self.field = field
        self.value = value
        self.expected = expected


def show(value: object, limit: int = 80) -> str:
    """A value as one short line, written the way YAML/JSON users read it."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return "a very large integer"
    try:
        text = json.dumps(value, ensure_ascii=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = "a nested value that cannot be shown"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def suggest(word: str, known: Iterable[str]) -> str | None:
    """The known word closest to `word`, if any is close enough to be a likely typo."""
    options = list(known)
    folded = {k.lower(): k for k in options}
    if word.lower() in folded:
        return folded[word.lower()]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None


def check_choice(field: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is None or value in allowed:
        return
    hint = suggest(value, allowed)
    expected = EXPECTED[field.split("[")[0]] + (f" (did you mean {hint}?)" if hint else "")
    raise FieldError(field, value, expected)


def resource_name(field: str, value: str) -> str:
    """`value` with the nvidia.com/ prefix added when missing; raises when it is not valid."""
    full = value if value.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + value
    if len(full) > MAX_NAME_LENGTH or not _DNS_SUBDOMAIN.fullmatch(full[len(RESOURCE_PREFIX) :]):
        raise FieldError(field, value, EXPECTED[field])
    return full


def check_devices(value: str | int | tuple[str | int, ...]) -> None:
    if isinstance(value, str):
        if value != "all":
            raise FieldError("devices", value, EXPECTED["devices"])
    elif isinstance(value, int):
        if value <= 0:
            raise FieldError("devices", value, EXPECTED["devices"])
    else:
        if not value:
            raise FieldError("devices", value, EXPECTED["devices"])
        for i, ref in enumerate(value):
            ok = ref >= 0 if isinstance(ref, int) else bool(_DEVICE_REF.fullmatch(ref))
            if not ok:
                raise FieldError(f"devices[{i}]", ref, EXPECTED["devices"])


def duration_seconds(text: str) -> float | None:
    """Seconds in a Go duration string ("1m30s"); None for "infinite". Raises ValueError."""
    if text == INFINITE:
        return None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(text)
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(text)
    return seconds


def check_duration(field: str, value: str | None) -> None:
    if value is None:
        return
    try:
        duration_seconds(value)
    except ValueError:
        raise FieldError(field, value, "a positive " + EXPECTED[field].removeprefix("a ")) from None
