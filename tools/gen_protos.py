"""Regenerate the committed protobuf and gRPC modules of the kubelet adapter.

    python tools/gen_protos.py          # rewrite the generated files in place
    python tools/gen_protos.py --check  # exit 1 if regenerating would change anything

Runs grpcio-tools' protoc with mypy-protobuf's plugins (the `codegen` dependency
group). Protos are compiled with --proto_path=src, so generated imports are the
real package paths (gpuslice.adapters.kubelet._proto...).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ run or loaded by path
import regen

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PROTO_DIR = SRC / "gpuslice" / "adapters" / "kubelet" / "_proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generated_files(root: Path) -> dict[Path, bytes]:
    """Generated files under root's copy of the _proto tree, keyed by path relative to src."""
    base = root / PROTO_DIR.relative_to(SRC)
    return {
        p.relative_to(root): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def _plugin(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        sys.exit(f"gen_protos: {name} not found; install the 'codegen' dependency group")
    return found


def generate(out: Path) -> None:
    """Run protoc over every .proto under _proto, writing into out (a src-like root)."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError:
        sys.exit("gen_protos: grpc_tools is not installed; install the 'codegen' dependency group")
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={SRC}",
        f"--proto_path={include}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *(str(p.relative_to(SRC)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        sys.exit("gen_protos: protoc failed")


def differences(fresh: dict[Path, bytes], committed: dict[Path, bytes]) -> list[str]:
    """One line per file that differs, plus the head of a unified diff for each."""
    return regen.differences(_text(fresh), _text(committed))


def _text(files: dict[Path, bytes]) -> dict[Path, str]:
    return {path: data.decode() for path, data in files.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if regenerating changes files")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gen-protos-") as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_files(out)
    committed = generated_files(SRC)
    if opts.check:
        diff = differences(fresh, committed)
        if diff:
            print("generated protobuf modules are out of date:", *diff, sep="\n")
            print("run: python tools/gen_protos.py")
            return 1
        print(f"generated protobuf modules are up to date ({len(fresh)} files)")
        return 0
    for path in committed.keys() - fresh.keys():
        (SRC / path).unlink()
    for path, data in fresh.items():
        (SRC / path).write_bytes(data)
    print(f"wrote {len(fresh)} generated files under {PROTO_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
