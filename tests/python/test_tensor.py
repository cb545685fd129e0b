"""coremesh.Tensor and zero-copy exchange with NumPy (buffer protocol) and
PyTorch (DLPack): same memory address both ways, dtypes, views, bad input."""

import hashlib

import numpy as np
import pytest
import torch

import coremesh as cm
from coremesh import ops


def address(array):
    return array.__array_interface__["data"][0]


def test_numpy_round_trip_shares_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = cm.from_numpy(a)
    assert t.shape == (3, 4) and t.dtype == "f32" and t.data_ptr() == address(a)
    back = np.asarray(t)
    assert address(back) == address(a) and back.shape == (3, 4)
    back[1, 2] = -7.0  # one memory: the write shows through every view
    assert a[1, 2] == -7.0
    again = cm.from_numpy(back)
    assert again.data_ptr() == address(a)


def test_coremesh_memory_exported_to_numpy_without_copy():
    t = cm.full([2, 3], 1.5)
    view = t.numpy()
    assert address(view) == t.data_ptr()
    view[0, 0] = 4.0
    np.testing.assert_array_equal(np.asarray(t), [[4.0, 1.5, 1.5], [1.5, 1.5, 1.5]])
    # the array keeps the tensor's storage alive after the tensor object is gone
    del t
    assert view.sum() == pytest.approx(4.0 + 5 * 1.5)


def test_export_waits_for_the_kernel_that_writes_the_tensor():
    a = cm.full([256, 256], 1.0)
    c = ops.matmul(a, a)  # asynchronous
    np.testing.assert_array_equal(np.asarray(c), np.full((256, 256), 256.0, np.float32))


def test_strided_views_export_their_strides():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = cm.from_numpy(a).transpose(1, 2)
    assert t.shape == (2, 4, 3) and not t.is_contiguous()
    view = np.asarray(t)
    np.testing.assert_array_equal(view, a.transpose(0, 2, 1))
    assert address(view) == address(a)
    np.testing.assert_array_equal(np.asarray(cm.from_numpy(a).slice(2, 1, 3)), a[:, :, 1:3])
    np.testing.assert_array_equal(np.asarray(cm.from_numpy(a).select(0, 1)), a[1])
    np.testing.assert_array_equal(np.asarray(t.contiguous()), a.transpose(0, 2, 1))
    view = memoryview(t)
    assert view.format == "f" and view.shape == (2, 4, 3) and view.strides == (48, 4, 16)
    assert not view.c_contiguous
    assert memoryview(cm.full([2, 3], 1.0)).c_contiguous


def test_integer_dtypes_both_ways():
    for np_type, name in [(np.int32, "i32"), (np.int64, "i64")]:
        a = np.arange(6, dtype=np_type)
        t = cm.from_numpy(a)
        assert t.dtype == name and np.asarray(t).dtype == np_type
        assert address(np.asarray(t)) == address(a)


def test_bf16_and_fp8_travel_as_raw_codes():
    x = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    b = cm.tensor(x, dtype="bf16")
    codes = np.asarray(b)
    assert codes.dtype == np.uint16
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(codes, expected)
    back = cm.from_numpy(codes, dtype="bf16")
    assert back.dtype == "bf16" and back.data_ptr() == address(codes)
    np.testing.assert_array_equal(np.asarray(back.to("f32")),
                                  torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    q = cm.tensor([448.0, -1.0, 0.0], dtype="f8e4m3")
    assert np.asarray(q).dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(q), [0x7E, 0xB8, 0x00])  # e4m3: 448 = S.1111.110


def test_torch_round_trip_through_dlpack_shares_memory():
    t = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    x = cm.from_dlpack(t)
    assert x.shape == (2, 5) and x.data_ptr() == t.data_ptr()
    y = torch.from_dlpack(x)
    assert y.data_ptr() == t.data_ptr()
    y[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    for dtype, name in [(torch.bfloat16, "bf16"), (torch.int32, "i32"), (torch.int64, "i64")]:
        src = torch.ones(3, dtype=dtype)
        c = cm.from_dlpack(src)
        assert c.dtype == name and c.data_ptr() == src.data_ptr()
        assert torch.from_dlpack(c).dtype == dtype


def test_from_dlpack_refuses_to_reinterpret_integers():
    # as from_numpy: only the documented pairs (uint32 read as i32 came back negative)
    for arr, name in [(np.array([3000000000], np.uint32), "i32"), (np.array([2**63 + 5], np.uint64), "i64"),
                      (torch.tensor([1, -1], dtype=torch.int16), "bf16"), (torch.tensor([1], dtype=torch.int8), "f8e4m3")]:
        with pytest.raises(cm.InvalidArgument):
            cm.from_dlpack(arr, dtype=name)
    codes = cm.from_dlpack(np.array([0x3F80], np.uint16), dtype="bf16")  # raw bf16 codes: the documented pair
    assert np.asarray(codes.to("f32")).tolist() == [1.0]
    assert cm.from_dlpack(np.array([-3], np.int32), dtype="i32").dtype == "i32"


def test_coremesh_results_reach_torch_through_dlpack():
    a = torch.randn(8, 16)
    b = torch.randn(16, 4)
    c = ops.matmul(cm.from_dlpack(a), cm.from_dlpack(b))
    torch.testing.assert_close(torch.from_dlpack(c), a @ b, rtol=1e-5, atol=1e-5)
    assert torch.utils.dlpack.from_dlpack(c.__dlpack__()).shape == (8, 4)
    assert c.__dlpack_device__() == (1, 0)
    # a raw capsule from torch.utils.dlpack works too, and only once
    cap = torch.utils.dlpack.to_dlpack(a)
    assert cm.from_dlpack(cap).data_ptr() == a.data_ptr()
    with pytest.raises(cm.InvalidArgument, match="not an unused DLPack capsule"):
        cm.from_dlpack(cap)


def test_numpy_dlpack_producer():
    a = np.arange(4, dtype=np.float32)
    assert cm.from_dlpack(a).data_ptr() == address(a)
    assert cm.from_dlpack(torch.zeros(0, 3)).shape == (0, 3)  # no element: its strides do not matter


def test_bad_buffers_are_refused_with_a_hint():
    with pytest.raises(cm.InvalidArgument, match="format 'd'"):
        cm.from_numpy(np.zeros(3))  # float64
    with pytest.raises(cm.InvalidArgument, match="C-contiguous"):
        cm.from_numpy(np.zeros((4, 4), np.float32)[:, ::2])
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(cm.InvalidArgument, match="read-only"):
        cm.from_numpy(ro)
    with pytest.raises(cm.InvalidArgument, match="format 'H'"):
        cm.from_numpy(np.zeros(3, np.uint16))  # bf16 codes need dtype='bf16'
    with pytest.raises(cm.InvalidArgument, match="contiguous"):
        cm.from_dlpack(torch.zeros(4, 4).t())
    with pytest.raises(ValueError):
        cm.empty([2], dtype="f16")
    with pytest.raises(cm.InvalidArgument, match="item"):
        cm.zeros([2]).item()


def test_a_failed_kernel_raises_from_every_numpy_export():
    # NumPy's np.asarray swallows a buffer export's error and made a 0-d object array
    table, ids = cm.zeros([5, 4]), cm.from_numpy(np.array([0, 9], np.int64))
    for export in (np.asarray, lambda t: np.array(t, dtype=np.float64), lambda t: t.numpy(), lambda t: t.asnumpy()):
        with pytest.raises(cm.KernelError, match="id 9 at 1 is out of range"):
            export(ops.embedding(table, ids))
    assert np.array(cm.full([2], 1.5), dtype=np.float64).dtype == np.float64  # __array__'s dtype
    strided = cm.zeros([4, 3]).transpose(0, 1)
    with pytest.raises(cm.InvalidArgument, match="strided"):
        hashlib.sha256(strided)  # a failed export (it asks for contiguous bytes) that reaches the caller
    assert cm.zeros([2]).numpy().shape == (2,)  # ... is not raised again by another tensor


def test_sizes_that_overflow_and_integers_out_of_range_are_refused():
    with pytest.raises(cm.InvalidArgument, match="more elements than an int64 counts"):
        cm.zeros([3, 0x5555555555555556])  # its 8 bytes segfaulted on use
    with pytest.raises(cm.InvalidArgument, match="negative size"):
        cm.zeros([2]).view(-2, -1)
    with pytest.raises(cm.InvalidArgument, match="does not fit in i32"):
        cm.full([2], float("nan")).to("i32")  # was INT_MIN
    assert cm.empty(np.int64(3)).shape == (3,) and cm.zeros([4]).view(np.int64(2), 2).shape == (2, 2)
    assert cm.zeros(np.array([2, 3])).shape == (2, 3) and cm.zeros([6]).view(np.array([3, 2])).shape == (3, 2)
    for bad in ([2.5], "abc", [2**70]):  # were pybind11's "Unable to cast Python instance"
        with pytest.raises(cm.InvalidArgument, match="int64 size|not a sequence of sizes"):
            cm.empty(bad)


def test_tensor_copies_and_converts():
    src = np.array([[1.0, 2.0], [3.0, 4.0]])  # float64 -> f32
    t = cm.tensor(src)
    assert t.dtype == "f32" and t.data_ptr() != address(src)
    np.testing.assert_array_equal(np.asarray(t), src.astype(np.float32))
    assert cm.tensor([1, 2, 3]).dtype == "i64"
    assert cm.full([1], 2.5).item() == 2.5
    assert cm.from_numpy(np.array([2**62 + 1])).item() == 2**62 + 1  # exact (was a float)
    z = cm.zeros([2, 2]).fill_(3.0)
    np.testing.assert_array_equal(np.asarray(z.clone()), np.full((2, 2), 3.0))
    assert repr(cm.zeros([2, 3], "i32")) == "Tensor([2, 3], i32)"
    assert cm.zeros([2, 3]).view(3, 2).shape == (3, 2)


def test_full_and_fill_take_the_value_exactly():
    """full/fill_ convert as Tensor(value, dtype) does: int64 past 2**24 exactly (they went
    through a float32), fractions for integer dtypes refused; copy_ from an overlapping view
    reads before it writes."""
    assert np.asarray(cm.full([2], 16777217, "i64")).tolist() == [16777217] * 2
    t = cm.zeros([3], "i64")
    t.fill_(2**40 + 1)
    assert np.asarray(t).tolist() == [2**40 + 1] * 3
    with pytest.raises(cm.InvalidArgument, match="whole numbers"):
        cm.full([1], 2.7, "i32")
    with pytest.raises(cm.InvalidArgument, match="does not fit in int64"):
        cm.zeros([1], "i64").fill_(2**200)
    with pytest.raises(cm.InvalidArgument, match="does not fit in int64"):
        cm.Tensor(2**70)
    x = cm.zeros([4, 4])
    x.transpose(0, 1).slice(0, 0, 2).fill_(3)  # a strided view: only its elements
    assert np.asarray(x).sum() == 24.0
    square = cm.from_numpy(np.array([[1, 2], [3, 4]], np.float32))
    square.copy_(square.transpose(0, 1))
    assert np.asarray(square).tolist() == [[1, 3], [2, 4]]


def test_from_numpy_reinterprets_only_the_documented_codes():
    for array, dtype in [(np.array([4000000000], np.uint32), "i32"), (np.zeros(2, np.int16), "bf16"),
                         (np.zeros(2, np.int8), "f8e4m3")]:
        with pytest.raises(cm.InvalidArgument, match="cannot hold a buffer"):
            cm.from_numpy(array, dtype=dtype)
    assert cm.from_numpy(np.zeros(2, np.uint16), dtype="bf16").dtype == "bf16"
    with pytest.raises(TypeError, match="0-d"):
        len(cm.Tensor(3.0))


def test_torch_dtypes_name_coremesh_dtypes():
    """common.hpp promises NumPy/torch dtype-like objects: torch 1.13's dtype has no itemsize,
    and was refused; None is the default (float32), as NumPy's None is its default."""
    assert cm.zeros([2], torch.float32).dtype == "f32" and cm.zeros([2], torch.bfloat16).dtype == "bf16"
    assert cm.zeros([2], torch.int64).dtype == "i64" and cm.zeros([2], None).dtype == "f32"
    with pytest.raises(cm.InvalidArgument, match="no dtype 'float16'"):
        cm.zeros([2], torch.float16)
