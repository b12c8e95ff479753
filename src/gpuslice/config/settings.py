"""The agent's complete effective settings: one immutable value per load.

Everything the agent needs from the outside world's wishes is resolved here: the config
file (or the per-node entry) with the command's flags applied once (config.flags:
explicit flags over env vars over the file over defaults), and the XID and recovery
policies the environment gave (config.options). Services never parse a flag or an env
var; they receive a Settings and converge to it.
"""

from __future__ import annotations

from collections.abc import Collection

from gpuslice.config.checks import duration_seconds
from gpuslice.config.convert import allocate_options, plugin_options, resource_settings
from gpuslice.config.flags import apply_flags
from gpuslice.config.loader import LoadedConfig, load_config_file
from gpuslice.config.options import RunOptions
from gpuslice.config.summary import describe
from gpuslice.config.v1 import Config, MemoryIsolation
from gpuslice.core.errors import ConfigError
from gpuslice.core.isolation import LimitRule, MemoryPolicy
from gpuslice.core.settings import LabelSettings, Settings

__all__ = ["Settings", "check_not_truncated", "load_config", "load_settings", "settings_from"]

DEFAULTS_SOURCE = "(no config file: flags, env vars and defaults)"


def load_config(opts: RunOptions) -> LoadedConfig:
    """The config file as read, before flags apply (none given: the empty config, which
    flags, env vars and defaults fill). Raises ConfigError."""
    if opts.source.file:
        return load_config_file(opts.source.file, name=opts.source.name)
    return LoadedConfig(Config(), source=DEFAULTS_SOURCE)


def load_settings(opts: RunOptions, *, imex_present: Collection[int] | None = None) -> Settings:
    """The settings of the config file (if any), flags and env. Raises ConfigError."""
    return settings_from(load_config(opts), opts, imex_present=imex_present)


def settings_from(
    loaded: LoadedConfig,
    opts: RunOptions,
    *,
    imex_present: Collection[int] | None = None,
) -> Settings:
    """The settings of one loaded config with the command's flags applied: the one
    resolution of this load. Raises ConfigError. `imex_present` (the IMEX channels whose
    device node exists) is given where the device plugin runs: its start-up rules apply
    then (convert.plugin_options; HardwareError for a required channel missing)."""
    config = apply_flags(loaded.config, opts.flags)
    allocate = allocate_options(config, complete=True)
    plugin_warnings: tuple[str, ...] = ()
    if imex_present is not None:
        allocate, plugin_warnings = plugin_options(config, imex_present, complete=True)
    return Settings(
        resources=resource_settings(config, complete=True),
        allocate=allocate,
        fail_on_init_error=bool(config.flags.fail_on_init_error),
        xid_policy=opts.xid_policy,
        recovery=opts.recovery,
        name=loaded.name,
        source=loaded.source,
        summary="; ".join(line.strip() for line in describe(config, complete=True).splitlines()),
        warnings=loaded.warnings + plugin_warnings,
        blank=loaded.blank,
        labels=label_settings(config),
        memory=memory_policy(config, opts.isolation.enabled),
    )


def memory_policy(config: Config, enabled: bool) -> MemoryPolicy:
    """The per-pod memory limit policy: --memory-isolation, and the config's gpuslice-only
    memoryIsolation block (absent: every replicated resource's default split)."""
    block = config.memory_isolation or MemoryIsolation()
    rules = {
        name: LimitRule(hard=rule.hard_bytes, soft=rule.soft_bytes, off=rule.off)
        for name, rule in block.resources.items()
    }
    return MemoryPolicy.of(enabled, rules, overcommit=block.allow_overcommit)


def label_settings(config: Config) -> LabelSettings:
    """flags.gfd of a complete config (every flag set), in core terms."""
    flags = config.flags
    gfd = flags.gfd
    return LabelSettings(
        use_node_feature_api=bool(flags.use_node_feature_api),
        output_file=gfd.output_file or "",
        interval_s=duration_seconds(gfd.sleep_interval or "60s"),
        timestamps=not gfd.no_timestamp,
        machine_type_file=gfd.machine_type_file or "",
        oneshot=bool(gfd.oneshot),
    )


def check_not_truncated(new: Settings | LoadedConfig, in_force: Settings | LoadedConfig) -> None:
    """Refuse a blank config replacing one that had content: far more likely a truncated
    write than a wish to drop all sharing. `version: v1` alone is the deliberate empty
    config. Raises ConfigError."""
    if new.blank and not in_force.blank:
        where = new.source or "the config"
        raise ConfigError(
            f"{where}: the config is empty (no content: zero bytes, whitespace or comments "
            "only), most likely a truncated write; write `version: v1` to serve the "
            "defaults on purpose"
        )
