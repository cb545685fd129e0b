"""coremesh.ops from Python, each op against NumPy or PyTorch (small shapes;
the C++ suite sweeps sizes and limits). Inputs go in without copies
(from_numpy / from_dlpack) and results come back through np.asarray."""

import numpy as np
import pytest
import torch

import coremesh as cm
from coremesh import ops
from conftest import cm_array, rand

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().numpy()
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol)


def grads_of(fn, *inputs):
    """(output, grads) of a torch function with a random upstream gradient."""
    leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
    out = fn(*leaves)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(dout)
    return out.detach(), dout.numpy(), [leaf.grad for leaf in leaves]


def e4m3_values():
    """The value of every OCP e4m3 code (an independent decoder)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    normal = (1 + man / 8.0) * 2.0 ** (exp - 7.0)
    sub = (man / 8.0) * 2.0 ** -6
    values = sign * np.where(exp == 0, sub, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


def dequant_rows(q, scale, block=128):
    """codes (R,K) + scale (R, ceil(K/128)) -> f32, one scale per 1x128 tile."""
    v = e4m3_values()[np.asarray(q)]
    return v * np.repeat(np.asarray(scale), block, axis=-1)[..., :v.shape[-1]]


def dequant_blocks(q, scale, block=128):
    v = e4m3_values()[np.asarray(q)]
    s = np.repeat(np.repeat(np.asarray(scale), block, axis=-2), block, axis=-1)
    return v * s[..., :v.shape[-2], :v.shape[-1]]


def test_elementwise(rng):
    a, b = rand(rng, 1000), rand(rng, 1000)
    close(ops.add(cm_array(a), cm_array(b)), a + b)
    close(ops.mul(cm_array(a), cm_array(b)), a * b)
    out = cm.empty([1000])
    ops.add_out(cm_array(a), cm_array(b), out)
    close(out, a + b)


def test_matmul_family(rng):
    a, b = rand(rng, 33, 20), rand(rng, 20, 17)
    close(ops.matmul(cm_array(a), cm_array(b)), a @ b)
    close(ops.matmul(cm_array(a.T), cm_array(b.T), trans_a=True, trans_b=True), a @ b)
    batched = rand(rng, 3, 33, 20)
    close(ops.matmul(cm_array(batched), cm_array(b)), batched @ b)
    c = cm_array(np.ones((33, 17)))
    ops.matmul_out(cm_array(a), cm_array(b), c, beta=1.0)
    close(c, a @ b + 1)
    dc = rand(rng, 33, 17)
    da, db = ops.matmul_backward(cm_array(dc), cm_array(a), cm_array(b))
    close(da, dc @ b.T)
    close(db, a.T @ dc)
    # bf16 inputs: exactly rounded, f32 accumulation
    ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
    close(ops.matmul(cm.from_dlpack(ta), cm.from_dlpack(tb)), ta.float() @ tb.float())


def test_fp8_quantization_and_block_scaled_gemm(rng):
    x, w = rand(rng, 16, 200), rand(rng, 130, 200)
    qx = ops.quantize_fp8_act(cm_array(x))
    data, scale = qx
    assert data.dtype == "f8e4m3" and scale.shape == (16, 2)
    amax = np.abs(np.pad(x, ((0, 0), (0, 56)))).reshape(16, 2, 128).max(-1)
    close(scale, amax / 448.0, rtol=1e-6, atol=0)
    close(dequant_rows(data, scale), x, rtol=1 / 16, atol=1e-2 * np.abs(x).max() / 448)
    close(ops.dequantize_fp8_act(qx), dequant_rows(data, scale), rtol=0, atol=0)
    qw = ops.quantize_fp8_weight(cm_array(w))
    assert qw.scale.shape == (2, 2)
    xd, wd = dequant_rows(qx.data, qx.scale), dequant_blocks(qw.data, qw.scale)
    close(ops.matmul_fp8(qx, qw), xd @ wd.T, rtol=1e-4, atol=1e-3)
    close(ops.cast(cm_array(x), "bf16").to("f32"), torch.from_numpy(x).bfloat16().float(), rtol=0, atol=0)


def test_grouped_matmul_layouts_and_backward(rng):
    G, K, N = 3, 24, 10
    x, w = rand(rng, 20, K), rand(rng, G, N, K)
    offsets = np.array([0, 7, 7, 18], np.int64)  # an empty group; rows 18.. are zero
    expected = np.zeros((20, N), np.float32)
    for g in range(G):
        rows = slice(offsets[g], offsets[g + 1])
        expected[rows] = x[rows] @ w[g].T
    off = cm.from_numpy(offsets)
    close(ops.grouped_matmul(cm_array(x), cm_array(w), off), expected)
    close(ops.grouped_matmul(cm_array(x), [cm_array(w[g]) for g in range(G)], off), expected)
    close(ops.grouped_matmul(cm_array(x), cm_array(w.transpose(0, 2, 1)), off, layout="kn"), expected)
    xs = [cm_array(x[offsets[g]:offsets[g + 1]]) for g in range(G)]
    ys = ops.grouped_matmul(xs, [cm_array(w[g]) for g in range(G)])
    for g in range(G):
        close(ys[g], expected[offsets[g]:offsets[g + 1]])
    close(ops.grouped_matmul_stacked(xs, [cm_array(w[g]) for g in range(G)]), expected[:18])
    # group by group: only group 0's rows (the rest, tail included, untouched), then groups 1-2 and the tail
    y = cm_array(np.full((20, N), 5.0, np.float32))
    ops.grouped_matmul_out(cm_array(x), cm_array(w), off, y, groups=(0, 1))
    close(y, np.where(np.arange(20)[:, None] < 7, expected, 5.0))
    ops.grouped_matmul_out(cm_array(x), cm_array(w), off, y, groups=(1, 3))  # ends at G: zeroes the tail
    close(y, expected)
    dy = rand(rng, 20, N)
    dx, dw = ops.grouped_matmul_backward(cm_array(dy), cm_array(x), cm_array(w), off)
    exp_dx, exp_dw = np.zeros_like(x), np.zeros_like(w)
    for g in range(G):
        rows = slice(offsets[g], offsets[g + 1])
        exp_dx[rows] = dy[rows] @ w[g]
        exp_dw[g] = dy[rows].T @ x[rows]
    close(dx, exp_dx)
    close(dw, exp_dw)
    dw_alone = cm_array(np.ones_like(w))
    ops.grouped_matmul_dw(cm_array(dy), cm_array(x), off, dw_alone, beta=1.0)
    close(dw_alone, exp_dw + 1)
    qx, qw = ops.quantize_fp8_act(cm_array(x)), ops.quantize_fp8_weight(cm_array(w))
    xd, wd = dequant_rows(qx.data, qx.scale), dequant_blocks(qw.data, qw.scale)
    exp_fp8 = np.zeros((20, N), np.float32)
    for g in range(G):
        rows = slice(offsets[g], offsets[g + 1])
        exp_fp8[rows] = xd[rows] @ wd[g].T
    close(ops.grouped_matmul_fp8(qx, qw, off), exp_fp8, rtol=1e-4, atol=1e-4)


def test_flash_attention_forward_backward_gqa(rng):
    B, T, H, Hkv, D = 2, 37, 4, 2, 16
    q, k, v = rand(rng, B, T, H, D), rand(rng, B, T, Hkv, D), rand(rng, B, T, Hkv, D)

    def attention(q, k, v):
        qh = q.permute(0, 2, 1, 3)
        kh = k.permute(0, 2, 1, 3).repeat_interleave(H // Hkv, dim=1)
        vh = v.permute(0, 2, 1, 3).repeat_interleave(H // Hkv, dim=1)
        s = qh @ kh.transpose(-1, -2) / D ** 0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ vh).permute(0, 2, 1, 3)

    expected, dout, (dq, dk, dv) = grads_of(attention, q, k, v)
    out, lse = ops.flash_attention(cm_array(q), cm_array(k), cm_array(v), causal=True)
    close(out, expected, atol=1e-5)
    assert lse.shape == (B, H, T)
    grads = ops.flash_attention_backward(cm_array(dout), cm_array(q), cm_array(k), cm_array(v),
                                         out, lse, causal=True)
    for got, want in zip(grads, (dq, dk, dv)):
        close(got, want, atol=1e-4)


def test_rmsnorm_forward_backward(rng):
    x, w = rand(rng, 6, 40), rand(rng, 40)
    expected, dy, (dx, dw) = grads_of(
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w)
    y, rstd = ops.rmsnorm(cm_array(x), cm_array(w))
    close(y, expected)
    gx, gw = ops.rmsnorm_backward(cm_array(dy), cm_array(x), cm_array(w), rstd)
    close(gx, dx, atol=1e-4)
    close(gw, dw, atol=1e-4)
    r = rand(rng, 6, 40)
    h, y2, _ = ops.rmsnorm_residual(cm_array(x), cm_array(r), cm_array(w))
    close(h, x + r)
    close(y2, np.asarray(ops.rmsnorm(cm_array(x + r), cm_array(w))[0]))


def test_activations_and_softmax(rng):
    x = rand(rng, 5, 48)
    tx = torch.from_numpy(x)
    close(ops.silu(cm_array(x)), torch.nn.functional.silu(tx))
    close(ops.gelu(cm_array(x)), torch.nn.functional.gelu(tx, approximate="tanh"))
    close(ops.gelu(cm_array(x), approximate="none"), torch.nn.functional.gelu(tx))
    expected, dy, (dgu,) = grads_of(
        lambda gu: torch.nn.functional.silu(gu[..., :24]) * gu[..., 24:], x)
    close(ops.swiglu(cm_array(x)), expected)
    close(ops.swiglu_backward(cm_array(dy), cm_array(x)), dgu)
    expected, dy, (dx,) = grads_of(lambda x: x.softmax(-1), x)
    y = ops.softmax(cm_array(x))
    close(y, expected)
    close(ops.softmax_backward(cm_array(dy), y), dx)
    _, dy, (dx,) = grads_of(torch.nn.functional.silu, x)
    close(ops.silu_backward(cm_array(dy), cm_array(x)), dx)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(rng, interleaved):
    B, T, H, D = 1, 5, 2, 8
    x = rand(rng, B, T, H, D)
    pos = np.arange(3, 3 + T, dtype=np.int64)
    freqs = 10000.0 ** (-np.arange(D // 2) * 2.0 / D)
    ang = pos[:, None] * freqs[None, :]
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :D // 2], x[..., D // 2:])
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    expected = np.empty_like(x)
    if interleaved:
        expected[..., 0::2], expected[..., 1::2] = r1, r2
    else:
        expected[..., :D // 2], expected[..., D // 2:] = r1, r2
    positions = cm.from_numpy(pos)
    y = ops.rope(cm_array(x), positions, interleaved=interleaved)
    close(y, expected)
    close(ops.rope_backward(y, positions, interleaved=interleaved), x)  # rotating back
    np.testing.assert_array_equal(np.asarray(ops.rope_positions(4, 2)), [2, 3, 4, 5])


def test_cross_entropy_forward_backward(rng):
    logits = rand(rng, 7, 11, scale=3)
    targets = np.array([1, 0, 10, -100, 5, 5, 2], np.int64)
    tl = torch.tensor(logits, requires_grad=True)
    loss_t = torch.nn.functional.cross_entropy(tl, torch.from_numpy(targets), reduction="none")
    dloss = rand(rng, 7)
    loss_t.backward(torch.from_numpy(dloss))
    loss, lse = ops.cross_entropy(cm_array(logits), cm.from_numpy(targets))
    close(loss, loss_t)
    close(lse, torch.logsumexp(torch.from_numpy(logits), -1))
    close(ops.cross_entropy_backward(cm_array(dloss), cm_array(logits), cm.from_numpy(targets), lse), tl.grad)


def test_embedding_forward_backward(rng):
    table = rand(rng, 9, 6)
    ids = np.array([[1, 8], [1, 0]], np.int64)
    close(ops.embedding(cm_array(table), cm.from_numpy(ids)), table[ids])
    dy = rand(rng, 2, 2, 6)
    expected = np.zeros_like(table)
    np.add.at(expected, ids.reshape(-1), dy.reshape(-1, 6))
    close(ops.embedding_backward(cm_array(dy), cm.from_numpy(ids), 9), expected)


def test_moe_routing_permute_and_combine(rng):
    T, E, k, C = 10, 6, 2, 4
    logits = rand(rng, T, E)
    scores = ops.router_scores(cm_array(logits), "softmax")
    close(scores, torch.from_numpy(logits).softmax(-1))
    routing = ops.topk_route(scores, k=k)
    s = np.asarray(scores)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(np.asarray(routing.indices), order)
    close(routing.weights, np.take_along_axis(s, order, 1))
    counts = ops.expert_counts(routing.indices, E)
    np.testing.assert_array_equal(np.asarray(counts), np.bincount(order.ravel(), minlength=E))
    x = rand(rng, T, C)
    xp, offsets, row_of = ops.permute(cm_array(x), routing.indices, E)
    off, rows = np.asarray(offsets), np.asarray(row_of)
    np.testing.assert_array_equal(off, np.concatenate([[0], np.cumsum(np.bincount(order.ravel(), minlength=E))]))
    for t in range(T):
        for j in range(k):
            e = order[t, j]
            assert off[e] <= rows[t, j] < off[e + 1]
            close(np.asarray(xp)[rows[t, j]], x[t])
    yp = rand(rng, T * k, C)
    w = np.asarray(routing.weights)
    expected = np.einsum("tj,tjc->tc", w, yp[rows])
    close(ops.unpermute(cm_array(yp), row_of, routing.weights), expected)
    dy = rand(rng, T, C)
    dyp, dweights = ops.unpermute_backward(cm_array(dy), cm_array(yp), row_of, routing.weights)
    close(dweights, np.einsum("tc,tjc->tj", dy, yp[rows]))
    exp_dyp = np.zeros_like(yp)
    exp_dyp[rows] = w[..., None] * dy[:, None, :]
    close(dyp, exp_dyp)
    loss, _ = ops.switch_aux_loss(scores, routing.indices, E, 0.01)
    f = np.bincount(order.ravel(), minlength=E) / (T * k)
    close(loss, [0.01 * E * np.sum(f * s.mean(0))])
    # sequence-wise balance loss over 2 sequences of 5 tokens
    B, L = 2, T // 2
    p_norm = s / s.sum(1, keepdims=True)
    expected = 0.0
    for b in range(B):
        f_b = np.bincount(order[b * L:(b + 1) * L].ravel(), minlength=E) * E / (k * L)
        expected += np.sum(f_b * p_norm[b * L:(b + 1) * L].mean(0))
    close(ops.sequence_balance_loss(scores, routing.indices, B, 0.1), [0.1 / B * expected])
    ts = torch.tensor(s, requires_grad=True)
    pn = ts / ts.sum(1, keepdim=True)
    f_all = [np.bincount(order[b * L:(b + 1) * L].ravel(), minlength=E) * E / (k * L) for b in range(B)]
    sum(0.1 / B * (torch.from_numpy(f_all[b]).float() * pn[b * L:(b + 1) * L].mean(0)).sum()
        for b in range(B)).backward()
    close(ops.sequence_balance_loss_backward(scores, routing.indices, B, 0.1, 1.0), ts.grad)
    kept = np.asarray(routing.indices).copy()
    kept[0, 1] = -1
    load = cm.zeros([E + 1], "i64")
    ops.accumulate_expert_load(routing.indices, cm.from_numpy(kept), load)
    np.testing.assert_array_equal(np.asarray(load), list(np.bincount(order.ravel(), minlength=E)) + [1])


def test_selection_margins_and_the_margin_bias_step(rng):
    """Each (token, expert)'s distance to its selection edge binned as margin_bin_edge
    says (NumPy), and one margin step at rate 1 evening out a skewed young router."""
    T, E, k, NB = 400, 8, 2, ops.MARGIN_BINS
    s = rng.uniform(0.45, 0.55, (T, E)).astype(np.float32)
    bias = (0.004 * (E // 2 - np.arange(E))).astype(np.float32)
    routing = ops.topk_route(cm_array(s), cm_array(bias), k=k)
    chosen = np.zeros((T, E), bool)
    np.put_along_axis(chosen, np.asarray(routing.indices), True, 1)
    a = s + bias
    lowest_in = np.where(chosen, a, np.inf).min(1, keepdims=True)
    highest_out = np.where(chosen, -np.inf, a).max(1, keepdims=True)
    dist = np.where(chosen, a - highest_out, lowest_in - a).astype(np.float64)
    edges = np.array([ops.margin_bin_edge(b) for b in range(NB)])
    bins = np.searchsorted(edges, dist, side="right") - 1
    expected = np.zeros((E, 2, NB), np.int64)
    np.add.at(expected, (np.broadcast_to(np.arange(E), (T, E)), np.where(chosen, 0, 1), bins), 1)
    margins = cm.zeros([E, 2, NB], "i64")
    ops.accumulate_selection_margins(cm_array(s), cm_array(bias), routing.indices, margins)
    np.testing.assert_array_equal(np.asarray(margins), expected)
    counts = np.bincount(np.asarray(routing.indices).ravel(), minlength=E)
    assert counts.max() / counts.mean() > 1.5
    stepped = cm_array(bias)
    ops.update_expert_bias(stepped, cm.from_numpy(counts.astype(np.int64)), 1.0, "margin", margins)
    after = ops.topk_route(cm_array(s), stepped, k=k)
    now = np.bincount(np.asarray(after.indices).ravel(), minlength=E)
    assert now.max() / now.mean() < 1.15
    with pytest.raises(Exception, match="margins"):
        ops.update_expert_bias(cm_array(bias), cm.from_numpy(counts.astype(np.int64)), 1.0, "margin")


def test_adamw_matches_torch(rng):
    p, g1, g2 = rand(rng, 50), rand(rng, 50), rand(rng, 50)
    tp = torch.tensor(p, requires_grad=True)
    opt = torch.optim.AdamW([tp], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    param, m, v = cm_array(p), cm.zeros([50]), cm.zeros([50])
    for step, g in enumerate([g1, g2], start=1):
        tp.grad = torch.from_numpy(g)
        opt.step()
        ops.adamw_step(param, cm_array(g), m, v, step, lr=1e-2, weight_decay=0.1)
    close(param, tp, rtol=1e-5, atol=1e-6)
    sq = ops.grad_sq_sum([cm_array(g1), cm_array(g2)])
    close(sq, [np.sum(g1 ** 2) + np.sum(g2 ** 2)], rtol=1e-5)
    close(ops.clip_coefficient(sq, 1.0), [1.0 / (np.sqrt(np.asarray(sq)[0]) + 1e-6)], rtol=1e-5)
    flat = rand(rng, 9000)
    segments = [ops.ParamSegment(0, 5000, True), ops.ParamSegment(6000, 3000)]
    partials = ops.grad_sq_partials(cm_array(flat), segments)
    inside = np.concatenate([flat[:5000], np.zeros(1000, np.float32), flat[6000:]])
    close(partials, [np.sum(inside[i:i + 4096] ** 2) for i in range(0, 9000, 4096)], rtol=1e-5)
    whole = ops.grad_sq_sum(cm_array(flat), segments)
    np.testing.assert_array_equal(np.asarray(ops.sum_partials(partials)), np.asarray(whole))


def test_transpose_moves_bits_of_any_dtype(rng):
    x = rng.integers(-2**40, 2**40, (3, 5, 7), dtype=np.int64)
    np.testing.assert_array_equal(np.asarray(ops.transpose(cm.from_numpy(x))), x.transpose(0, 2, 1))
    y = cm.empty([3, 7, 5], "i64")
    ops.transpose_out(cm.from_numpy(x), y)
    np.testing.assert_array_equal(np.asarray(y), x.transpose(0, 2, 1))


def test_bad_arguments_raise_at_the_call(rng):
    with pytest.raises(cm.InvalidArgument, match="shape"):
        ops.add(cm.zeros([3]), cm.zeros([4]))
    with pytest.raises(ValueError, match="layout"):
        ops.grouped_matmul(cm.zeros([2, 2]), cm.zeros([1, 2, 2]), cm.zeros([2], "i64"), layout="xy")
    with pytest.raises(TypeError):
        ops.matmul(np.zeros((2, 2), np.float32), cm.zeros([2, 2]))  # no implicit conversion


def test_docstrings_give_shapes():
    assert "(B,T,H,D)" in ops.flash_attention.__doc__
    assert "(M,K)" in ops.matmul.__doc__
    assert "(G+1)" in ops.grouped_matmul.__doc__
