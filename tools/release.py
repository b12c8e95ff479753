"""Build a release's artefacts reproducibly, with their checksums.

    python3 dev.py release               # chart package, image, dist/SHA256SUMS
    python3 dev.py release --no-image    # the chart package only (no buildah needed)
    python3 dev.py release --arch amd64,arm64 --push registry.example.com/team/gpuslice
    python3 dev.py release --arch amd64,arm64 --push ... --dry-run   # the commands only

The version is pyproject.toml's, the one place it is set: tools/gen_chart.py writes it into
Chart.yaml (version and appVersion, checked by `dev.py test`), and deploy/image/build.sh tags
the image with it. Everything is stamped with SOURCE_DATE_EPOCH (default: the last commit's
time), so the same commit gives the same bytes:

- dist/gpuslice-<version>.tgz: the chart as `helm package` lays it out (gpuslice/..., the
  files .helmignore does not exclude), in a tar with sorted entries, fixed mtimes, owner 0:0
  and no user names, gzipped without a name or time; `helm push` it to an OCI registry
  (`helm push dist/gpuslice-<version>.tgz oci://REGISTRY/charts`);
- the image localhost/gpuslice:<version> (IMAGE to choose another name), by build.sh, and
  dist/gpuslice-<version>.image: its image ID (the digest of its config). With several
  --arch, or with --push, one image per architecture (<image>-<arch>, build.sh with ARCH)
  gathered in a manifest list named <image>, or REPOSITORY:<version> with --push, which
  `buildah manifest push --all` publishes to that repository; the .image file then holds
  each image's ID, and the list's digest once pushed;
- dist/SHA256SUMS: the sha256 of each file above (`sha256sum -c SHA256SUMS`).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import io
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ run or loaded by path
import gen_chart

ROOT = gen_chart.ROOT
CHART = gen_chart.CHART
DIST = ROOT / "dist"
ARCHES = ("amd64", "arm64")
BUILD_SH = "deploy/image/build.sh"


class Step(NamedTuple):
    """One command of the image's release: argv with `env` added to the environment."""

    argv: list[str]
    env: Mapping[str, str] = MappingProxyType({})
    may_fail: bool = False  # removing what may not be there

    def shell(self) -> str:
        line = shlex.join([*(f"{k}={v}" for k, v in self.env.items()), *self.argv])
        return line + (" 2>/dev/null || true" if self.may_fail else "")


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        sys.exit(f"release: error: {name} not found")
    return found


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    found = subprocess.run(
        [tool("git"), "-C", str(ROOT), "log", "-1", "--format=%ct"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return int(found.stdout.strip() or 0)


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .helmignore's patterns (globs on the path or its base name) exclude `rel`."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def chart_files(chart: Path) -> list[Path]:
    ignore = chart / ".helmignore"
    patterns = []
    if ignore.exists():
        lines = (line.strip() for line in ignore.read_text().splitlines())
        patterns = [line for line in lines if line and not line.startswith("#")]
    return sorted(
        p
        for p in chart.rglob("*")
        if p.is_file() and not ignored(p.relative_to(chart).as_posix(), patterns)
    )


def package_chart(chart: Path, out_dir: Path, epoch: int) -> Path:
    """The chart as a reproducible .tgz in `out_dir`."""
    version = gen_chart.project_version()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in chart_files(chart):
            info = tarfile.TarInfo(f"{chart.name}/{path.relative_to(chart).as_posix()}")
            data = path.read_bytes()
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = out_dir / f"{chart.name}-{version}.tgz"
    with open(out, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def image_steps(
    version: str, arches: list[str], epoch: int, *, image: str, push: str, digest: Path
) -> tuple[list[Step], dict[str, str], str]:
    """The commands that build and publish the image: (steps, image per architecture,
    the manifest list's name or "" for one image built as before)."""
    built = {"SOURCE_DATE_EPOCH": str(epoch)}
    if not push and arches == [host_arch()]:
        return [Step(["bash", BUILD_SH], {"IMAGE": image, **built})], {arches[0]: image}, ""
    images = {arch: f"{image}-{arch}" for arch in arches}
    listed = f"{push}:{version}" if push else image
    steps = [Step(["bash", BUILD_SH], {"ARCH": a, "IMAGE": i, **built}) for a, i in images.items()]
    steps += [
        Step(["buildah", "rmi", listed], may_fail=True),  # a list (or image) of a former run
        Step(["buildah", "manifest", "create", listed]),
        *(Step(["buildah", "manifest", "add", listed, f"containers-storage:{i}"])
          for i in images.values()),
    ]  # fmt: skip
    if push:
        steps.append(Step(["buildah", "manifest", "push", "--all", "--digestfile", str(digest),
                           listed, f"docker://{listed}"]))  # fmt: skip
    return steps, images, listed


def run_step(step: Step) -> None:
    argv = [tool(step.argv[0]), *step.argv[1:]]
    quiet = subprocess.DEVNULL if step.may_fail else None
    done = subprocess.run(argv, env={**os.environ, **step.env}, cwd=ROOT, stderr=quiet)
    if done.returncode and not step.may_fail:
        sys.exit(f"release: error: {step.shell()} exited {done.returncode}")


def build_image(steps: list[Step], images: dict[str, str], listed: str, out: Path) -> Path:
    """Run the steps; `out` records each image's ID (and the pushed list's digest)."""
    for step in steps:
        run_step(step)
    lines = []
    for image in images.values():
        image_id = subprocess.run(
            [tool("buildah"), "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        lines.append(f"{image} sha256:{image_id}\n")
    digest = out.with_suffix(".digest")
    if listed and digest.exists():
        lines.append(f"{listed} {digest.read_text().strip()}\n")
        digest.unlink()
    out.write_text("".join(lines))
    return out


def arch_list(text: str) -> list[str]:
    arches = [a.strip() for a in text.split(",") if a.strip()]
    wrong = [a for a in arches if a not in ARCHES]
    if not arches or wrong or len(set(arches)) != len(arches):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected architectures from {', '.join(ARCHES)}, comma-separated, once each"
        )
    return arches


def repository(text: str) -> str:
    """A repository to push to (registry/path, no tag: the tag is the version)."""
    last = text.rsplit("/", 1)[-1]
    if "/" not in text or "://" in text or ":" in last or "@" in last:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a repository such as registry.example.com/team/gpuslice "
            "(no transport, no tag: the tag is the version)"
        )
    return text


def write_sums(files: list[Path], out_dir: Path) -> Path:
    lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in sorted(files)]
    sums = out_dir / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-image", action="store_true", help="package the chart only")
    parser.add_argument("--dist", type=Path, default=DIST, help="where the artefacts go")
    parser.add_argument("--arch", type=arch_list, default=None, metavar="ARCH,...",
                        help=f"the image's architectures, of {', '.join(ARCHES)} "
                        "(default: this machine's)")  # fmt: skip
    parser.add_argument(
        "--push",
        type=repository,
        default=None,
        metavar="REPOSITORY",
        help="publish the images under one tag (the version) to this repository",
    )
    parser.add_argument("--dry-run", action="store_true",
                        help="print the image's commands, run nothing")  # fmt: skip
    opts = parser.parse_args(argv)
    version = gen_chart.project_version()
    epoch = source_date_epoch()
    record = opts.dist / f"gpuslice-{version}.image"
    image = os.environ.get("IMAGE", f"localhost/gpuslice:{version}")
    arches = opts.arch or [host_arch()]
    digest = record.with_suffix(".digest").absolute()  # the steps run in ROOT
    if digest.is_relative_to(ROOT):
        digest = digest.relative_to(ROOT)
    steps, images, listed = image_steps(version, arches, epoch, image=image, push=opts.push or "",
                                        digest=digest)  # fmt: skip
    if opts.dry_run:
        print("\n".join(step.shell() for step in steps))
        return 0
    if gen_chart.main(["--check"]) != 0:
        return 1  # the chart must be what the sources generate
    opts.dist.mkdir(parents=True, exist_ok=True)
    files = [package_chart(CHART, opts.dist, epoch)]
    if not opts.no_image:
        files.append(build_image(steps, images, listed, record))
    sums = write_sums(files, opts.dist)
    for f in [*files, sums]:
        print(f"release: {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
