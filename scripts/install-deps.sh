#!/usr/bin/env bash
# Installs every Debian package coremesh needs. Idempotent: it runs
# `apt-get update` and `apt-get install` only when a package is missing.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build make pkg-config
  # libraries
  libopenblas-dev libxsmm-dev libopenmpi-dev openmpi-bin libucx-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # PyTorch cross-checks and benchmarks (/usr/bin/python3)
  python3-torch python3-numpy
  # the Python extension (python/) and its pytest suite (tests/python)
  pybind11-dev python3-dev python3-pytest
  # training corpus for `make run`
  bible-kjv
  # headless rendering of the training report in tests (tests/train/test_report.cpp)
  chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
