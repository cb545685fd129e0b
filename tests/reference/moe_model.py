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
"""
import math

import torch
import torch.nn.functional as F


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
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    D = C // H
    q = (x @ P[f"layers.{l}.wq"].t()).view(B, T, H, D).transpose(1, 2)
    k = (x @ P[f"layers.{l}.wk"].t()).view(B, T, Hkv, D).transpose(1, 2)
    v = (x @ P[f"layers.{l}.wv"].t()).view(B, T, Hkv, D).transpose(1, 2)
    q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ P[f"layers.{l}.wo"].t()


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()


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


def moe(cfg, P, B_, l, x, stats):
    B, T, C = x.shape
    E, K = cfg["n_routed_experts"], cfg["top_k"]
    xf = x.reshape(B * T, C)
    scores = xf @ P[f"layers.{l}.router"].t()
    p, idx, w = route(cfg, scores, B_[f"layers.{l}.router_bias"])
    keep = capacity_keep(cfg, idx, w)
    y = torch.zeros_like(xf)
    for e in range(E):
        n, k = torch.nonzero((idx == e) & keep, as_tuple=True)
        if n.numel() == 0:
            continue
        w1, w3 = P[f"layers.{l}.experts.w13"][e].chunk(2)  # [gate; up] rows
        h = swiglu(xf[n], w1, w3, P[f"layers.{l}.experts.w2"][e])
        y = y.index_add(0, n, h * w[n, k][:, None])
    if cfg["n_shared_experts"] > 0:
        y = y + swiglu(xf, P[f"layers.{l}.shared.w1"], P[f"layers.{l}.shared.w3"],
                       P[f"layers.{l}.shared.w2"])
    counts = torch.zeros(E).index_add_(0, idx.reshape(-1), torch.ones(idx.numel()))
    stats.setdefault(l, torch.zeros(E))
    stats[l] += counts
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
            y = swiglu(hn, P[f"layers.{l}.w1"], P[f"layers.{l}.w3"], P[f"layers.{l}.w2"])
        x = x + y
    x = rms_norm(x, P["final_norm"], eps)
    head = P["wte"] if cfg["tied_embeddings"] else P["lm_head"]
    logits = x @ head.t()
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1).long())
    return logits, ce, aux


def update_bias(cfg, Bufs, stats):
    rate = cfg["bias_update_rate"]
    if rate <= 0:
        return
    for l, load in stats.items():
        b = Bufs[f"layers.{l}.router_bias"]
        b += rate * torch.sign(load.mean() - load)
