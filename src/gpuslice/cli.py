"""The `gpuslice` command."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from gpuslice import __version__
from gpuslice.config.flags import FLAGS, GfdEnv, check_settings
from gpuslice.core.errors import GpusliceError

F = TypeVar("F", bound=Callable[..., Any])
FLAG_PARAMS = {f.param: f.name for f in FLAGS}


def flag_options(
    fn: F, *, taken: frozenset[str] = frozenset(), skip: frozenset[str] = frozenset()
) -> F:
    """Every upstream flag as an option; env vars are read by the config resolver.
    Spellings in `taken` belong to the command itself and are left out, and so are
    the flags named in `skip` (they mean nothing to the command)."""
    for flag in reversed(FLAGS):
        names = [o for o in flag.options if o not in taken]
        if flag.name in skip or not names:
            continue
        extra: dict[str, Any] = {}
        if flag.is_bool:
            extra = {"is_flag": False, "flag_value": "true", "metavar": "BOOL"}
        elif flag.choices:
            extra = {"metavar": "|".join(flag.choices)}
        env = ", ".join(flag.env)
        text = f"{flag.help} [env: {env}; default: {flag.default_text or 'unset'}]"
        fn = click.option(*names, flag.param, default=None, help=text, **extra)(fn)
    return fn


def hardware_options(fn: F) -> F:
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


def run_options(ctx: click.Context, params: dict[str, Any], *, labeller: bool = False) -> Any:
    """RunOptions from the parsed command line: only explicitly given flags count. The
    labeller alone reads GFD_ env vars before their unprefixed names, as GFD does. A bad
    setting ends the command with its one-line error."""
    from gpuslice.wiring import RunOptions

    given = {
        FLAG_PARAMS[p]: str(v)
        for p, v in params.items()
        if p in FLAG_PARAMS
        and v is not None
        and ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE
    }
    env = GfdEnv(os.environ) if labeller else dict(os.environ)
    try:
        check_settings(given, env)
    except GpusliceError as exc:
        fail(exc)
    return RunOptions(
        cli_values=given,
        env=env,
        config_name=params.get("config_name"),
        fake_hardware=params.get("fake_hardware"),
        fake_events=params.get("fake_events"),
    )


def fail(exc: Exception) -> NoReturn:
    click.echo(f"gpuslice: error: {exc}", err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """Share NVIDIA GPUs between Kubernetes pods (drop-in for NVIDIA's device plugin)."""


def log_options(fn: F) -> F:
    fn = click.option("--log-format", type=click.Choice(["text", "json"]), default="text")(fn)
    return click.option(
        "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info"
    )(fn)


def start_logs(opts: Any, log_level: str, log_format: str) -> None:
    from gpuslice import logs

    node = opts.get("node-name")
    logs.setup(log_level, log_format, bound={"node": node} if node else None)


@main.command()
@hardware_options
@flag_options
@log_options
@click.pass_context
def run(ctx: click.Context, /, log_level: str, log_format: str, **params: Any) -> None:
    """Run the node agent: serve every resource to the kubelet until SIGTERM."""
    from gpuslice.wiring import run_node

    opts = run_options(ctx, params)
    start_logs(opts, log_level, log_format)
    try:
        asyncio.run(_until_signalled(run_node, opts))
    except GpusliceError as exc:
        fail(exc)


# Flags of the plugin and of per-node configs that mean nothing to the labeller alone.
_NOT_LABELS = frozenset(
    {
        "labels",
        "kubelet-socket",
        "status-address",
        "node-label",
        "config-file-srcdir",
        "default-config",
        "fallback-strategies",
    }
)


@main.command()
@hardware_options
@functools.partial(flag_options, skip=_NOT_LABELS)
@log_options
@click.pass_context
def labels(ctx: click.Context, /, log_level: str, log_format: str, **params: Any) -> None:
    """Label the node as GPU Feature Discovery does, without the device plugin.

    Writes the NodeFeature object (needs --node-name and a cluster) or, with
    --use-node-feature-api=false, the features file (an empty --output-file prints to
    stdout). --oneshot labels once and exits; otherwise labels every --sleep-interval
    until SIGTERM, then removes the features file. SIGHUP re-reads the config.
    """
    from gpuslice.labels_cmd import run_labels

    opts = run_options(ctx, params, labeller=True)
    start_logs(opts, log_level, log_format)
    try:
        asyncio.run(_until_signalled(run_labels, opts))
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
    await serve(opts, stop, reload)


def _inspect_flag_options(fn: F) -> F:
    return flag_options(fn, taken=frozenset({"--output", "-o"}))


@main.command()
@hardware_options
@_inspect_flag_options
@click.option("--output", "output_format", type=click.Choice(["table", "json"]), default="table")
@click.pass_context
def inspect(ctx: click.Context, /, output_format: str, **params: Any) -> None:
    """Show what a config advertises on some hardware, without a kubelet."""
    from gpuslice.inspect import inspect_node, render_table

    opts = run_options(ctx, params)
    try:
        report = inspect_node(opts)
    except GpusliceError as exc:
        fail(exc)
    if output_format == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(render_table(report))


@main.command()
@click.option("--profile", default="dgx-a100", show_default=True, help="simulated node profile")
@click.option("--verbose", is_flag=True, help="also print the agent's log lines")
def demo(profile: str, verbose: bool) -> None:
    """Run the agent on a simulated node against a kubelet stand-in and show what it does."""
    from gpuslice.demo import run_demo

    try:
        asyncio.run(run_demo(profile, verbose=verbose, out=click.echo))
    except GpusliceError as exc:
        fail(exc)


@main.group()
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
        click.echo(f"{result.source or path}: valid")
        click.echo(describe(result.config))
    if any(isinstance(result, GpusliceError) for result in results):
        sys.exit(1)
