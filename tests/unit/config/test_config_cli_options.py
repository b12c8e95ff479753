"""How the CLI hands flags and env vars to the agent: settings resolved and checked up
front (cli.command_options, a pure function of the command line and environment), and
the labeller reading GFD_ env vars first."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuslice import cli
from gpuslice.config.flags import apply_flags
from gpuslice.config.v1 import Config

ENV = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single", "GFD_CONFIG_FILE": "/g"}
ENV_CLEARED = {"CONFIG_FILE": "/c"}


def test_labels_reads_gfd_env_vars_first() -> None:
    opts = cli.command_options("labels", [], {**ENV, **ENV_CLEARED})
    assert apply_flags(Config(), opts.flags).flags.mig_strategy == "mixed"
    assert opts.source.file == "/g"


def test_inspect_reads_unprefixed_env_vars_first() -> None:
    opts = cli.command_options("inspect", [], {**ENV, **ENV_CLEARED})
    assert apply_flags(Config(), opts.flags).flags.mig_strategy == "single"
    assert opts.source.file == "/c"


def test_each_command_takes_only_its_own_env_vars_and_types_every_setting() -> None:
    """`run` reads the plugin's variables, not GFD's oneshot; values arrive typed."""
    env = {"GFD_ONESHOT": "true", "GPUSLICE_SAMPLE_INTERVAL": "500ms", "GPUSLICE_ACCOUNTING": "0"}
    run = cli.command_options("run", ["--memory-budget", "nvidia.com/gpu.shared=1Gi"], env)
    assert "oneshot" not in run.flags.explicit
    assert (run.accounting.sample_interval_s, run.accounting.enabled) == (0.5, False)
    assert run.accounting.budgets == {"nvidia.com/gpu.shared": 1024**3}
    labels = cli.command_options("labels", ["--oneshot=true"], {})
    assert apply_flags(Config(), labels.flags).flags.gfd.oneshot is True


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
