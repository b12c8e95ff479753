"""No code outside core.strategies decides by a sharing strategy's name: comparing one
(by its constant, its spelling or the strategy object) means a new strategy would have
to be added there too."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuslice
from gpuslice.core import strategies

SRC = Path(gpuslice.__file__).parent
OWN = SRC / "core" / "strategies"
# Every spelling of a sharing strategy: its name, config block and DRA name.
SPELLINGS = frozenset(
    word
    for s in strategies.STRATEGIES
    if s.shares
    for word in (s.name, s.config_key, s.config_attr, s.dra_name)
)
NAME_CONSTANTS = {"gpuslice.core.sharing": {"NONE", "TIME_SLICING", "MPS"}}
STRATEGY_MODULES = ("gpuslice.core.strategies",)
OBJECTS = {n for n, v in vars(strategies).items() if isinstance(v, strategies.Strategy)}
NAMED_FIELDS = {"sharing", "strategy"}  # fields that hold a strategy's name


def _tracked(tree: ast.Module) -> set[str]:
    """Local names bound to a strategy name constant, a spelling or a strategy object."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
            if isinstance(node.value, ast.Tuple) and isinstance(node.targets[0], ast.Tuple):
                pairs = list(zip(node.targets[0].elts, node.value.elts, strict=False))
            for target, value in pairs:
                spelt = isinstance(value, ast.Constant) and value.value in SPELLINGS
                if spelt and isinstance(target, ast.Name):
                    names.add(target.id)
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        for alias in node.names:
            constant = alias.name in NAME_CONSTANTS.get(node.module, ())
            strategy = node.module.startswith(STRATEGY_MODULES) and alias.name in OBJECTS
            if constant or strategy:
                names.add(alias.asname or alias.name)
    return names


def _operands(node: ast.Compare) -> list[ast.expr]:
    out: list[ast.expr] = []
    for side in (node.left, *node.comparators):
        out += side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
    return out


def offences(source: str, where: str) -> list[str]:
    """Each comparison in `source` that decides by a strategy's name."""
    tree = ast.parse(source)
    tracked = _tracked(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = _operands(node)
        strings = [o.value for o in operands if isinstance(o, ast.Constant)]
        named = any(isinstance(o, ast.Attribute) and o.attr in NAMED_FIELDS for o in operands)
        if (
            any(isinstance(o, ast.Name) and o.id in tracked for o in operands)
            or any(isinstance(s, str) and s in SPELLINGS for s in strings)
            or (named and any(isinstance(s, str) for s in strings))
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def test_no_module_outside_the_strategies_compares_a_strategy_name() -> None:
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if OWN not in path.parents
        for hit in offences(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert found == []


def test_the_scan_finds_each_way_of_comparing_a_name() -> None:
    source = (
        "from gpuslice.core.sharing import MPS as NODE_MPS, NONE\n"
        "from gpuslice.core.strategies import TIME_SLICING\n"
        "a = res.sharing == NODE_MPS\n"
        "b = plan.strategy != NONE\n"
        "c = device.sharing in (TIME_SLICING, x)\n"
        "d = config.strategy == 'TimeSlicing'\n"
        "e = res.sharing == 'none'\n"
        "f = 'mps' if key == 'mps' else 'timeSlicing'\n"
        "g = flags.mig_strategy == 'none'\n"  # the MIG strategy: not a way of sharing
        "SLICED, SERVED = 'TimeSlicing', 'MPS'\n"
        "h = asked not in (SLICED, SERVED)\n"
    )
    assert [int(hit.split(":")[1]) for hit in offences(source, "x.py")] == [
        3, 4, 5, 6, 7, 8, 11,
    ]  # fmt: skip
