"""Which IMEX channel device nodes exist on this node (/dev/nvidia-caps-imex-channels).

As upstream, a channel exists when its node is a character device at its /dev path or
under a root where the host's /dev is mounted (the driver root inside this container).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from gpuslice.core.container_spec import IMEX_CHANNEL_DEV


def existing_channels(ids: Iterable[int], roots: Iterable[str] = ("/",)) -> frozenset[int]:
    """The channels of `ids` whose device node is found under one of `roots`."""
    bases = tuple(dict.fromkeys(r for r in roots if r))
    return frozenset(i for i in ids if any(_is_char_device(b, i) for b in bases))


def _is_char_device(root: str, channel: int) -> bool:
    path = os.path.join(root, IMEX_CHANNEL_DEV.format(channel).lstrip("/"))
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
