#!/usr/bin/env bash
# Times `make run` as a newcomer meets it: a fresh Debian 12 (debootstrap into
# DIR) with only what the base image has (g++, make, CMake, Ninja,
# GoogleTest, Google Benchmark, git, Python), a fresh clone of this
# repository's HEAD, no ccache, nothing installed or built before. Prints
# each line of `make run` with the seconds since it started, so the first
# step line and the end can be read off (README, "Quick start").
# Needs root and the Debian mirror. Run it on an otherwise idle machine.
# usage: scripts/time-fresh-run.sh [DIR]   (default /tmp/coremesh-fresh; removed first)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/tmp/coremesh-fresh}
mounts=(proc sys dev dev/pts dev/shm)
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "$root/${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
rm -rf --one-file-system "$root"

command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
echo "time-fresh-run: debootstrap bookworm into $root"
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
rm -f "$root/etc/apt/sources.list"
cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null ||
  echo "deb http://deb.debian.org/debian bookworm main" >"$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/"
for m in "${mounts[@]}"; do mount --bind "/$m" "$root/$m"; done
echo "time-fresh-run: installing the base image's tools"
chroot "$root" bash -c 'apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  --no-install-recommends g++ gcc make cmake ninja-build libgtest-dev libgmock-dev libbenchmark-dev git python3 \
  ca-certificates procps >/dev/null'
git clone -q "$repo" "$root/root/coremesh"
echo "time-fresh-run: make run (seconds since start, then the line)"
chroot "$root" bash -c 'cd /root/coremesh && start=$(date +%s) &&
  make run 2>&1 | while IFS= read -r line; do echo "$(( $(date +%s) - start )) $line"; done &&
  echo "$(( $(date +%s) - start )) make run finished"' |
  grep -v -E '^[0-9]+ (Selecting|Preparing|Unpacking|Setting up|Processing|\(Reading|update-alternatives)'
