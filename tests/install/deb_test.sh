#!/bin/bash
# The .deb (cpack): it builds, holds what an install holds under /usr, declares
# its dependencies (apt resolves them on this Debian), and its files work
# where `dpkg -x` unpacks them (no installing into this machine): oshcc and
# oshrun build and run an OpenSHMEM program, python3 imports coremesh.
# usage: deb_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 python=$3
work=$(mktemp -d /tmp/coremesh-deb-test.XXXXXX)
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$work"; else echo "deb test failed; files kept in $work"; fi' EXIT
fail() { echo "FAIL: $*"; exit 1; }

(cd "$build" && cpack -B "$work/package" > "$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack"; }
deb=$(ls "$work"/package/coremesh_*.deb)
echo "built $(basename "$deb"): $(du -h "$deb" | cut -f1)"

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' > "$work/contents.txt"
for f in /usr/bin/coremesh /usr/bin/oshcc /usr/bin/oshc++ /usr/bin/oshrun /usr/bin/coremesh-cc \
         /usr/include/shmem.h /usr/include/pshmem.h /usr/include/coremesh/runtime/stream.hpp \
         /usr/lib/libcoremesh_shmem.a /usr/lib/libcoremesh_train.so.0.1.0 /usr/lib/pkgconfig/coremesh.pc \
         /usr/lib/cmake/coremesh/coremeshConfig.cmake /usr/lib/cmake/coremesh/coremeshTargets.cmake; do
  grep -qxF "$f" "$work/contents.txt" || fail "the package lacks $f"
done
grep -q '/usr/lib/python3[.0-9]*/dist-packages/coremesh/_C\..*\.so$' "$work/contents.txt" ||
  fail "the package lacks the Python extension"

depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for dep in libopenblas libopenmpi libucx libfmt libstdc++6 python3 python3-numpy g++; do
  grep -q "$dep" <<< "$depends" || fail "Depends does not name $dep"
done
# apt resolves every dependency from the configured archive (a simulation:
# nothing is installed).
apt-get install -s -q "$deb" > "$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt cannot install the package"; }

# Unpacked anywhere, it works: the wrappers find the unpacked tree.
dpkg -x "$deb" "$work/root"
usr=$work/root/usr
cp "$src/tests/shmem/c/ring_put.c" "$work/"
cd "$work"
"$usr/bin/oshcc" -O1 ring_put.c -o ring_put
"$usr/bin/oshrun" -np 2 ./ring_put > ring_put.txt 2>&1 || { cat ring_put.txt; fail "oshrun -np 2 ./ring_put"; }
[ "$(grep -c 'ring ok (0 errors)' ring_put.txt)" -eq 2 ] || { cat ring_put.txt; fail "ring_put's output"; }
PYTHONPATH=$(echo "$usr"/lib/python3*/dist-packages) "$python" -c \
  "import coremesh; assert coremesh.__file__.startswith('$usr/'); print('python: imported', coremesh.__file__)"
echo "deb test ok"
