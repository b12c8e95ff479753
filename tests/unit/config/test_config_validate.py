"""`gpuslice config validate`: every config checked, one line per bad one, warnings once;
and `run` refusing --config-name where per-node configs pick the config."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest
from click.testing import CliRunner

from gpuslice.cli import main
from gpuslice.config.loader import LoadedConfig, load_each
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import ConfigError
from gpuslice.testing.configmap import write_configmap_volume

TS4 = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n"
BAD_MIG = "flags: {migStrategy: bogus}\n"
BAD_REPLICAS = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n"
MIG_ERROR = 'flags.migStrategy: got "bogus"; expected one of none, single, mixed'
REPLICAS_ERROR = (
    "sharing.timeSlicing.resources[0].replicas: got 1; expected an integer from 2 to 1024"
)
RESOURCES = "resources: {gpus: [{pattern: '*', name: gpu}]}\n"
NO_FILES = "holds no config files (entries starting with .. and subdirectories are skipped)"


def configmap(entries: dict[str, str]) -> str:
    body = "".join(
        f"  {key}: |\n" + "".join(f"    {line}\n" for line in text.splitlines())
        for key, text in entries.items()
    )
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata:\n{body}"


def validate(*args: str) -> tuple[int, list[str], list[str]]:
    result = CliRunner().invoke(main, ["config", "validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout.splitlines(), result.stderr.splitlines()


# ---- warnings name their config once


def test_a_warning_names_the_file_once(tmp_path: Path) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(RESOURCES)
    code, out, err = validate(str(path))
    assert code == 0
    assert err == [
        f"warning: {path}: resources: custom resource naming is not supported (as upstream); "
        "ignored"
    ]
    assert out[0] == f"{path}: valid"


def test_a_warning_in_a_configmap_entry_names_the_entry_once(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"a": RESOURCES}))
    _, _, err = validate(str(path))
    assert len(err) == 1
    assert err[0].startswith(f"warning: {path}[a]: resources: custom")


# ---- a ConfigMap: every entry, one line per bad one


def test_every_bad_configmap_entry_gets_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"good": TS4, "mig": BAD_MIG, "one": BAD_REPLICAS}))
    code, out, err = validate(str(path))
    assert code == 1
    assert err == [
        f"gpuslice: error: {path}[mig]: {MIG_ERROR}",
        f"gpuslice: error: {path}[one]: {REPLICAS_ERROR}",
    ]
    assert f"{path}[good]: valid" in out


def test_a_configmap_with_only_good_entries_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"a": TS4, "b": "{}\n"}))
    code, out, err = validate(str(path))
    assert (code, err) == (0, [])
    assert [line for line in out if line.endswith(": valid")] == [
        f"{path}[a]: valid",
        f"{path}[b]: valid",
    ]


def test_config_name_checks_only_that_entry(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"good": TS4, "mig": BAD_MIG}))
    assert validate(str(path), "--config-name", "good")[0] == 0
    code, _, err = validate(str(path), "--config-name", "mig")
    assert (code, err) == (1, [f"gpuslice: error: {path}[mig]: {MIG_ERROR}"])


def test_a_broken_manifest_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text("kind: ConfigMap\ndata: [a]\n")
    code, out, err = validate(str(path))
    assert (code, out) == (1, [])
    assert err == [f'gpuslice: error: {path}: data: got ["a"]; expected a mapping of named configs']


def test_a_plain_file_reports_its_first_problem(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(dedent(BAD_MIG))
    code, _, err = validate(str(path))
    assert (code, err) == (1, [f"gpuslice: error: {path}: {MIG_ERROR}"])


# ---- a directory: every config in it, as the agent reads it


def test_a_directory_checks_each_config_file(tmp_path: Path) -> None:
    root = tmp_path  # a mounted ConfigMap: `..data` and one link per entry
    write_configmap_volume(
        str(root), {"ts.yaml": TS4, "mig.yaml": BAD_MIG, "one.yaml": BAD_REPLICAS}
    )
    code, out, err = validate(str(root))
    assert code == 1
    assert err == [
        f"gpuslice: error: {root / 'mig.yaml'}: {MIG_ERROR}",
        f"gpuslice: error: {root / 'one.yaml'}: {REPLICAS_ERROR}",
    ]
    assert [line for line in out if line.endswith(": valid")] == [f"{root / 'ts.yaml'}: valid"]


def test_a_directory_file_holding_a_configmap_is_checked_as_it_is_alone(
    tmp_path: Path,
) -> None:
    """Each entry checked, as `config validate cm.yaml` checks it; one warning says that
    the agent, reading the directory as a mounted ConfigMap, would refuse the file."""
    (tmp_path / "cm.yaml").write_text(configmap({"a": TS4, "b": TS4}))
    (tmp_path / "ts.yaml").write_text(TS4)
    code, out, err = validate(str(tmp_path))
    alone = validate(str(tmp_path / "cm.yaml"))
    assert (code, alone[0]) == (0, 0), (err, alone)
    valid = [line for line in out if line.endswith(": valid")]
    assert valid == [f"{tmp_path / 'cm.yaml'}[a]: valid", f"{tmp_path / 'cm.yaml'}[b]: valid",
                     f"{tmp_path / 'ts.yaml'}: valid"]  # fmt: skip
    assert err == [
        f"warning: {tmp_path / 'cm.yaml'}: a ConfigMap manifest of 2 configs, each checked; "
        "as a file of a mounted ConfigMap directory (--config-file-srcdir, --config-file DIR) "
        "the agent would refuse it: it takes one config per file"
    ]


def test_the_examples_directory_is_valid_as_each_example_is() -> None:
    examples = Path(__file__).parents[3] / "examples"
    code, out, err = validate(str(examples))
    assert code == 0, err
    alone = [line for f in sorted(examples.glob("*.yaml")) for line in validate(str(f))[1]]
    assert [line for line in out if ": valid" in line] == [
        line for line in alone if ": valid" in line
    ]


def test_several_configs_without_a_name_say_which_flag_names_one(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"a": TS4, "b": TS4}))
    result = CliRunner().invoke(
        main, ["inspect", "--fake-hardware", "t4", "--config-file", str(path)]
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"gpuslice: error: {path}: holds 2 configs (a, b); name the one to use with --config-name"
    ]


def test_an_empty_file_is_valid_and_said_to_mean_every_default(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set yet\n")
    code, out, err = validate(str(path))
    assert (code, err) == (0, [])
    assert out[0] == (
        f"{path}: valid, and empty: every setting takes its default (once a config with "
        "content is in force, an empty one replacing it is refused as a cut-short write; "
        "write `version: v1` to mean the defaults)"
    )
    (tmp_path / "v1.yaml").write_text("version: v1\n")
    assert validate(str(tmp_path / "v1.yaml"))[1][0] == f"{tmp_path / 'v1.yaml'}: valid"


def test_an_empty_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "..data").mkdir()
    code, out, err = validate(str(tmp_path))
    assert (code, out) == (1, [])
    assert err == [f"gpuslice: error: {tmp_path}: {NO_FILES}"]


def test_an_empty_directory_with_a_name_says_so(tmp_path: Path) -> None:
    code, _, err = validate(str(tmp_path), "--config-name", "a100")
    assert (code, err) == (1, [f"gpuslice: error: {tmp_path}: {NO_FILES}"])


def test_a_missing_path_is_one_line(tmp_path: Path) -> None:
    code, _, err = validate(str(tmp_path / "nope.yaml"))
    assert code == 1
    assert err == [
        f"gpuslice: error: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory"
    ]


def test_load_each_returns_configs_and_errors_in_order(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"b": BAD_MIG, "a": TS4}))
    first, second = load_each(path)
    assert isinstance(first, ConfigError)
    assert str(first) == f"{path}[b]: {MIG_ERROR}"
    assert isinstance(second, LoadedConfig)
    assert second.name == "a"


# ---- run: per-node configs are picked by the label or default, not --config-name


def test_config_name_with_a_config_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:  # when the options are resolved
        resolve_options({"config-file": str(tmp_path)}, config_name="a100")
    assert str(caught.value) == (
        f'--config-name "a100": not used with the per-node configs of {tmp_path}; name the '
        "config with --default-config (DEFAULT_CONFIG) or the node label "
        "nvidia.com/device-plugin.config"
    )


def test_config_name_with_a_srcdir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not used with the per-node configs"):
        resolve_options(env={"CONFIG_FILE_SRCDIR": str(tmp_path)}, config_name="x")


def test_config_name_with_a_file_is_still_used(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(configmap({"a": TS4, "b": BAD_MIG}))
    opts = resolve_options({"config-file": str(path)}, config_name="a")
    assert opts.source.dir == ""
    opts = resolve_options({"config-file": str(tmp_path), "node-name": "n1"})
    assert opts.source.dir == str(tmp_path)
