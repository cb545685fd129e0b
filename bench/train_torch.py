#!/usr/bin/python3
"""PyTorch 1.13 side of the training benchmark: trains the same model
(tests/reference/moe_model.py) on the same config and byte data with AdamW
and prints steady-state tokens/s (steps after the first two).

usage: OPENBLAS_NUM_THREADS=N OMP_WAIT_POLICY=passive bench/train_torch.py config.json steps
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import moe_model  # noqa: E402


def main():
    full = json.load(open(sys.argv[1]))
    steps = int(sys.argv[2])
    cfg, tr = full["model"], full["train"]
    torch.manual_seed(0)
    C, V, D = cfg["d_model"], cfg["vocab_size"], cfg["d_model"] // cfg["n_heads"]
    H, Hkv, E, F = cfg["n_heads"], cfg["n_kv_heads"], cfg["n_routed_experts"], cfg["expert_hidden"]
    P, B_ = {"wte": torch.randn(V, C) * 0.02, "final_norm": torch.ones(C)}, {}
    for l in range(cfg["n_layers"]):
        p = f"layers.{l}."
        P[p + "attn_norm"], P[p + "ffn_norm"] = torch.ones(C), torch.ones(C)
        P[p + "wq"], P[p + "wo"] = torch.randn(H * D, C) * 0.02, torch.randn(C, H * D) * 0.02
        P[p + "wk"], P[p + "wv"] = torch.randn(Hkv * D, C) * 0.02, torch.randn(Hkv * D, C) * 0.02
        if l < cfg["first_k_dense"]:
            Fd = cfg["dense_hidden"]
            P[p + "w1"], P[p + "w3"] = torch.randn(Fd, C) * 0.02, torch.randn(Fd, C) * 0.02
            P[p + "w2"] = torch.randn(C, Fd) * 0.02
        else:
            P[p + "router"] = torch.randn(E, C) * 0.02
            P[p + "experts.w13"] = torch.randn(E, 2 * F, C) * 0.02  # [gate; up] rows per expert
            P[p + "experts.w2"] = torch.randn(E, C, F) * 0.02
            SF = cfg["n_shared_experts"] * F
            if SF:
                P[p + "shared.w1"], P[p + "shared.w3"] = torch.randn(SF, C) * 0.02, torch.randn(SF, C) * 0.02
                P[p + "shared.w2"] = torch.randn(C, SF) * 0.02
            B_[p + "router_bias"] = torch.zeros(E)
    for t in P.values():
        t.requires_grad_(True)
    opt = torch.optim.AdamW(P.values(), lr=tr["lr"], weight_decay=tr["weight_decay"])
    data = open(tr["data"][0], "rb").read()
    Bsz, T = tr["batch_size"], tr["seq_len"]
    g = torch.Generator().manual_seed(1)
    times = []
    for s in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (Bsz,), generator=g)
        chunk = torch.tensor([list(data[i:i + T + 1]) for i in starts.tolist()], dtype=torch.long)
        t0 = time.perf_counter()
        opt.zero_grad()
        stats = {}
        _, ce, aux = moe_model.forward(cfg, P, B_, chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous(), stats)
        (ce + aux).backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), tr["grad_clip"])
        opt.step()
        moe_model.update_bias(cfg, B_, stats)
        times.append(time.perf_counter() - t0)
    steady = times[2:] if len(times) > 3 else times
    print("%.1f" % (Bsz * T * len(steady) / sum(steady)))


if __name__ == "__main__":
    main()
