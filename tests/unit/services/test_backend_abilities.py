"""A backend's optional abilities (MIG control, memory limits, process owners) are asked
for through the port, which answers None where there is none: no service or wiring module
probes a backend or host with hasattr/getattr or casts it to one of the ports."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import gpuslice.core.ports.hardware as hardware
from gpuslice.adapters.fake.backend import FakeBackend

SRC = Path(hardware.__file__).resolve().parents[2]
MODULES = sorted([*(SRC / "services").rglob("*.py"), *(SRC / "wiring").rglob("*.py")])
PORTS = {name for name, obj in vars(hardware).items() if inspect.isclass(obj)}
PORT_MEMBERS = {
    member
    for name in PORTS
    for member in vars(getattr(hardware, name))
    if not member.startswith("_")
}


def _probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        first, name = node.args[0], node.func.id
        where = f"{path.relative_to(SRC)}:{node.lineno}"
        if name == "cast" and ast.unparse(first).split(".")[-1] in PORTS:
            found.append(f"{where} cast to {ast.unparse(first)}")
        if name in ("hasattr", "getattr"):
            subject = ast.unparse(first).lower()
            attr = node.args[1] if len(node.args) > 1 else None
            asked = attr.value if isinstance(attr, ast.Constant) else None
            if "backend" in subject or "host" in subject or asked in PORT_MEMBERS:
                found.append(f"{where} {name}({ast.unparse(first)}, {asked!r})")
    return found


def test_no_service_or_wiring_module_probes_a_backend_or_host() -> None:
    assert MODULES
    assert {"Host", "GpuBackend", "MemoryLimits"} <= PORTS
    assert [probe for path in MODULES for probe in _probes(path)] == []


def test_the_simulated_backend_offers_its_abilities_through_the_port() -> None:
    backend = FakeBackend.from_spec("t4")
    try:
        assert backend.memory_limits() is backend
        assert backend.process_owners() is backend
        assert backend.mig_control() is backend
    finally:
        backend.close()
