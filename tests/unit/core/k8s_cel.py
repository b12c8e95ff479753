"""Evaluate a ValidatingAdmissionPolicy's CEL the way the API server does, as far as a Python
CEL library allows: cel-expr-python (cel-cpp) with the optional and strings extensions that
Kubernetes' base environment has from 1.30 on, plus a stand-in for Kubernetes' Quantity
library, which no Python library has.

The stand-in follows k8s.io/apimachinery's resource.ParseQuantity grammar (sign, decimal
number, a binary SI, decimal SI or exponent suffix) and compares exactly. A quantity is a
tagged string here (the library cannot hold an opaque Python value): its methods refuse an
untagged string, so an expression that forgets quantity() fails as it would in Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_optional, ext_strings

_TAG = "quantity:"
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+\.?[0-9]*|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[eE][+-]?[0-9]+|[numkMGTPE]?)"
)
_BINARY = {p + "i": 1024 ** (i + 1) for i, p in enumerate("KMGTPE")}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    **{p: Fraction(1000 ** (i + 1)) for i, p in enumerate("kMGTPE")},
}


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string; ValueError for anything else."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    value = Fraction(match["number"])
    suffix = match["suffix"]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        value *= Fraction(10) ** int(suffix[1:])
    else:
        value *= _BINARY.get(suffix) or _DECIMAL[suffix]
    return -value if match["sign"] == "-" else value


def _quantity(text: str) -> str:
    value = parse_quantity(text)
    return f"{_TAG}{value.numerator}/{value.denominator}"


def _value(tagged: str) -> Fraction:
    if not tagged.startswith(_TAG):
        raise TypeError(f"no such overload: {tagged!r} is a string, not a quantity")
    return Fraction(tagged.removeprefix(_TAG))


def _compare(a: str, b: str) -> int:
    x, y = _value(a), _value(b)
    return (x > y) - (x < y)


S, B, INT = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT
QUANTITY_LIBRARY = [
    cel.FunctionDecl("quantity", [cel.Overload("string_to_quantity", S, [S], impl=_quantity)]),
    cel.FunctionDecl(
        "isQuantity",
        [cel.Overload("is_quantity_string", B, [S], impl=lambda s: bool(_QUANTITY.fullmatch(s)))],
    ),
    cel.FunctionDecl(
        "compareTo",
        [cel.Overload("quantity_compareTo", INT, [S, S], is_member=True, impl=_compare)],
    ),
    cel.FunctionDecl(
        "isGreaterThan",
        [
            cel.Overload(
                "quantity_isGreaterThan",
                B,
                [S, S],
                is_member=True,
                impl=lambda a, b: _compare(a, b) > 0,
            )
        ],
    ),
    cel.FunctionDecl(
        "isLessThan",
        [
            cel.Overload(
                "quantity_isLessThan",
                B,
                [S, S],
                is_member=True,
                impl=lambda a, b: _compare(a, b) < 0,
            )
        ],
    ),
]
NAMES = ("object", "oldObject", "request", "params", "variables")


class CelError(Exception):
    """An expression failed to compile or evaluate."""


def _env() -> Any:
    return cel.NewEnv(
        variables={n: cel.Type.DYN for n in NAMES},
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings(2)],
        functions=QUANTITY_LIBRARY,
    )


ENV = _env()


def evaluate(expression: str, data: Mapping[str, Any]) -> Any:
    try:
        compiled = ENV.compile(expression)
    except Exception as exc:  # the library raises its own types
        raise CelError(f"{expression}: {exc}") from None
    result = compiled.eval(data={n: data.get(n) for n in NAMES})
    if result.type() == cel.Type.ERROR:
        raise CelError(f"{expression}: {result.value()}")
    return result.plain_value()


@dataclass(frozen=True)
class Verdict:
    matched: bool
    allowed: bool
    message: str = ""


def admit(
    spec: Mapping[str, Any],
    obj: Mapping[str, Any],
    params: Mapping[str, Any] | None,
    *,
    old: Mapping[str, Any] | None = None,
) -> Verdict:
    """A policy spec's answer for one request: its match conditions, then its variables
    (evaluated in order, as the API server makes them available), then each validation."""
    request = {"operation": "UPDATE" if old is not None else "CREATE"}
    data: dict[str, Any] = {"object": obj, "oldObject": old, "request": request}
    data["params"] = params
    for condition in spec.get("matchConditions", []):
        if not evaluate(condition["expression"], data):
            return Verdict(matched=False, allowed=True)
    variables: dict[str, Any] = {}
    data["variables"] = variables
    for variable in spec.get("variables", []):
        variables[variable["name"]] = evaluate(variable["expression"], data)
    for validation in spec["validations"]:
        if not evaluate(validation["expression"], data):
            return Verdict(True, False, evaluate(validation["messageExpression"], data))
    return Verdict(True, True)
