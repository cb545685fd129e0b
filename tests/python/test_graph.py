"""Graph mode from Python: the RFC's static-graph cases (分核 4, 分核 5, 交叉 2,
交叉 3) captured, instantiated and replayed, block_dim read back from
kernel_details.csv; replay against eager execution; refusals.
The C++ versions are in tests/graph/test_rfc_graph.cpp."""

import numpy as np
import pytest

import coremesh as cm
from coremesh import graph, ops, profiler
from coremesh.runtime import (Event, Stream, StreamCtx, StreamLimitCtx, get_stream_limit,
                              synchronize)
from conftest import Operands, any_overlap, kernel_details, records_of, rows_named


def test_core_limit_4_limit_ctx_in_graph_mode(profiled, tmp_path):
    """分核 4: StreamLimitCtx in a capture; the replay runs with its counts."""
    s = Stream()
    t = Operands(vector_len=1 << 16)
    with graph.capture(s) as cap:
        with StreamLimitCtx(s, cube_num=3, vector_num=1):
            assert get_stream_limit(s) == {"cube_core_num": 3, "vector_core_num": 1}
            c = ops.matmul(t.a, t.b)
            z = ops.add(t.x, t.y)
    synchronize()
    assert profiler.records() == [], "a capture runs nothing"
    exe = graph.instantiate(cap.graph)
    exe.replay(s)
    synchronize()
    rows = kernel_details(tmp_path)
    assert [r["block_dim"] for r in rows_named(rows, "matmul")] == ["3"]
    assert [r["block_dim"] for r in rows_named(rows, "add")] == ["1"]
    np.testing.assert_allclose(np.asarray(c)[0, 0], 384 * 0.01 * 0.02, rtol=1e-5)
    assert np.asarray(z)[7] == 3.0


def test_core_limit_5_each_scope_replays_with_its_count(profiled, tmp_path):
    """分核 5: matmuls in scopes of 1, 3, 2 cube cores, and the default outside them."""
    s = Stream()
    t = Operands(vector_len=1 << 16)
    outs = []  # kept: a result nobody holds is a dead node, and the pass drops it
    with graph.capture(s) as cap:
        with StreamCtx(s):
            outs.append(ops.matmul(t.a, t.b))
        for cube in (1, 3, 2):
            with StreamLimitCtx(s, cube_num=cube):
                outs.append(ops.matmul(t.a, t.b))
        with StreamCtx(s):
            outs.append(ops.matmul(t.a, t.b))
    exe = graph.instantiate(cap.graph)
    exe.replay(s)
    synchronize()
    mm = rows_named(kernel_details(tmp_path), "matmul")
    assert [r["block_dim"] for r in mm] == ["4", "1", "3", "2", "4"]


def test_results_nobody_holds_are_dead_nodes():
    """The dead-node pass drops work whose results nobody outside the graph holds."""
    s = Stream()
    t = Operands(vector_len=1 << 16)
    kept = None
    with graph.capture(s) as cap:
        with StreamCtx(s):
            ops.matmul(t.a, t.b)
            kept = ops.add(t.x, t.y)
    exe = graph.instantiate(cap.graph)
    assert (exe.captured_nodes, exe.nodes) == (2, 1), exe.dump()
    assert [r.removed for r in exe.pass_results if r.name == "dead_nodes"] == [1]
    exe.replay(s)
    synchronize()
    assert np.asarray(kept)[0] == 3.0


def test_cross_2_two_streams_replay_concurrently(profiled):
    """交叉 2: matmul on S1 (cube limit) and add on S2 (vector limit), forked and
    joined by events, overlap in replay with their counts."""
    s1, s2 = Stream(), Stream()
    t = Operands(vector_len=1 << 16)
    big = cm.full([768, 768], 0.1)
    fork, join = Event(), Event()
    with graph.capture(s1) as cap:
        fork.record(s1)
        with StreamLimitCtx(s1, cube_num=2):
            products = [ops.matmul(big, big) for _ in range(3)]
        with StreamLimitCtx(s2, vector_num=2):
            fork.wait()
            sums = [ops.add(t.x, t.y) for _ in range(12)]
            join.record()
        join.wait(s1)
    assert len(cap.graph) == 15
    exe = graph.instantiate(cap.graph)
    assert exe.nodes == 15, "different streams and limits: nothing fuses"
    exe.replay(s1)
    synchronize()
    r1, r2 = records_of(s1), records_of(s2)
    assert [r.block_dim for r in r1] == [2] * 3
    assert [r.block_dim for r in r2] == [2] * 12
    assert any_overlap(r1, r2)
    np.testing.assert_allclose(np.asarray(products[2])[5, 5], 768 * 0.1 * 0.1, rtol=1e-4)
    assert np.asarray(sums[11])[3] == 3.0


def eager_assign_add(t, c0):
    c = cm.tensor(np.asarray(c0))
    ops.add_out(c, ops.matmul(t.a, t.b), c)
    synchronize()
    return np.asarray(c).copy()


def test_cross_3_matmul_assign_add_fusion_respects_streams_and_limits():
    """交叉 3: C += A B fuses without stream/limit attributes; not across two
    streams; not under different core limits. Every variant equals eager bit for bit."""
    s1, s2 = Stream(), Stream()
    t = Operands(vector_len=1 << 16)
    c0 = np.full((384, 384), 1.0, np.float32)
    eager = eager_assign_add(t, c0)

    c = cm.tensor(c0)
    with graph.capture(s1) as cap:
        with StreamCtx(s1):
            ops.add_out(c, ops.matmul(t.a, t.b), c)
    fused = graph.instantiate(cap.graph)
    assert fused.nodes == 1, fused.dump()
    assert "matmul_add" in fused.dump()
    assert [r.matches for r in fused.pass_results if r.name == "matmul_add"] == [1]
    fused.replay(s1)
    synchronize()
    assert np.array_equal(np.asarray(c), eager)

    c2 = cm.tensor(c0)
    e, back = Event(), Event()
    with graph.capture(s1) as cap:
        with StreamCtx(s1):
            p = ops.matmul(t.a, t.b)
            e.record()
        with StreamCtx(s2):
            e.wait()
            ops.add_out(c2, p, c2)
            back.record()
        back.wait(s1)
        del p
    split_streams = graph.instantiate(cap.graph)
    assert split_streams.nodes == 2, "matmul on S1 and add on S2 must not fuse"
    split_streams.replay(s1)
    synchronize()
    assert np.array_equal(np.asarray(c2), eager)

    c3 = cm.tensor(c0)
    with graph.capture(s1) as cap:
        with StreamLimitCtx(s1, cube_num=2):
            p = ops.matmul(t.a, t.b)
        with StreamCtx(s1):
            ops.add_out(c3, p, c3)
        del p
    split_limits = graph.instantiate(cap.graph)
    assert split_limits.nodes == 2, "different core limits must not fuse"
    split_limits.replay(s1)
    synchronize()
    assert np.array_equal(np.asarray(c3), eager)


def test_replay_again_and_without_passes_matches_eager():
    """A graph replays as often as wanted; with passes=False nothing is rewritten."""
    s = Stream()
    t = Operands(vector_len=1 << 16)
    acc = cm.zeros([1 << 16])
    with graph.capture(s) as cap:
        with StreamCtx(s):
            ops.add_out(acc, ops.add(t.x, t.y), acc)
    exe = graph.instantiate(cap.graph, passes=False)
    assert exe.nodes == exe.captured_nodes == 2
    for _ in range(3):
        exe.replay(s)
    synchronize()
    assert np.all(np.asarray(acc) == 9.0)


def test_host_synchronization_inside_a_capture_is_refused():
    s = Stream()
    t = Operands(vector_len=1 << 16)
    with pytest.raises(cm.Error, match="captur"):
        with graph.capture(s):
            with StreamCtx(s):
                ops.add(t.x, t.y)
                s.synchronize()
    synchronize()


def test_capture_makes_its_stream_current_and_a_graph_instantiates_once():
    """Ops in `with graph.capture(s)` go to s (they ran eagerly on the default
    stream, leaving an empty graph); a Graph that instantiate consumed, or one
    with no nodes, is refused (a second Exec replayed nothing)."""
    s = Stream()
    a, c = cm.full([4], 1.0), cm.zeros([4])
    with graph.capture(s) as cap:
        ops.add_out(c, a, c)
    assert len(cap.graph) == 1
    exe = graph.instantiate(cap.graph)
    with pytest.raises(cm.InvalidArgument, match="no nodes"):
        graph.instantiate(cap.graph)
    exe.replay(s)
    exe.replay(s)
    s.synchronize()
    assert np.asarray(c).tolist() == [2.0] * 4
