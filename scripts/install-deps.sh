#!/usr/bin/env bash
# Installs the Debian packages coremesh needs. Idempotent: it runs
# `apt-get update` and `apt-get install` only when a package is missing.
#   install-deps.sh        everything: the build, the tests, the benchmarks, Python
#   install-deps.sh run    what `make run` needs: the build of the coremesh
#                          executable and the demo's corpus
#   install-deps.sh fuzz   that, and clang with libFuzzer (`make fuzz`)
set -euo pipefail

run_packages=(
  # toolchain
  g++ cmake ninja-build make pkg-config
  # libraries of the coremesh executable
  libopenblas-dev libxsmm-dev libopenmpi-dev openmpi-bin libucx-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  # subword tokenizers (`coremesh tokenizer train`, train --tokenizer)
  libsentencepiece-dev
  # training corpus for `make run`
  bible-kjv
)
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev
  # PyTorch cross-checks and benchmarks (/usr/bin/python3)
  python3-torch python3-numpy
  # the Python extension (python/) and its pytest suite (tests/python)
  pybind11-dev python3-dev python3-pytest
  # headless rendering of the training report in tests (tests/train/test_report.cpp)
  chromium
)
# libFuzzer (make fuzz): clang and its runtime libraries
fuzz_packages=(clang libclang-rt-14-dev)
case "${1:-all}" in
  run) packages=("${run_packages[@]}") ;;
  fuzz) packages=("${run_packages[@]}" "${fuzz_packages[@]}") ;;
  all) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: install-deps.sh [run|all|fuzz]" >&2; exit 2 ;;
esac

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
