"""Reading and writing files the agent does not fully own.

Files the kubelet, the kernel, a user or another process may have put in place: the
kubelet's checkpoint, /proc/<pid>/cgroup, config files, CDI specs, the socket-directory
lock's holder file, the simulated node's events file. Each read opens with O_NONBLOCK (a
FIFO never blocks), takes only a regular file (a FIFO, a device or a directory is
refused with one line) and reads at most `limit` bytes. Where the path is ours
(`follow=False`) the last component is opened with O_NOFOLLOW, relative to an opened
directory when one is given, so a planted symlink is refused rather than followed.
Writes go to a temporary file with an unpredictable name created with O_EXCL in the
target's directory, then renamed over the target; directories we create get their mode
explicitly, whatever the umask. Every failure is an OSError; RefusedFileError says why in a
line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_CHUNK = 1 << 16


class RefusedFileError(OSError):
    """A file that is not read: not a regular file, a link where none may be, too large."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(errno.EINVAL, problem, os.fspath(path))
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.filename}: {self.problem}"


def reason(exc: OSError) -> str:
    """Why a read failed, for a one-line message: the refusal, or the OS's words."""
    if isinstance(exc, RefusedFileError):
        return exc.problem
    return exc.strerror or str(exc)


def read_bytes(
    path: str | os.PathLike[str],
    *,
    limit: int,
    follow: bool = True,
    dir_fd: int | None = None,
) -> bytes:
    """At most `limit` bytes of the regular file at `path`. Raises RefusedFileError for a
    special file, a symlink (when not `follow`) or a file larger than `limit`, and
    OSError when it cannot be opened or read."""
    flags = _READ | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise RefusedFileError(path, "is a symbolic link; refused") from None
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise RefusedFileError(path, f"is {_kind(kind)}, not a regular file; refused")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            except BlockingIOError:  # pragma: no cover - regular files do not block
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise RefusedFileError(path, f"larger than {limit} bytes; refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(
    path: str | os.PathLike[str],
    *,
    limit: int,
    follow: bool = True,
    dir_fd: int | None = None,
    errors: str = "strict",
) -> str:
    """read_bytes as UTF-8 text. With errors="strict" a file that is not UTF-8 raises
    RefusedFileError (naming the offset); "replace" or "surrogateescape" decode anyway."""
    data = read_bytes(path, limit=limit, follow=follow, dir_fd=dir_fd)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise RefusedFileError(path, f"not UTF-8 text (byte offset {exc.start}); refused") from None


def open_dir(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """An O_DIRECTORY fd of `path` (close it); a symlink is refused unless `follow`."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(path, flags)
    except OSError as exc:  # O_NOFOLLOW|O_DIRECTORY on a link: ELOOP or ENOTDIR
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and not follow and os.path.islink(path):
            raise RefusedFileError(path, "is a symbolic link, not a directory; refused") from None
        raise


def make_dir(path: str | os.PathLike[str], mode: int, *, parents_mode: int = 0o755) -> None:
    """Create `path` with exactly `mode` (missing parents with `parents_mode`), whatever
    the umask; an existing directory is left as it is. Raises OSError."""
    where = Path(path)
    if where.is_dir():
        return
    if not where.parent.is_dir():
        make_dir(where.parent, parents_mode, parents_mode=parents_mode)
    with contextlib.suppress(FileExistsError):
        os.mkdir(where, mode)
        fd = open_dir(where, follow=False)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    if not where.is_dir():
        raise RefusedFileError(where, "exists and is not a directory; refused")


def own_dir(path: str | os.PathLike[str], mode: int, *, uid: int | None = None) -> None:
    """Make `path` a directory of ours with exactly `mode`: created when missing; a
    symlink, a non-directory or a directory owned by another user than `uid` (default:
    this process's) is refused, never changed. Raises OSError."""
    make_dir(path, mode)
    fd = open_dir(path, follow=False)
    try:
        owner = os.fstat(fd).st_uid
        want = os.geteuid() if uid is None else uid
        if owner != want:
            raise RefusedFileError(path, f"is owned by uid {owner}, not {want}; refused")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def replace_atomically(
    path: str | os.PathLike[str],
    text: str,
    mode: int = 0o644,
    *,
    dir_mode: int = 0o755,
    durable: bool = True,
) -> None:
    """Replace `path` so that a reader sees the old content or the new, never a part.

    The new content goes to a hidden temporary file (readers that scan the directory
    skip names starting with '.' or ending in '.tmp') created with O_EXCL|O_NOFOLLOW
    under an unpredictable name, is flushed to disk, renamed over the old file, and the
    directory is synced so the rename survives a crash too. A missing directory is
    created with `dir_mode`. Not `durable`: without the syncs (still atomic for readers
    and across a process kill). Raises OSError; no temporary file is left behind."""
    target = Path(path)
    make_dir(target.parent, dir_mode)
    dir_fd = open_dir(target.parent)
    try:
        write_in_dir(dir_fd, target.name, text, mode, durable=durable)
    finally:
        os.close(dir_fd)


def write_in_dir(
    dir_fd: int, name: str, text: str, mode: int = 0o644, *, durable: bool = True
) -> None:
    """replace_atomically for `name` in the opened directory `dir_fd`; not `durable`:
    without the fsyncs (a file that need not survive a crash, written in a moment)."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), mode)
            if durable:
                os.fsync(out.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if durable:
        os.fsync(dir_fd)  # make the rename itself durable


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"
