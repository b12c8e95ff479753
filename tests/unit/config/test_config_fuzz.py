"""Whatever a user feeds in, loading gives a config or a ConfigError of one printable line,
never another exception (also for flags and env vars)."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.config import v1
from gpuslice.config.flags import FLAGS, resolve
from gpuslice.config.loader import LoadedConfig, load_config
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError

STRUCTS = [c for c in vars(v1).values() if isinstance(c, type) and issubclass(c, msgspec.Struct)]
FIELD_NAMES = sorted({f.encode_name for c in STRUCTS for f in msgspec.structs.fields(c)})
FIELD_NAMES += ["kind", "apiVersion", "data", "metadata"]  # ConfigMap manifest keys
WORDS = ["v1", "all", "none", "mixed", "envvar", "uuid", "60s", "gpu", "nvidia.com/gpu"]
WORDS += ["infinite", "ConfigMap", "0:1", "GPU-1", "", "\u2028", "\x00"]
VALID: dict[str, Any] = {
    "version": "v1",
    "flags": {
        "migStrategy": "mixed",
        "plugin": {"deviceListStrategy": ["envvar"], "deviceIDStrategy": "uuid"},
        "gfd": {"sleepInterval": "60s"},
    },
    "resources": {"gpus": [{"pattern": "*", "name": "gpu"}]},
    "sharing": {
        "timeSlicing": {"resources": [{"name": "gpu", "replicas": 4, "devices": [0]}]},
        "mps": {"resources": [{"name": "gpu", "replicas": 2}]},
    },
    "imex": {"channelIDs": [0], "required": True},
}

keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=12), st.integers(-3, 3))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**200),
    st.floats(allow_nan=True),
    st.sampled_from(WORDS),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=20,
)


def check(text: str) -> None:
    try:
        result = load_config(text, source="fuzz.yaml")
    except ConfigError as exc:
        message = str(exc)
    else:
        assert isinstance(result, LoadedConfig)
        assert all(len(w.splitlines()) == 1 for w in result.warnings)
        return
    assert len(message.splitlines()) == 1, message
    assert message.isprintable(), message
    assert message.startswith("fuzz.yaml")


def dumps(value: object, as_json: bool) -> str:
    if as_json:
        return json.dumps(value, default=str)
    return yaml.safe_dump(value, allow_unicode=True)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*prefix, i))
    return found


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    check(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.booleans())
def test_arbitrary_documents(value: object, as_json: bool) -> None:
    try:
        text = dumps(value, as_json)
    except (TypeError, ValueError):
        return  # not expressible in that syntax (an int key in JSON, ...)
    check(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_mutations_of_a_valid_config(data: st.DataObject, as_json: bool) -> None:
    doc = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        *parent_path, last = path
        parent: Any = doc
        for step in parent_path:
            parent = parent[step]
        action = data.draw(st.sampled_from(["replace", "delete", "add", "rename"]))
        if action == "replace":
            parent[last] = data.draw(values)
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(keys)] = data.draw(values)
        elif action == "rename" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=12))] = parent.pop(last)
    check(dumps(doc, as_json))


def test_the_unmutated_document_is_valid() -> None:
    """The fuzzing above starts from a config that loads (with its warnings: `resources`
    ignored, mps over timeSlicing; `devices` is honoured, so it adds none)."""
    loaded = load_config(json.dumps(VALID), source="fuzz.yaml")
    assert loaded.config.sharing.strategy == "mps"
    assert len(loaded.warnings) == 2


flag_names = st.sampled_from([f.name for f in FLAGS])
env_names = st.sampled_from([v for f in FLAGS for v in f.env])


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(flag_names, st.text(max_size=15)),
    st.dictionaries(env_names, st.text(max_size=15)),
)
def test_arbitrary_flag_and_env_values(cli: dict[str, str], env: dict[str, str]) -> None:
    try:
        config = resolve(Config(), cli, env)
    except ConfigError as exc:
        message = str(exc)
    else:
        assert isinstance(config, Config)
        return
    assert len(message.splitlines()) == 1
    assert message.isprintable()
