"""Pin the sha256 of every locked distribution, so that pip installs the locks only with
--require-hashes (dev.py, CI and the image).

    python tools/lock_hashes.py requirements/runtime.lock requirements/dev.lock

For each lock: `pip download --no-deps --only-binary=:all:` of its pins (binary wheels only:
nothing is built at install time) from whatever index pip is configured with, then each pin
gets a `--hash=sha256:` line for the wheel pip chose, as `pip hash` prints it. Comments and
order are kept; hashes already there are replaced. Run it after changing a lock. The wheels
are those for this machine's Python and platform (CPython 3.11, x86_64 Linux): the ones dev.py,
CI and the image install. The image's lock (runtime.lock) also pins the wheels of its other
architecture, aarch64 (the arm64 image), so deploy/image/build.sh fetches them with
--require-hashes on any machine.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
HASH_LINE = re.compile(r"^\s+--hash=sha256:[0-9a-f]{64}\s*\\?\s*$")
# pip's options for CPython 3.11 wheels of another platform, by lock file name
AARCH64 = ["--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_17_aarch64",
           "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11",
           "--implementation", "cp"]  # fmt: skip
FOREIGN = {"runtime.lock": [AARCH64]}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for line in text.splitlines() if (m := PIN.match(line))]


def strip_hashes(text: str) -> str:
    """The lock without hash lines or line continuations after its pins."""
    out = []
    for line in text.splitlines():
        if HASH_LINE.match(line):
            continue
        out.append(re.sub(r"\s*\\\s*$", "", line) if PIN.match(line) else line)
    return "\n".join(out) + "\n"


def wheel_hashes(text: str, platforms: list[list[str]] | None = None) -> dict[str, list[str]]:
    """Canonical name -> sha256 of the wheels pip downloads for the lock's pins: this
    machine's, then those of each further platform (pip options) given."""
    found: dict[str, list[str]] = {}
    for platform in [[], *(platforms or [])]:
        with tempfile.TemporaryDirectory(prefix="lock-hashes-") as tmp:
            reqs = Path(tmp) / "pins.txt"
            reqs.write_text("".join(f"{n}=={v}\n" for n, v in pins(text)))
            pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            only = ["--only-binary=:all:", "--disable-pip-version-check", *platform]
            subprocess.run([*pip, *only, "-r", str(reqs), "-d", tmp], check=True)
            for wheel in sorted(Path(tmp).glob("*.whl")):
                digests = found.setdefault(canonical(wheel.name.split("-")[0]), [])
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                if digest not in digests:  # a pure-Python wheel serves every platform
                    digests.append(digest)
    return found


def with_hashes(text: str, hashes: dict[str, list[str]]) -> str:
    out = []
    for line in strip_hashes(text).splitlines():
        match = PIN.match(line)
        if not match:
            out.append(line)
            continue
        digests = hashes.get(canonical(match[1]))
        if not digests:
            sys.exit(f"lock_hashes: no wheel downloaded for {match[1]}=={match[2]}")
        out.append(f"{line} \\")
        out += [f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "")
                for i, d in enumerate(digests)]  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for path in map(Path, argv):
        text = path.read_text()
        hashes = wheel_hashes(strip_hashes(text), FOREIGN.get(path.name))
        path.write_text(with_hashes(text, hashes))
        print(f"lock_hashes: {path}: {len(pins(text))} pins hashed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
