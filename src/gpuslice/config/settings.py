"""The agent's complete effective settings: one immutable value per load.

Everything the agent needs from the outside world's wishes is resolved here: the config
file (or the per-node entry), explicit flags over env vars over the file over defaults,
and the XID and recovery policies from the environment. Services never parse a flag or an
env var; they receive a Settings and converge to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpuslice.config.convert import allocate_options, plugin_options, resource_settings
from gpuslice.config.flags import resolve, setting
from gpuslice.config.health_env import recovery_from_env, xid_policy_from_env
from gpuslice.config.loader import LoadedConfig, load_config_file
from gpuslice.config.summary import describe
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError
from gpuslice.core.settings import Settings

__all__ = ["Settings", "check_not_truncated", "load_settings", "settings_from"]

DEFAULTS_SOURCE = "(no config file: flags, env vars and defaults)"


def effective_config(
    cli_values: Mapping[str, str], env: Mapping[str, str], *, config_name: str | None = None
) -> LoadedConfig:
    """The config file (if any) with flags and env vars applied. Raises ConfigError."""
    path = setting("config-file", cli_values, env)
    if path:
        loaded = load_config_file(path, name=config_name)
    else:
        loaded = LoadedConfig(Config(), source=DEFAULTS_SOURCE)
    config = resolve(loaded.config, cli_values, env)
    return LoadedConfig(config, loaded.warnings, loaded.source, loaded.name, loaded.blank)


def load_settings(
    cli_values: Mapping[str, str],
    env: Mapping[str, str],
    *,
    config_name: str | None = None,
    imex_present: Collection[int] | None = None,
) -> Settings:
    """The settings of the config file (if any), flags and env. Raises ConfigError."""
    loaded = effective_config(cli_values, env, config_name=config_name)
    return settings_from(loaded, cli_values, env, imex_present=imex_present)


def settings_from(
    loaded: LoadedConfig,
    cli_values: Mapping[str, str],
    env: Mapping[str, str],
    *,
    imex_present: Collection[int] | None = None,
) -> Settings:
    """The settings of one loaded config, with flags and env vars applied (resolving
    twice is harmless: an explicit flag always wins). Raises ConfigError.
    `imex_present` (the IMEX channels whose device node exists) is given where the
    device plugin runs: its start-up rules apply then (convert.plugin_options)."""
    config = resolve(loaded.config, cli_values, env)
    allocate = allocate_options(config)
    plugin_warnings: tuple[str, ...] = ()
    if imex_present is not None:
        allocate, plugin_warnings = plugin_options(config, imex_present)
    return Settings(
        resources=resource_settings(config),
        allocate=allocate,
        fail_on_init_error=bool(config.flags.fail_on_init_error),
        xid_policy=xid_policy_from_env(env),
        recovery=recovery_from_env(env),
        name=loaded.name,
        source=loaded.source,
        summary="; ".join(line.strip() for line in describe(config).splitlines()),
        warnings=loaded.warnings + plugin_warnings,
        blank=loaded.blank,
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
