#!/bin/sh
# mpirun with the network path forced on one machine: MPI (the bootstrap)
# and UCX (the ucx engine) restricted to TCP over loopback, and every PE its
# own host (COREMESH_PES_PER_HOST=1), so that every PE reaches every other
# as it would on another machine. Override COREMESH_PES_PER_HOST (k: hosts
# of k PEs, shared memory within) and COREMESH_TRANSPORT (ucx, mpi).
# usage: mpirun_net.sh N PROG [ARGS...]
set -eu
n=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export COREMESH_PES_PER_HOST=${COREMESH_PES_PER_HOST:-1} COREMESH_TRANSPORT=${COREMESH_TRANSPORT:-ucx}
export SHMEM_SYMMETRIC_SIZE=${SHMEM_SYMMETRIC_SIZE:-${COREMESH_HEAP_SIZE:-64M}}
export COREMESH_WAIT_TIMEOUT_S=${COREMESH_WAIT_TIMEOUT_S:-60} OPENBLAS_NUM_THREADS=1
export UCX_TLS=tcp UCX_NET_DEVICES=lo
# Under AddressSanitizer: OpenMPI and UCX keep allocations to exit in
# components they unload at finalize, which LeakSanitizer cannot attribute;
# memory errors are still caught.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset COREMESH_HEAP_SIZE
exec mpirun -n "$n" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt \
  -x COREMESH_PES_PER_HOST -x COREMESH_TRANSPORT -x SHMEM_SYMMETRIC_SIZE -x COREMESH_WAIT_TIMEOUT_S \
  -x OPENBLAS_NUM_THREADS -x UCX_TLS -x UCX_NET_DEVICES -x ASAN_OPTIONS "$@"
