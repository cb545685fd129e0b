"""Independent PyTorch implementation of coremesh's DeepSeek-V3-style decoder
(DESIGN.md §6), written with autograd and torch.nn.functional only.

Semantics (the contract coremesh's src/model implements by hand):
  x = wte[tokens]
  per layer:  h = x + Attn(RMSNorm(x));  x = h + FFN(RMSNorm(h))
    Attn: q/k/v projections, RoPE (rotate-half pairs (i, i + D/2),
          freq_i = theta^(-2i/D)), causal softmax(q k^T / sqrt(D)) v, GQA:
          query head h reads kv head h // (H / Hkv); output projection wo.
    FFN:  layers < first_k_dense: SwiGLU  w2(silu(w1 x) * w3 x)
          else MoE: shared SwiGLU + sum_k w_k * expert_{e_k}(x)
  MoE routing per token: s = x router^T; p = softmax(s) | sigmoid(s);
    selection score p + bias (bias: aux-free balancing buffer);
    group-limited: group score = sum of the top-2 selection scores of the
    group (top-1 for groups of one), keep topk_groups groups;
    top-k experts by selection score; w_k = p[e_k], normalized to sum 1 for
    sigmoid gating. Capacity (capacity_factor > 0): cap = ceil(cf*N*K/E)
    assignments per expert per micro-batch; token_order keeps the earliest
    tokens, low_score keeps the largest w_k (ties: earlier token).
  aux loss (sequence-wise, DeepSeek-V3): per sequence, f_i = E/(K T) * #selections
    of expert i, P_i = mean_t p_i / sum_j p_j; alpha * mean_b sum_i f_i P_i,
    summed over MoE layers.
  final RMSNorm, logits = x head^T (head = wte when tied), loss = mean CE + aux.
  Bias update after each optimizer step: b_i += rate * sign(mean load - load_i).

Precision (cfg["precision"], coremesh docs/architecture.md "Precision"): the
block GEMMs (packed [wq; wk; wv], wo, packed [w1; w3] and w2 of the dense and
shared SwiGLU, the routed experts) take rounded inputs in the forward
(y = x W^T), the dgrad (dx = dy W) and the wgrad (dW = dy^T x), all with f32
accumulation; embedding, LM head, router, norms, attention and loss stay f32.
  bf16: both operands rounded to bf16 (nearest even).
  fp8:  e4m3 (nearest even, saturating at 448) with scale = amax / 448 (1 for
        a zero tile) per tile along the product's reduction: forward x in 1x128
        tiles, W in 128x128 blocks (over the packed matrix); dgrad dy in 1x128
        tiles, W^T in 128x128 blocks (the transposed blocks of W); wgrad dy^T
        and x^T in 1x128 tiles along tokens, where x is the forward's rounded x.
        Routed experts run on the permuted rows (expert order, token order
        inside an expert, zero rows for dropped slots at the end), and their
        wgrad tiles count from row 0 of that buffer.
Implemented here with torch only (no coremesh code): BlockLinear and
GroupedLinear are autograd Functions that spell out the three products.
"""
import math

import torch
import torch.nn.functional as F


QB = 128          # fp8 tile / block edge
F8_MAX = 448.0    # largest finite e4m3


def round_bf16(t):
    return t.to(torch.bfloat16).float()


def round_e4m3(v):
    """f32 -> nearest e4m3 value (ties to even), saturating at +-448."""
    v = v.clamp(-F8_MAX, F8_MAX)
    _, e = torch.frexp(v)  # |v| = m 2^e, m in [0.5, 1): v lies in binade 2^(e-1)
    # 3 mantissa bits; below the smallest normal 2^-6 the step stays 2^-9
    step = torch.ldexp(torch.ones_like(v), torch.clamp(e - 1, min=-6) - 3)
    return torch.round(v / step) * step


def _fp8_scale(amax):
    return torch.where(amax > 0, amax / F8_MAX, torch.ones_like(amax))


def fp8_act(x):
    """x (M,K) -> its fp8 values with one scale per 1x128 tile along K."""
    M, K = x.shape
    Kb = -(-K // QB)
    t = F.pad(x, (0, Kb * QB - K)).reshape(M, Kb, QB)
    s = _fp8_scale(t.abs().amax(-1, keepdim=True))
    return (round_e4m3(t / s) * s).reshape(M, Kb * QB)[:, :K]


def fp8_weight(w):
    """w (N,K) -> its fp8 values with one scale per 128x128 block."""
    N, K = w.shape
    Nb, Kb = -(-N // QB), -(-K // QB)
    t = F.pad(w, (0, Kb * QB - K, 0, Nb * QB - N)).reshape(Nb, QB, Kb, QB)
    s = _fp8_scale(t.abs().amax(dim=(1, 3), keepdim=True))
    return (round_e4m3(t / s) * s).reshape(Nb * QB, Kb * QB)[:N, :K]


def _round_inputs(x, w, precision):
    if precision == "f32":
        return x, w
    if precision == "bf16":
        return round_bf16(x), round_bf16(w)
    if w.dim() == 3:
        return fp8_act(x), torch.stack([fp8_weight(we) for we in w])
    return fp8_act(x), fp8_weight(w)


def _round_backward(dy, xs, precision):
    """-> (dy for the dgrad, dy^T and x^T for the wgrad)."""
    if precision == "f32":
        return dy, dy.t(), xs.t()
    if precision == "bf16":
        d = round_bf16(dy)
        return d, d.t(), xs.t()
    return fp8_act(dy), fp8_act(dy.t()), fp8_act(xs.t())


class BlockLinear(torch.autograd.Function):
    """y (M,N) = x (M,K) W^T (N,K) with the GEMM inputs of `precision`."""

    @staticmethod
    def forward(ctx, x, w, precision):
        xs, ws = _round_inputs(x, w, precision)
        ctx.precision = precision
        ctx.save_for_backward(xs, ws)
        return xs @ ws.t()

    @staticmethod
    def backward(ctx, dy):
        xs, ws = ctx.saved_tensors
        d, dyt, xt = _round_backward(dy, xs, ctx.precision)
        # fp8: W^T's 128x128 blocks are W's blocks transposed, so ws serves the dgrad
        return d @ ws, dyt @ xt.t(), None


class GroupedLinear(torch.autograd.Function):
    """Rows [offsets[e], offsets[e+1]) of x (R,K) belong to expert e:
    y_e = x_e W_e^T with W (E,N,K); rows past offsets[E] give zeros."""

    @staticmethod
    def forward(ctx, x, w, offsets, precision):
        xs, ws = _round_inputs(x, w, precision)
        ctx.precision, ctx.offsets = precision, offsets
        ctx.save_for_backward(xs, ws)
        y = x.new_zeros(x.shape[0], w.shape[1])
        for e in range(w.shape[0]):
            a, b = offsets[e], offsets[e + 1]
            y[a:b] = xs[a:b] @ ws[e].t()
        return y

    @staticmethod
    def backward(ctx, dy):
        xs, ws = ctx.saved_tensors
        d, dyt, xt = _round_backward(dy, xs, ctx.precision)
        dx, dw = torch.zeros_like(xs), torch.zeros_like(ws)
        for e in range(ws.shape[0]):
            a, b = ctx.offsets[e], ctx.offsets[e + 1]
            dx[a:b] = d[a:b] @ ws[e]
            dw[e] = dyt[:, a:b] @ xt[:, a:b].t()
        return dx, dw, None, None


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    # x: (B, H, T, D)
    B, H, T, D = x.shape
    half = D // 2
    freq = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(cfg, P, l, x):
    B, T, C = x.shape
    precision = cfg.get("precision", "f32")
    if precision != "f32":  # one packed qkv GEMM: the fp8 blocks run over [wq; wk; wv]
        wqkv = torch.cat([P[f"layers.{l}.wq"], P[f"layers.{l}.wk"], P[f"layers.{l}.wv"]])
        qkv = BlockLinear.apply(x.reshape(B * T, C), wqkv, precision).view(B, T, -1)
        Hq, Hk = P[f"layers.{l}.wq"].shape[0], P[f"layers.{l}.wk"].shape[0]
        q, k, v = qkv.split([Hq, Hk, Hk], dim=-1)
    else:
        q, k, v = (x @ P[f"layers.{l}.{n}"].t() for n in ("wq", "wk", "wv"))
    y = attend(cfg, q, k, v)
    if precision != "f32":
        return BlockLinear.apply(y.reshape(B * T, -1), P[f"layers.{l}.wo"], precision).view(B, T, C)
    return y @ P[f"layers.{l}.wo"].t()


def attend(cfg, q, k, v):
    """q (B,T,H*D), k v (B,T,Hkv*D) -> causal GQA attention with RoPE (B,T,H*D)."""
    B, T, _ = q.shape
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    D = cfg["d_model"] // H
    q = q.reshape(B, T, H, D).transpose(1, 2)
    k = k.reshape(B, T, Hkv, D).transpose(1, 2)
    v = v.reshape(B, T, Hkv, D).transpose(1, 2)
    q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, H * D)


def swiglu(x, w1, w3, w2, precision="f32"):
    if precision == "f32":
        return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()
    # one packed [w1; w3] GEMM, as coremesh runs it (the fp8 blocks span both)
    shape = x.shape
    gu = BlockLinear.apply(x.reshape(-1, shape[-1]), torch.cat([w1, w3]), precision)
    g = F.silu(gu[:, : w1.shape[0]]) * gu[:, w1.shape[0]:]
    return BlockLinear.apply(g, w2, precision).view(*shape[:-1], w2.shape[0])


def route(cfg, scores, bias):
    """scores (N, E) -> p (N, E), topk indices (N, K), weights (N, K)."""
    E, K = cfg["n_routed_experts"], cfg["top_k"]
    p = scores.softmax(-1) if cfg["gating"] == "softmax" else scores.sigmoid()
    sel = (p + bias).detach()
    G, TG = cfg["n_groups"], cfg["topk_groups"]
    if G > 1:
        N = sel.shape[0]
        grouped = sel.view(N, G, E // G)
        top = min(2, E // G)
        gscore = grouped.topk(top, dim=-1).values.sum(-1)
        keep = gscore.topk(TG, dim=-1).indices
        gmask = torch.zeros(N, G, dtype=torch.bool)
        gmask.scatter_(1, keep, True)
        sel = sel.masked_fill(~gmask.repeat_interleave(E // G, dim=1), float("-inf"))
    idx = sel.topk(K, dim=-1).indices
    w = p.gather(1, idx)
    if cfg["gating"] == "sigmoid":
        w = w / w.sum(-1, keepdim=True)
    return p, idx, w


def capacity_keep(cfg, idx, w):
    """(N, K) mask of assignments kept under the expert capacity."""
    N, K = idx.shape
    E, cf = cfg["n_routed_experts"], cfg["capacity_factor"]
    keep = torch.ones(N, K, dtype=torch.bool)
    if cf <= 0:
        return keep
    cap = max(1, math.ceil(cf * N * K / E))
    for e in range(E):
        slots = [(n, k) for n in range(N) for k in range(K) if idx[n, k] == e]
        if cfg["drop_policy"] == "low_score":
            slots.sort(key=lambda s: (-float(w[s[0], s[1]]), s[0]))
        for n, k in slots[cap:]:
            keep[n, k] = False
    return keep


def local_experts(cfg, P, l, xf, idx, w, keep):
    """f32 routed experts, all on this process: sum_k w_k * expert_{e_k}(x)."""
    y = torch.zeros_like(xf)
    for e in range(cfg["n_routed_experts"]):
        n, k = torch.nonzero((idx == e) & keep, as_tuple=True)
        if n.numel() == 0:
            continue
        w1, w3 = P[f"layers.{l}.experts.w13"][e].chunk(2)  # [gate; up] rows
        h = swiglu(xf[n], w1, w3, P[f"layers.{l}.experts.w2"][e])
        y = y.index_add(0, n, h * w[n, k][:, None])
    return y


# The f32 routed experts moe() runs; bench/train_torch.py's expert-parallel
# mode swaps in experts spread over processes (same signature).
routed_experts = local_experts


def moe(cfg, P, B_, l, x, stats):
    B, T, C = x.shape
    E, K = cfg["n_routed_experts"], cfg["top_k"]
    xf = x.reshape(B * T, C)
    scores = xf @ P[f"layers.{l}.router"].t()
    p, idx, w = route(cfg, scores, B_[f"layers.{l}.router_bias"])
    keep = capacity_keep(cfg, idx, w)
    precision = cfg.get("precision", "f32")
    if precision == "f32":
        y = routed_experts(cfg, P, l, xf, idx, w, keep)
    else:
        # permuted rows: expert order, token order inside an expert, zero rows
        # for the dropped slots at the end
        picks = [torch.nonzero((idx == e) & keep, as_tuple=True) for e in range(E)]
        n = torch.cat([p[0] for p in picks])
        k = torch.cat([p[1] for p in picks])
        offsets = [0]
        for p_ in picks:
            offsets.append(offsets[-1] + p_[0].numel())
        xp = torch.cat([xf[n], xf.new_zeros(B * T * K - n.numel(), C)])
        gu = GroupedLinear.apply(xp, P[f"layers.{l}.experts.w13"], offsets, precision)
        Fh = gu.shape[1] // 2
        g = F.silu(gu[:, :Fh]) * gu[:, Fh:]
        ye = GroupedLinear.apply(g, P[f"layers.{l}.experts.w2"], offsets, precision)
        y = torch.zeros_like(xf).index_add(0, n, ye[: n.numel()] * w[n, k][:, None])
    if cfg["n_shared_experts"] > 0:
        y = y + swiglu(xf, P[f"layers.{l}.shared.w1"], P[f"layers.{l}.shared.w3"],
                       P[f"layers.{l}.shared.w2"], precision)
    counts = torch.zeros(E).index_add_(0, idx.reshape(-1), torch.ones(idx.numel()))
    stats.setdefault(l, torch.zeros(E))
    stats[l] += counts
    if cfg.get("bias_update", "sign") == "margin":
        margins = stats.setdefault("margins", {}).setdefault(l, torch.zeros(E, 2, MARGIN_BINS, dtype=torch.int64))
        margins += selection_margins((p + B_[f"layers.{l}.router_bias"]).detach(), idx)
    aux = torch.zeros(())
    if cfg["aux_loss_alpha"] > 0:
        pn = (p / p.sum(-1, keepdim=True)).view(B, T, E)
        sel = torch.zeros(B * T, E).scatter_(1, idx, 1.0).view(B, T, E)
        f = sel.sum(1) * (E / (K * T))
        Pm = pn.mean(1)
        aux = cfg["aux_loss_alpha"] * (f * Pm).sum(-1).mean()
    return y.view(B, T, C), aux


def forward(cfg, P, Bufs, tokens, targets, stats=None):
    """Returns logits (B,T,V), ce, aux."""
    stats = {} if stats is None else stats
    x = P["wte"][tokens]
    aux = torch.zeros(())
    eps = cfg["norm_eps"]
    for l in range(cfg["n_layers"]):
        x = x + attention(cfg, P, l, rms_norm(x, P[f"layers.{l}.attn_norm"], eps))
        hn = rms_norm(x, P[f"layers.{l}.ffn_norm"], eps)
        if cfg["n_routed_experts"] > 0 and l >= cfg["first_k_dense"]:
            y, a = moe(cfg, P, Bufs, l, hn, stats)
            aux = aux + a
        else:
            y = swiglu(hn, P[f"layers.{l}.w1"], P[f"layers.{l}.w3"], P[f"layers.{l}.w2"],
                       cfg.get("precision", "f32"))
        x = x + y
    x = rms_norm(x, P["final_norm"], eps)
    head = P["wte"] if cfg["tied_embeddings"] else P["lm_head"]
    logits = x @ head.t()
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1).long())
    return logits, ce, aux


MARGIN_BINS = 48
MARGIN_EDGES = torch.tensor([0.0] + [1e-6 * 2.0 ** ((b - 1) / 2) for b in range(1, MARGIN_BINS)],
                            dtype=torch.float64)


def selection_margins(a, idx):
    """a (N, E) selection scores (p + bias), idx (N, K) the chosen experts ->
    (E, 2, MARGIN_BINS) counts of each (token, expert)'s distance to its
    selection edge: [e][0] how far e's score must fall to leave the top-k,
    [e][1] how far it must rise to enter, binned at MARGIN_EDGES."""
    N, E = a.shape
    chosen = torch.zeros(N, E, dtype=torch.bool).scatter_(1, idx, True)
    lowest_in = a.masked_fill(~chosen, float("inf")).min(1, keepdim=True).values
    highest_out = a.masked_fill(chosen, float("-inf")).max(1, keepdim=True).values
    dist = torch.where(chosen, a - highest_out, lowest_in - a).double()
    bins = torch.searchsorted(MARGIN_EDGES, dist, right=True) - 1
    side = torch.where(chosen, 0, 1)
    out = torch.zeros(E * 2 * MARGIN_BINS, dtype=torch.int64)
    flat = (torch.arange(E)[None, :] * 2 + side) * MARGIN_BINS + bins
    return out.index_add_(0, flat.reshape(-1), torch.ones(flat.numel(), dtype=torch.int64)).view(E, 2, MARGIN_BINS)


def balancing_shift(count, mean, hist):
    """The bias shift that moves |mean - count| of an expert's selections
    across its selection edge, linear inside the bin where that count is reached."""
    need, raise_ = abs(mean - count), mean > count
    side, seen, far = hist[1 if raise_ else 0].tolist(), 0.0, 0.0
    for b in range(MARGIN_BINS):
        if need <= 0:
            break
        lo = MARGIN_EDGES[b].item()
        hi = MARGIN_EDGES[b + 1].item() if b + 1 < MARGIN_BINS else lo * 2 ** 0.5
        if side[b] == 0:
            continue
        far = hi
        if seen + side[b] >= need:
            far = lo + (hi - lo) * (need - seen) / side[b]
            break
        seen += side[b]
    return far if raise_ else -far


def update_bias(cfg, Bufs, stats):
    rate = cfg["bias_update_rate"]
    if rate <= 0:
        return
    for l, load in stats.items():
        if l == "margins":
            continue
        b = Bufs[f"layers.{l}.router_bias"]
        err = load.mean() - load
        mode = cfg.get("bias_update", "sign")
        if mode == "proportional":  # the miss relative to the mean
            b += rate * (err / load.mean() if load.mean() > 0 else torch.zeros_like(err))
        elif mode == "margin":  # the shift that would have balanced the step's tokens
            mean = load.double().mean().item()
            shifts = [balancing_shift(load[e].item(), mean, stats["margins"][l][e]) for e in range(load.numel())]
            b += rate * torch.tensor(shifts, dtype=torch.float32)
        else:
            b += rate * torch.sign(err)
