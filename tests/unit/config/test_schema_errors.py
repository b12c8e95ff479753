"""Every validation rule fails with one line: source, path, the bad value, what is allowed."""

from __future__ import annotations

from textwrap import dedent

import pytest

from gpuslice.config.loader import load_config
from gpuslice.core.errors import ConfigError

NAME_RULE = (
    "a resource name: nvidia.com/ followed by a DNS subdomain (lowercase letters, digits, "
    "'-' and '.'), 63 characters at most in all"
)
DEVICES_RULE = (
    '"all", a positive count, or a list of GPU indexes (0), MIG indexes ("0:1") or UUIDs '
    "(GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>; <uuid> is "
    "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hex)"
)
DURATION_RULE = (
    'duration string such as "60s", "1m30s", "500ms" or "infinite" '
    "(a bare number is refused: upstream reads it as nanoseconds)"
)
NO_RESOURCES = "a non-empty list of {name, replicas} entries (no resources specified)"


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(dedent(text), source="cfg.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cfg.yaml: ")
    return message.removeprefix("cfg.yaml: ")


def sharing(entry: str, block: str = "timeSlicing") -> str:
    return f"sharing:\n  {block}:\n    resources:\n    - {entry}\n"


CASES = [
    ("version: v2", 'version: got "v2"; expected v1 (or empty, meaning v1)'),
    ("version: 1", "version: got 1; expected v1 (or empty, meaning v1)"),
    (
        "flags: {migStrategy: mix}",
        'flags.migStrategy: got "mix"; expected one of none, single, mixed (did you mean mixed?)',
    ),
    (
        "flags: {migStrategy: off}",
        "flags.migStrategy: got false; expected one of none, single, mixed "
        "(YAML reads yes/no/on/off as true/false: quote the value)",
    ),
    (
        "flags: {deviceDiscoveryStrategy: vfio}",
        'flags.deviceDiscoveryStrategy: got "vfio"; expected one of auto, nvml, tegra',
    ),
    (
        "flags: {failOnInitError: maybe}",
        'flags.failOnInitError: got "maybe"; expected true or false',
    ),
    (
        "flags: {plugin: {deviceListStrategy: cdi}}",
        'flags.plugin.deviceListStrategy: got "cdi"; expected one of envvar, volume-mounts, '
        "cdi-annotations, cdi-cri, or a list of them (did you mean cdi-cri?)",
    ),
    (
        "flags: {plugin: {deviceListStrategy: []}}",
        "flags.plugin.deviceListStrategy: got []; expected one of envvar, volume-mounts, "
        "cdi-annotations, cdi-cri, or a list of them",
    ),
    (
        "flags: {plugin: {deviceListStrategy: [envvar, 3]}}",
        "flags.plugin.deviceListStrategy[1]: got 3; expected one of envvar, volume-mounts, "
        "cdi-annotations, cdi-cri, or a list of them",
    ),
    (
        "flags: {plugin: {deviceIDStrategy: serial}}",
        'flags.plugin.deviceIDStrategy: got "serial"; expected uuid or index',
    ),
    (
        "flags: {plugin: {sharedDevicesAllocationPolicy: spread}}",
        'flags.plugin.sharedDevicesAllocationPolicy: got "spread"; expected distributed or packed',
    ),
    (
        "flags: {plugin: {cdiAnnotationPrefix: 12}}",
        "flags.plugin.cdiAnnotationPrefix: got 12; expected a string "
        "(YAML did not read it as text: quote the value)",
    ),
    (
        "flags: {gfd: {sleepInterval: 60}}",
        f"flags.gfd.sleepInterval: got 60; expected a {DURATION_RULE}",
    ),
    (
        "flags: {gfd: {sleepInterval: '60'}}",
        f'flags.gfd.sleepInterval: got "60"; expected a positive {DURATION_RULE}',
    ),
    (
        "flags: {gfd: {sleepInterval: 0s}}",
        f'flags.gfd.sleepInterval: got "0s"; expected a positive {DURATION_RULE}',
    ),
    (
        "flags: {gfd: {sleepInterval: -5s}}",
        f'flags.gfd.sleepInterval: got "-5s"; expected a positive {DURATION_RULE}',
    ),
    (
        "flags: {gfd: {sleepInterval: 5 minutes}}",
        f'flags.gfd.sleepInterval: got "5 minutes"; expected a positive {DURATION_RULE}',
    ),
    (
        "flags: {gfd: {oneshot: 1}}",
        "flags.gfd.oneshot: got 1; expected true or false",
    ),
    (
        "sharing: {timeSlicing: {}}",
        f"sharing.timeSlicing.resources: missing; expected {NO_RESOURCES}",
    ),
    (
        "sharing: {mps: {resources: []}}",
        f"sharing.mps.resources: got []; expected {NO_RESOURCES}",
    ),
    (
        "sharing: {timeSlicing: {resources: {name: gpu}}}",
        f'sharing.timeSlicing.resources: got {{"name": "gpu"}}; expected {NO_RESOURCES}',
    ),
    (
        sharing("replicas: 2"),
        f"sharing.timeSlicing.resources[0].name: missing; expected {NAME_RULE}",
    ),
    (
        sharing("name: gpu"),
        "sharing.timeSlicing.resources[0].replicas: missing; expected an integer from 2 to 1024",
    ),
    (
        sharing("{name: gpu, replicas: 1}"),
        "sharing.timeSlicing.resources[0].replicas: got 1; expected an integer from 2 to 1024",
    ),
    (
        sharing("{name: gpu, replicas: 5000}", "mps"),
        "sharing.mps.resources[0].replicas: got 5000; expected an integer from 2 to 1024",
    ),
    (
        sharing("{name: gpu, replicas: '4'}"),
        'sharing.timeSlicing.resources[0].replicas: got "4"; expected an integer from 2 to 1024',
    ),
    (
        sharing("{name: gpu, replicas: 2.5}"),
        "sharing.timeSlicing.resources[0].replicas: got 2.5; expected an integer from 2 to 1024",
    ),
    (
        sharing("{name: example.com/gpu, replicas: 2}"),
        f'sharing.timeSlicing.resources[0].name: got "example.com/gpu"; expected {NAME_RULE}',
    ),
    (
        sharing("{name: GPU, replicas: 2}"),
        f'sharing.timeSlicing.resources[0].name: got "GPU"; expected {NAME_RULE}',
    ),
    (
        sharing("{name: " + "a" * 53 + ", replicas: 2}"),
        f'sharing.timeSlicing.resources[0].name: got "{"a" * 53}"; expected {NAME_RULE}',
    ),
    (
        sharing("{name: gpu, replicas: 2, rename: Bad_Name}"),
        f'sharing.timeSlicing.resources[0].rename: got "Bad_Name"; expected {NAME_RULE}, or empty',
    ),
    (
        sharing("{name: gpu, replicas: 2, devices: some}"),
        f'sharing.timeSlicing.resources[0].devices: got "some"; expected {DEVICES_RULE}',
    ),
    (
        sharing("{name: gpu, replicas: 2, devices: 0}"),
        f"sharing.timeSlicing.resources[0].devices: got 0; expected {DEVICES_RULE}",
    ),
    (
        sharing("{name: gpu, replicas: 2, devices: []}"),
        f"sharing.timeSlicing.resources[0].devices: got []; expected {DEVICES_RULE}",
    ),
    (
        sharing("{name: gpu, replicas: 2, devices: [0, 'gpu0']}"),
        f'sharing.timeSlicing.resources[0].devices[1]: got "gpu0"; expected {DEVICES_RULE}',
    ),
    (
        sharing("{name: gpu, replicas: 2, devices: [-1]}"),
        f"sharing.timeSlicing.resources[0].devices[0]: got -1; expected {DEVICES_RULE}",
    ),
    ("imex: {channelIDs: [1]}", "imex.channelIDs: got [1]; expected [] or [0]"),
    ("imex: {channelIDs: [0, 0]}", "imex.channelIDs: got [0, 0]; expected [] or [0]"),
    ("imex: {channelIDs: '0'}", 'imex.channelIDs: got "0"; expected [] or [0]'),
    (
        "resources: {gpus: [{name: gpu}]}",
        "resources.gpus[0].pattern: missing; expected a non-empty glob in which * matches anything",
    ),
    ("resources: {mig: [{pattern: '*'}]}", f"resources.mig[0].name: missing; expected {NAME_RULE}"),
    (
        "resources: {gpus: [{pattern: '', name: gpu}]}",
        'resources.gpus[0].pattern: got ""; expected a non-empty glob in which * matches anything',
    ),
    ("resources: {gpus: [gpu]}", 'resources.gpus[0]: got "gpu"; expected a mapping'),
    ("resources: 5", "resources: got 5; expected a mapping"),
    ("sharing: [timeSlicing]", 'sharing: got ["timeSlicing"]; expected a mapping'),
]


@pytest.mark.parametrize(("text", "message"), CASES)
def test_invalid_value_names_path_value_and_what_is_allowed(text: str, message: str) -> None:
    assert error_of(text) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sharing:\n  timeSlicing:\n    renameByDefalt: true\n",
            "sharing.timeSlicing.renameByDefalt: unknown field; did you mean renameByDefault?",
        ),
        (
            "flags: {plugin: {deviceIdStrategy: uuid}}",
            "flags.plugin.deviceIdStrategy: unknown field; did you mean deviceIDStrategy?",
        ),
        (
            "flags: {migstrategy: mixed}",
            "flags.migstrategy: unknown field; did you mean migStrategy?",
        ),
        (
            sharing("{name: gpu, replica: 2}"),
            "sharing.timeSlicing.resources[0].replica: unknown field; did you mean replicas?",
        ),
        (
            "imex: {channelIds: [0]}",
            "imex.channelIds: unknown field; did you mean channelIDs?",
        ),
        (
            "zzz: 1",
            "zzz: unknown field; known fields here: version, flags, resources, sharing, imex, "
            "memoryIsolation",
        ),
        (
            "flags: {'mig strategy': none}",
            'flags."mig strategy": unknown field; did you mean migStrategy?',
        ),
    ],
)
def test_unknown_key_names_its_full_path_and_the_closest_known_key(text: str, message: str) -> None:
    assert error_of(text) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "got a list; expected a mapping of config fields"),
        ("just some words", 'got the text "just some words"; expected a mapping of config fields'),
        ("42", "got a single value; expected a mapping of config fields"),
        (
            "a: b: c",
            "line 1, column 5: not valid YAML or JSON: "
            "mapping values are not allowed in this context",
        ),
        (
            "flags: {\n",
            "line 2, column 1: not valid YAML or JSON: did not find expected node content",
        ),
        ("a: 1\na: 2\n", 'line 2, column 1: not valid YAML or JSON: key "a" is given twice'),
        ("{1: x}", "key 1 is not a string; keys are field names"),
        ("[" * 5000 + "]" * 5000, "not a config: nested too deeply"),
        ("flags: " + "{a: " * 3000 + "1" + "}" * 3000, "not a config: nested too deeply"),
        ("flags: {2: x}", "flags: key 2 is not a string; keys are field names"),
        (
            "version: v1\n---\nversion: v1\n",
            "line 2, column 1: not valid YAML or JSON: "
            "expected a single document in the stream, but found another document",
        ),
        (
            "!!python/object:os.system {}",
            "line 1, column 1: not valid YAML or JSON: "
            "tag !!python/object:os.system is not allowed in a config",
        ),
    ],
)
def test_documents_that_are_not_configs_fail_with_one_line(text: str, message: str) -> None:
    assert error_of(text) == message


def test_yaml_dates_get_a_quoting_hint() -> None:
    assert error_of("flags: {mpsRoot: 2024-01-01}") == (
        'flags.mpsRoot: got "2024-01-01"; expected a string '
        "(YAML did not read it as text: quote the value)"
    )


def test_binary_junk_and_control_characters_stay_on_one_line() -> None:
    message = error_of("\x00\x01\x02\nflags:\n")
    assert message.startswith("not valid YAML or JSON: unacceptable character #x0000")
    source = "bad\nname.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config("zzz: 1", source=source)
    assert str(caught.value).startswith("bad\\nname.yaml: zzz: unknown field")


def test_huge_integer_is_reported_without_printing_it() -> None:
    message = error_of(sharing("{name: gpu, replicas: " + "9" * 400 + "}"))
    assert message == (
        "sharing.timeSlicing.resources[0].replicas: got a very large integer; "
        "expected an integer from 2 to 1024"
    )
