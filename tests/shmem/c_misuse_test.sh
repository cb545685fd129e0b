#!/bin/sh
# OpenSHMEM C API misuse (c/misuse.c): each mode commits one misuse on 2 PEs
# under the launcher; the job must end within 60 s with a nonzero status and
# print "shmem error on PE <pe> in <call>: <what is wrong>" plus a HINT.
# usage: c_misuse_test.sh COREMESH_CC RUNNER SRC_DIR OUT_DIR
set -eu
cc_wrapper=$1 runner=$2 src=$3 out=$4
mkdir -p "$out"
"$cc_wrapper" -std=c11 -Wall -Wextra -Werror -O1 "$src/misuse.c" -o "$out/misuse"
failed=0
# expect MODE CALL TEXT: the job fails and its output names CALL and TEXT.
expect() {
  mode=$1 call=$2 text=$3
  log="$out/$mode.txt"
  status=0
  timeout 60 "$runner" run -n 2 "$out/misuse" "$mode" > "$log" 2>&1 || status=$?
  [ "$status" -ne 0 ] || { echo "FAIL $mode: the job succeeded"; cat "$log"; failed=1; return; }
  [ "$status" -ne 124 ] || { echo "FAIL $mode: hung (killed after 60 s)"; cat "$log"; failed=1; return; }
  if ! grep -q "shmem error on PE -\{0,1\}[0-9]* in $call: .*$text" "$log" || ! grep -q "HINT: " "$log"; then
    echo "FAIL $mode: expected 'in $call: ... $text' and a HINT"; cat "$log"; failed=1; return
  fi
  if grep -q "misuse not caught\|AddressSanitizer\|runtime error" "$log"; then
    echo "FAIL $mode: not stopped cleanly"; cat "$log"; failed=1; return
  fi
  echo "ok $mode (status $status): $(grep -m1 'shmem error' "$log")"
}
expect before_init shmem_long_p "called before shmem init"
expect put_pe_range shmem_long_put "PE 2 is out of range; the job has 2 PEs"
expect get_pe_range shmem_long_g "PE -1 is out of range"
expect atomic_pe_range shmem_long_atomic_fetch_add "PE 5 is out of range"
expect put_stack_address shmem_long_put "is not symmetric on PE 0"
expect put_malloc_address shmem_long_put "is not symmetric on PE 0"
expect get_past_heap_end shmem_getmem "is not symmetric on PE 0"
expect malloc_size_mismatch shmem_malloc "differs between PEs"
expect free_foreign shmem_free "is not symmetric on PE 0"
expect free_interior shmem_free "is not the start of a live symmetric block"
expect broadcast_bad_root shmem_long_broadcast "root 2 is not in"
expect wait_bad_cmp shmem_long_wait_until "unknown comparison 99"
expect destroyed_team shmem_team_sync "is not a live team"
expect made_up_team shmem_team_n_pes "is not a live team"
expect destroyed_context shmem_ctx_long_p "is not a live context"
expect context_destroyed_twice shmem_ctx_destroy "is not a live context"
expect made_up_context shmem_ctx_long_p "context handle 0x5000 is not a live context"
expect context_of_destroyed_team shmem_ctx_long_p "the team of context .* was destroyed"
expect after_finalize shmem_long_p "called after shmem_finalize"
expect skipped_barrier shmem_finalize "PE 1 already called shmem_finalize and will not arrive"
expect count_wraps shmem_long_put "span more bytes than the address space"
expect stride_wraps shmem_long_iput "span more bytes than the address space"
expect alltoalls_stride_wraps shmem_long_alltoalls "span more bytes than the address space"
expect get_into_null shmem_long_get "the local target is NULL"
expect split_into_null shmem_team_split_strided "new_team is NULL"
expect wait_some_null_indices shmem_long_wait_until_some "indices is NULL"
expect fetch_into_null shmem_long_atomic_fetch_inc_nbi "the fetch address is NULL"
exit $failed
