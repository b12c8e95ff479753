"""The environment agent processes are measured in: as close to the runtime image as
this checkout allows.

The image installs requirements/runtime.lock and compiled bytecode. This venv also
holds the dev tools (and one of them pulls in rich, which structlog imports when it
finds it), and the shell may set PYTHONDONTWRITEBYTECODE, so every start would
compile our modules from source. Processes started here therefore get:

- bytecode, cached under bench/results/pycache (PYTHONPYCACHEPREFIX),
- every package of dev.lock that runtime.lock lacks hidden (bench/image_shim),
- no variable the agent reads as a flag.

The baseline processes get the same environment, so ratios stay like for like.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from pathlib import Path

from bench.rigs import REPO
from gpuslice.config.flags import FLAGS

LOCKS = REPO / "requirements"
STATE = REPO / "bench" / "results"
SHIM = Path(__file__).resolve().parent / "image_shim"


def _lock_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith((" ", "#", "-")):
            names.add(_normal(re.split(r"[=<>\[ ;]", line.strip(), maxsplit=1)[0]))
    return names


def _normal(dist: str) -> str:
    return dist.lower().replace("_", "-")


def hidden_modules() -> list[str]:
    """Top-level modules of the distributions only the dev lock has."""
    dev_only = _lock_names(LOCKS / "dev.lock") - _lock_names(LOCKS / "runtime.lock")
    return sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_normal(d) in dev_only for d in dists) and module.isidentifier()
    )


@functools.cache
def _env() -> tuple[tuple[str, str], ...]:
    drop = {var for flag in FLAGS for var in flag.env} | {"NODE_NAME", "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), env.get("PYTHONPATH")) if p)
    env["PYTHONPYCACHEPREFIX"] = str(STATE / "pycache")
    env["GPUSLICE_BENCH_HIDDEN"] = ",".join(hidden_modules())
    return tuple(env.items())


def runtime_env() -> dict[str, str]:
    """The environment for agent and baseline processes (made once per run)."""
    return dict(_env())
