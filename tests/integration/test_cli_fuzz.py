"""Bad values for every option and env var of `run`, `labels`, `inspect` and `config
validate`, each in its own real `gpuslice` process: none ends in a traceback, and a value
the command refuses ends it non-zero with one error line naming the option, its env var
or the value.

Each option and each env var gets one bad value, taken in turn from BAD so that every
kind of value meets many kinds of flag (`config validate` gets all of them). A free-form
value (FREE_FORM: names, paths read or written later, lists without effect) and an empty
value where empty has a documented meaning (EMPTY_OK) may be accepted: the command then
runs (`run` still running after RUNNING_S, `labels --oneshot` and `inspect` exiting 0) or
refuses it in one line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from agent_harness import remove_dir, short_dir
from process_harness import GPUSLICE, clean_env

from gpuslice import cli
from gpuslice.config.flags import COUNT, FLAGS, NUMBER

HUGE = "x" * 5000
NON_UTF8 = b"\xff\xfe"
BAD: list[str | bytes] = ["", "-1", "abc", "99999", "::::", "MISSING", "DIR", HUGE, NON_UTF8]
RUNNING_S = 3.0  # how long an accepted value lets `run` run before the case ends
EXIT_WITHIN_S = 60.0  # generous: a loaded machine starts Python slowly
WORKERS = 4

# Any value is allowed by design: a name, a path used later (it may appear, or is created),
# a list that has no effect. The command may run with it.
FREE_FORM = {
    "--mps-root", "--driver-root", "--dev-root", "--cdi-annotation-prefix",
    "--nvidia-cdi-hook-path", "--driver-root-ctr-path", "--output-file",
    "--machine-type-file", "--kubelet-socket", "--cdi-feature-flags", "--cdi-disable-hooks",
    "--cdi-spec-dir", "--node-name", "--node-label", "--default-config", "--namespace",
    "--pod-name", "--fake-events", "--config-name", "--pod-resources-socket", "--proc-root",
    "--mps-control-binary",  # run only under sharing.mps; a bad one holds MPS replicas back
    "--mps-control-socket",  # the same: a socket nobody serves holds MPS replicas back
    "--dra-plugins-dir", "--dra-registry-dir",  # used (created) only with --dra
    "--dra-driver-name",  # a DNS subdomain ("abc" is one); others are refused in one line
    "--cgroup-root",  # a mount point, read only with --memory-isolation (or shown by inspect)
    "--status-socket",  # a socket path the agent creates, beside --status-address
}  # fmt: skip
# Empty means unset or off: no config file, in-cluster config, no probe endpoint, NVML,
# no IMEX channels, no per-node configs (from a directory or the API), no fallbacks, no
# per-resource memory budgets (the replica's share), /metrics on the status address.
EMPTY_OK = {
    "--config-file", "--kubeconfig", "--status-address", "--fake-hardware",
    "--imex-channel-ids", "--config-file-srcdir", "--fallback-strategies", "--config-map",
    "--memory-budget", "--metrics-address",
    "--dra-device-plugin-resources",  # none kept on the device-plugin API
}  # fmt: skip
# A directory is a mounted ConfigMap: what is in it decides (an empty one is refused in
# one line that says so).
DIR_OK = {"--config-file", "--config-file-srcdir"}
# 99999 is a valid number of API queries or requests.
NUMBER_OK = {f"--{flag.name}" for flag in FLAGS if flag.kind in (NUMBER, COUNT)}
ENV_OPTION = {var: f"--{flag.name}" for flag in FLAGS for var in flag.env}


@dataclass(frozen=True)
class Case:
    argv: list[str | bytes]
    env: dict[str, str | bytes]
    option: str  # the long option fuzzed (directly or through `var`)
    var: str | None
    value: str | bytes
    bad: str | bytes  # the entry of BAD it came from

    @property
    def may_run(self) -> bool:
        if self.argv[0] == "config":  # validate refuses every bad path and name
            return False
        return (
            self.option in FREE_FORM
            or (self.value == "" and self.option in EMPTY_OK)
            or (self.value == "99999" and self.option in NUMBER_OK)
            or (
                isinstance(self.value, str)
                and self.value.endswith("/dir")
                and self.option in DIR_OK
            )
        )

    def __str__(self) -> str:
        shown = self.value if len(self.value) < 40 else f"{self.value[:20]!r}..."
        return f"{self.var or self.option}={shown!r}"


def _base(command: str, tmp: Path, i: int) -> dict[str, str]:
    """Options that make case `i` quick and self-contained (an agent gets a device-plugin
    directory of its own); the fuzzed option replaces its own entry."""
    if command == "run":
        plugins = tmp / f"plugins-{i}"
        plugins.mkdir()
        return {
            "--fake-hardware": "t4",
            "--kubelet-socket": str(plugins / "kubelet.sock"),
            "--labels": "false",
            "--node-name": "fuzz-node",  # so that --kubeconfig is used
            "--log-level": "warning",
        }
    if command == "labels":
        return {
            "--fake-hardware": "t4",
            "--oneshot": "true",
            "--use-node-feature-api": "false",
            "--output-file": str(tmp / "features"),
            "--node-name": "fuzz-node",
            "--log-level": "warning",
        }
    if command == "mps-control":
        return {"--mps-root": str(tmp / f"mps-{i}"), "--log-level": "warning"}
    return {"--fake-hardware": "t4"}


def _value(value: str | bytes, tmp: Path) -> str | bytes:
    if value == "MISSING":
        return str(tmp / "missing" / "file")
    return str(tmp / "dir") if value == "DIR" else value


def _cases(command: str, tmp: Path) -> list[Case]:
    params = [p for p in cli.main.commands[command].params if isinstance(p, click.Option)]
    options = [max(p.opts, key=lambda o: o.startswith("--")) for p in params if p.name != "help"]
    variables = [var for flag in FLAGS if flag.taken_by(command) for var in flag.env]
    cases = []
    for i, option in enumerate(options):
        bad = BAD[i % len(BAD)]
        value = _value(bad, tmp)
        given = {**_base(command, tmp, i), option: value}
        argv = [command, *(f"{o}=".encode() + v if isinstance(v, bytes) else f"{o}={v}"
                           for o, v in given.items())]  # fmt: skip
        cases.append(Case(argv, {}, option, None, value, bad))
    for i, var in enumerate(variables):
        bad = BAD[(i + 4) % len(BAD)]
        value = _value(bad, tmp)
        option = ENV_OPTION[var]
        base = _base(command, tmp, len(options) + i)
        rest = {o: v for o, v in base.items() if o != option}
        cases.append(Case([command, *(f"{o}={v}" for o, v in rest.items())], {var: value},
                          option, var, value, bad))  # fmt: skip
    return cases


def _validate_cases(tmp: Path) -> list[Case]:
    configmap = str(
        Path(__file__).resolve().parents[2] / "examples" / "time-slicing-configmap.yaml"
    )
    cases = []
    for bad in BAD:
        value = _value(bad, tmp)
        cases.append(Case(["config", "validate", "--", value], {}, "PATH", None, value, bad))
        cases.append(Case(["config", "validate", configmap, "--config-name", value], {},
                          "--config-name", None, value, bad))  # fmt: skip
    return cases


@dataclass
class Outcome:
    case: Case
    returncode: int | None  # None: still running after RUNNING_S
    output: str


def _run(case: Case, cwd: Path) -> Outcome:
    env: dict[bytes, bytes] = {k.encode(): v.encode() for k, v in clean_env().items()}
    env.update({k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in case.env.items()})
    argv = [GPUSLICE.encode(), *(a if isinstance(a, bytes) else a.encode() for a in case.argv)]
    wait = RUNNING_S if case.may_run and case.argv[0] in ("run", "mps-control") else EXIT_WITHIN_S
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=wait)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        returncode = None
    return Outcome(case, returncode, out.decode("utf-8", "replace"))


def _problem(outcome: Outcome) -> str | None:
    """What is wrong with one outcome, or None."""
    case, text = outcome.case, outcome.output
    if "Traceback" in text:
        return "a traceback"
    errors = [line for line in text.splitlines() if line.startswith("gpuslice: error: ")]
    if outcome.returncode in (None, 0):
        return None if case.may_run else "the bad value was accepted"
    if len(errors) != 1 or not text.rstrip().endswith(errors[0]):
        return f"exit {outcome.returncode} without one closing error line"
    if case.may_run:
        return None  # refused after all, in one line
    value = case.value
    if isinstance(value, bytes):  # as Python reads it from argv or the environment
        value = value.decode("utf-8", "surrogateescape")
    shown = [value[:40], ascii(value)[1:-1][:40]] if value else ['""']
    named = [case.option, case.var or case.option, *shown]
    if not any(name and name in errors[0] for name in named):
        return "the error line names neither the option, its env var nor the value"
    return None


def _fuzz(cases: list[Case], tmp: Path) -> None:
    (tmp / "dir").mkdir(exist_ok=True)
    cwd = tmp / "cwd"  # relative values ("abc") land here
    cwd.mkdir(exist_ok=True)
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(lambda case: _run(case, cwd), cases))
    bad = [(o, p) for o in outcomes if (p := _problem(o))]
    report = "\n".join(f"{o.case}: {p}\n    {o.output[-300:]!r}" for o, p in bad)
    assert not bad, f"{len(bad)} of {len(cases)} cases:\n{report}"


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short directory: the agents' unix socket paths stay well below 108 bytes."""
    path = short_dir("gsf-")
    try:
        yield Path(path)
    finally:
        remove_dir(path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["run", "labels", "inspect", "mps-control"])
def test_bad_values_of_every_option_and_env_var(command: str, tmp: Path) -> None:
    _fuzz(_cases(command, tmp), tmp)


@pytest.mark.timeout(300)
def test_bad_paths_and_names_for_config_validate(tmp: Path) -> None:
    _fuzz(_validate_cases(tmp), tmp)


def test_the_lists_name_real_options() -> None:
    """FREE_FORM and EMPTY_OK stay in step with the commands' options."""
    options = {o for c in ("run", "labels", "inspect") for p in cli.main.commands[c].params
               for o in p.opts}  # fmt: skip
    assert options >= FREE_FORM | EMPTY_OK
    assert os.path.basename(GPUSLICE) == "gpuslice"
