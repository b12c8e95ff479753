"""Loaded by benchmarked processes (bench.runtime_env puts this folder on PYTHONPATH):
the packages named in GPUSLICE_BENCH_HIDDEN fail to import, as in the runtime image."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


class _NotInImage:
    hidden = frozenset(os.environ.get("GPUSLICE_BENCH_HIDDEN", "").split(","))

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in self.hidden:
            raise ImportError(f"{name} is not in the runtime image")
        return None


sys.meta_path.insert(0, _NotInImage())
