"""Every Python snippet of the RFC ("[RFC]: 多核并行"), run after `import coremesh as ms`.

rfc_snippets.txt holds the RFC's code blocks byte for byte. Each runnable
block runs in a fresh interpreter on a device of 24 cores (the RFC's A3 card
has 24-25 per die; its snippets ask for up to 12 cube and 24 vector cores):

    import coremesh as ms
    import numpy as np
    from coremesh import Tensor, ops      # the RFC's blocks use Tensor, ops, np unimported
    <inputs the block leaves undefined, e.g. a1, b1, a2, b2>
    <the block, with only the repairs listed in REPAIRS>
    <a call of its construct(), then checks of what ran, from the profiler>

REPAIRS is the complete list of changes to the RFC's text, each with the
reason it is needed in Python at all. Two touch a call: the NPU-only
`torch.npu.current_device()` (torch_npu exists only on Ascend NPUs; the RFC's
next line spells the same device ms.runtime.current_device()), and block 8's
`event1 = ms.runtime.Stream()`, a slip for the Event whose record()/wait() it
calls. Everything else -- Tensor(np.ones(...), ms.float32), ms.runtime.Stream(),
Event(), MyMsJitStreamCtx, StreamLimitCtx, ops.Depend(), record_event,
wait_event, ms.set_device_limit/get_device_limit -- runs as the RFC writes it.

Blocks 1 and 2 are API listings (method name: description), not code: the
listed methods must exist. The RFC's tables list interface signatures
(INTERFACE_SIGNATURES below, copied from them); each is called with its
default arguments. The prose's `get_stream_limit(device)` and
`set_stream_limit(device, ...)` (stream functions given a device) are slips
of the text, not code, and are not run.

The other seed (002_*.txt, an article on CANN SHMEM) has Python for another
package (`shmem_mp` on torch_npu), not the RFC's API: nothing of it applies.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import coremesh as ms

HERE = Path(__file__).parent
BLOCKS = re.findall(r"```\n(.*?)```", (HERE / "rfc_snippets.txt").read_text(encoding="utf-8"), re.S)

PREAMBLE = """\
import coremesh as ms
import numpy as np
from coremesh import Tensor, ops
"""

# The construct() inputs blocks 3-5 use without defining (the RFC's args).
INPUTS_A1_B1_A2_B2 = """\
a1 = Tensor(np.full([256, 256], 0.5), ms.float32)
b1 = Tensor(np.full([256, 256], 0.25), ms.float32)
a2 = Tensor(np.ones([1 << 16]), ms.float32)
b2 = Tensor(np.full([1 << 16], 2.0), ms.float32)
"""

MISSING_COLON = ("def construct(self, args)\n", "def construct(self, args):\n",
                 "the RFC's `def` lacks its colon (a SyntaxError)")

# block -> [(RFC text, replacement, reason)]; each RFC text occurs exactly once.
REPAIRS = {
    0: [("\xa0", " ", "the web page turned indentation into non-breaking spaces (U+00A0), "
                      "which Python refuses; every one becomes a space")],
    3: [MISSING_COLON,
        ("def construct(self, args):\n", "def construct(self, args):\n    global event1, event2, a2, b2\n",
         "MindSpore compiles construct() as a graph in which these outer names are rebound; "
         "in Python rebinding makes them locals (UnboundLocalError) unless declared global")],
    4: [MISSING_COLON],
    5: [MISSING_COLON,
        ("\nwith ms.runtime.MyMsJitStreamCtx(s2):", "\n    with ms.runtime.MyMsJitStreamCtx(s2):",
         "the second `with` lost its indentation: it belongs to construct() as in the two "
         "blocks before (at module level it would run before construct() made event1)")],
    6: [("torch.npu.current_device()", "ms.runtime.current_device()",
         "NPU-only: torch_npu's torch.npu exists only on Ascend NPUs; the RFC's next line "
         "names the device as ms.runtime.current_device()")],
    7: [("vector_num=-1)\n", "vector_num=-1):\n    seen = ms.runtime.current_stream()\n",
         "the RFC shows only the statement's head; a colon and a body make it a statement")],
    8: [("import mindspore as ms\n", "import coremesh as ms\n", "the package under test"),
        ("event1 = ms.runtime.Stream() ", "event1 = ms.runtime.Event() ",
         "a slip of the RFC: the block calls event1.record() and event1.wait(), the methods of "
         "the Event its section 1.2 defines"),
        ("event2 = ms.runtime.Stream() ", "event2 = ms.runtime.Event() ", "the same slip"),
        ("    \tx = depend(x, event1)", "        x = depend(x, event1)",
         "a tab after four spaces: Python refuses the mix (TabError)"),
        ("def construct(self, args):\n", "def construct(self, args):\n    global x, event1\n",
         "construct() rebinds the outer x and event1 (see block 3)")],
}

# What runs after each block: the call of its construct(), then checks.
RECORDS = """
ms.runtime.synchronize()
records = sorted(ms.profiler.records(), key=lambda r: r.start_ns)
def named(name):
    return [r for r in records if r.name == name]
"""
EVENT_ORDER = RECORDS + """
mm, add = named("matmul"), named("add")
assert len(mm) == 2 and {r.stream for r in mm} == {s1.id}, mm
assert len(add) == 2 and {r.stream for r in add} == {s2.id}, add
assert max(r.end_ns for r in mm) <= min(r.start_ns for r in add), "the adds ran before event1's matmuls ended"
"""
DRIVERS = {
    0: "XXX().construct(None)" + RECORDS + """
mm = named("matmul")
assert [r.stream for r in mm].count(s1.id) == 1 and len(mm) == 2, mm
assert [r for r in mm if r.stream != s1.id][0].stream == ms.runtime.current_stream().id
""",
    3: "construct(None, None)" + EVENT_ORDER,
    4: "construct(None, None)" + EVENT_ORDER,
    5: "construct(None, None)" + EVENT_ORDER,
    6: """
import ast
said = ast.literal_eval(re.search(r"返回dict：(\\{.*\\})", BLOCK).group(1))
got = ms.get_device_limit(ms.runtime.current_device())
assert got == said == {'cube_core_num': 12, 'vector_core_num': 24}, (got, said)
""",
    7: "assert seen == stream",
    8: "construct(None, None)" + RECORDS + """
# the RFC's own comments on each add: "# cube:C vector:V", or "# 用满核" (all cores)
full = ms.runtime.current_device().spec
said = []
for line in BLOCK.splitlines():
    if "ops.add" in line:
        m = re.search(r"# cube:(\\d+) vector:(\\d+)", line)
        said.append((int(m[1]), int(m[2])) if m else (full["cube_core_num"], full["vector_core_num"]))
# the adds' streams in program order; each stream runs its own in order (the two overlap)
streams = [stream1.id] * 2 + [stream2.id] * 3 + [stream1.id] * 2
for s in (stream1.id, stream2.id):
    ran = [(r.cube_num, r.vector_num) for r in named("add") if r.stream == s]
    want = [limits for t, limits in zip(streams, said) if t == s]
    assert ran == want, (s, ran, want)
""",
}
SETUP = {3: INPUTS_A1_B1_A2_B2, 4: INPUTS_A1_B1_A2_B2, 5: INPUTS_A1_B1_A2_B2,
         7: "stream = ms.runtime.Stream()\n"}


def repaired(index):
    text = BLOCKS[index]
    for old, new, reason in REPAIRS.get(index, []):
        count = text.count(old)
        assert count == 1 or (old == "\xa0" and count > 0), f"block {index}: {old!r} occurs {count} times"
        text = text.replace(old, new)
    return text


def run_block(index, tmp_path):
    script = "\n".join([
        PREAMBLE,
        "import re",
        f"BLOCK = {BLOCKS[index]!r}",
        "ms.profiler.start()",
        SETUP.get(index, ""),
        "# --- the RFC's block ---",
        repaired(index),
        "# --- the driver and checks ---",
        DRIVERS[index],
        "print('ok')",
    ])
    path = tmp_path / f"rfc_block_{index}.py"
    path.write_text(script, encoding="utf-8")
    env = dict(os.environ, COREMESH_CORES="24", COREMESH_PIN="0")
    done = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=150)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"block {index} failed:\n{done.stderr}\n--- script ---\n{script}")


def test_the_file_holds_the_rfcs_nine_blocks():
    assert len(BLOCKS) == 9
    assert BLOCKS[0].startswith("s1=ms.runtime.Stream()\nclass XXX:")
    assert BLOCKS[8].startswith("import mindspore as ms\nx = Tensor(np.ones([1024, 1024]), ms.float32)")
    assert set(REPAIRS) | {1, 2} | set(DRIVERS) == set(range(9))


@pytest.mark.parametrize("index", [0, 3, 4, 5, 6, 7, 8])
def test_rfc_block_runs(index, tmp_path):
    run_block(index, tmp_path)


def test_the_blocks_fail_without_their_repairs():
    """The repairs are needed: each repaired block fails to compile or to run as written."""
    for index in (0, 3, 4, 5, 7):
        with pytest.raises(SyntaxError):
            compile(BLOCKS[index], f"block {index}", "exec")
    with pytest.raises(TabError):
        compile(BLOCKS[8], "block 8", "exec")


@pytest.mark.parametrize("index, cls", [(1, "Event"), (2, "Stream")])
def test_rfc_api_listing(index, cls):
    """Blocks 1 and 2: mindspore.runtime.Event / Stream and their methods."""
    lines = BLOCKS[index].splitlines()
    assert lines[0] == f"mindspore.runtime.{cls}" and lines[2] == cls
    methods = [m[1] for m in (re.match(r"(\w+)\s*[:：]", line) for line in lines[3:]) if m]
    assert len(methods) == 5
    for name in methods:
        assert callable(getattr(getattr(ms.runtime, cls), name)), f"{cls}.{name}"


# The "MindSpore 暴露接口" column of section 1.3's table and the first column of
# the test plan's table, as written ("Event.record()" names the method).
INTERFACE_SIGNATURES = [
    "ms.runtime.set_device_limit(device, cube_num=-1, vector_num=-1)",
    "ms.runtime.get_device_limit(device)",
    "ms.runtime.set_stream_limit(stream, cube_num=-1, vector_num=-1)",
    "with ms.runtime.StreamLimitCtx(stream, cube_num=-1, vector_num=-1)",
    "ms.runtime.reset_stream_limit(stream)",
    "ms.runtime.get_stream_limit(stream)",
    "with ms.runtime.MyMsJitStreamCtx(s1)",
    "Event.record()",
    "Event.wait()",
    "ms.set_device_limit(device, cube_num=-1, vector_num=-1)",
    "ms.get_device_limit(device)",
    "ms.set_stream_limit(stream, cube_num=-1, vector_num=-1)",
    "ms.reset_stream_limit(stream)",
    "ms.get_stream_limit(stream)",
]


@pytest.mark.parametrize("signature", INTERFACE_SIGNATURES)
def test_rfc_interface_signature(signature):
    device = ms.runtime.current_device()
    stream = s1 = ms.runtime.Stream()
    Event = ms.runtime.Event()  # noqa: N806 -- "Event.record()": the method of an Event
    spec = device.spec
    env = {"ms": ms, "device": device, "stream": stream, "s1": s1, "Event": Event}
    if signature.startswith("with "):
        exec(compile(f"{signature}:\n    inside = ms.runtime.current_stream()\n", signature, "exec"), env)
        assert env["inside"] == stream
    else:
        result = eval(signature, env)
        if "get_" in signature:
            assert result == spec, (signature, result)  # -1 everywhere: nothing limited
    assert ms.get_stream_limit(stream) == spec and ms.get_device_limit(device) == spec

