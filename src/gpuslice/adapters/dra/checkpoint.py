"""The DRA plugin's checkpoint: the claims it prepared, so that unprepare (and a repeated
prepare) works after the agent restarts, without the ResourceClaim.

One JSON file in the plugin's directory under /var/lib/kubelet/plugins, which the agent
owns but other processes could tamper with: it is read through adapters.outside_files
(without following a link, only as a regular file, up to MAX_BYTES) and decoded off the
loop into a typed value; it is replaced atomically (a new file made with O_EXCL, renamed
over the old) before a prepare or unprepare is answered. The driver's writes need not be
fsync'ed: after a crash of the node, whatever part of them reached the disk, the next
start's sweep makes specs and entries agree (an orphan spec is removed, an entry whose
spec is gone rolled back), and the kubelet prepares its pods' claims again.

Each claim carries its state, as NVIDIA's driver's does: PrepareStarted is written before
the claim's CDI spec, PrepareCompleted after it, so an agent killed in between knows at
start which spec may be half done. Fields this agent does not know are ignored (a newer
agent's additions: a downgrade keeps working); an older file without states is all
PrepareCompleted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from functools import partial

import msgspec

from gpuslice.adapters.outside_files import read_bytes, reason, replace_atomically
from gpuslice.core.dra.claims import ClaimRef, PreparedClaim, PreparedDevice
from gpuslice.core.errors import BackendError

VERSION = 1
MAX_BYTES = 4 * 1024 * 1024
CHECKPOINT_NAME = "checkpoint.json"


STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


class _Device(msgspec.Struct, rename="camel"):
    requests: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str | None = None
    admin: bool = False
    memory_mib: int | None = None  # the GPU memory the claim was charged (consumable)


class _Claim(msgspec.Struct, rename="camel"):
    namespace: str
    name: str
    devices: list[_Device]
    spec: str = ""
    state: str = COMPLETED


class _File(msgspec.Struct):
    version: int
    claims: dict[str, _Claim]


class ClaimCheckpointFile:
    """The ClaimCheckpoint port over <directory>/checkpoint.json."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CHECKPOINT_NAME)

    async def load(self) -> dict[str, PreparedClaim]:
        return await asyncio.to_thread(self._load)

    async def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True) -> None:
        data = _File(VERSION, {uid: _encode(c) for uid, c in claims.items()})
        text = msgspec.json.encode(data).decode()
        write = partial(replace_atomically, dir_mode=0o750, durable=durable)
        try:
            await asyncio.to_thread(write, self.path, text, 0o600)
        except OSError as exc:
            raise BackendError(
                f"DRA checkpoint {self.path}: cannot write: {exc.strerror or exc}", transient=True
            ) from None

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            raw = read_bytes(self.path, limit=MAX_BYTES, follow=False)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise BackendError(f"DRA checkpoint {self.path}: {reason(exc)}") from None
        try:
            data = msgspec.json.decode(raw, type=_File)
        except msgspec.DecodeError as exc:
            raise BackendError(f"DRA checkpoint {self.path}: not a checkpoint: {exc}") from None
        if data.version != VERSION:
            raise BackendError(
                f"DRA checkpoint {self.path}: version {data.version}, this agent reads {VERSION}"
            )
        return {uid: _decode(uid, c) for uid, c in data.claims.items()}


def _encode(claim: PreparedClaim) -> _Claim:
    devices = [
        _Device(
            list(d.requests), d.pool, d.device, list(d.cdi_ids), d.share_id, d.admin, d.memory_mib
        )
        for d in claim.devices
    ]
    state = COMPLETED if claim.completed else STARTED
    return _Claim(claim.ref.namespace, claim.ref.name, devices, claim.spec, state)


def _decode(uid: str, claim: _Claim) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(d.requests), d.pool, d.device, tuple(d.cdi_ids), d.share_id, d.admin, d.memory_mib
        )
        for d in claim.devices
    )
    ref = ClaimRef(claim.namespace, uid, claim.name)
    return PreparedClaim(ref, devices, claim.spec, completed=claim.state != STARTED)
