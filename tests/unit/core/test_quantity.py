"""One parser for every size the agent reads: what either of the former two accepted
(the budgets' and config's sizes, the DRA claims' quantities) is read the same way."""

from __future__ import annotations

import pytest

from gpuslice.core.dra.fields import quantity_mib
from gpuslice.core.errors import ConfigError
from gpuslice.core.quantity import parse_bytes

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10Gi", 10 * GIB), ("512Mi", 512 * MIB), ("1G", 10**9), ("1.5Gi", 3 * GIB // 2),
        ("42", 42), ("1k", 1000), ("8K", 8000), ("10 Gi", 10 * GIB), ("2Ti", 2 * 2**40),
        ("1Pi", 2**50), ("3E", 3 * 10**18), ("0.5", 1), ("1.0000001Ki", 1025), (" 7Mi ", 7 * MIB),
    ],
)  # fmt: skip
def test_sizes_are_kubernetes_quantities(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    "text", ["", "Gi", "-1Gi", "1.5.5Gi", "1Xi", "1e3", "0x10", "1GiB", "1 2Mi", "9" * 70]
)
def test_what_is_no_quantity_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity such as 10Gi") as caught:
        parse_bytes(text)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 140


@pytest.mark.parametrize("text", ["10Gi", "1.5Gi", "1G", "8000K", "10 Gi", "2097152"])
def test_a_dra_quantity_is_the_same_size_in_whole_mib(text: str) -> None:
    assert quantity_mib(text, "x") == parse_bytes(text) // MIB


def test_a_dra_quantity_keeps_its_field_and_floor() -> None:
    with pytest.raises(ConfigError, match=r"^at.memory: 'lots' is not a memory quantity"):
        quantity_mib("lots", "at.memory")
    with pytest.raises(ConfigError, match=r"is below 1Mi"):
        quantity_mib("4096", "at.memory")
