"""coremesh.runtime behaviour beyond the RFC plan: errors where the RFC expects
them, events, threads, tensors kept alive by queued kernels, the GIL released
in waits and Ctrl-C interrupting them.

A gate holds a stream deterministically: SHMEM's on-stream signal wait
(this process is a 1-PE job) parks the stream until the host sets the signal.
"""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import coremesh as cm
from coremesh import ops, runtime, shmem
from coremesh.runtime import Event, Stream, StreamCtx, StreamLimitCtx


@pytest.fixture(scope="module", autouse=True)
def one_pe_job():
    shmem.init()
    yield
    shmem.finalize()


class Gate:
    """Later work on `stream` waits until open() is called."""

    def __init__(self, stream):
        self.signal = shmem.zeros(1, "uint64")
        shmem.signal_wait_on_stream(self.signal, "ge", 1, stream=stream)

    def open(self):
        shmem.atomic_set(self.signal, 1, shmem.my_pe())


def wait_until(predicate, seconds=5.0):
    """Polls `predicate` (objects dropped by workers are released on the main thread)."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()


def test_kernel_error_names_the_kernel_and_reaches_waiting_streams():
    s1, s2 = Stream(), Stream()
    table = cm.zeros([4, 3])
    bad_ids = cm.from_numpy(np.array([1, 99], np.int64))
    event = Event()
    with StreamCtx(s1):
        ops.embedding(table, bad_ids)  # the id is checked inside the kernel
        event.record()
    with StreamCtx(s2):
        event.wait()
        ops.add(cm.zeros([8]), cm.zeros([8]))
    with pytest.raises(cm.KernelError, match="kernel 'embedding'") as info:
        s1.synchronize()
    assert isinstance(info.value, RuntimeError) and "HINT" in str(info.value)
    with pytest.raises(cm.KernelError, match="embedding"):
        s2.synchronize()  # the error travelled through the event
    with pytest.raises(cm.KernelError):
        event.synchronize()
    assert s1.query() and s2.query()  # reported once, then cleared
    with StreamCtx(s1):
        ok = ops.add(cm.full([4], 1.0), cm.full([4], 2.0))
    np.testing.assert_array_equal(np.asarray(ok), [3.0] * 4)


def test_query_and_device_synchronize_report_kernel_errors():
    s = Stream()
    with StreamCtx(s):
        ops.cross_entropy(cm.zeros([2, 3]), cm.from_numpy(np.array([0, 7], np.int64)))
    with pytest.raises(cm.KernelError, match="cross_entropy"):
        runtime.synchronize()
    with StreamCtx(s):
        ops.embedding(cm.zeros([2, 2]), cm.from_numpy(np.array([5], np.int64)))
    with pytest.raises(cm.KernelError):
        while not s.query():
            time.sleep(0.001)


def test_invalid_limits_are_refused_with_a_hint():
    device, s = runtime.current_device(), Stream()
    for cube, vector in [(0, -1), (-2, -1), (-1, 5)]:
        with pytest.raises(cm.InvalidArgument, match="HINT"):
            runtime.set_device_limit(device, cube_num=cube, vector_num=vector)
        with pytest.raises(ValueError):
            runtime.set_stream_limit(s, cube_num=cube, vector_num=vector)
    assert runtime.get_device_limit(device) == {"cube_core_num": 4, "vector_core_num": 4}
    with pytest.raises(cm.InvalidArgument, match="'cpu' is not a device"):
        runtime.set_device_limit("cpu", cube_num=1)
    for seconds in (float("inf"), float("nan"), 1e300, 0, 1e-4):  # inf was "must be positive"
        with pytest.raises(cm.InvalidArgument, match="seconds in"):
            runtime.set_wait_timeout(seconds)
    before = runtime.current_stream()
    with pytest.raises(cm.InvalidArgument):
        with StreamLimitCtx(s, cube_num=9):
            pass
    assert runtime.current_stream() == before
    assert runtime.get_stream_limit(s) == {"cube_core_num": 4, "vector_core_num": 4}
    with pytest.raises(cm.InvalidArgument, match="device 7 does not exist"):
        runtime.get_device_limit(7)
    runtime.set_device_limit(device.id, vector_num=2)  # by id, and -1 leaves cube alone
    assert runtime.get_device_limit(device) == {"cube_core_num": 4, "vector_core_num": 2}
    assert runtime.get_stream_limit(s) == {"cube_core_num": 4, "vector_core_num": 2}
    runtime.reset_device_limit(device)


def test_events_time_and_order_work():
    s1, s2 = Stream(), Stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    a = cm.full([256, 256], 1.0)
    with pytest.raises(cm.InvalidArgument, match="record both"):
        start.elapsed_time(end)
    start.record(s1)
    with StreamCtx(s1):
        c = ops.matmul(a, a)
    end.record(s1)
    s2.wait_stream(s1)
    with StreamCtx(s2):
        d = ops.add(c, c)
    end.synchronize()
    assert start.query() and end.elapsed_time(end) == 0.0
    assert start.elapsed_time(end) > 0.0
    with pytest.raises(cm.InvalidArgument, match="enable_timing|Event\\(true\\)"):
        Event().elapsed_time(end)
    assert Event().query()  # never recorded: nothing to wait for
    np.testing.assert_array_equal(np.asarray(d)[:2, :2], 512.0)


def test_current_stream_is_per_thread():
    s = Stream(priority=1)
    seen = []
    with StreamCtx(s):
        t = threading.Thread(target=lambda: seen.append(runtime.current_stream()))
        t.start()
        t.join()
        assert runtime.current_stream() == s
    assert seen == [runtime.default_stream()] and s.priority == 1
    ctx = StreamCtx(s)
    with ctx:
        with ctx:  # re-entered: each entry restores its own previous stream
            assert runtime.current_stream() == s
        assert runtime.current_stream() == s
    assert runtime.current_stream() == runtime.default_stream()


def test_contexts_left_out_of_order_or_on_another_thread():
    """Contexts of interleaved generators end out of order: the last one to end
    restores the stream and limit from before the first. Leaving on another
    thread is refused (the current stream belongs to the thread that entered)."""
    s1, s2 = Stream(), Stream()
    limit = StreamLimitCtx(s1, 1, 1)
    c1, c2 = StreamCtx(s1), StreamCtx(s2)
    before = runtime.get_stream_limit(s1)
    c1.__enter__(), limit.__enter__(), c2.__enter__()
    c1.__exit__(None, None, None)
    assert runtime.current_stream() == s2
    limit.__exit__(None, None, None)
    c2.__exit__(None, None, None)
    assert runtime.current_stream() == runtime.default_stream()
    assert runtime.get_stream_limit(s1) == before
    ctx = StreamCtx(s1)
    ctx.__enter__()
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(cm.InvalidArgument, ctx.__exit__, None, None, None)))
    t.start()
    t.join()
    assert "thread that entered it" in str(errors[0].value)
    ctx.__exit__(None, None, None)
    assert runtime.current_stream() == runtime.default_stream()


def test_queued_kernel_keeps_numpy_and_torch_memory_alive():
    s = Stream()
    gate = Gate(s)
    x_np = np.full(4096, 1.5, np.float32)
    y_torch = torch.full((4096,), 2.0)
    x_alive, y_alive = weakref.ref(x_np), weakref.ref(y_torch)
    with StreamCtx(s):
        out = ops.add(cm.from_numpy(x_np), cm.from_dlpack(y_torch))
    del x_np, y_torch
    gc.collect()
    churn = [np.full(4096, -9.0, np.float32) for _ in range(64)]  # would reuse freed memory
    assert x_alive() is not None and y_alive() is not None, "the queued kernel holds them"
    gate.open()
    s.synchronize()
    np.testing.assert_array_equal(np.asarray(out), np.full(4096, 3.5, np.float32))
    assert wait_until(lambda: x_alive() is None and y_alive() is None), "released after the kernel ran"
    del churn


def test_waits_release_the_gil():
    """While the main thread waits, a Python thread counts and then opens the gate;
    a wait that held the GIL would never see the gate open (the watchdog would fire)."""
    saved = runtime.get_wait_timeout()
    runtime.set_wait_timeout(20.0)
    try:
        for wait in ("stream", "event", "device"):
            s = Stream()
            gate = Gate(s)
            with StreamCtx(s):
                done = ops.add(cm.full([16], 1.0), cm.full([16], 1.0))
                event = s.record_event()
            counted = []

            def count_then_open():
                for i in range(20000):
                    counted.append(i)
                gate.open()

            worker = threading.Thread(target=count_then_open)
            worker.start()
            {"stream": s.synchronize, "event": event.synchronize, "device": runtime.synchronize}[wait]()
            worker.join()
            assert len(counted) == 20000, wait
            np.testing.assert_array_equal(np.asarray(done), [2.0] * 16)
    finally:
        runtime.set_wait_timeout(saved)


CTRL_C_PROGRAM = textwrap.dedent("""
    import time
    import coremesh as cm
    from coremesh import runtime, shmem
    shmem.init()
    sig = shmem.zeros(2, "uint64")
    s = runtime.Stream()
    shmem.signal_wait_on_stream(sig[0:1], "ge", 1, stream=s)
    for name, wait in [("stream", s.synchronize), ("signal", lambda: shmem.signal_wait_until(sig[1:2], "ge", 1))]:
        print("waiting", name, flush=True)
        t0 = time.monotonic()
        try:
            wait()
            print("not interrupted", name, flush=True)
        except KeyboardInterrupt:
            print("interrupted", name, "after %.2f s" % (time.monotonic() - t0), flush=True)
    shmem.atomic_set(sig[0:1], 1, shmem.my_pe())
    s.synchronize()
    shmem.finalize()
    print("clean exit", flush=True)
""")


def test_ctrl_c_interrupts_waits():
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_PROGRAM], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    watchdog = threading.Timer(60, proc.kill)  # a wait that ignores Ctrl-C fails, not hangs
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:  # one buffered reader for every line
            lines.append(line)
            if line.startswith("waiting"):
                time.sleep(0.3)
                proc.send_signal(signal.SIGINT)
        proc.wait()
    finally:
        watchdog.cancel()
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert "interrupted stream" in text and "interrupted signal" in text and "clean exit" in text, text


# Objects whose memory is symmetric, alive at exit: the interpreter destroys them in its own order on
# each PE (reversed on PE 1 by the first ending), and their frees must not be collective (a clean exit
# aborted on "sym_free differs between PEs"; a failing one waited for the watchdog).
KEEP_SYMMETRIC_OBJECTS = ("from coremesh import parallel; kept = [parallel.FusedTensorComm(capacity=1024, max_rows=16), "
                          "parallel.FusedTensorComm(capacity=4096, max_rows=16)]")


@pytest.mark.parametrize("ending, status", [("raise RuntimeError('a user error')", 1), ("pass", 0),
                                            ("sys.exit(3) if shmem.my_pe() == 1 else shmem.wait_until(a, 'eq', 42)", 3),
                                            ("shmem.wait_until(a, 'eq', 42) if shmem.my_pe() else exit(4)", 4),
                                            ("raise SystemExit(1) if shmem.my_pe() == 1 else shmem.wait_until(a, 'eq', 42)", 1),
                                            (KEEP_SYMMETRIC_OBJECTS + "[::1 - 2 * shmem.my_pe()]", 0),
                                            (KEEP_SYMMETRIC_OBJECTS + "; sys.exit(1) if shmem.my_pe() else shmem.wait_until(a, 'eq', 42)", 1)])
def test_a_shmem_script_that_does_not_finalize_exits_cleanly(tmp_path, ending, status):
    """Without shmem.finalize(), a script that ends normally finalizes as a C
    program does; one that dies of an exception exits with status 1 and its
    traceback, and the launcher stops the other PEs (it segfaulted at exit). So does one that
    exits with a failing status (sys.exit, the exit builtin, raise SystemExit) while a peer
    waits for it (it waited in the finalize barrier until the watchdog)."""
    script = tmp_path / "no_finalize.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np
        from coremesh import shmem
        shmem.init()
        a = shmem.zeros(4, "int64")
        shmem.put(a, np.full(4, shmem.my_pe(), np.int64), (shmem.my_pe() + 1) % shmem.n_pes())
        {ending}
    """))
    run = subprocess.run([os.environ["COREMESH_RUN"], "run", "-n", "2", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == status, run.stderr
    assert "Segmentation" not in run.stderr and "signal" not in run.stderr, run.stderr
    if "RuntimeError" in ending:
        assert "a user error" in run.stderr
