#!/bin/bash
# The installed coremesh, used as a user would, outside the source and build
# trees: `cmake --install` into a temporary prefix, which is then moved
# elsewhere (an install is relocatable), then
#   - nothing installed names the first prefix; every expected file is there;
#     the shared libraries export only what exported_symbols.py allows;
#   - OpenSHMEM C programs built with oshcc (through a symlink too) run under
#     oshrun -np / -n; a C++ one built with oshc++;
#   - a C++ project with find_package(coremesh) (cmake + ninja) and a program
#     built with pkg-config run without LD_LIBRARY_PATH;
#   - /usr/bin/python3 imports coremesh from the prefix and runs a matmul;
#   - coremesh --help and oshrun --help describe the commands.
# usage: install_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 python=$3
work=$(mktemp -d /tmp/coremesh-install-test.XXXXXX)
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$work"; else echo "install test failed; files kept in $work"; fi' EXIT
fail() { echo "FAIL: $*"; exit 1; }

staged=$work/staged
cmake --install "$build" --prefix "$staged" > "$work/install.log"
mkdir "$work/elsewhere"
mv "$staged" "$work/elsewhere/prefix"
prefix=$work/elsewhere/prefix
cd "$work"  # nothing below runs in the source or build tree

# Relocatable: no installed file names the prefix it was installed to.
if grep -rlF "$staged" "$prefix"; then fail "the files above name the install prefix $staged"; fi
libdir=$(dirname "$(find "$prefix" -name coremesh.pc)")/..
libdir=$(cd "$libdir" && pwd)
for f in bin/coremesh bin/oshcc bin/oshc++ bin/oshrun bin/coremesh-cc include/shmem.h include/pshmem.h \
         include/coremesh/ops/gemm.hpp; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
for layer in core runtime ops shmem graph parallel model train; do
  for f in "$libdir/libcoremesh_$layer.so" "$libdir/libcoremesh_$layer.a"; do
    [ -e "$f" ] || fail "$f is not installed"
  done
done
[ -e "$libdir/cmake/coremesh/coremeshConfig.cmake" ] || fail "no CMake package in $libdir/cmake"
"$python" "$src/tests/shmem/exported_symbols.py" "$libdir"/libcoremesh_*.so > "$work/symbols.log" ||
  { cat "$work/symbols.log"; fail "the shared libraries export names they should not"; }
echo "installed and moved: $(find "$prefix" -type f | wc -l) files, none names the old prefix"

# OpenSHMEM programs: oshcc, oshc++ and oshrun, as with other implementations.
cp "$src"/tests/shmem/c/{ring_put.c,globals.c,profiling.c,check.h} "$src/tests/install/ring.cpp" "$work/"
mkdir "$work/links" && ln -s "$prefix/bin/oshcc" "$work/links/oshcc"
"$prefix/bin/oshcc" -std=c11 -Wall -Werror -O1 ring_put.c -o ring_put
"$work/links/oshcc" -std=c11 -Wall -Werror -O1 globals.c -o globals    # through a symlink
PATH="$prefix/bin:$PATH" oshcc -std=c11 -Wall -Werror -O1 profiling.c -o profiling
"$prefix/bin/oshc++" -std=c++20 -Wall -Werror -O1 ring.cpp -o ring_cpp
# (no `cmd | grep -q` here: grep's early exit would fail the pipe, pipefail)
"$prefix/bin/oshcc" --showme -c x.c > showme.txt
grep -qF -- "-I$prefix/include" showme.txt || fail "oshcc --showme: no -I$prefix/include"
expect_lines() {  # expect_lines COUNT PATTERN FILE
  [ "$(grep -c "$2" "$3")" -eq "$1" ] || { cat "$3"; fail "expected $1 lines '$2' in $3"; }
}
"$prefix/bin/oshrun" -np 2 ./ring_put > ring_put.txt 2>&1 || { cat ring_put.txt; fail "oshrun -np 2 ./ring_put"; }
expect_lines 2 'ring ok (0 errors)' ring_put.txt
"$prefix/bin/oshrun" -n 3 --tag-output ./globals > globals.txt 2>&1 || { cat globals.txt; fail "oshrun -n 3 ./globals"; }
expect_lines 3 'ok (0 errors)' globals.txt
"$prefix/bin/oshrun" -np=2 ./profiling > profiling.txt 2>&1 || { cat profiling.txt; fail "oshrun -np=2 ./profiling"; }
expect_lines 2 'ok (0 errors)' profiling.txt
"$prefix/bin/oshrun" --np 2 ./ring_cpp > ring_cpp.txt 2>&1 || { cat ring_cpp.txt; fail "oshrun --np 2 ./ring_cpp"; }
expect_lines 2 'C++ ring ok (0 errors)' ring_cpp.txt
echo "OpenSHMEM: oshcc/oshc++ programs ran under oshrun"

# C++ with find_package(coremesh).
cp -r "$src/tests/install/consumer" "$work/consumer"
cmake -S consumer -B consumer-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  > consumer.log 2>&1 || { cat consumer.log; fail "configuring a find_package(coremesh) project"; }
cmake --build consumer-build >> consumer.log 2>&1 || { cat consumer.log; fail "building it"; }
env -u LD_LIBRARY_PATH consumer-build/consumer | tee consumer.txt
grep -q "matmul entry 32.0, lr(4) 0.000500" consumer.txt || fail "the find_package program's results"
ldd consumer-build/consumer > consumer.ldd
grep -qF "$libdir/libcoremesh_train.so" consumer.ldd || fail "not linked to $libdir's shared libraries"

# C++ with pkg-config.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --variable=libdir coremesh)" -ef "$libdir" ] || fail "coremesh.pc's libdir is not $libdir"
# shellcheck disable=SC2046  # pkg-config's flags are words
g++ -std=c++20 -O1 consumer/main.cpp -o pkgconfig_consumer $(pkg-config --cflags --libs coremesh) \
  -Wl,-rpath,"$(pkg-config --variable=libdir coremesh)"
env -u LD_LIBRARY_PATH ./pkgconfig_consumer > pkgconfig_consumer.txt
grep -q "matmul entry 32.0" pkgconfig_consumer.txt || fail "the pkg-config program's results"
echo "C++: find_package(coremesh) and pkg-config programs ran"

# Python from the prefix.
pythonpath=$(dirname "$(find "$prefix" -path '*-packages/coremesh/__init__.py')")/..
PYTHONPATH=$pythonpath "$python" -c "
import coremesh, numpy as np
assert coremesh.__file__.startswith('$prefix/'), coremesh.__file__
c = coremesh.ops.matmul(coremesh.from_numpy(np.full((8, 4), 0.5, np.float32)),
                        coremesh.from_numpy(np.full((4, 2), 2.0, np.float32)))
coremesh.runtime.synchronize()
assert (np.asarray(c) == 4.0).all(), np.asarray(c)
print('python: imported', coremesh.__file__)
"

# The help.
"$prefix/bin/coremesh" --help > help.txt
for word in run train generate eval schedule info demo COREMESH_CORES oshrun; do
  grep -q "$word" help.txt || { cat help.txt; fail "coremesh --help does not mention $word"; }
done
"$prefix/bin/oshrun" --help > oshrun_help.txt
grep -q -- "--tag-output" oshrun_help.txt || { cat oshrun_help.txt; fail "oshrun --help is not coremesh run's"; }
echo "install test ok"
