"""coremesh.shmem from Python, run on N PEs by ctest:

    coremesh run -n N /usr/bin/python3 -m pytest tests/python/shmem_pe_test.py

Every PE runs the same tests in the same order (collectives must match), and
each test checks its results after its last collective call, so a failure on
one PE does not leave the others waiting.
"""

import numpy as np
import pytest

import coremesh as cm
from coremesh import ops, profiler, runtime, shmem


@pytest.fixture(scope="module", autouse=True)
def job():
    shmem.init()
    yield
    shmem.barrier()
    shmem.finalize()


@pytest.fixture
def me():
    return shmem.my_pe(), shmem.n_pes()


def test_identity(me):
    pe, n = me
    assert shmem.initialized() and 0 <= pe < n
    world = shmem.Team.world()
    assert world.my_pe() == pe and world.n_pes() == n and world.world_pes() == list(range(n))
    assert shmem.transport_name() in ("shm", "shm-rma", "ucx", "mpi")


def test_put_get_ring(me):
    pe, n = me
    dest = shmem.zeros(4, "int64")
    assert isinstance(dest, np.ndarray) and dest.dtype == np.int64
    shmem.put(dest, np.arange(4, dtype=np.int64) + 10 * pe, (pe + 1) % n)
    shmem.barrier()
    left = (pe - 1) % n
    got = np.empty(4, np.int64)
    shmem.get(got, dest, (pe + 1) % n)  # what I put there
    shmem.barrier()
    received = dest.copy()
    shmem.free(dest)
    np.testing.assert_array_equal(received, np.arange(4) + 10 * left)
    np.testing.assert_array_equal(got, np.arange(4) + 10 * pe)


def test_put_nbi_quiet_and_put_signal(me):
    pe, n = me
    data, sig = shmem.zeros(8, "float32"), shmem.zeros(1, "uint64")
    right = (pe + 1) % n
    shmem.put_nbi(data[:4], np.full(4, pe, np.float32), right)
    shmem.quiet()
    shmem.put_signal(data[4:], np.full(4, pe + 0.5, np.float32), sig, 1, right, op="add")
    value = shmem.signal_wait_until(sig, "ge", 1)
    shmem.barrier()
    left = (pe - 1) % n
    got = data.copy()
    shmem.free(sig)
    shmem.free(data)
    assert value == 1
    np.testing.assert_array_equal(got, [left] * 4 + [left + 0.5] * 4)


def test_atomics(me):
    pe, n = me
    counter, flag = shmem.zeros(1, "int64"), shmem.zeros(1, "float64")
    shmem.barrier()
    old = shmem.atomic_fetch_add(counter, 5, 0)
    shmem.atomic_inc(counter, 0)
    shmem.barrier()
    total = shmem.atomic_fetch(counter, 0)
    shmem.barrier()
    swapped = shmem.atomic_compare_swap(counter, 6 * n, -1, 0) if pe == 0 else None
    shmem.barrier()
    final = shmem.atomic_fetch(counter, 0)
    shmem.atomic_set(flag, 2.5, pe)
    mine = shmem.atomic_fetch(flag, pe)
    shmem.barrier()
    shmem.free(flag)
    shmem.free(counter)
    assert 0 <= old <= 6 * (n - 1) and total == 6 * n and final == -1
    assert swapped in (None, 6 * n) and mine == 2.5


def test_collectives(me):
    pe, n = me
    src = shmem.zeros(6, "float32")
    src[:] = np.arange(6) + pe
    gathered = shmem.zeros(6 * n, "float32")
    shmem.allgather(gathered, src)
    summed = shmem.zeros(6, "float32")
    shmem.allreduce(summed, src, op="sum")
    biggest = shmem.zeros(6, "float32")
    shmem.allreduce(biggest, src, op="max")
    bcast = shmem.zeros(6, "float32")
    shmem.broadcast(bcast, src, root=n - 1)
    a2a_src, a2a = shmem.zeros(2 * n, "int32"), shmem.zeros(2 * n, "int32")
    a2a_src[:] = 100 * pe + np.arange(2 * n)
    shmem.alltoall(a2a, a2a_src)
    rs_src, rs = shmem.zeros(3 * n, "int64"), shmem.zeros(3, "int64")
    rs_src[:] = np.arange(3 * n) * (pe + 1)
    shmem.reduce_scatter(rs, rs_src, op="sum")
    results = [x.copy() for x in (gathered, summed, biggest, bcast, a2a, rs)]
    for x in (rs, rs_src, a2a, a2a_src, bcast, biggest, summed, gathered, src):
        shmem.free(x)
    g, s, mx, b, a, r = results
    np.testing.assert_array_equal(g, np.concatenate([np.arange(6) + k for k in range(n)]))
    np.testing.assert_array_equal(s, n * np.arange(6) + n * (n - 1) / 2)
    np.testing.assert_array_equal(mx, np.arange(6) + n - 1)
    np.testing.assert_array_equal(b, np.arange(6) + n - 1)
    np.testing.assert_array_equal(a, [100 * k + 2 * pe + j for k in range(n) for j in range(2)])
    np.testing.assert_array_equal(r, (np.arange(3) + 3 * pe) * n * (n + 1) // 2)


def alltoallv_plan(pe, n):
    """PE i sends i + j + 1 elements valued 1000 i + j to PE j (MoE-like uneven counts)."""
    send_counts = [pe + j + 1 for j in range(n)]
    send_offsets = list(np.cumsum([0] + send_counts[:-1]))
    recv_counts = [i + pe + 1 for i in range(n)]
    recv_offsets = list(np.cumsum([0] + recv_counts[:-1]))
    src = np.concatenate([np.full(c, 1000 * pe + j) for j, c in enumerate(send_counts)])
    expected = np.concatenate([np.full(c, 1000 * i + pe) for i, c in enumerate(recv_counts)])
    return send_counts, send_offsets, recv_counts, recv_offsets, src, expected


def test_alltoallv_blocking(me):
    pe, n = me
    sc, so, rc, ro, values, expected = alltoallv_plan(pe, n)
    src, dest = shmem.zeros(2 * n * n, "float32"), shmem.zeros(2 * n * n, "float32")
    src[:len(values)] = values
    shmem.alltoallv(dest, rc, ro, src, sc, so)
    got = dest[:len(expected)].copy()
    shmem.free(dest)
    shmem.free(src)
    np.testing.assert_array_equal(got, expected)


def test_teams(me):
    pe, n = me
    evens = shmem.Team.world().split_strided(0, 2, (n + 1) // 2)
    row, col = shmem.Team.world().split_2d(2)
    src, dest = shmem.zeros(1, "int32"), shmem.zeros(1, "int32")
    src[0] = pe
    if evens:
        shmem.allreduce(dest, src, team=evens)
    shmem.barrier()
    got = int(dest[0])
    shmem.free(dest)
    shmem.free(src)
    assert bool(evens) == (pe % 2 == 0)
    if evens:
        assert evens.n_pes() == (n + 1) // 2 and evens.world_pe(evens.my_pe()) == pe
        assert got == sum(range(0, n, 2))
    assert row.n_pes() == min(2, n - (pe // 2) * 2) and row.my_pe() == pe % 2
    reversed_world = shmem.Team.from_pes(shmem.Team.world(), list(range(n - 1, -1, -1)))
    parity = shmem.Team.world().split(pe % 2, key=-pe)  # ordered by descending PE
    assert reversed_world.my_pe() == n - 1 - pe
    assert parity.world_pes() == sorted(range(pe % 2, n, 2), reverse=True)


def test_on_stream_put_signal_and_collectives_under_a_vector_limit(me):
    pe, n = me
    s_comm, s_compute = runtime.Stream(), runtime.Stream()
    data, sig = shmem.zeros(1 << 16, "float32"), shmem.zeros(1, "uint64")
    reduced, part = shmem.zeros(4, "int64"), shmem.zeros(4, "int64")
    part[:] = pe + 1
    sc, so, rc, ro, values, expected = alltoallv_plan(pe, n)
    v_src, v_dest = shmem.zeros(2 * n * n, "int32"), shmem.zeros(2 * n * n, "int32")
    v_src[:len(values)] = values
    shmem.barrier()
    profiler.clear()
    profiler.start()
    scattered, gathered, bcast = shmem.zeros(2, "float64"), shmem.zeros(2 * n, "float64"), shmem.zeros(2, "float64")
    zero_src = shmem.zeros(2 * n, "float64")
    zero_src[:] = np.arange(2 * n) * (pe + 1)
    shmem.barrier()
    with runtime.StreamLimitCtx(s_comm, vector_num=2):
        shmem.put_signal_on_stream(data, np.full(1 << 16, pe, np.float32), sig, 1, (pe + 1) % n)
        shmem.allreduce_on_stream(reduced, part, op="sum")
        shmem.alltoallv_on_stream(v_dest, rc, ro, v_src, sc, so)
        shmem.reduce_scatter_on_stream(scattered, zero_src, op="sum")
        shmem.allgather_on_stream(gathered, scattered)
        shmem.broadcast_on_stream(bcast, zero_src[:2], root=n - 1)
        shmem.barrier_on_stream()
    with runtime.StreamCtx(s_compute):
        shmem.signal_wait_on_stream(sig, "ge", 1)  # later work on s_compute waits for the data
        doubled = ops.add(cm.from_numpy(data), cm.from_numpy(data))
    runtime.synchronize()
    profiler.stop()
    comm = [r for r in profiler.records() if r.stream == s_comm.id]
    results = (np.asarray(doubled)[:3].copy(), reduced.copy(), v_dest[:len(expected)].copy(),
               scattered.copy(), gathered.copy(), bcast.copy())
    shmem.barrier()
    for x in (zero_src, bcast, gathered, scattered, v_dest, v_src, part, reduced, sig, data):
        shmem.free(x)
    ranks = n * (n + 1) // 2  # sum over PEs of (pe + 1)
    np.testing.assert_array_equal(results[3], (np.arange(2) + 2 * pe) * ranks)
    np.testing.assert_array_equal(results[4], np.arange(2 * n) * ranks)
    np.testing.assert_array_equal(results[5], np.arange(2) * n)
    left = (pe - 1) % n
    np.testing.assert_array_equal(results[0], [2 * left] * 3)
    np.testing.assert_array_equal(results[1], [n * (n + 1) // 2] * 4)
    np.testing.assert_array_equal(results[2], expected)
    assert comm and all(r.kind == "comm" and r.block_dim <= 2 for r in comm)
    assert any(r.block_dim == 2 for r in comm), "a 256 KiB copy splits over the 2 allowed cores"


def test_bad_calls_raise_with_a_hint(me):
    pe, n = me
    dest = shmem.zeros(2, "int32")
    with pytest.raises(cm.InvalidArgument, match="put"):
        shmem.put(dest, np.zeros(2, np.int32), n)  # no such PE
    with pytest.raises(cm.InvalidArgument, match="symmetric"):
        shmem.put(np.zeros(2, np.int32), np.zeros(2, np.int32), pe)  # dest not symmetric
    with pytest.raises(cm.InvalidArgument, match="dtype"):
        shmem.put(dest, np.zeros(2, np.float32), pe)
    with pytest.raises(cm.InvalidArgument, match="uint64"):
        shmem.signal_fetch(dest)
    with pytest.raises(cm.InvalidArgument, match="not a symmetric array"):
        shmem.free(dest[:1])
    # values an element cannot hold are named with the range (they were bare pybind11 cast errors)
    with pytest.raises(cm.InvalidArgument, match=r"value 1099511627776 is outside \[-2147483648, 2147483647\]"):
        shmem.atomic_add(dest, 2**40, pe)
    for value in (1.5, None):
        with pytest.raises(cm.InvalidArgument, match="is not an integer"):
            shmem.atomic_add(dest, value, pe)
    floats = shmem.zeros(1, "float32")
    with pytest.raises(cm.InvalidArgument, match="too large for a float"):
        shmem.atomic_set(floats, 2**2000, pe)
    shmem.free(floats)
    with pytest.raises(cm.InvalidArgument, match="cond 'x' is not an integer"):
        shmem.atomic_compare_swap(dest, "x", 1, pe)
    shmem.free(dest)
    with pytest.raises(cm.InvalidArgument, match="already freed"):
        shmem.free(dest)


def test_freed_arrays_empty_arrays_and_bad_shapes_are_refused(me):
    pe, n = me
    a = shmem.zeros(4, "int64")
    shmem.free(a)
    b = shmem.zeros(4, "int64")  # may reuse a's block
    with pytest.raises(cm.InvalidArgument, match="shmem.free freed"):
        shmem.put(a, np.full(4, 9, np.int64), pe)
    with pytest.raises(cm.InvalidArgument, match="shmem.free freed"):
        shmem.atomic_set(a[1:2], 9, pe)
    with pytest.raises(cm.InvalidArgument, match="no elements"):
        shmem.atomic_set(b[4:], 99, pe)  # element 0 of an empty view is past its end
    with pytest.raises(cm.InvalidArgument, match="no elements"):
        shmem.test(b[4:], "eq", 0)
    assert list(b) == [0, 0, 0, 0]
    for dtype in (object, "U10"):
        with pytest.raises(cm.InvalidArgument, match="numeric dtype"):
            shmem.empty(4, dtype)
    with pytest.raises(cm.InvalidArgument, match="is empty"):
        shmem.zeros((3, 0), "int64")
    with pytest.raises(cm.InvalidArgument, match="address space"):
        shmem.zeros([2**31, 2**31, 8], "int64")
    c = shmem.zeros(np.int64(3), "int32")  # NumPy integers are dimensions
    assert c.shape == (3,)
    # alltoallv counts and offsets stay inside dest and src
    dest, src = shmem.zeros(4, "int64"), shmem.zeros(64, "int64")
    with pytest.raises(cm.InvalidArgument, match="passes the end of dest"):
        shmem.alltoallv(dest, [32] * n, [0] * n, src, [1] * n, [0] * n)
    with pytest.raises(cm.InvalidArgument, match="passes the end of src"):
        shmem.alltoallv(dest, [1] * n, [0] * n, src, [1] * n, [64] * n)
    # free waits for on-stream work queued on the array: the put lands in it,
    # not in the next array the heap hands out
    big = shmem.zeros(1 << 20, "float32")
    shmem.put_on_stream(big, np.ones(1 << 20, np.float32), pe)
    shmem.free(big)
    fresh = shmem.zeros(1 << 20, "float32")
    runtime.synchronize()
    assert fresh.sum() == 0.0
    # a collective whose members pass different sizes is refused on every member (it summed garbage)
    d, s8 = shmem.zeros(8, "float32"), shmem.zeros(8, "float32")
    if n > 1:
        with pytest.raises(cm.InvalidArgument, match="source sizes \\(bytes\\) differ"):
            shmem.allreduce(d[:4 if pe == 0 else 8], s8[:4 if pe == 0 else 8])
    shmem.allreduce(d, s8)  # the team goes on
    for array in (fresh, dest, src, c, b, d, s8):
        shmem.free(array)


def test_fused_tp_operators_equal_their_unfused_sequences(me):
    from coremesh import parallel
    pe, n = me
    rows, K, F, C = 4, 24, 20, 18
    N = rows * n
    rng = np.random.default_rng(7)
    w = cm.from_numpy(rng.standard_normal((C, K), dtype=np.float32))
    w2 = cm.from_numpy(rng.standard_normal((C, F), dtype=np.float32))
    norm = cm.from_numpy(rng.standard_normal(C, dtype=np.float32))
    mine = np.random.default_rng(100 + pe)
    x = cm.from_numpy(mine.standard_normal((rows, K), dtype=np.float32))
    h = cm.from_numpy(mine.standard_normal((N, F), dtype=np.float32))
    resid = cm.from_numpy(rng.standard_normal((N, C), dtype=np.float32))
    upd = cm.from_numpy(mine.standard_normal((N, C), dtype=np.float32))
    fused = parallel.FusedTensorComm(capacity=N * K, max_rows=N)
    sp = parallel.TensorParallelGroup([N * K, N * C], sequence_parallel=True)
    ar = parallel.TensorParallelGroup([N * C])
    got = [*fused.allgather_matmul(x, w), fused.matmul_reduce_scatter(h, w2), fused.matmul_allreduce(h, w2),
           *fused.add_rmsnorm_allreduce(resid, upd, norm)]
    want = [*parallel.reference_allgather_matmul(sp, x, w), parallel.reference_matmul_reduce_scatter(sp, h, w2),
            parallel.reference_matmul_allreduce(ar, h, w2),
            *parallel.reference_add_rmsnorm_allreduce(ar, resid, upd, norm, 1e-6)]
    runtime.synchronize()
    shmem.barrier()
    assert [tuple(a.shape) for a in got] == [(N, C), (N, K), (rows, C), (N, C), (N, C), (N, C), (N,)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert fused.bytes_put > 0 or n == 1
    # the fp8 forms: rows quantized before the gather equal the gathered rows quantized after it
    wq, w2q, hq = ops.quantize_fp8_weight(w), ops.quantize_fp8_weight(w2), ops.quantize_fp8_act(h)
    y, g = fused.allgather_matmul(ops.quantize_fp8_act(x), wq)
    sp.reduce_scatter(cm.zeros([N, K]))  # the unfused SP halves of one size alternate
    ry, rg = parallel.reference_allgather_matmul(sp, x, wq)
    sp.all_gather(cm.zeros([rows, C]))
    got = [y, g.data, g.scale, fused.matmul_reduce_scatter(hq, w2q), fused.matmul_allreduce(hq, w2q)]
    want = [ry, rg.data, rg.scale, parallel.reference_matmul_reduce_scatter(sp, hq, w2q),
            parallel.reference_matmul_allreduce(ar, hq, w2q)]
    runtime.synchronize()
    shmem.barrier()
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_array_equal(np.asarray(a.to("f32") if a.dtype == "f8e4m3" else a),
                                      np.asarray(b.to("f32") if b.dtype == "f8e4m3" else b))
    # expert-TP's w2: the grouped product's sum, a group straddling the chunks, padding rows past the last
    w3 = cm.from_numpy(rng.standard_normal((3, C, F), dtype=np.float32))
    offsets = cm.from_numpy(np.array([0, 1, N // 2 + 1, N - 1], dtype=np.int64))
    got = [fused.grouped_matmul_allreduce(h, w3, offsets),
           fused.grouped_matmul_allreduce(hq, ops.quantize_fp8_weight(w3), offsets)]
    want = [parallel.reference_grouped_matmul_allreduce(ar, h, w3, offsets),
            parallel.reference_grouped_matmul_allreduce(ar, hq, ops.quantize_fp8_weight(w3), offsets)]
    runtime.synchronize()
    shmem.barrier()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.asarray(got[0])[N - 1:].any()


def test_fused_tp_backward_halves(me):
    from coremesh import parallel
    pe, n = me
    rows, K, C = 4, 24, 18
    N = rows * n
    member_w = [np.random.default_rng(300 + p).standard_normal((C, K), dtype=np.float32) for p in range(n)]
    member_dy = [np.random.default_rng(400 + p).standard_normal((N, C), dtype=np.float32) for p in range(n)]
    gathered = np.random.default_rng(5).standard_normal((N, K), dtype=np.float32)
    w, dy = cm.from_numpy(member_w[pe]), cm.from_numpy(member_dy[pe])
    fused = parallel.FusedTensorComm(capacity=N * K, max_rows=N)
    sp = parallel.TensorParallelGroup([N * K, N * C], sequence_parallel=True)
    # y = all_gather(x) w^T: dx = this member's rows of sum(dy w), dw = dy^T gathered
    got = fused.allgather_matmul_backward(dy, cm.from_numpy(gathered), w)
    want = parallel.reference_allgather_matmul_backward(sp, dy, cm.from_numpy(gathered), w)
    # y = reduce_scatter(h w^T): dh = all_gather(dy) w, dw = all_gather(dy)^T h
    h = cm.from_numpy(gathered)
    mine = cm.from_numpy(member_dy[pe][pe * rows:(pe + 1) * rows])
    got2 = fused.matmul_reduce_scatter_backward(mine, h, w)
    want2 = parallel.reference_matmul_reduce_scatter_backward(sp, mine, h, w)
    # the kn forward: w read as (K, C)
    wkn = cm.from_numpy(np.ascontiguousarray(member_w[pe].T))
    got3 = fused.matmul_allreduce(cm.from_numpy(gathered[:, :K]), wkn, layout="kn")
    runtime.synchronize()
    shmem.barrier()
    for a, b in zip([*got, *got2], [*want, *want2]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    dx = sum(member_dy[p].astype(np.float64) @ member_w[p] for p in range(n))[pe * rows:(pe + 1) * rows]
    np.testing.assert_allclose(np.asarray(got[0]), dx, rtol=1e-5, atol=1e-5 * np.abs(dx).max())
    np.testing.assert_allclose(np.asarray(got[1]), member_dy[pe].T.astype(np.float64) @ gathered, rtol=1e-4,
                               atol=1e-5 * np.abs(gathered).max() * N)
    all_dy = np.concatenate([member_dy[p][p * rows:(p + 1) * rows] for p in range(n)]).astype(np.float64)
    np.testing.assert_allclose(np.asarray(got2[0]), all_dy @ member_w[pe], rtol=1e-4, atol=1e-4)
    sum_y = sum(gathered.astype(np.float64) @ member_w[p].T for p in range(n))
    np.testing.assert_allclose(np.asarray(got3), sum_y, rtol=1e-4, atol=1e-4)
    with pytest.raises(cm.InvalidArgument, match="layout"):
        fused.matmul_allreduce(h, wkn, layout="tn")
    # fp8 (the forward's rows quantized): the same calls take them, and equal their unfused sequences
    x8 = ops.quantize_fp8_act(cm.from_numpy(gathered))
    sp.all_gather(cm.from_numpy(np.zeros((rows, K), np.float32)))  # the unfused halves of a size alternate
    sp.reduce_scatter(cm.from_numpy(np.zeros((N, C), np.float32)))
    got8 = fused.allgather_matmul_backward(dy, x8, w)
    want8 = parallel.reference_allgather_matmul_backward(sp, dy, x8, w)
    got9 = fused.matmul_reduce_scatter_backward(mine, x8, w)
    want9 = parallel.reference_matmul_reduce_scatter_backward(sp, mine, x8, w)
    runtime.synchronize()
    for a, b in zip([*got8, *got9], [*want8, *want9]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # within fp8's rounding of the f32 gradients (e4m3: 3 mantissa bits)
    np.testing.assert_allclose(np.asarray(got8[0]), dx, atol=0.1 * np.abs(dx).max())


def test_expert_dispatch_and_its_fused_forms(me):
    """The EP exchange from Python: the plain round trip with an identity second GEMM run expert by expert
    (matmul_combine), and the fused fp8 dispatch: rows quantized at the source arrive as the owner would
    have quantized them, the first GEMM runs once per source and equals one GEMM over the rows."""
    from coremesh import parallel
    pe, n = me
    E, C, R, W = 2 * n, 130, 24, 6  # C: two scale tiles per row; 2 experts per PE at any PE count
    rng = np.random.default_rng(40 + pe)
    counts = np.bincount(rng.integers(0, E, R - pe), minlength=E)
    offsets = cm.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    rows = np.zeros((R, C), dtype=np.float32)
    rows[:counts.sum()] = rng.standard_normal((counts.sum(), C), dtype=np.float32)
    xp = cm.from_numpy(rows)
    plain = parallel.ExpertParallelGroup(experts=E, width=C, max_rows=R, fused=True)  # f32 on the wire
    fused = parallel.ExpertParallelGroup(experts=E, width=C, max_rows=R, fused=True, wire="f8e4m3")
    El = fused.local_experts
    assert El == E // n and fused.first_expert == pe * El
    w8 = ops.quantize_fp8_weight(cm.from_numpy(np.random.default_rng(3).standard_normal((El, W, C), dtype=np.float32)))
    eye = cm.from_numpy(np.tile(np.eye(C, dtype=np.float32), (El, 1, 1)))
    calls = []

    def first(rows, scale, offs, out):
        calls.append(rows.shape[0])
        ops.grouped_matmul_fp8(ops.QuantizedTensor(rows, scale), w8, offs, out=out)

    ref = plain.dispatch(xp, offsets)
    d = fused.dispatch(xp, offsets, first=first, first_width=W)
    assert len(calls) == n, "one first GEMM per source"
    ranges = []

    def identity(y, b, e):
        ranges.append((b, e))
        ops.grouped_matmul_out(ref.rows, eye, ref.offsets, y, groups=(b, e))

    back = plain.matmul_combine(cm.empty(list(ref.rows.shape)), identity, ref)
    fused_back = fused.combine(ref.rows, d)
    dx = fused.dispatch_backward(fused.combine_backward(xp, d), d)
    want = ops.quantize_fp8_act(ref.rows)
    one = ops.grouped_matmul_fp8(ops.QuantizedTensor(d.rows, d.scale), w8, d.offsets)
    runtime.synchronize()
    shmem.barrier()
    assert ref.scale is None and ref.first is None and ref.rows.dtype == "f32"
    assert d.rows.dtype == "f8e4m3" and d.first is not None
    np.testing.assert_array_equal(np.asarray(d.rows.to("f32")), np.asarray(want.data.to("f32")))
    np.testing.assert_array_equal(np.asarray(d.scale), np.asarray(want.scale))
    np.testing.assert_array_equal(np.asarray(d.offsets), np.asarray(ref.offsets))
    np.testing.assert_allclose(np.asarray(d.first), np.asarray(one), rtol=1e-6, atol=1e-6)
    assert len(ranges) == El, "the second GEMM expert by expert"
    for got in (back, fused_back, dx):
        np.testing.assert_array_equal(np.asarray(got), rows)
    # bad arguments are refused on every PE before a row moves (bf16 rows went out as f32 bytes; a y
    # wider than the group's rows wrote past the peer's receive buffer)
    with pytest.raises(cm.InvalidArgument, match="pass contiguous f32 rows"):
        plain.dispatch(xp.to(cm.bfloat16), offsets)
    with pytest.raises(cm.InvalidArgument, match="one contiguous f32 row per delivered row"):
        plain.combine(cm.empty([ref.rows.shape[0], 2 * C]), ref)
    with pytest.raises(cm.InvalidArgument, match="one contiguous f32 row per dispatched row"):
        plain.combine_backward(cm.empty([2, C]), ref)


def test_expert_offsets_past_the_rows_are_refused_before_a_row_leaves(me):
    """Offsets are computed on the stream, so the send kernel checks them: offsets past the rows sent
    heap bytes as rows. One PE: with more, the peers would wait for rows that never come."""
    from coremesh import parallel
    pe, n = me
    if n != 1:
        return
    ep = parallel.ExpertParallelGroup(experts=2, width=8, max_rows=10)
    xp = cm.from_numpy(np.ones((1, 8), np.float32))
    ep.dispatch(xp, cm.from_numpy(np.array([0, 0, 10], np.int64)))
    with pytest.raises(cm.KernelError, match=r"expert offsets \[0\]=0 \[E\]=10 for 1 rows"):
        runtime.synchronize()


def test_a_dispatch_whose_first_gemm_raises_says_the_layer_is_unusable(me):
    """The user's first GEMM raising inside dispatch leaves the exchange part way: the next dispatch
    of that layer names the error and what to do (it said 'combine each dispatch', which could not
    be followed: the failed dispatch returned nothing to combine). One PE: with more, the members'
    exchange would stop at different points."""
    from coremesh import parallel
    pe, n = me
    if n != 1:
        return
    E, C, R, W = 4, 8, 12, 6
    offsets = cm.from_numpy(np.array([0, 3, 6, 9, 12], np.int64))
    xp = cm.from_numpy(np.random.default_rng(1).standard_normal((R, C), dtype=np.float32))
    ep = parallel.ExpertParallelGroup(experts=E, width=C, max_rows=R, fused=True)

    def bad(rows, scale, offs, out):
        raise ValueError("a bug in the user's first GEMM")

    with pytest.raises(ValueError, match="a bug in the user's first GEMM"):
        ep.dispatch(xp, offsets, first=bad, first_width=W)
    with pytest.raises(cm.InvalidArgument, match="after the previous one failed: .*a bug in the user's first GEMM"):
        ep.dispatch(xp, offsets, first=bad, first_width=W)
    runtime.synchronize()
    # so does a second GEMM (matmul_combine's) that raises (the next dispatch waited for the watchdog)
    ep2 = parallel.ExpertParallelGroup(experts=E, width=C, max_rows=R, fused=True)
    d = ep2.dispatch(xp, offsets)

    def bad_second(y, b, e):
        raise ValueError("a bug in the user's second GEMM")
    with pytest.raises(ValueError, match="second GEMM"):
        ep2.matmul_combine(cm.empty(list(d.rows.shape)), bad_second, d)
    with pytest.raises(cm.InvalidArgument, match="after the previous one failed: .*a bug in the user's second GEMM"):
        ep2.dispatch(xp, offsets)
    runtime.synchronize()
