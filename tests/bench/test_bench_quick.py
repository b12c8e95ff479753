"""The benchmark suite's quick form runs end to end and reports every figure.

Targets are not asserted here (this machine may be busy); that each figure is measured
and numeric is, so a benchmark that breaks is noticed by CI.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The report's figure names, as docs/benchmarks.md lists them.
FIGURES = {
    "allocate_p50",
    "allocate_p99",
    "preferred_whole_gpus_p99",
    "preferred_replicas_p99",
    "xid_unhealthy_p99",
    "restart_register_p99",
    "restart_register_mixed_p99",
    "list_first_message",
    "config_change_p99",
    "configmap_edit_p50",
    "configmap_edit_p99",
    "process_start",
    "rss_idle",
    "rss_after_allocates",
    "rss_growth",
    "sample_cpu",
    "sample_rss_growth",
    "dra_prepare_1_p50",
    "dra_prepare_1_p99",
    "dra_prepare_8_p50",
    "dra_prepare_8_p99",
    "dra_prepare_shares_p50",
    "dra_prepare_shares_p99",
    "dra_prepare_mig_p50",
    "dra_prepare_mig_p99",
    "dra_prepare_dynamic_mig_p50",
    "dra_prepare_dynamic_mig_p99",
    "dra_prepare_dynamic_mig_mps_p50",
    "dra_prepare_dynamic_mig_mps_p99",
    "dra_publish_after_health_p99",
    "dra_slice_repair_p99",
    "upgrade_gap",
    "upgrade_roll_failures",
    "upgrade_roll_window",
    "metrics_scrape_cached_auth",
    "metrics_scrape_uncached_auth",
    "advise_1000_pods_7d",
    "advise_peak_rss",
    "isolation_allocate_p99",
    "isolation_limit_latency",
    "isolation_cpu_per_100_pods",
    "fleet_idle_requests",
    "fleet_switch_p99",
    "fleet_slow_start_exits",
    "fleet_slow_start",
    "api_restart_reopen_p50",
    "api_restart_reopen_max",
    "api_restart_peak_rps",
    "api_restart_refused_lists_switch_max",
    "mig_layout_change_p99",
}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.timeout(240)
def test_quick_bench_reports_every_figure_as_numbers(tmp_path: Path) -> None:
    """`python -m bench --quick` exits 0 and writes the same JSON it prints, with a
    numeric value, min, max, trial count and target verdict for every figure."""
    output = tmp_path / "quick.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)
    assert json.loads(output.read_text(encoding="utf-8")) == printed
    assert printed["plan"] == "quick"
    assert printed["all_measured"] is True
    figures = printed["figures"]
    assert set(figures) == FIGURES
    for name, fig in figures.items():
        for key in ("value", "min", "max"):
            assert _number(fig[key]), (name, key, fig)
        assert fig["min"] <= fig["value"] <= fig["max"], (name, fig)
        assert fig["trials"] >= 1, name
        assert isinstance(fig["met"], bool), name
        assert fig["target"], name
        if "baseline" in fig:
            assert _number(fig["baseline"]["value"]), name
            assert fig["baseline"]["value"] > 0, name
            assert _number(fig["ratio"]), name
    assert "figure" in done.stderr  # the human table
