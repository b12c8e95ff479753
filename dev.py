#!/usr/bin/env python3
"""Bootstrap and run gpuslice from a fresh clone with nothing but python3.

    python3 dev.py demo      # the agent on a simulated DGX A100 against a kubelet stand-in
    python3 dev.py test      # lint, types, layer contracts, generated-code check, every test
                             # (what CI runs; 7 to 15 minutes on 2 cores); arguments after
                             # `test` go to pytest: `python3 dev.py test tests/unit` (1 minute)
    python3 dev.py bench     # the benchmark suite
    python3 dev.py release   # chart package, image and checksums in dist/ (tools/release.py)
    python3 dev.py run ...   # any gpuslice command, e.g. `python3 dev.py run inspect --help`

The first call creates .venv and installs the locked dependencies into it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
LOCK = ROOT / "requirements" / "dev.lock"


def _ensure_env() -> None:
    digest = hashlib.sha256(LOCK.read_bytes() + (ROOT / "pyproject.toml").read_bytes())
    stamp = VENV / f".installed-{digest.hexdigest()[:16]}"
    if stamp.exists():
        return
    if not (BIN / "python").exists():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(BIN / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    print("dev.py: installing locked dependencies into .venv", flush=True)
    # Every pin carries the sha256 of its wheel (tools/lock_hashes.py); nothing is built.
    subprocess.run([*pip, "--require-hashes", "--only-binary=:all:", "-r", str(LOCK)], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    for old in VENV.glob(".installed-*"):
        old.unlink()
    stamp.touch()


def _run(*argv: str) -> int:
    return subprocess.run(argv, cwd=ROOT, check=False).returncode


def test(extra: list[str]) -> int:
    code = [p for p in ("src", "tests", "bench", "tools", "dev.py") if (ROOT / p).exists()]
    steps = [
        [str(BIN / "ruff"), "check", *code],
        [str(BIN / "ruff"), "format", "--check", *code],
        [str(BIN / "mypy")],
        [str(BIN / "lint-imports")],
        [str(BIN / "python"), "tools/gen_protos.py", "--check"],
        [str(BIN / "python"), "tools/gen_chart.py", "--check"],
        [str(BIN / "pytest"), *extra],
    ]
    for step in steps:
        print(
            f"dev.py: {' '.join(Path(step[0]).name if i == 0 else a for i, a in enumerate(step))}",
            flush=True,
        )
        code = _run(*step)
        if code != 0:
            print(f"dev.py: step failed with exit code {code}", flush=True)
            return code
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"demo", "test", "bench", "run", "release"}:
        print(__doc__)
        return 2
    cmd, extra = sys.argv[1], sys.argv[2:]
    os.chdir(ROOT)
    _ensure_env()
    if cmd == "test":
        return test(extra)
    if cmd == "demo":
        return _run(str(BIN / "gpuslice"), "demo", *extra)
    if cmd == "bench":
        return _run(str(BIN / "python"), "-m", "bench", *extra)
    if cmd == "release":
        return _run(str(BIN / "python"), "tools/release.py", *extra)
    return _run(str(BIN / "gpuslice"), *extra)


if __name__ == "__main__":
    sys.exit(main())
