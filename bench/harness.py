"""Figures, their statistics and targets, the JSON report and the stderr table.

A figure is measured in repeated trials; its value is the median of the trial values,
with their min and max. Where a baseline is measured alongside (same trials, same
process, same kind of socket), `ratio` is the median of the per-trial ratios, so
machine noise that hits both sides of one trial cancels out.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MS = "ms"
S = "s"
MIB = "MiB"


def now() -> float:
    """Monotonic seconds (the clock every latency is taken with)."""
    return time.perf_counter()


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the two nearest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Target:
    """`on` is "value" or "ratio"; met when that is at most `limit`."""

    limit: float
    on: str = "value"

    def met(self, value: float, ratio: float | None) -> bool:
        subject = value if self.on == "value" else ratio
        return subject is not None and subject <= self.limit

    def text(self, unit: str) -> str:
        return f"<= {self.limit:g} {unit}" if self.on == "value" else f"ratio <= {self.limit:g}"


@dataclass
class Figure:
    """One reported number: per-trial values, optionally a paired baseline per trial."""

    name: str
    title: str
    unit: str
    values: list[float]
    targets: tuple[Target, ...] = ()
    baseline: list[float] | None = None
    baseline_name: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return statistics.median(self.values)

    @property
    def ratio(self) -> float | None:
        if not self.baseline:
            return None
        pairs = [v / b for v, b in zip(self.values, self.baseline, strict=True) if b > 0]
        return statistics.median(pairs) if pairs else None

    @property
    def met(self) -> bool:
        return all(t.met(self.value, self.ratio) for t in self.targets)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": self.title,
            "value": _round(self.value),
            "unit": self.unit,
            "min": _round(min(self.values)),
            "max": _round(max(self.values)),
            "trials": len(self.values),
        }
        if self.baseline:
            out["baseline"] = {
                "what": self.baseline_name,
                "value": _round(statistics.median(self.baseline)),
                "min": _round(min(self.baseline)),
                "max": _round(max(self.baseline)),
            }
            ratio = self.ratio
            out["ratio"] = None if ratio is None else _round(ratio)
        out["target"] = " and ".join(t.text(self.unit) for t in self.targets) or None
        out["met"] = self.met
        out.update(self.detail)
        return out


def failed(name: str, error: str) -> dict[str, Any]:
    """The JSON of a figure that could not be measured."""
    return {"title": name, "value": None, "error": error, "met": False}


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def table(figures: dict[str, dict[str, Any]]) -> str:
    """A short human table of the JSON figures."""
    rows = [("figure", "value", "min..max", "baseline", "ratio", "target", "met")]
    for name, fig in figures.items():
        if fig.get("value") is None:
            rows.append((name, "ERROR", fig.get("error", "")[:60], "", "", "", "no"))
            continue
        unit = fig["unit"]
        base = fig.get("baseline")
        ratio = fig.get("ratio")
        rows.append(
            (
                name,
                f"{fig['value']:g} {unit}",
                f"{fig['min']:g}..{fig['max']:g}",
                f"{base['value']:g} {unit}" if base else "",
                f"{ratio:.2f}" if ratio is not None else "",
                fig["target"] or "",
                "yes" if fig["met"] else "NO",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
