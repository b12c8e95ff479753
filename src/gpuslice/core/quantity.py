"""Sizes as Kubernetes writes them ("10Gi", "512Mi", "1.5G", "42"): the one parser for
every size the agent reads (config files, flags, DRA claims and their opaque config)."""

from __future__ import annotations

import re

# Also the chart's values schema pattern for sizes (tools/gen_chart.py).
PATTERN = r"([0-9]{1,18})(?:\.([0-9]{1,9}))?\s*(Ki|Mi|Gi|Ti|Pi|Ei|[kKMGTPE])?"
_QUANTITY = re.compile(PATTERN)
_UNITS: dict[str, int] = {"": 1, "k": 10**3, **{u: 1000 ** (i + 1) for i, u in enumerate("KMGTPE")}}
_UNITS.update({f"{u}i": 1024 ** (i + 1) for i, u in enumerate("KMGTPE")})
MAX_TEXT = 64  # a quantity is a few characters; a longer text is no size


def parse_bytes(text: str) -> int:
    """The whole number `text` stands for (bytes of a size); a fraction of a byte is
    rounded up, as Kubernetes rounds a memory quantity. Raises ValueError."""
    found = _QUANTITY.fullmatch(text.strip()) if len(text) <= MAX_TEXT else None
    if found is None:
        raise ValueError(f"not a quantity such as 10Gi, 512Mi or 1G: {text[:MAX_TEXT]!r}")
    whole, fraction, unit = str(found[1]), str(found[2] or ""), str(found[3] or "")
    scale = _UNITS[unit]
    tenths: int = 10 ** len(fraction)  # the fraction's denominator
    return int(whole) * scale + -(-int(fraction or 0) * scale // tenths)
