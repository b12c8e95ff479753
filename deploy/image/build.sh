#!/usr/bin/env bash
# Build the gpuslice image end to end with buildah: the base image from Debian's packages when it
# is missing, then the image from deploy/image/Dockerfile. Safe to run again: the base is kept,
# the wheels of the locked dependencies are kept while requirements/runtime.lock is unchanged,
# and an unchanged tree reuses buildah's layer cache.
#
#   deploy/image/build.sh [--rebuild-base]
#
# Environment:
#   IMAGE        the tag to build (default localhost/gpuslice:<version from pyproject.toml>)
#   BASE_IMAGE   the base the Dockerfile's FROM names (default localhost/gpuslice-base:bookworm)
#   PYTHON       a Python 3.11 with pip, to fetch and build the wheels (default python3)
#   SOURCE_URL   org.opencontainers.image.source (default: the git remote "origin", if any)
#
# Needs buildah and mmdebstrap (apt-get install buildah mmdebstrap), root or a rootless buildah
# setup, and PyPI plus Debian's package archive (the base) reachable.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work="$here/.build"
base_image=${BASE_IMAGE:-localhost/gpuslice-base:bookworm}
python=${PYTHON:-python3}
pip_version=25.3 # runs the install inside the build stage; never part of the image
rebuild_base=0

for arg in "$@"; do
    case $arg in
        --rebuild-base) rebuild_base=1 ;;
        *) echo "build.sh: error: unknown argument $arg (allowed: --rebuild-base)" >&2; exit 2 ;;
    esac
done

need() {
    command -v "$1" >/dev/null 2>&1 || {
        echo "build.sh: error: $1 not found: apt-get install $1" >&2
        exit 1
    }
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

need buildah
# RUN steps: crun cannot set up cgroups in every sandbox (a hybrid v1/v2 host refuses it);
# chroot isolation needs none and is enough to run pip.
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
image=${IMAGE:-localhost/gpuslice:$version}
mkdir -p "$work"

# 1. The base: Debian bookworm's essential packages plus python3 (3.11), libstdc++ and CA certificates,
#    without docs, man pages or locales; no apt, no pip. libstdc++6 is for grpcio.
if [[ $rebuild_base == 1 ]] || ! buildah inspect --type image "$base_image" >/dev/null 2>&1; then
    need mmdebstrap
    start=$(now)
    tarball="$work/base-bookworm.tar"
    rm -f "$tarball"
    # No mirror named: mmdebstrap uses Debian's archive with bookworm-updates and -security.
    mmdebstrap --quiet --variant=essential --include=python3,libstdc++6,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --format=tar bookworm "$tarball" </dev/null
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tarball" /
    buildah config \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 \
        --cmd '["/usr/bin/python3"]' \
        --label org.opencontainers.image.description="Debian bookworm with python3, from deploy/image/build.sh" \
        "$ctr"
    buildah commit --quiet --rm "$ctr" "$base_image" >/dev/null
    rm -f "$tarball"
    echo "build.sh: base $base_image built in $(since "$start") s"
else
    echo "build.sh: base $base_image present"
fi

# 2. The build context: wheels of the locked runtime dependencies (fetched once per lock),
#    pip's wheel, gpuslice's wheel from this tree, and the example configs.
start=$(now)
lock="$root/requirements/runtime.lock"
lock_id=$(sha256sum "$lock" | cut -c1-16)
deps="$work/wheels-$lock_id"
if [[ ! -d $deps ]]; then
    rm -rf "$work"/wheels-* "$deps.tmp"
    "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -r "$lock" -w "$deps.tmp"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps "pip==$pip_version" -d "$deps.tmp/pip"
    mv "$deps.tmp" "$deps"
fi
context="$work/context"
rm -rf "$context"
mkdir -p "$context/wheels"
cp "$deps"/*.whl "$context/wheels/"
cp "$deps"/pip/pip-*.whl "$context/pip.whl"
cp "$lock" "$context/wheels/runtime.lock"
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$context/wheels" "$root"
cp -RL "$root/examples" "$context/examples"  # a symlinked example becomes its file

revision=$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null) || revision=unknown
if [[ $revision != unknown && -n $(git -C "$root" status --porcelain 2>/dev/null) ]]; then
    revision="$revision-dirty"
fi
source_url=${SOURCE_URL:-$(git -C "$root" remote get-url origin 2>/dev/null || echo unknown)}

# 3. The image.
buildah build --quiet --layers \
    --build-arg BASE="$base_image" \
    --build-arg VERSION="$version" \
    --build-arg REVISION="$revision" \
    --build-arg SOURCE="$source_url" \
    -f "$here/Dockerfile" -t "$image" "$context" >/dev/null
size=$(buildah images --noheading --format '{{.Size}}' "$image" | head -n1)
echo "build.sh: image $image built in $(since "$start") s, size $size"
