"""The agent runs on every GPU node: its dependencies and imports stay lean."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HEAVY = ("kubernetes", "kubernetes_asyncio", "pydantic", "rich", "typer")
LOCK = Path(__file__).resolve().parents[2] / "requirements" / "runtime.lock"

# The dev environment has rich (a linter needs it); the runtime image does not.
# Hide the heavy packages as the image would, then import the whole agent.
PROBE = """
import importlib.abc, json, sys
HEAVY = set(sys.argv[1].split(","))
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(name + " is not in the runtime image")
sys.meta_path.insert(0, Absent())
import gpuslice.cli, gpuslice.wiring.run, gpuslice.services.agent
import gpuslice.adapters.deviceplugin.server
rss = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) // 1024
print(json.dumps({"rss_mib": rss, "modules": len(sys.modules)}))
"""


def test_runtime_lock_has_none_of_the_heavy_packages() -> None:
    """What ships to every node excludes the official client, pydantic, rich and typer."""
    names = {
        re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower().replace("_", "-")
        for line in LOCK.read_text().splitlines()
        if line and not line.startswith((" ", "#"))
    }
    assert "grpcio" in names  # the file is the lock we think it is
    assert not names & {h.replace("_", "-") for h in HEAVY}


def test_agent_imports_work_without_heavy_packages_and_stay_small() -> None:
    """The agent, CLI and gRPC server import without them, in under 60 MiB of RSS."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HEAVY)], check=True, capture_output=True, text=True
    )
    probe = json.loads(out.stdout)
    assert 0 < probe["rss_mib"] < 60, probe


ONLY_WHEN_USED = (
    "lightkube",
    "gpuslice.adapters.kube",
    "gpuslice.adapters.nvml",
    "gpuslice.adapters.nfd_file",
    "gpuslice.adapters.status_http",
    "gpuslice.adapters.metrics",
    "prometheus_client",
    "gpuslice.testing",
    "gpuslice.frontends.dra",  # --dra
    "gpuslice.core.dra.claims",
    "gpuslice.core.dra.slices",
    "gpuslice.services.mig_manager",  # --mig-parted-config
    "gpuslice.config.mig_parted",
)


def test_what_a_run_may_not_need_is_imported_only_when_used() -> None:
    """The Kubernetes client, NVML, the features file, the probe server and Prometheus'
    client load only when a run uses them: each costs start-up time on every node."""
    code = (
        "import json, sys\n"
        "import gpuslice.cli, gpuslice.wiring.run, gpuslice.adapters.fake\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = json.loads(out.stdout)
    assert "gpuslice.services.agent" in loaded  # the probe imported the agent
    early = [m for m in loaded if any(m == p or m.startswith(f"{p}.") for p in ONLY_WHEN_USED)]
    assert early == []
