#!/usr/bin/env bash
# Run a command inside the emulated Arm board that scripts/make_board.sh built, with THIS checkout
# mounted read-only at /opt/tunefarm (on the board's Python path), so the board always runs the
# code of the checkout it is started from, never a stale copy.
#
#   scripts/board_run.sh python3 -c 'import platform; print(platform.machine())'     # aarch64
#   scripts/board_run.sh tunefarm agent --tracker 127.0.0.1:9190 --key arm-a72
#
# The board shares the host's network (a chroot, not a namespace): 127.0.0.1 is the host's
# loopback, so an agent inside dials a tracker on the host. Everything is mounted in a private
# mount namespace (unshare), so the mounts vanish with the command: nothing is left mounted on
# the host, whatever way the command ends. The command is exec'd (unshare and chroot replace
# themselves), so the pid the caller sees is the board process's: signals reach it directly.
# Needs root, and the cache built (scripts/make_board.sh prints its path; $TUNEFARM_BOARD_ROOT).
#
# The board's CPU: $TUNEFARM_BOARD_CPU (default cortex-a72, a Raspberry Pi 4's; also cortex-a53,
# a Pi 3's, and neoverse-n1, a Graviton2's). qemu emulates exactly that core (QEMU_CPU, so a kernel
# using an instruction it lacks dies as it would on the device), and /proc/cpuinfo in the board
# describes it as that device's Linux does. qemu 7.2 (Debian bookworm's) passes the x86 host's
# /proc/cpuinfo through to the guest, from which LLVM would read cpu "generic" with no features;
# qemu 8.2 and later write one for the emulated core themselves, which is what this does.
# (The agent still knows it runs emulated: /proc/sys/kernel/arch says x86_64.)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(dirname "$HERE")"
ROOT="${TUNEFARM_BOARD_ROOT:-/var/cache/tunefarm/board-aarch64-bookworm}"

[[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "board_run: must run as root (chroot, mount)" >&2; exit 2; }
[[ -f "$ROOT/.tunefarm-board-wheels" ]] || {
    echo "board_run: no board at $ROOT; build it with scripts/make_board.sh (as root)" >&2; exit 2; }
[[ -f /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || {
    echo "board_run: qemu-aarch64 is not registered with binfmt_misc; scripts/make_board.sh registers it" >&2; exit 2; }

CPU="${TUNEFARM_BOARD_CPU:-cortex-a72}"
case "$CPU" in   # MIDR fields and HWCAP names as Linux's /proc/cpuinfo shows them on that core
    cortex-a72) PART=0xd08 VARIANT=0x0 REVISION=3 FEATURES="fp asimd evtstrm crc32 cpuid" ;;
    cortex-a53) PART=0xd03 VARIANT=0x0 REVISION=4 FEATURES="fp asimd evtstrm crc32 cpuid" ;;
    neoverse-n1) PART=0xd0c VARIANT=0x3 REVISION=1
        FEATURES="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
    *) echo "board_run: TUNEFARM_BOARD_CPU=$CPU is not one of cortex-a72, cortex-a53, neoverse-n1" >&2; exit 2 ;;
esac
CPUINFO=""
for ((i = 0; i < $(nproc); i++)); do
    CPUINFO+=$(printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' \
        "$i" "$FEATURES" "$VARIANT" "$PART" "$REVISION")$'\n'
done

# PYTHONDONTWRITEBYTECODE: the checkout is read-only in here; the host's own __pycache__ (same
# CPython 3.11 bytecode) is used when it is current.
exec unshare --mount --propagation private -- /bin/bash -c '
set -e
root=$1; checkout=$2; cpu=$3; cpuinfo=$4; shift 4
mount --bind "$checkout" "$root/opt/tunefarm"
mount -o remount,bind,ro "$root/opt/tunefarm"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
printf "%s" "$cpuinfo" >"$root/run/cpuinfo"
mount --bind "$root/run/cpuinfo" "$root/proc/cpuinfo"
exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 QEMU_CPU="$cpu" \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 ${TUNEFARM_AGENT_TOKEN:+TUNEFARM_AGENT_TOKEN=$TUNEFARM_AGENT_TOKEN} \
    "$@"
' board-run "$ROOT" "$CHECKOUT" "$CPU" "$CPUINFO" "$@"
