"""The RFC's test plan (测试设计), written against its Python API.

多流 1-3 (multi-stream overlap), 执行序 1-3 (order through events), 分核 1-5
(device and stream core limits, block_dim read back from kernel_details.csv),
交叉 1 (streams + events + limits together) and 交叉 4 (the op cache id).
The C++ versions are in tests/runtime/test_rfc_plan.cpp.

On the CPU backend a kernel with as many blocks as the device has cores
leaves no core to a concurrent one, so where the RFC expects overlap the
streams get core limits (as the RFC's cross test does).
"""

import numpy as np

import coremesh as cm
from coremesh import ops, profiler
from coremesh.runtime import (Event, Stream, StreamCtx, StreamLimitCtx, current_device,
                              current_stream, get_device_limit, get_stream_limit,
                              reset_stream_limit, set_device_limit, set_stream_limit,
                              synchronize)
from conftest import Operands, any_overlap, kernel_details, records_of, rows_named, span_of


def test_multi_stream_1_dual_stream_single_op_overlaps(profiled):
    """多流 1: matmul on the main stream S1 overlaps add on S2 = Stream()."""
    s1, s2 = current_stream(), Stream()
    t = Operands()
    big = cm.full([1024, 1024], 0.1)
    with StreamLimitCtx(s1, cube_num=2):
        c = ops.matmul(big, big)
    with StreamLimitCtx(s2, vector_num=2):
        for _ in range(8):
            d = ops.add(t.x, t.y)
    synchronize()
    assert any_overlap(records_of(s1), records_of(s2))
    np.testing.assert_allclose(np.asarray(c)[:2, :2], 1024 * 0.01, rtol=1e-5)
    assert np.asarray(d)[123] == 3.0


def test_multi_stream_2_dual_stream_multi_op_overlaps(profiled):
    """多流 2: several matmul/add on S1 and on S2, concurrently."""
    s1, s2 = current_stream(), Stream()
    t = Operands()
    set_stream_limit(s1, 2, 2)
    set_stream_limit(s2, 2, 2)
    for _ in range(4):
        with StreamCtx(s1):
            ops.matmul(t.a, t.b)
            ops.add(t.x, t.y)
        with StreamCtx(s2):
            ops.add(t.x, t.y)
            ops.matmul(t.a, t.b)
    synchronize()
    assert len(records_of(s1)) == 8 and len(records_of(s2)) == 8
    assert any_overlap(records_of(s1), records_of(s2))


def test_multi_stream_3_five_streams_overlap(profiled):
    """多流 3: matmul on S1, matmul/add on S2..S5; every stream overlaps another."""
    streams = [current_stream()] + [Stream() for _ in range(4)]
    t = Operands()
    for rnd in range(3):
        for i, s in enumerate(streams):
            with StreamLimitCtx(s, cube_num=1, vector_num=1):
                ops.matmul(t.a, t.b)
                if i > 0:
                    ops.add(t.x, t.y)
    synchronize()
    for i, s in enumerate(streams):
        others = [records_of(o) for j, o in enumerate(streams) if j != i]
        assert any(any_overlap(records_of(s), o) for o in others), f"stream {s.id} ran alone"


def test_order_1_single_event_single_record(profiled):
    """执行序 1: event1.record() after matmul on S1, event1.wait() before add on S2."""
    s1, s2 = current_stream(), Stream()
    t = Operands()
    event1 = Event()
    with StreamCtx(s1):
        ops.matmul(t.a, t.b)
        ops.matmul(t.a, t.b)
        event1.record()
    with StreamCtx(s2):
        event1.wait()
        ops.add(t.x, t.y)
        ops.add(t.x, t.y)
    synchronize()
    r1, r2 = records_of(s1), records_of(s2)
    assert len(r1) == 2 and len(r2) == 2
    assert not any_overlap(r1, r2)
    assert span_of(r2)[0] >= span_of(r1)[1]


def test_order_1_stream_methods(profiled):
    """执行序 1 in the RFC's final form: event1 = s1.record_event(); s2.wait_event(event1)."""
    s1, s2 = current_stream(), Stream()
    t = Operands()
    with StreamCtx(s1):
        ops.matmul(t.a, t.b)
        event1 = s1.record_event()
    with StreamCtx(s2):
        s2.wait_event(event1)
        ops.add(t.x, t.y)
        event2 = s2.record_event()
    event2.synchronize()
    assert event1.query() and event2.query()
    assert span_of(records_of(s2))[0] >= span_of(records_of(s1))[1]


def test_order_2_five_events_serialise_five_streams(profiled):
    """执行序 2: each stream waits for the previous one's event: no overlap at all."""
    streams = [current_stream()] + [Stream() for _ in range(4)]
    events = [Event() for _ in streams]
    t = Operands()
    for i, s in enumerate(streams):
        with StreamCtx(s):
            if i > 0:
                events[i - 1].wait()
            ops.matmul(t.a, t.b)
            ops.add(t.x, t.y)
            events[i].record()
    synchronize()
    for i in range(1, len(streams)):
        cur = records_of(streams[i])
        assert len(cur) == 2
        assert span_of(cur)[0] >= span_of(records_of(streams[i - 1]))[1]
        for j in range(i):
            assert not any_overlap(records_of(streams[j]), cur)


def test_order_3_one_event_gates_four_streams(profiled):
    """执行序 3: one event recorded on S1 gates S2..S5: all after S1, concurrent with each other."""
    s1 = current_stream()
    others = [Stream() for _ in range(4)]
    t = Operands()
    event = Event()
    with StreamCtx(s1):
        ops.matmul(t.a, t.b)
        event.record()
    for s in others:
        with StreamLimitCtx(s, cube_num=1, vector_num=1):
            event.wait()
            for _ in range(3):
                ops.matmul(t.a, t.b)
    synchronize()
    s1_end = span_of(records_of(s1))[1]
    for s in others:
        assert span_of(records_of(s))[0] >= s1_end
    pairs = sum(any_overlap(records_of(a), records_of(b))
                for i, a in enumerate(others) for b in others[i + 1:])
    assert pairs >= 3, "the gated streams should run concurrently"


def test_core_limit_1_device_limit(profiled, tmp_path):
    """分核 1: set_device_limit matches get_device_limit and the block_dim in kernel_details.csv."""
    device = current_device()
    t = Operands()
    set_device_limit(device, cube_num=3, vector_num=2)
    assert get_device_limit(device) == {"cube_core_num": 3, "vector_core_num": 2}
    ops.matmul(t.a, t.b)
    ops.add(t.x, t.y)
    synchronize()
    rows = kernel_details(tmp_path)
    mm, add = rows_named(rows, "matmul"), rows_named(rows, "add")
    assert len(mm) == 1 and len(add) == 1
    assert mm[0]["block_dim"] == "3" and mm[0]["cube_num"] == "3"
    assert add[0]["block_dim"] == "2" and add[0]["vector_num"] == "2"


def test_core_limit_2_3_stream_limit_between_ops_then_reset(profiled, tmp_path):
    """分核 2/3: set_stream_limit once, then between matmuls; reset -> the default counts."""
    s = Stream()
    t = Operands()
    counts = [1, 4, 2, 3]
    with StreamCtx(s):
        for c in counts:
            set_stream_limit(s, cube_num=c, vector_num=c)
            assert get_stream_limit(s) == {"cube_core_num": c, "vector_core_num": c}
            ops.matmul(t.a, t.b)
        reset_stream_limit(s)
        assert get_stream_limit(s) == get_device_limit(current_device())
        ops.matmul(t.a, t.b)
    synchronize()
    mm = rows_named(kernel_details(tmp_path), "matmul")
    assert [r["block_dim"] for r in mm] == [str(c) for c in counts] + ["4"]


def test_core_limit_4_5_stream_limit_ctx_scopes(profiled, tmp_path):
    """分核 4/5: inside StreamLimitCtx its counts, outside the default ones."""
    s = Stream()
    t = Operands()
    with StreamCtx(s):
        ops.add(t.x, t.y)  # default
    with StreamLimitCtx(s, cube_num=3, vector_num=1):
        assert get_stream_limit(s) == {"cube_core_num": 3, "vector_core_num": 1}
        assert current_stream() == s
        ops.matmul(t.a, t.b)
        ops.add(t.x, t.y)
    with StreamLimitCtx(s, cube_num=2, vector_num=3):
        ops.matmul(t.a, t.b)
        ops.add(t.x, t.y)
    assert get_stream_limit(s) == {"cube_core_num": 4, "vector_core_num": 4}
    with StreamCtx(s):
        ops.matmul(t.a, t.b)  # default again
    synchronize()
    rows = kernel_details(tmp_path)
    assert [r["block_dim"] for r in rows_named(rows, "add")] == ["4", "1", "3"]
    assert [r["block_dim"] for r in rows_named(rows, "matmul")] == ["3", "2", "4"]


def test_cross_1_matmul_and_add_under_split_limits_overlap(profiled):
    """交叉 1: matmul on S1 (cube limit) ‖ add on S2 (vector limit), ordered by an event."""
    s1, s2 = current_stream(), Stream()
    t = Operands()
    big = cm.full([768, 768], 0.1)
    start = Event()
    start.record(s1)
    set_stream_limit(s1, cube_num=2)
    set_stream_limit(s2, vector_num=2)
    with StreamCtx(s1):
        for _ in range(3):
            ops.matmul(big, big)
    with StreamCtx(s2):
        start.wait()
        for _ in range(12):
            ops.add(t.x, t.y)
    synchronize()
    r1, r2 = records_of(s1), records_of(s2)
    assert [r.block_dim for r in r1] == [2] * 3
    assert [r.block_dim for r in r2] == [2] * 12
    assert any_overlap(r1, r2)
    assert all(b.core_id < current_device().num_cores for r in profiler.records() for b in r.blocks)


def test_cross_4_op_cache_id_follows_the_limits(profiled):
    """交叉 4: the same op under the same limits has one cache id; other limits another."""
    s = Stream()
    t = Operands()
    for cube in (2, 2, 2, 3):
        with StreamLimitCtx(s, cube_num=cube, vector_num=4):
            ops.matmul(t.a, t.b)
    synchronize()
    ids = [r.cache_id for r in records_of(s)]
    assert ids[0] == ids[1] == ids[2] != ids[3]
