"""The composition root composes and decides nothing: it stays small, asks the chosen host
instead of whether the hardware is simulated, types the API by its ports instead of
probing it, builds each object whole instead of patching it afterwards, and re-exports no
testing kit."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import gpuslice.wiring
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import ConfigError
from gpuslice.wiring.host import host

WIRING = Path(gpuslice.wiring.__file__).parent
MODULES = sorted(WIRING.glob("*.py"))
MAX_LINES = 350


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_every_wiring_module_is_small() -> None:
    assert MODULES, WIRING
    long = {p.name: n for p in MODULES if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert long == {}


def test_only_the_host_choice_asks_for_simulated_hardware() -> None:
    asked = {
        (p.name, node.lineno)
        for p in MODULES
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.Attribute) and node.attr in {"fake_hardware", "fake_events"}
    }
    assert {name for name, _ in asked} == {"host.py"}
    (chooser,) = (
        f
        for f in _tree(WIRING / "host.py").body
        if isinstance(f, ast.FunctionDef) and f.name == "host"
    )
    inside = set(range(chooser.lineno, (chooser.end_lineno or chooser.lineno) + 1))
    assert {line for _, line in asked} <= inside


def test_no_duck_typing_patching_or_kit_reexport() -> None:
    for path in MODULES:
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                probes = {"hasattr", "getattr", "isinstance"}
                assert node.func.id not in probes, (path.name, node.lineno)
            if isinstance(node, ast.Assign):  # `mps.notify = ...` after building
                for target in node.targets:
                    assert not isinstance(target, ast.Attribute), (path.name, node.lineno)
        top = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert "__getattr__" not in top, path.name
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.startswith("gpuslice.testing")}, path.name


def test_the_host_is_chosen_by_the_options() -> None:
    real = host(resolve_options(command="run"))
    simulated = host(resolve_options(command="run", fake_hardware="t4"))
    assert type(real).__name__ == "RealHost"
    assert type(simulated).__name__ == "SimulatedHost"
    assert simulated.control_devices() == ()
    assert simulated.mps_binary()[1:] == ["-m", "gpuslice.testing.mps_control"]


def test_the_host_is_built_once_per_command_and_handed_on() -> None:
    """host(opts) is called once where a command's composition starts (a node's parts,
    the labeller, inspect, inspect of a MIG layout); every other builder is handed it."""
    src = WIRING.parent
    calls = Counter(
        (str(path.relative_to(src)), top.name)
        for path in sorted(src.rglob("*.py"))
        for top in _tree(path).body
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(top)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "host"
    )
    assert calls == {
        ("wiring/agent.py", "parts"): 1,
        ("wiring/commands.py", "labels_node"): 1,
        ("commands/inspect.py", "inspect_node"): 1,
        ("commands/inspect_mig.py", "inspect_mig"): 1,
    }


def test_nothing_patches_the_options_after_they_are_resolved() -> None:
    """The compositions take RunOptions as resolved (own_plugin_dir included)."""
    src = WIRING.parent
    for path in [*MODULES, *sorted((src / "commands").glob("*.py")), src / "cli.py"]:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("replace"):
                patched = [a for a in node.args[:1] if ast.unparse(a) in {"opts", "options"}]
                assert not patched, (str(path), node.lineno)


def test_dra_flags_are_checked_when_the_options_are_resolved() -> None:
    with pytest.raises(ConfigError, match=r"^--dra \(GPUSLICE_DRA\): "):
        resolve_options({"dra": "true"}, command="run")
    assert resolve_options({"dra": "true"}, command="inspect").dra is not None


def test_mps_control_loads_none_of_the_agent() -> None:
    """`gpuslice mps-control` runs on every MPS node as long as its daemons: its
    composition loads the MPS adapter, not the agent's services or front-ends."""
    code = (
        "import json, sys\n"
        "import gpuslice.commands.mps_control, gpuslice.wiring.mps_control\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = json.loads(out.stdout)
    assert "gpuslice.adapters.mps" in loaded
    heavy = ("gpuslice.services", "gpuslice.frontends", "gpuslice.wiring.agent", "grpc")
    assert [m for m in loaded if m.startswith(heavy)] == []
