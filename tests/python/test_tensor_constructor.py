"""The RFC's (MindSpore's) tensor spellings: Tensor(array_like, dtype) copies and
converts, .asnumpy(), .shape, .dtype; bad input raises InvalidArgument that
says what to change. The RFC's own lines: test_rfc_snippets.py."""

import numpy as np
import pytest

import coremesh as ms
from coremesh import Tensor, ops


def address(array):
    return array.__array_interface__["data"][0]


def test_numpy_input_is_copied_and_converted():
    src = np.ones([1024, 2048])  # float64, as the RFC writes it
    a = Tensor(src, ms.float32)
    assert isinstance(a, ms.Tensor) and a.shape == (1024, 2048) and isinstance(a.shape, tuple)
    assert a.dtype == ms.float32 == "f32"
    assert a.data_ptr() != address(src)
    src[0, 0] = 7.0  # a copy: the tensor does not see later writes
    assert a.asnumpy()[0, 0] == 1.0
    np.testing.assert_array_equal(a.asnumpy(), np.ones([1024, 2048], np.float32))


def test_nested_lists_tuples_and_scalars():
    t = Tensor([[1.5, 2.0], [3.0, 4.0]], ms.float32)
    assert t.shape == (2, 2) and t.dtype == ms.float32
    np.testing.assert_array_equal(t.asnumpy(), [[1.5, 2.0], [3.0, 4.0]])
    assert Tensor(((1, 2), (3, 4))).dtype == ms.int64
    s = Tensor(2.5, ms.float32)
    assert s.shape == () and s.item() == 2.5 and s.asnumpy().shape == ()
    assert Tensor(3).dtype == ms.int64 and Tensor(3).item() == 3
    assert Tensor([]).shape == (0,) and Tensor([]).dtype == ms.float32
    assert Tensor([True, False]).asnumpy().tolist() == [1, 0]


def test_default_dtypes():
    assert Tensor(np.zeros(3, np.float16)).dtype == ms.float32
    assert Tensor(np.zeros(3, np.float32)).dtype == ms.float32
    assert Tensor(np.zeros(3, np.int32)).dtype == ms.int32
    assert Tensor(np.zeros(3, np.uint8)).dtype == ms.int64
    assert Tensor([1.0, 2]).dtype == ms.float32


def test_dtype_conversions():
    ints = Tensor([1.0, -2.0, 3.0], ms.int32)
    assert ints.dtype == ms.int32 and ints.asnumpy().tolist() == [1, -2, 3]
    assert Tensor(np.arange(4), ms.int64).asnumpy().dtype == np.int64
    assert Tensor(np.arange(4, dtype=np.int64), ms.float32).asnumpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    b = Tensor([1.0, 1.00390625, 3.14159], ms.bfloat16)  # rounds to nearest even
    assert b.dtype == ms.bfloat16
    np.testing.assert_array_equal(b.to(ms.float32).asnumpy(), [1.0, 1.0, 3.140625])
    q = Tensor([448.0, -1.0, 0.0], ms.float8_e4m3)
    assert q.dtype == ms.float8_e4m3 and q.to("f32").asnumpy().tolist() == [448.0, -1.0, 0.0]
    assert Tensor([1, 2], dtype="f32").dtype == ms.float32  # names and NumPy dtypes work too
    assert Tensor([1, 2], np.int32).dtype == ms.int32


def test_a_coremesh_tensor_is_copied_after_its_kernels():
    a = ms.full([64, 64], 1.0)
    c = ops.matmul(a, a)  # asynchronous
    d = Tensor(c)
    assert d.data_ptr() != c.data_ptr()
    np.testing.assert_array_equal(d.asnumpy(), np.full((64, 64), 64.0, np.float32))
    assert Tensor(c, ms.bfloat16).dtype == ms.bfloat16
    assert Tensor(Tensor([1, 2], ms.int32)).dtype == ms.int32
    assert ms.tensor([1.0]).dtype == ms.float32  # the older spelling is the same constructor


def test_asnumpy_is_a_view_and_refuses_raw_codes():
    t = Tensor([1.0, 2.0], ms.float32)
    view = t.asnumpy()
    assert address(view) == t.data_ptr()
    view[0] = 5.0
    assert t.asnumpy()[0] == 5.0
    with pytest.raises(ms.InvalidArgument, match=r"to\(coremesh.float32\).asnumpy\(\)"):
        Tensor([1.0], ms.bfloat16).asnumpy()


def message(excinfo):
    return str(excinfo.value)


def test_ragged_lists_say_where():
    with pytest.raises(ms.InvalidArgument) as e:
        Tensor([[1, 2, 3], [4, 5]], ms.float32)
    assert "ragged" in message(e) and "input_data[1] has 2 elements but input_data[0] has 3" in message(e)
    assert "HINT" in message(e) and "same length" in message(e)
    with pytest.raises(ms.InvalidArgument, match=r"input_data\[0\]\[1\] has 1 elements"):
        Tensor([[[1, 2], [3]], [[4, 5], [6, 7]]])
    with pytest.raises(ms.InvalidArgument, match=r"input_data\[1\] has a scalar"):
        Tensor([[1, 2], 3])
    assert isinstance(e.value, ValueError)  # InvalidArgument is also a ValueError


def test_unsupported_data_says_what_to_pass():
    with pytest.raises(ms.InvalidArgument, match="(?s)strings.*HINT: pass real numbers"):
        Tensor(["a", "b"])
    with pytest.raises(ms.InvalidArgument, match="complex numbers"):
        Tensor(np.ones(2, np.complex64))
    with pytest.raises(ms.InvalidArgument, match="(?s)None.*HINT: replace None"):
        Tensor([1.0, None])
    with pytest.raises(ms.InvalidArgument, match="Python objects"):
        Tensor(object())


def test_unsupported_dtypes_say_which_exist():
    with pytest.raises(ms.InvalidArgument, match="(?s)no dtype 'float64'.*HINT: pass coremesh.float32"):
        Tensor([1.0], np.float64)
    with pytest.raises(ms.InvalidArgument, match="no dtype 'f16'"):
        Tensor([1.0], "f16")
    with pytest.raises(AttributeError, match="no dtype float16: use coremesh.float32 or bfloat16"):
        ms.float16
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        ms.nonsense


def test_integer_dtypes_take_whole_numbers_in_range():
    with pytest.raises(ms.InvalidArgument, match="(?s)whole numbers.*np.round"):
        Tensor([1.5], ms.int32)
    with pytest.raises(ms.InvalidArgument, match="whole numbers"):
        Tensor([float("nan")], ms.int64)
    with pytest.raises(ms.InvalidArgument, match="(?s)do not fit in i32.*int64"):
        Tensor([2**31], ms.int32)
    with pytest.raises(ms.InvalidArgument, match="do not fit in i64"):
        Tensor(np.array([2**63], np.uint64))
    assert Tensor([2**31 - 1, -2**31], ms.int32).asnumpy().tolist() == [2**31 - 1, -2**31]


def test_the_rfcs_other_spellings():
    assert ms.runtime.MyMsJitStreamCtx is ms.runtime.StreamCtx
    depend = ops.Depend()
    x, y = Tensor([1.0]), Tensor([2.0])
    assert depend(x, y) is x
    device = ms.runtime.current_device()
    spec = device.spec
    ms.set_device_limit(device, cube_num=1, vector_num=-1)
    try:
        assert ms.get_device_limit(device) == {"cube_core_num": 1, "vector_core_num": spec["vector_core_num"]}
    finally:
        ms.reset_device_limit(device)
    s = ms.runtime.Stream()
    ms.set_stream_limit(s, cube_num=2, vector_num=2)
    assert ms.get_stream_limit(s) == {"cube_core_num": 2, "vector_core_num": 2}
    ms.reset_stream_limit(s)
    assert ms.get_stream_limit(s) == spec
