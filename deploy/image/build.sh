#!/usr/bin/env bash
# Build the gpuslice image end to end with buildah: the base image from Debian's packages when it
# is missing, then the image from deploy/image/Dockerfile. Safe to run again: the base is kept,
# the wheels of the locked dependencies are kept while requirements/runtime.lock is unchanged,
# and an unchanged tree reuses buildah's layer cache.
#
#   deploy/image/build.sh [--rebuild-base] [--refresh-base]
#
# --rebuild-base   make the base anew from Debian's newest packages
# --refresh-base   the same, then record its package list in deploy/image/base-packages.list
#
# Reproducible as far as Debian's archive allows: it serves only the newest version of each
# package, so the base takes the newest python3, libstdc++6 and ca-certificates, never pinned
# versions that would stop building on the day of a security update. The base records the
# exact list it got (name=version, in /usr/share/gpuslice/base-packages.list and in the label
# io.gpuslice.base-packages, both inherited by the image), and every build compares it with
# deploy/image/base-packages.list, the list last recorded: a difference is reported, with the
# command that records it, and never fails the build. The wheels are those whose sha256 the
# runtime lock pins, and every timestamp (files, image config) is SOURCE_DATE_EPOCH, by default
# the last commit's time, so two builds of one commit in one run give the same image digest.
#
# Environment:
#   ARCH         the image's architecture, amd64 or arm64 (default: this machine's). Another
#                machine's needs its programs run through qemu: binfmt_misc with qemu-user-static
#                (Debian's maintainer scripts in mmdebstrap, pip in the image's RUN step)
#   IMAGE        the tag to build (default localhost/gpuslice:<version from pyproject.toml>)
#   BASE_IMAGE   the base the Dockerfile's FROM names (default localhost/gpuslice-base:bookworm,
#                bookworm-<arch> for an ARCH other than amd64)
#   BASE_PACKAGES_LIST  the recorded package list (default deploy/image/base-packages.list,
#                base-packages-<arch>.list for an ARCH other than amd64)
#   BINFMT_DIR   where the kernel lists its binfmt_misc handlers (default /proc/sys/fs/binfmt_misc)
#   PYTHON       a Python 3.11 with pip, to fetch and build the wheels (default python3)
#   SOURCE_URL   org.opencontainers.image.source (default: the git remote "origin", if any)
#   SOURCE_DATE_EPOCH  every timestamp in the image (default: the last commit's time)
#   NO_CACHE     1: build the image stage again rather than reuse buildah's layer cache
#
# Needs buildah and mmdebstrap (apt-get install buildah mmdebstrap), root or a rootless buildah
# setup, and PyPI plus Debian's package archive (the base) reachable.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work="$here/.build"
case $(uname -m) in
    x86_64) host_arch=amd64 ;;
    aarch64 | arm64) host_arch=arm64 ;;
    *) host_arch=$(uname -m) ;;
esac
arch=${ARCH:-$host_arch}
case $arch in
    amd64) qemu=qemu-x86_64 suffix="" machine=x86_64 ;;
    arm64) qemu=qemu-aarch64 suffix=-arm64 machine=aarch64 ;;
    *) echo "build.sh: error: ARCH $arch: expected amd64 or arm64" >&2; exit 2 ;;
esac
# the tags of CPython 3.11 wheels for Linux on that machine, as tools/lock_hashes.py pins them
wheel_platforms=(--platform "manylinux2014_$machine" --platform "manylinux_2_17_$machine"
    --platform "manylinux_2_28_$machine" --python-version 3.11 --implementation cp)
if [[ $arch == "$host_arch" ]]; then
    wheel_platforms=()  # this machine's own wheels, as pip picks them
else
    # Another architecture's programs run here only through a binfmt_misc handler: Debian's
    # qemu-user-static registers one per architecture, with the F flag so it works in chroots.
    binfmt=${BINFMT_DIR:-/proc/sys/fs/binfmt_misc}/$qemu
    if ! grep -qs '^enabled' "$binfmt"; then
        echo "build.sh: error: building $arch on $host_arch runs $arch programs (Debian's maintainer scripts, pip in the image) through qemu, and $binfmt is not an enabled handler: apt-get install qemu-user-static binfmt-support on the host (a container sees the host's handlers), or build on an $arch machine" >&2
        exit 1
    fi
fi
base_image=${BASE_IMAGE:-localhost/gpuslice-base:bookworm$suffix}
python=${PYTHON:-python3}
pip_version=25.3 # runs the install inside the build stage; never part of the image
pip_sha256=9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd
recorded=${BASE_PACKAGES_LIST:-$here/base-packages$suffix.list}
packages_label=io.gpuslice.base-packages
rebuild_base=0
refresh_base=0

for arg in "$@"; do
    case $arg in
        --rebuild-base) rebuild_base=1 ;;
        --refresh-base) rebuild_base=1 refresh_base=1 ;;
        *) echo "build.sh: error: unknown argument $arg (allowed: --rebuild-base, --refresh-base)" >&2; exit 2 ;;
    esac
done
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null) || SOURCE_DATE_EPOCH=0
fi
export SOURCE_DATE_EPOCH

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
    # No mirror named: mmdebstrap uses Debian's archive with bookworm-updates and -security, and
    # takes the newest version of each package. SOURCE_DATE_EPOCH makes mmdebstrap clamp every
    # mtime and drop its logs, so the same packages give the same tar.
    mmdebstrap --quiet --variant=essential --architectures="$arch" --include=python3,libstdc++6,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --format=tar bookworm "$tarball" </dev/null
    tar -xOf "$tarball" ./var/lib/dpkg/status \
        | awk '/^Package: /{p=$2} /^Version: /{print p "=" $2}' | LC_ALL=C sort -u >"$work/base-packages.list"
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tarball" /
    buildah copy --quiet --chmod 0644 "$ctr" "$work/base-packages.list" /usr/share/gpuslice/base-packages.list
    buildah config \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 \
        --cmd '["/usr/bin/python3"]' \
        --label org.opencontainers.image.description="Debian bookworm with python3, from deploy/image/build.sh" \
        --label "$packages_label=$(paste -sd' ' "$work/base-packages.list")" \
        "$ctr"
    buildah config --arch "$arch" --os linux "$ctr"
    buildah commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$base_image" >/dev/null
    rm -f "$tarball"
    echo "build.sh: base $base_image built in $(since "$start") s"
else
    echo "build.sh: base $base_image present"
fi

# The package list the base holds, compared with the one last recorded: reported, never fatal.
got=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$packages_label\"}}" "$base_image")
if [[ ! -f $recorded && $refresh_base == 0 ]]; then
    echo "build.sh: note: no package list recorded for $arch in $recorded; deploy/image/build.sh --refresh-base records one"
elif [[ -z $got || $got == "<no value>" ]]; then
    echo "build.sh: note: $base_image records no package list (built before lists were recorded); --rebuild-base makes one that does"
elif [[ $refresh_base == 1 ]]; then
    { grep -s '^#' "$recorded" || true; tr ' ' '\n' <<<"$got"; } >"$recorded.tmp" && mv "$recorded.tmp" "$recorded"
    echo "build.sh: recorded the base's $(wc -w <<<"$got") packages in $recorded"
elif ! diff <(grep -v '^#' "$recorded") <(tr ' ' '\n' <<<"$got") >"$work/base-packages.diff"; then
    echo "build.sh: note: the base's Debian packages differ from those last recorded (< recorded, > in $base_image):"
    sed 's/^/build.sh:   /' "$work/base-packages.diff"
    echo "build.sh: note: to record them: deploy/image/build.sh --refresh-base, then commit $(basename "$recorded")"
else
    echo "build.sh: base packages: as recorded ($(wc -w <<<"$got"))"
fi

# 2. The build context: wheels of the locked runtime dependencies (fetched once per lock),
#    pip's wheel, gpuslice's wheel from this tree, and the example configs.
start=$(now)
lock="$root/requirements/runtime.lock"
lock_id=$(sha256sum "$lock" | cut -c1-16)
deps="$work/wheels-$arch-$lock_id"
if [[ ! -d $deps ]]; then
    rm -rf "$work/wheels-$arch"-* "$deps.tmp"
    # Binary wheels only, each checked against the sha256 the lock pins: nothing is built.
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        "${wheel_platforms[@]}" --require-hashes -r "$lock" -d "$deps.tmp"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        "pip==$pip_version" -d "$deps.tmp/pip"
    echo "$pip_sha256  $(echo "$deps.tmp"/pip/pip-*.whl)" | sha256sum --check --quiet
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
cache=--layers
if [[ ${NO_CACHE:-0} == 1 ]]; then cache=--no-cache; fi
buildah build --quiet "$cache" --timestamp "$SOURCE_DATE_EPOCH" --platform "linux/$arch" \
    --build-arg BASE="$base_image" \
    --build-arg VERSION="$version" \
    --build-arg REVISION="$revision" \
    --build-arg SOURCE="$source_url" \
    -f "$here/Dockerfile" -t "$image" "$context" >/dev/null
size=$(buildah images --noheading --format '{{.Size}}' "$image" | awk 'NR == 1')  # awk reads all: no SIGPIPE
echo "build.sh: image $image built in $(since "$start") s, size $size"
