"""Build a release's artefacts reproducibly, with their checksums.

    python3 dev.py release               # chart package, image, dist/SHA256SUMS
    python3 dev.py release --no-image    # the chart package only (no buildah needed)

The version is pyproject.toml's, the one place it is set: tools/gen_chart.py writes it into
Chart.yaml (version and appVersion, checked by `dev.py test`), and deploy/image/build.sh tags
the image with it. Everything is stamped with SOURCE_DATE_EPOCH (default: the last commit's
time), so the same commit gives the same bytes:

- dist/gpuslice-<version>.tgz: the chart as `helm package` lays it out (gpuslice/..., the
  files .helmignore does not exclude), in a tar with sorted entries, fixed mtimes, owner 0:0
  and no user names, gzipped without a name or time; `helm push` it to an OCI registry
  (`helm push dist/gpuslice-<version>.tgz oci://REGISTRY/charts`);
- the image localhost/gpuslice:<version> (IMAGE to choose another name), by build.sh, and
  dist/gpuslice-<version>.image: its image ID (the digest of its config);
- dist/SHA256SUMS: the sha256 of each file above (`sha256sum -c SHA256SUMS`).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ run or loaded by path
import gen_chart

ROOT = gen_chart.ROOT
CHART = gen_chart.CHART
DIST = ROOT / "dist"


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


def build_image(out_dir: Path, epoch: int) -> Path:
    version = gen_chart.project_version()
    image = os.environ.get("IMAGE", f"localhost/gpuslice:{version}")
    env = {**os.environ, "IMAGE": image, "SOURCE_DATE_EPOCH": str(epoch)}
    subprocess.run([tool("bash"), str(ROOT / "deploy" / "image" / "build.sh")], env=env, check=True)
    image_id = subprocess.run(
        [tool("buildah"), "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    out = out_dir / f"gpuslice-{version}.image"
    out.write_text(f"{image} sha256:{image_id}\n")
    return out


def write_sums(files: list[Path], out_dir: Path) -> Path:
    lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in sorted(files)]
    sums = out_dir / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-image", action="store_true", help="package the chart only")
    parser.add_argument("--dist", type=Path, default=DIST, help="where the artefacts go")
    opts = parser.parse_args(argv)
    if gen_chart.main(["--check"]) != 0:
        return 1  # the chart must be what the sources generate
    epoch = source_date_epoch()
    opts.dist.mkdir(parents=True, exist_ok=True)
    files = [package_chart(CHART, opts.dist, epoch)]
    if not opts.no_image:
        files.append(build_image(opts.dist, epoch))
    sums = write_sums(files, opts.dist)
    for f in [*files, sums]:
        print(f"release: {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
