"""YAML text as plain data, bounded: only what the v1 format needs.

Plain scalars resolve to str, int, float, bool or null, or a date (which the schema
then refuses with a hint to quote it); the explicit tags !!str, !!int, !!float, !!bool,
!!null, !!timestamp, !!map and !!seq are honoured. Any other tag, or an explicit tag
whose value is not of its type (`!!bool maybe`), is a YAMLError naming its line and
column. Aliases are bounded: at most MAX_ALIASES of them, no alias inside its own
anchor, and at most MAX_NODES nodes once every alias is expanded, so a bomb of a few
hundred bytes is refused before anything walks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml
import yaml.cyaml

from gpuslice.config.checks import show

# The errors a read raises, for the modules that read YAML through this one.
YAMLError = yaml.YAMLError
MarkedYAMLError = yaml.MarkedYAMLError

MAX_ALIASES = 1000
MAX_NODES = 20_000  # also with aliases expanded; a real config has a few hundred

_CORE = "tag:yaml.org,2002:"
_SCALARS = ("str", "int", "float", "bool", "null", "timestamp")
_KEPT_RESOLVERS = {f"{_CORE}{t}" for t in (*_SCALARS, "merge")}


class _PyParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    """The pure-Python parser, where PyYAML was built without libyaml."""

    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


_Parser: Any = vars(yaml.cyaml).get("CParser", _PyParser)  # libyaml's: about 10x faster


class _Composer(yaml.composer.Composer):
    """Nodes from the parser's events, counted as they come: a document of more than
    MAX_NODES nodes is refused before it is all in memory."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            mark = self.peek_event().start_mark  # type: ignore[attr-defined]
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_NODES} values", mark)
        return super().compose_node(parent, index)


class _Resolver(yaml.resolver.Resolver):
    """The YAML 1.1 implicit types without `=` (the value key)."""


_Resolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag in _KEPT_RESOLVERS]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}


class _Constructor(yaml.constructor.SafeConstructor):
    """Only the v1 types; a key given twice in one mapping is refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != f"{_CORE}merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"key {show(key_node.value)} is given twice",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_unknown(self, node: yaml.Node) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"tag {_short(node.tag)} is not allowed in a config", node.start_mark
        )


def _checked(kind: str) -> Any:
    """SafeConstructor's constructor of `kind`, its failures on a bad value made one
    YAMLError (PyYAML raises KeyError, IndexError or ValueError there)."""
    base = yaml.constructor.SafeConstructor.yaml_constructors[f"{_CORE}{kind}"]

    def construct(self: _Constructor, node: yaml.Node) -> Any:
        try:
            return base(self, node)
        except yaml.YAMLError:
            raise
        except (KeyError, IndexError, ValueError, TypeError, AttributeError, OverflowError):
            value = node.value if isinstance(node, yaml.ScalarNode) else type(node).__name__
            raise yaml.constructor.ConstructorError(
                None, None, f"!!{kind} {show(value)}: not a valid {kind}", node.start_mark
            ) from None

    return construct


_Constructor.yaml_constructors = {
    **{f"{_CORE}{kind}": _checked(kind) for kind in _SCALARS},
    f"{_CORE}seq": yaml.constructor.SafeConstructor.construct_yaml_seq,
    f"{_CORE}map": yaml.constructor.SafeConstructor.construct_yaml_map,
    None: _Constructor.construct_unknown,
}


class _Loader(_Composer, _Parser, _Constructor, _Resolver):  # type: ignore[misc]
    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        _Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


def load_yaml(text: str) -> object:
    """The single document of `text` as plain data. Raises yaml.YAMLError."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes as if every alias were expanded (each distinct node's size once,
    so this costs what the text holds, not what it expands to)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    seen = [0]  # references to an already-counted node: the aliases

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            seen[0] += 1
            if seen[0] > MAX_ALIASES:
                _refuse(node, f"more than {MAX_ALIASES} aliases")
            return sizes[key]
        if key in open_:
            _refuse(node, "an alias refers to the node that holds it")
        open_.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                expanded = " once its aliases are expanded" if seen[0] else ""
                _refuse(node, f"more than {MAX_NODES} values{expanded}")
        open_.discard(key)
        sizes[key] = total
        return total

    size(root)


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def _refuse(node: yaml.Node, problem: str) -> None:
    raise yaml.composer.ComposerError(None, None, problem, node.start_mark)


def dump_documents(objects: Iterable[object]) -> str:
    """`objects` as YAML documents, each opened by `---`, keys in their order."""
    return "".join("---\n" + yaml.safe_dump(o, sort_keys=False, width=1000) for o in objects)
