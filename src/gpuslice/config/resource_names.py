"""Which resource a sharing rule may name: one that some GPU can have.

A rule whose name no GPU can ever have (`nvidia.com/gpus`, `nvidia.com/mig-1g5gb`)
would share nothing, silently, on every node; it is refused with a suggestion. A name
that is possible but absent on one node is that node's warning (core.resources).
"""

from __future__ import annotations

import re

from gpuslice.config.checks import FieldError, suggest
from gpuslice.core.resources import (
    MIG_ATTRIBUTES,
    RESOURCE_PREFIX,
    mig_resource_name,
    servable_name,
)
from gpuslice.core.sharing import GPU_RESOURCE

SHARED_SUFFIX = ".shared"
SERVABLE_TEXT = (
    f"a resource a GPU can have: {GPU_RESOURCE}, or {RESOURCE_PREFIX}mig-<g>g.<m>gb "
    "(a MIG profile under migStrategy mixed, such as mig-1g.5gb) optionally followed "
    f"by {', '.join(MIG_ATTRIBUTES[:-1])} or {MIG_ATTRIBUTES[-1]}"
)
# MIG profiles by GPU, for suggestions only: any profile of the grammar is accepted.
_KNOWN_PROFILES = {
    "A100-40GB": "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb",
    "A100-80GB, H100-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "A30": "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb",
    "H100-94GB": "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb",
    "H200": "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
    "B200": "1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb",
}
_MIG_NAMES = (mig_resource_name(p) for ps in _KNOWN_PROFILES.values() for p in ps.split())
_KNOWN = tuple(n.removeprefix(RESOURCE_PREFIX) for n in dict.fromkeys((GPU_RESOURCE, *_MIG_NAMES)))
_SIZES = re.compile(r"(\d+)\s*g\W*(\d+)")  # "1g5gb", "1g-5g"


def check_servable(field: str, value: str, full: str) -> None:
    """Raise FieldError (with a did-you-mean) when no GPU can have resource `full`, the
    prefixed form of `value` as written."""
    if servable_name(full):
        return
    hint = suggest_servable(full)
    raise FieldError(field, value, SERVABLE_TEXT + (f" (did you mean {hint}?)" if hint else ""))


def suggest_servable(full: str) -> str | None:
    """The servable name `full` most likely meant."""
    base = full.removesuffix(SHARED_SUFFIX)
    if base != full and servable_name(base):
        return base  # the advertised (renamed) name given where the resource is named
    short = full.removeprefix(RESOURCE_PREFIX)
    close = suggest(short, _KNOWN)
    if close is not None:
        return RESOURCE_PREFIX + close
    sizes = _SIZES.search(short)
    if "mig" in short and sizes:
        guess = f"{RESOURCE_PREFIX}mig-{int(sizes[1])}g.{int(sizes[2])}gb"
        return guess if servable_name(guess) else None
    return None
