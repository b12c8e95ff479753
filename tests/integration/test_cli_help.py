"""`gpuslice COMMAND --help` as a real process: every option of every command has a line
of help, each command lists only the options it uses, and each table flag's help names
its env vars."""

from __future__ import annotations

import re

import click
import pytest
from process_harness import clean_env, run_once

from gpuslice import cli
from gpuslice.config.flags import FLAGS

COMMANDS = {"run": ["run"], "labels": ["labels"], "inspect": ["inspect"]}
COMMANDS |= {"demo": ["demo"], "config validate": ["config", "validate"], "advise": ["advise"]}

# Options a command does not use, so its --help must not list them.
NOT_SHOWN = {
    "run": ["--oneshot", "--kube-api-qps", "--kube-api-burst", "--device-discovery-strategy",
            "--cdi-feature-flags", "--cdi-disable-hooks"],
    "labels": ["--kubelet-socket", "--status-address", "--labels", "--node-label",
               "--config-file-srcdir", "--default-config", "--fallback-strategies",
               "--device-list-strategy", "--device-id-strategy", "--pass-device-specs",
               "--imex-channel-ids", "--cdi-annotation-prefix", "--kube-api-qps",
               "--kube-api-burst", "--fake-events", "--gdrcopy-enabled", "--driver-root"],
    "inspect": ["--kubelet-socket", "--status-address", "--kube-api-qps", "--kube-api-burst",
                "--namespace", "--dra-plugins-dir", "--dra-registry-dir", "--kubeconfig",
                "--pod-name", "--labels",
                "--oneshot", "--sleep-interval", "--output-file", "--no-timestamp",
                "--log-level", "--log-format", "--device-list-strategy",
                "--fail-on-init-error", "--use-node-feature-api", "--config-file-srcdir"],
    "demo": ["--config-file", "--kubelet-socket", "--log-format"],
    "config validate": ["--config-file", "--fake-hardware", "--mig-strategy"],
    "advise": ["--config-file", "--node-name", "--kubeconfig", "--log-format"],
}  # fmt: skip
SHOWN = {
    "run": ["--kubelet-socket", "--status-address", "--config-file", "--fake-hardware",
            "--fake-events", "--log-level", "--log-format", "--node-name", "--labels"],
    "labels": ["--oneshot", "--sleep-interval", "--output-file", "--node-name", "--kubeconfig",
               "--config-file", "--fake-hardware", "--log-level", "--log-format"],
    "inspect": ["--config-file", "--config-name", "--fake-hardware", "--mig-strategy",
                "--output", "--dra", "--dra-driver-name", "--dra-device-plugin-resources",
                "--dra-mig-devices", "--fake-events", "--node-name"],
    "demo": ["--profile", "--verbose"],
    "config validate": ["--config-name"],
    "advise": ["--prometheus", "--prometheus-bearer-token-file", "--prometheus-ca-file",
               "--prometheus-cert-file", "--prometheus-key-file",
               "--prometheus-insecure-skip-verify", "--window", "--namespace", "--output"],
}  # fmt: skip


def options_help(command: list[str]) -> dict[str, str]:
    """Each option of `gpuslice COMMAND --help` (its first long spelling) with its help."""
    result = run_once(*command, "--help", env=clean_env(COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.split(r"\n(?=  -)", section)
    found = {}
    for entry in entries:
        names, _, text = entry.strip().partition("  ")
        spellings = [n.rstrip(",") for n in names.split() if n.startswith("-")]
        longest = max(spellings, key=lambda n: n.startswith("--"))  # the first long one
        found[longest] = " ".join(text.split())
    return found


def _every_command(group: click.Group, path: list[str]) -> list[list[str]]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _every_command(command, [*path, name])
        else:
            found.append([*path, name])
    return found


@pytest.mark.parametrize("command", _every_command(cli.main, []), ids=" ".join)
def test_every_option_of_every_command_has_help(command: list[str]) -> None:
    options = options_help(command)
    assert options
    assert all(options.values()), {o: t for o, t in options.items() if not t}


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_shows_the_options_it_uses_and_no_others(name: str) -> None:
    options = options_help(COMMANDS[name])
    assert set(SHOWN[name]) <= set(options), set(SHOWN[name]) - set(options)
    assert not set(NOT_SHOWN[name]) & set(options), set(NOT_SHOWN[name]) & set(options)


@pytest.mark.parametrize("name", ["run", "labels", "inspect", "advise"])
def test_each_table_flag_shown_names_its_env_vars(name: str) -> None:
    options = options_help(COMMANDS[name])
    for flag in FLAGS:  # advise's own --namespace is not the table's
        if flag.taken_by(name) and f"--{flag.name}" in options:
            assert f"[env: {', '.join(flag.env)};" in options[f"--{flag.name}"], flag.name


@pytest.mark.parametrize("name", ["run", "labels"])
def test_flags_taken_without_effect_are_named_below_the_options(name: str) -> None:
    """Hidden from the option list, still accepted (a DaemonSet's arguments keep working)
    and named in one closing line."""
    result = run_once(name, "--help", env=clean_env(COLUMNS="200"))
    closing = " ".join(result.stdout.split("\n\n")[-1].split())
    assert closing.startswith("Accepted as ")
    assert "--kube-api-qps" in closing
    assert "--kube-api-burst" in closing
