"""No module leans on another's private names: an upgrade of lightkube, httpx2 or grpc, or
a change inside one adapter, must fail here or not at all. Each exception below is one
object's own business (its class, module or package), or a library with no public way,
read defensively; a new one must be added here with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuslice.services.supervision import State

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuslice"

ALLOWED = {
    # The same class's other instance.
    ("core/advice_stats.py", "other._bucketed"),
    ("core/advice_stats.py", "other._counts"),
    # Objects of the module itself: the servicer's owner, the backend built by its class.
    ("adapters/dra/server.py", "self._owner._registration_status"),
    ("adapters/nvml/backend.py", "backend._events"),
    ("testing/kubelet/kubelet.py", "self._standin._register"),
    # pynvml names no public probe of whether the driver exports a call; a missing one
    # reads as "not exported".
    ("adapters/nvml/limits.py", "nv._nvmlGetFunctionPointer"),
    # grpc.aio cannot say whether a server is shutting down; read through getattr, absent
    # reads as unknown.
    ("adapters/deviceplugin/server.py", "getattr(server, '_server', None)"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    """self, cls or super(): the object's own names."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return _called(node, ("super",))


def _called(node: ast.expr, names: tuple[str, ...]) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found += [f"from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute):
            if _private(node.attr) and not _own(node.value):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and _called(node, ("getattr", "setattr", "hasattr")):
            name = getattr(node.args[1], "value", None) if len(node.args) > 1 else None
            if isinstance(name, str) and _private(name):
                found.append(ast.unparse(node))
    return found


def test_no_module_reaches_into_another_objects_private_names() -> None:
    used = {
        (str(path.relative_to(SRC)), use)
        for path in SRC.rglob("*.py")
        if "_proto" not in path.parts
        for use in _uses(path)
    }
    assert sorted(used - ALLOWED) == []


def test_the_scan_sees_the_coupling_it_forbids(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from a.b import _unlink\n"
        "http = client._client._client\n"
        "http._transport = t\n"
        "mounts = getattr(http, '_mounts')\n"
        "self._fine = super()._fine()\n"
    )
    assert sorted(_uses(module)) == [
        "client._client",
        "client._client._client",
        "from a.b import _unlink",
        "getattr(http, '_mounts')",
        "http._transport",
    ]


def test_the_supervisor_names_only_its_own_states() -> None:
    """A subclass's states (a plugin's registration, an MPS daemon's wait) are its own."""
    names = {name for name in vars(State) if name.isupper()}
    assert names == {"NEW", "STARTING", "RUNNING", "BACKING_OFF", "STOPPED", "FAILED"}
