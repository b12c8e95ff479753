"""How the CLI hands flags and env vars to the agent: settings checked up front, and the
labeller reading GFD_ env vars first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner

from gpuslice import cli, labels_cmd
from gpuslice.config.flags import resolve, setting
from gpuslice.config.v1 import Config
from gpuslice.wiring import RunOptions

ENV = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single", "GFD_CONFIG_FILE": "/g"}
ENV_CLEARED = {"CONFIG_FILE": "/c"}


def captured_labels_options(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> RunOptions:
    seen: list[RunOptions] = []

    async def fake(opts: RunOptions, stop: asyncio.Event, reload: Any = None) -> None:
        seen.append(opts)

    monkeypatch.setattr(labels_cmd, "run_labels", fake)
    result = CliRunner().invoke(cli.main, ["labels"], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_labels_reads_gfd_env_vars_first(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = captured_labels_options(monkeypatch, {**ENV, **ENV_CLEARED})
    assert resolve(Config(), opts.cli_values, opts.env).flags.mig_strategy == "mixed"
    assert setting("config-file", opts.cli_values, opts.env) == "/g"


def test_inspect_reads_unprefixed_env_vars_first(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[RunOptions] = []

    def fake(opts: RunOptions) -> dict[str, Any]:
        seen.append(opts)
        raise SystemExit(0)

    import gpuslice.inspect

    monkeypatch.setattr(gpuslice.inspect, "inspect_node", fake)
    CliRunner().invoke(cli.main, ["inspect"], env={**ENV, **ENV_CLEARED})
    opts = seen[0]
    assert resolve(Config(), opts.cli_values, opts.env).flags.mig_strategy == "single"
    assert setting("config-file", opts.cli_values, opts.env) == "/c"


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (["labels", "--kube-api-qps", "fast"], {},
         'gpuslice: error: --kube-api-qps: got "fast"; expected a number of 0 or more, '
         "such as 5 or 2.5"),
        (["run"], {"KUBE_API_BURST": "many"},
         'gpuslice: error: env KUBE_API_BURST: got "many"; expected an integer from 0 to '
         "2147483647"),
        (["run", "--fallback-strategies", "nmaed"], {},
         'gpuslice: error: --fallback-strategies: got "nmaed"; expected one of named, single, '
         "empty (did you mean named?)"),
    ],
)  # fmt: skip
def test_a_bad_setting_stops_the_command_in_one_line(
    args: list[str], env: dict[str, str], line: str
) -> None:
    result = CliRunner().invoke(cli.main, args, env=env)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [line]


def test_upstreams_flags_are_accepted_by_the_commands_that_take_them() -> None:
    """The plugin's and GFD's flags parse where upstream's binary takes them (a bad value
    is refused by our own check, not as an unknown option)."""
    for command, option in (("run", "--cdi-feature-flags"), ("run", "--cdi-disable-hooks"),
                            ("run", "--kube-api-qps"), ("labels", "--kube-api-qps"),
                            ("labels", "--kube-api-burst"), ("labels", "--pod-name"),
                            ("run", "--pod-name")):  # fmt: skip
        result = CliRunner().invoke(cli.main, [command, f"{option}=", "--mig-strategy=bad"])
        assert result.exit_code == 1, (command, option, result.output)
