#!/usr/bin/env bash
# Build (once) and cache an emulated Arm board: an aarch64 Debian bookworm root that runs on an
# x86 host through qemu-user and binfmt_misc, holding Python 3.11 and the device agent's base
# install only (numpy, llvmlite, grpcio, protobuf: aarch64 wheels from PyPI; nothing of FastAPI,
# SQLAlchemy or XGBoost). The project's own code is NOT copied in: scripts/board_run.sh mounts
# the current checkout at /opt/tunefarm for each run, so the board always runs the code under test.
#
#   scripts/make_board.sh            build or reuse the cache, print the root's path
#   scripts/make_board.sh --check    exit 0 when the cache is current, 1 when it must be (re)built
#   scripts/make_board.sh --rebuild  build from scratch even when the cache is current
#
# Where: $TUNEFARM_BOARD_ROOT (default /var/cache/tunefarm/board-aarch64-bookworm), outside any
# checkout, so a session's tests and CI on the same machine share one build (the packages'
# maintainer scripts run under emulation: minutes; reusing the cache takes none).
# How: mmdebstrap, which resolves and downloads with the host's own apt and runs only dpkg and the
# maintainer scripts under emulation. (debootstrap's second stage runs its whole shell logic under
# qemu too: 330 s of one core against mmdebstrap's 160 s for the same root on one host.)
# Stamps: .tunefarm-board-base says what mmdebstrap made (suite, arch, packages, script format)
# and .tunefarm-board-wheels which wheel versions are installed. The wheels follow the versions
# installed in $PYTHON (default: the checkout's .venv, else python3), so the board runs the same
# llvmlite, protobuf and grpcio as the tuner and tracker that serve it; a different stamp means a
# stale cache: the base is rebuilt, or only the wheels reinstalled when only they differ.
# Needs root (chroot, mount, binfmt_misc). Installs mmdebstrap, qemu-user-static and
# binfmt-support with apt-get when they are missing, mounts binfmt_misc and registers
# qemu-aarch64 when they are not. Exit status: 0 with the root's path on stdout; 3 when this
# machine cannot make a board (not root, binfmt_misc unavailable, packages not installable);
# 2 when the build itself failed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(dirname "$HERE")"
ROOT="${TUNEFARM_BOARD_ROOT:-/var/cache/tunefarm/board-aarch64-bookworm}"
SUITE=bookworm
ARCH=arm64
MIRROR="${TUNEFARM_BOARD_MIRROR:-http://deb.debian.org/debian}"
# python3 is 3.11 on bookworm; libgomp1 runs the kernels' parallel loops (compiler/openmp.py)
PACKAGES=python3,libgomp1
BASE_FORMAT=1
AGENT_PACKAGES=(numpy llvmlite grpcio protobuf)

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$CHECKOUT/.venv/bin/python" ]]; then PYTHON="$CHECKOUT/.venv/bin/python"; else PYTHON=python3; fi
fi

say() { echo "make_board: $*" >&2; }
die() { say "error: $*"; exit 2; }
cannot() { say "this machine cannot make the board: $*"; exit 3; }   # tests skip on 3, fail on 2

base_stamp() {
    printf 'tunefarm board base format %s\nsuite %s\narch %s\npackages %s\n' "$BASE_FORMAT" "$SUITE" "$ARCH" "$PACKAGES"
}

# The agent's wheels pinned to the versions $PYTHON has ("numpy==2.4.6 ..."); a package it lacks
# is left to pip's newest within pyproject.toml's range.
wheel_pins() {
    "$PYTHON" - "${AGENT_PACKAGES[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
pins = []
for name in sys.argv[1:]:
    try:
        pins.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pins.append(name)
print(" ".join(pins))
EOF
}

wheels_stamp() { printf 'python 3.11 manylinux aarch64\n%s\n' "$(wheel_pins)"; }

stamp_matches() {  # FILE EXPECTED
    [[ -f "$1" ]] && [[ "$(cat "$1")" == "$2" ]]
}

case "${1:-}" in
    --check)
        stamp_matches "$ROOT/.tunefarm-board-base" "$(base_stamp)" &&
            stamp_matches "$ROOT/.tunefarm-board-wheels" "$(wheels_stamp)" && exit 0
        exit 1 ;;
    --rebuild) REBUILD=1 ;;
    "") REBUILD=0 ;;
    *) die "unknown option $1 (use --check or --rebuild)" ;;
esac

[[ "$(id -u)" == 0 ]] || cannot "must run as root (mmdebstrap, chroot, mount, binfmt_misc)"

mkdir -p "$(dirname "$ROOT")"
# One builder at a time: two test runs starting together wait for one build.
exec 9>"$ROOT.lock"
flock 9

ensure_tools() {
    local missing=()
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    if ((${#missing[@]})); then
        say "installing ${missing[*]} with apt-get"
        apt-get update -q >/dev/null || cannot "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
            cannot "apt-get install ${missing[*]} failed"
    fi
}

# aarch64 ELF executables run through qemu-aarch64 once binfmt_misc knows them. Debian's entry
# has the F flag (the kernel opens the interpreter at registration), so it works inside a chroot
# that holds no qemu; a copy goes into the root anyway for entries registered without it.
ensure_binfmt() {
    local dir=/proc/sys/fs/binfmt_misc
    if [[ ! -f "$dir/register" ]]; then
        mount -t binfmt_misc binfmt_misc "$dir" || cannot "cannot mount binfmt_misc on $dir"
    fi
    if [[ ! -f "$dir/qemu-aarch64" ]]; then
        update-binfmts --enable qemu-aarch64 2>/dev/null || update-binfmts --import qemu-aarch64 2>/dev/null || true
    fi
    if [[ ! -f "$dir/qemu-aarch64" ]]; then
        # binfmt-support could not (no /usr/share/binfmts entry?): register Debian's fields directly
        local magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
        local mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
        printf ':qemu-aarch64:M::%s:%s:%s:F\n' "$magic" "$mask" "$(command -v qemu-aarch64-static)" >"$dir/register" ||
            cannot "cannot register qemu-aarch64 with binfmt_misc"
    fi
    grep -q '^enabled' "$dir/qemu-aarch64" || die "binfmt_misc has qemu-aarch64 but it is disabled ($dir/qemu-aarch64)"
}

build_base() {
    local tmp="$ROOT.build"
    rm -rf "$tmp"
    say "mmdebstrap ($SUITE $ARCH, minbase + $PACKAGES) into $tmp, maintainer scripts under qemu-aarch64 (minutes)"
    # --mode=root: the host's apt resolves and downloads; dpkg runs in the new root (emulated)
    mmdebstrap --mode=root --arch="$ARCH" --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" >"$tmp.log" 2>&1 ||
        { tail -20 "$tmp.log" >&2; die "mmdebstrap failed (log: $tmp.log)"; }
    install -D -m 755 "$(command -v qemu-aarch64-static)" "$tmp/usr/bin/qemu-aarch64-static"
    chroot "$tmp" /usr/bin/python3 -c 'import platform, sys; assert sys.version_info[:2] == (3, 11), sys.version; assert platform.machine() == "aarch64", platform.machine()' ||
        die "the new root's python3 is not an aarch64 Python 3.11"
    rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
    install -d "$tmp/opt/tunefarm"
    # the checkout board_run.sh mounts at /opt/tunefarm is on the path, as an editable install is
    echo /opt/tunefarm >"$tmp/usr/lib/python3/dist-packages/tunefarm-checkout.pth"
    cat >"$tmp/usr/local/bin/tunefarm" <<'EOF'
#!/usr/bin/python3
# tunefarm's console script, from the checkout board_run.sh mounts at /opt/tunefarm.
import sys

from tuner.cli import main

sys.exit(main())
EOF
    chmod 755 "$tmp/usr/local/bin/tunefarm"
    base_stamp >"$tmp/.tunefarm-board-base"
    rm -rf "$ROOT" "$tmp.log"
    mv "$tmp" "$ROOT"
}

install_wheels() {
    local site="$ROOT/usr/local/lib/python3.11/dist-packages"
    local pins
    read -r -a pins <<<"$(wheel_pins)"
    say "installing aarch64 wheels ${pins[*]} (downloaded on the host, no pip under emulation)"
    rm -f "$ROOT/.tunefarm-board-wheels"
    rm -rf "$site"
    mkdir -p "$site"
    # every manylinux tag bookworm's glibc (2.36) runs: pip does not infer older ones from a newer one
    local platforms=(--platform manylinux2014_aarch64)
    for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
    "$PYTHON" -m pip install -q --disable-pip-version-check --target "$site" "${platforms[@]}" \
        --python-version 3.11 --implementation cp --abi cp311 --only-binary=:all: "${pins[@]}" ||
        die "pip could not fetch aarch64 wheels for ${pins[*]}"
    chroot "$ROOT" /usr/bin/python3 -c 'import numpy, llvmlite.binding, grpc, google.protobuf' ||
        die "the board cannot import its wheels"
    wheels_stamp >"$ROOT/.tunefarm-board-wheels"
}

ensure_tools
ensure_binfmt
if ((REBUILD)) || ! stamp_matches "$ROOT/.tunefarm-board-base" "$(base_stamp)"; then
    start=$SECONDS
    build_base
    say "base built in $((SECONDS - start)) s"
fi
if ((REBUILD)) || ! stamp_matches "$ROOT/.tunefarm-board-wheels" "$(wheels_stamp)"; then
    install_wheels
fi
echo "$ROOT"
