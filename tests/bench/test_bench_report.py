"""The suite's exit status and report when a figure cannot be measured: the other
groups' figures are still reported, the broken one carries its error, and the
command exits 1 (a missed target alone never does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.harness import MS, Figure, Target
from bench.plan import Plan

from bench import __main__ as bench_main


async def _slow_but_measured(plan: Plan) -> list[Figure]:
    return [Figure("slow", "a figure over its target", MS, [3.0, 2.0, 4.0], (Target(1.0),))]


async def _broken(plan: Plan) -> list[Figure]:
    raise RuntimeError("the stand-in never answered")


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *groups: str) -> tuple[int, dict]:
    monkeypatch.setitem(bench_main.GROUPS, "slow", (("slow",), _slow_but_measured))
    monkeypatch.setitem(bench_main.GROUPS, "broken", (("gone",), _broken))
    output = tmp_path / "out.json"
    only = [arg for group in groups for arg in ("--only", group)]
    code = bench_main.main(["--quick", "--output", str(output), *only])
    return code, json.loads(output.read_text(encoding="utf-8"))


def test_a_figure_that_cannot_be_measured_makes_the_run_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _run(monkeypatch, tmp_path, "slow", "broken")
    assert code == 1
    assert report["all_measured"] is False
    assert report["figures"]["gone"]["value"] is None
    assert report["figures"]["gone"]["error"] == "RuntimeError: the stand-in never answered"
    assert report["figures"]["slow"]["value"] == 3.0
    assert json.loads(capsys.readouterr().out) == report


def test_a_missed_target_alone_exits_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, report = _run(monkeypatch, tmp_path, "slow")
    assert code == 0
    slow = report["figures"]["slow"]
    assert (slow["value"], slow["min"], slow["max"], slow["met"]) == (3.0, 2.0, 4.0, False)
