"""The DRA plugin's checkpoint: the claims it prepared, so that unprepare (and a repeated
prepare) works after the agent restarts, without the ResourceClaim, and the memory limits
of their pods are kept.

One JSON file in the plugin's directory under /var/lib/kubelet/plugins, which the agent
owns but other processes could tamper with: it is read through adapters.outside_files
(without following a link, only as a regular file, up to MAX_BYTES) and decoded off the
loop into a typed value. Every save a prepare's or an unprepare's answer depends on is
durable before it is sent: a temporary file in the same directory, fsync'ed, renamed
over the old one, and the directory fsync'ed (a PrepareStarted mark is only renamed
into place: frontends.dra.driver says why that is enough). The file carries a checksum
of its claims as written (sha256 of the exact bytes of `claims`), as the kubelet's own
checkpoints carry one of their data, so a torn or altered file is told from a
checkpoint: it raises BadCheckpoint (the driver sets it aside and rebuilds). A file
without a checksum, as releases before it wrote, is read as it is.

    {"version": 1, "claims": {"<uid>": {...}}, "checksum": "<sha256 hex of claims>"}

Each claim is a small record with its state, as NVIDIA's driver's: PrepareStarted is
written before the claim's CDI spec, PrepareCompleted after it, so an agent killed in
between knows at start which spec may be half done. `version` changes only for a change
an older agent would misread; fields it does not know are ignored (a newer agent's
additions, the checksum itself: a downgrade keeps working), and a missing one takes its
default (an older file without states is all PrepareCompleted).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from functools import partial

import msgspec

from gpuslice.adapters.outside_files import (
    RefusedFileError,
    open_dir,
    read_bytes,
    reason,
    replace_atomically,
)
from gpuslice.core.dra.claims import ClaimRef, PreparedClaim, PreparedDevice
from gpuslice.core.errors import BackendError, BadCheckpoint
from gpuslice.core.isolation import Limit
from gpuslice.core.mps import DaemonPlan

VERSION = 1
MAX_BYTES = 4 * 1024 * 1024
CHECKPOINT_NAME = "checkpoint.json"
KEEP_BAD = 3  # bad files set aside, newest first
BAD_SUFFIX = ".bad-"

STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


class _Limit(msgspec.Struct):
    hard: int
    soft: int = 0


class _Device(msgspec.Struct, rename="camel"):
    requests: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str | None = None
    admin: bool = False
    memory_mib: int | None = None  # the GPU memory the claim was charged (consumable)


class _Instance(msgspec.Struct, rename="camel"):
    parent_uuid: str
    profile: str
    placement_start: int


class _Daemon(msgspec.Struct, rename="camel"):
    resource: str
    root: str
    gpus: list[str]
    pinned_mib: list[int]
    thread_percentage: int


class _Claim(msgspec.Struct, rename="camel"):
    namespace: str
    name: str
    devices: list[_Device]
    spec: str = ""
    state: str = COMPLETED
    pods: list[str] = msgspec.field(default_factory=list)  # reservedFor's, when prepared
    limits: dict[str, _Limit] = msgspec.field(default_factory=dict)  # GPU UUID -> limit
    mig_instances: list[_Instance] = msgspec.field(default_factory=list)  # --dra-dynamic-mig
    mps_daemon: _Daemon | None = None  # MPS on MIG devices: the claim's own daemon


class _Head(msgspec.Struct):
    version: int


class _File(msgspec.Struct):
    version: int
    claims: msgspec.Raw  # checked against `checksum` before it is decoded
    checksum: str | None = None


class ClaimCheckpointFile:
    """The ClaimCheckpoint port over <directory>/checkpoint.json."""

    def __init__(self, directory: str, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.path = os.path.join(directory, CHECKPOINT_NAME)
        self._clock = clock
        self._tidy = True  # leftovers of an earlier agent's save go at our first save

    async def load(self) -> dict[str, PreparedClaim]:
        return await asyncio.to_thread(self._load)

    async def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True) -> None:
        text = encode(claims)
        try:
            if self._tidy:
                await asyncio.to_thread(self._remove_leftovers)
                self._tidy = False
            write = partial(replace_atomically, dir_mode=0o750, durable=durable)
            await asyncio.to_thread(write, self.path, text, 0o600)
        except OSError as exc:
            raise BackendError(
                f"DRA checkpoint {self.path}: cannot write: {exc.strerror or exc}", transient=True
            ) from None

    async def set_aside(self) -> str:
        try:
            return await asyncio.to_thread(self._set_aside)
        except OSError as exc:
            raise BackendError(
                f"DRA checkpoint {self.path}: cannot move it aside: {exc.strerror or exc}"
            ) from None

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            raw = read_bytes(self.path, limit=MAX_BYTES, follow=False)
        except FileNotFoundError:
            return {}
        except RefusedFileError as exc:
            raise BadCheckpoint(f"DRA checkpoint {self.path}: {exc.problem}") from None
        except OSError as exc:
            raise BackendError(f"DRA checkpoint {self.path}: {reason(exc)}") from None
        return decode(raw, self.path)

    def _remove_leftovers(self) -> None:
        """Temporary files of a save an earlier agent was killed in before its rename
        (the checkpoint is then the one before that save). Only once this agent saves:
        a predecessor that still serves may be writing one."""
        prefix = f".{CHECKPOINT_NAME}."
        with contextlib.suppress(OSError):
            for name in os.listdir(self.directory):
                if name.startswith(prefix) and name.endswith(".tmp"):
                    os.unlink(os.path.join(self.directory, name))

    def _set_aside(self) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._clock()))
        prefix = CHECKPOINT_NAME + BAD_SUFFIX
        older = sorted(n for n in os.listdir(self.directory) if n.startswith(prefix))
        for name in older[: max(len(older) - (KEEP_BAD - 1), 0)]:
            os.unlink(os.path.join(self.directory, name))
        target = f"{prefix}{stamp}Z"
        n = 1
        while os.path.lexists(os.path.join(self.directory, target)):
            n += 1
            target = f"{prefix}{stamp}Z.{n}"
        os.rename(self.path, os.path.join(self.directory, target))
        dir_fd = open_dir(self.directory, follow=False)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return os.path.join(self.directory, target)


def encode(claims: Mapping[str, PreparedClaim]) -> str:
    """The file's text for `claims`, with the checksum of the claims' bytes."""
    body = msgspec.json.encode({uid: _encode(c) for uid, c in claims.items()})
    data = _File(VERSION, msgspec.Raw(body), hashlib.sha256(body).hexdigest())
    return msgspec.json.encode(data).decode()


def decode(raw: bytes, path: str) -> dict[str, PreparedClaim]:
    """The claims of a file's bytes. Raises BadCheckpoint, naming `path` and why."""
    try:
        version = msgspec.json.decode(raw, type=_Head).version
        if version != VERSION:
            raise BadCheckpoint(
                f"DRA checkpoint {path}: version {version}, this agent reads {VERSION}"
            )
        data = msgspec.json.decode(raw, type=_File)
        if data.checksum is not None and data.checksum != hashlib.sha256(data.claims).hexdigest():
            raise BadCheckpoint(f"DRA checkpoint {path}: checksum mismatch (altered or torn)")
        claims = msgspec.json.decode(data.claims, type=dict[str, _Claim])
    except msgspec.DecodeError as exc:
        raise BadCheckpoint(f"DRA checkpoint {path}: not a checkpoint: {exc}") from None
    return {uid: _decode(uid, c) for uid, c in claims.items()}


def _encode(claim: PreparedClaim) -> _Claim:
    devices = [
        _Device(
            list(d.requests), d.pool, d.device, list(d.cdi_ids), d.share_id, d.admin, d.memory_mib
        )
        for d in claim.devices
    ]
    state = COMPLETED if claim.completed else STARTED
    limits = {gpu: _Limit(lim.hard, lim.soft) for gpu, lim in claim.limits}
    instances = [_Instance(*i) for i in claim.instances]
    d = claim.daemon
    daemon = None if d is None else _Daemon(d.resource, d.root, list(d.gpu_uuids),
                                            list(d.pinned_mib), d.thread_percentage)  # fmt: skip
    return _Claim(claim.ref.namespace, claim.ref.name, devices, claim.spec, state,
                  list(claim.pods), limits, instances, daemon)  # fmt: skip


def _decode(uid: str, claim: _Claim) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(d.requests), d.pool, d.device, tuple(d.cdi_ids), d.share_id, d.admin, d.memory_mib
        )
        for d in claim.devices
    )
    ref = ClaimRef(claim.namespace, uid, claim.name)
    limits = tuple((gpu, Limit(lim.hard, lim.soft)) for gpu, lim in sorted(claim.limits.items()))
    instances = tuple((i.parent_uuid, i.profile, i.placement_start) for i in claim.mig_instances)
    d = claim.mps_daemon
    daemon = None
    if d is not None:
        daemon = DaemonPlan(d.resource, d.root, tuple(d.gpus), tuple(d.pinned_mib),
                            d.thread_percentage)  # fmt: skip
    return PreparedClaim(ref, devices, claim.spec, claim.state != STARTED, tuple(claim.pods),
                         limits, instances, daemon)  # fmt: skip
