"""The `gpuslice` command."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import textwrap
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from gpuslice import __version__
from gpuslice.config.flags import FLAGS, GfdEnv, explain
from gpuslice.core.errors import ConfigError, GpusliceError
from gpuslice.entry import take_held_reload

F = TypeVar("F", bound=Callable[..., Any])
FLAG_PARAMS = {f.param: f.name for f in FLAGS}
UPSTREAM = {"run": "NVIDIA's device plugin", "labels": "GPU Feature Discovery"}


def fail(error: Exception | str, code: int = 1) -> NoReturn:
    """End the command with its one error line (a JSON event under --log-format json)."""
    from gpuslice import logs

    said = error if isinstance(error, str) else explain(error)  # a refused setting: its flag
    text = " ".join(said.split()).encode("utf-8", "backslashreplace").decode()
    if not logs.json_mode() and _json_asked(sys.argv[1:]):  # failed before logs were set up
        logs.setup("error", "json")
    if logs.json_mode():
        logs.final_error(text, code)
    else:
        click.echo(f"gpuslice: error: {text}", err=True)
    sys.exit(code)


def _json_asked(argv: Sequence[str]) -> bool:
    return "--log-format=json" in argv or ("--log-format", "json") in itertools.pairwise(argv)


class OneLineErrors(click.Group):
    """A group whose usage errors (unknown option, bad choice, missing value) end the
    command in one line, like every other error."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _usage_failed(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _usage_failed(exc)


def _usage_failed(exc: click.UsageError) -> NoReturn:
    where = f"; see '{exc.ctx.command_path} --help'" if exc.ctx else ""
    fail(exc.format_message().rstrip(".") + where, exc.exit_code)


def flag_options(command: str) -> Callable[[F], F]:
    """The table's flags that `command` takes, as options; env vars are read by the config
    resolver. Those it takes without effect are left out of its --help."""

    def add(fn: F) -> F:
        for flag in reversed(FLAGS):
            if not flag.taken_by(command):
                continue
            extra: dict[str, Any] = {}
            if flag.is_bool:
                extra = {"is_flag": False, "flag_value": "true", "metavar": "BOOL"}
            elif flag.choices:
                extra = {"metavar": "|".join(flag.choices)}
            elif flag.metavar:
                extra = {"metavar": flag.metavar}
            env = ", ".join(flag.env)
            text = f"{flag.help} [env: {env}; default: {flag.default_text or 'unset'}]"
            hidden = command not in flag.uses
            fn = click.option(
                *flag.options, flag.param, default=None, help=text, hidden=hidden, **extra
            )(fn)
        return fn

    return add


def accepted_note(command: str) -> str | None:
    """The --help epilog naming the flags `command` takes without effect."""
    names = [f"--{f.name}" for f in FLAGS if f.taken_by(command) and command not in f.uses]
    if not names:
        return None
    text = f"Accepted as {UPSTREAM[command]} takes them, without effect: {', '.join(names)}."
    lines = textwrap.wrap(text, 78, break_on_hyphens=False)
    return "\b\n" + "\n".join(lines)  # \b: click keeps these line breaks


def hardware_options(*, events: bool) -> Callable[[F], F]:
    def add(fn: F) -> F:
        if events:
            fn = click.option(
                "--fake-events",
                metavar="FILE",
                help="JSON-lines file of injected health events for the simulated backend",
            )(fn)
        fn = click.option(
            "--fake-hardware",
            metavar="PROFILE|FILE",
            help="simulate this node (a built-in profile or a YAML node file) instead of NVML",
        )(fn)
        return click.option(
            "--config-name", metavar="NAME", help="the entry to use from a ConfigMap manifest"
        )(fn)

    return add


def log_options(fn: F) -> F:
    fn = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        help="text: an event and key=value fields per line; json: every line on stderr is "
        "a JSON object [default: text]",
    )(fn)
    return click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        help="the least severe log events written [default: info]",
    )(fn)


def start_logs(log_level: str, log_format: str) -> None:
    from gpuslice import logs

    if log_format == "json":
        logs.setup(log_level, "json", stream=logs.capture_stderr())
    else:
        logs.setup(log_level, log_format)


def command_options(command: str, args: Sequence[str], environ: Mapping[str, str]) -> Any:
    """The options `gpuslice <command> <args>` would run with in `environ`, resolved once
    (config.options.RunOptions); nothing starts. Raises click.UsageError for a bad command
    line, ConfigError for a bad setting."""
    ctx = main.commands[command].make_context(command, list(args))
    return _resolved(ctx, ctx.params, command, environ)


def run_options(ctx: click.Context, params: dict[str, Any], command: str) -> Any:
    """RunOptions from the parsed command line; a bad setting ends the command with its
    one-line error."""
    try:
        opts = _resolved(ctx, params, command, os.environ)
    except GpusliceError as exc:
        fail(exc)
    if opts.api.node_name and command != "inspect":
        from gpuslice import logs

        logs.bind(node=opts.api.node_name)
    return opts


def _given(ctx: click.Context, params: Mapping[str, Any]) -> dict[str, str]:
    """The table's flags given on the command line, as strings (keys: Flag.name)."""
    return {
        FLAG_PARAMS[p]: str(v)
        for p, v in params.items()
        if p in FLAG_PARAMS
        and v is not None
        and ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE
    }


def _resolved(
    ctx: click.Context, params: Mapping[str, Any], command: str, environ: Mapping[str, str]
) -> Any:
    """Only explicitly given flags count, and only the env vars of flags `command` takes.
    The labeller alone reads GFD_ env vars before their unprefixed names, as GFD does."""
    from gpuslice.config.options import resolve_options

    given = _given(ctx, params)
    env = GfdEnv(environ) if command == "labels" else environ
    return resolve_options(
        given,
        env,
        command=command,
        config_name=params.get("config_name"),
        fake_hardware=params.get("fake_hardware"),
        fake_events=params.get("fake_events"),
    )


@click.group(
    cls=OneLineErrors,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """Share NVIDIA GPUs between Kubernetes pods (drop-in for NVIDIA's device plugin)."""


@main.command(epilog=accepted_note("run"))
@hardware_options(events=True)
@flag_options("run")
@log_options
@click.pass_context
def run(ctx: click.Context, /, log_level: str, log_format: str, **params: Any) -> None:
    """Run the node agent: serve every resource to the kubelet until SIGTERM."""
    start_logs(log_level, log_format)
    opts = run_options(ctx, params, "run")
    from gpuslice.wiring.run import run_node

    try:
        asyncio.run(_until_signalled(run_node, opts))
    except GpusliceError as exc:
        fail(exc)


@main.command(epilog=accepted_note("labels"))
@hardware_options(events=False)
@flag_options("labels")
@log_options
@click.pass_context
def labels(ctx: click.Context, /, log_level: str, log_format: str, **params: Any) -> None:
    """Label the node as GPU Feature Discovery does, without the device plugin.

    Writes the NodeFeature object (needs --node-name and a cluster) or, with
    --use-node-feature-api=false, the features file (an empty --output-file prints to
    stdout). --oneshot labels once and exits; otherwise labels every --sleep-interval
    until SIGTERM, then removes the features file. SIGHUP re-reads the config.
    """
    start_logs(log_level, log_format)
    opts = run_options(ctx, params, "labels")
    from gpuslice.wiring.commands import run_labels

    try:
        asyncio.run(_until_signalled(run_labels, opts))
    except GpusliceError as exc:
        fail(exc)


@main.command("mps-control")
@click.option(
    "--simulated",
    is_flag=True,
    help="start the testing kit's simulated control daemon instead of the control binary "
    "(a node without GPUs, as `run --fake-hardware`)",
)
@flag_options("mps-control")
@log_options
@click.pass_context
def mps_control(
    ctx: click.Context, /, simulated: bool, log_level: str, log_format: str, **params: Any
) -> None:
    """Start MPS control daemons for the agent, from a pod of their own.

    Listens on --mps-control-socket (default <mps-root>/.mps-control.sock) until
    SIGTERM. The agent, given the same socket, has every MPS daemon started here, so
    that the daemons and their clients outlive its restarts and upgrades; the daemons
    keep running when this command stops, until its container ends.
    """
    start_logs(log_level, log_format)
    opts = run_options(ctx, params, "mps-control")
    from gpuslice.commands.mps_control import run_mps_control

    try:
        asyncio.run(
            _until_signalled(
                lambda o, stop, reload: run_mps_control(o, stop, simulated=simulated), opts
            )
        )
    except GpusliceError as exc:
        fail(exc)


async def _until_signalled(
    serve: Callable[[Any, asyncio.Event, asyncio.Event], Awaitable[None]], opts: Any
) -> None:
    """Run `serve` with a stop event SIGTERM and SIGINT set and a reload event for SIGHUP."""
    loop = asyncio.get_running_loop()
    stop, reload = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    if take_held_reload():  # one came while starting: it asked for a re-read too
        reload.set()
    await serve(opts, stop, reload)


@main.command()
@hardware_options(events=True)
@flag_options("inspect")
@click.option(
    "--output",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    help="a table, or one JSON object: resources (name: device count), labels, GPUs (with "
    "each share's memory limit), memoryIsolation, warnings [default: table]",
)
@click.option(
    "--mig-parted-config", "mig_parted_file", metavar="FILE",
    help="instead, what the layout --mig-config names in this mig-parted config would do "
    "on each GPU, and the resources then advertised (nothing is changed)",
)  # fmt: skip
@click.option("--mig-config", "mig_config", metavar="NAME",
              help="the config of --mig-parted-config to show")  # fmt: skip
@click.pass_context
def inspect(
    ctx: click.Context,
    /,
    output_format: str,
    mig_parted_file: str | None,
    mig_config: str | None,
    **params: Any,
) -> None:
    """Show what a config advertises on some hardware, without a kubelet."""
    opts = run_options(ctx, params, "inspect")
    from gpuslice.commands.inspect import inspect_node, render_table
    from gpuslice.commands.inspect_mig import inspect_mig, render_mig_table

    try:
        if (mig_parted_file is None) != (mig_config is None):
            raise ConfigError("--mig-parted-config and --mig-config go together")
        if mig_parted_file is not None and mig_config is not None:
            report = inspect_mig(opts, mig_parted_file, mig_config)
            render = render_mig_table
        else:
            report, render = inspect_node(opts), render_table
    except GpusliceError as exc:
        fail(exc)
    if output_format == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(render(report))


@main.command()
@click.option("--profile", default="dgx-a100", show_default=True, help="simulated node profile")
@click.option("--verbose", is_flag=True, help="also print the agent's log lines")
@click.option(
    "--advise", "show_advice", is_flag=True,
    help="instead, right-sizing advice read from a synthetic Prometheus (gpuslice advise)",
)  # fmt: skip
def demo(profile: str, verbose: bool, show_advice: bool) -> None:
    """Run the agent on a simulated node against a kubelet stand-in and show what it does."""
    if show_advice:
        from gpuslice.commands.advise import demo_advice

        try:
            click.echo(demo_advice())
        except GpusliceError as exc:
            fail(exc)
        return
    from gpuslice.commands.demo import run_demo

    try:
        asyncio.run(run_demo(profile, verbose=verbose, out=click.echo))
    except GpusliceError as exc:
        fail(exc)


@main.command()
@flag_options("advise")
@click.option("--window", default="7d", show_default=True, help="how far back to read")
@click.option("--step", default="30s", show_default=True, help="one sample per step")
@click.option("--min-samples", default=120, show_default=True, type=click.IntRange(1),
              help="fewer samples than this: too few to judge")  # fmt: skip
@click.option("--namespace", default="", help="only this namespace's workloads")
@click.option("--end", type=float, metavar="UNIX_TIME", help="the window's end [default: now]")
@click.option(
    "--output",
    type=click.Choice(["table", "json", "config", "mig-config"]),
    default="table",
    show_default=True,
    help="advice per workload, as a table or JSON, a proposed v1 config, or a proposed "
    "mig-parted config for the pools whose workloads fit MIG profiles",
)
@click.pass_context
def advise(
    ctx: click.Context,
    /,
    window: str,
    step: str,
    min_samples: int,
    namespace: str,
    end: float | None,
    output: str,
    **params: Any,
) -> None:
    """Right-size shared GPUs from what each workload used, read from Prometheus.

    A secured Prometheus is read with a bearer token file, a CA bundle and a client
    certificate, as Prometheus' own HTTP client config names them.
    """
    from gpuslice.commands.advise import run_advise
    from gpuslice.config.flags import read_flags
    from gpuslice.config.prometheus_access import prometheus_access

    try:
        access = prometheus_access(read_flags(_given(ctx, params), os.environ, "advise"))
        text = run_advise(access, window=window, step=step, min_samples=min_samples,
                          namespace=namespace, output=output, end=end)  # fmt: skip
    except GpusliceError as exc:
        fail(exc)
    click.echo(text, nl=not text.endswith("\n"))


@main.group(cls=OneLineErrors)
def config() -> None:
    """Config file tools."""


@config.command("validate")
@click.argument("path", type=click.Path(dir_okay=True))
@click.option("--config-name", metavar="NAME", help="the one config to check (an entry or file)")
def validate(path: str, config_name: str | None) -> None:
    """Check a config file, ConfigMap manifest or mounted ConfigMap directory.

    Every config in it is checked; each bad one gets one error line naming it (its first
    problem), and the command exits 1 when any is bad.
    """
    from gpuslice.config.loader import load_each
    from gpuslice.config.summary import describe

    if not path:
        fail('PATH "": expected a config file, ConfigMap manifest or config directory')
    try:
        results = load_each(path, name=config_name)
    except GpusliceError as exc:
        fail(exc)
    for result in results:
        if isinstance(result, GpusliceError):
            click.echo(f"gpuslice: error: {result}", err=True)
            continue
        for warning in result.warnings:  # each already names its config
            click.echo(f"warning: {warning}", err=True)
        if result.blank:
            click.echo(
                f"{result.source or path}: valid, and empty: every setting takes its default "
                "(once a config with content is in force, an empty one replacing it is "
                "refused as a cut-short write; write `version: v1` to mean the defaults)"
            )
        else:
            click.echo(f"{result.source or path}: valid")
        click.echo(describe(result.config))
    if any(isinstance(result, GpusliceError) for result in results):
        sys.exit(1)


@main.group(cls=OneLineErrors)
def admission() -> None:
    """Admission policies that refuse impossible GPU requests when a pod is created."""


@admission.command("render")
@click.option("--config-file", metavar="PATH", help="a config file or ConfigMap manifest")
@click.option("--config-file-srcdir", metavar="DIR", help="a mounted ConfigMap of named configs")
@click.option("--config-name", metavar="NAME", help="only this config (an entry or file)")
@click.option("--name", default="gpuslice", show_default=True, help="prefix of object names")
@click.option("--namespace", default="gpuslice", show_default=True, help="namespace of the params")
@click.option(
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="the objects as one YAML stream or one JSON list",
)
def admission_render(
    config_file: str | None,
    config_file_srcdir: str | None,
    config_name: str | None,
    name: str,
    namespace: str,
    output: str,
) -> None:
    """Print the ValidatingAdmissionPolicy, its bindings and their params for the configs.

    A container asking for more than 1 of a resource shared with failRequestsGreaterThanOne
    is denied when every config caps it, and warned about when only some do. Apply with
    kubectl apply -f -; on a config change, apply again (only the params change).
    """
    from gpuslice.commands.admission import render_admission

    if bool(config_file) == bool(config_file_srcdir):
        fail("give one of --config-file PATH or --config-file-srcdir DIR")
    path = config_file or config_file_srcdir or ""
    try:
        text = render_admission(
            path, config_name=config_name, name=name, namespace=namespace, output=output
        )
    except GpusliceError as exc:
        fail(exc)
    click.echo(text, nl=not text.endswith("\n"))
