#!/usr/bin/python3
"""PyTorch 1.13 manual causal attention (no SDPA in 1.13), forward + backward,
for the shapes of bench_ops_kernels' attention table. Run with
OPENBLAS_NUM_THREADS=<cores> OMP_WAIT_POLICY=passive set before Python starts
(Debian's torch runs fp32 matmul through OpenBLAS and ignores set_num_threads).
Prints markdown rows: | B | T | H | Hkv | D | torch fwd ms | torch fwd+bwd ms |"""
import math
import os
import sys
import time

import torch


def manual_attention(q, k, v, causal=True):
    # q (B,H,T,D), k/v (B,Hkv,T,D)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[2]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def median_time(fn, budget=0.4):
    fn()
    fn()
    times = []
    while len(times) < 5 or (sum(times) < budget and len(times) < 200):
        a = time.perf_counter()
        fn()
        times.append(time.perf_counter() - a)
    times.sort()
    return times[len(times) // 2]


def main():
    threads = int(os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    quick = "--quick" in sys.argv
    shapes = [(1, 128, 2, 2, 64), (1, 1024, 8, 8, 64), (1, 1024, 8, 2, 64), (2, 2048, 8, 8, 64)]
    if quick:
        shapes = shapes[:2]
    print(f"torch {torch.__version__}, {threads} OpenBLAS threads")
    print("| B | T | H | Hkv | D | torch fwd ms | torch fwd+bwd ms |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for b, t, h, hkv, d in shapes:
        q = torch.randn(b, h, t, d, generator=g, requires_grad=True)
        k = torch.randn(b, hkv, t, d, generator=g, requires_grad=True)
        v = torch.randn(b, hkv, t, d, generator=g, requires_grad=True)
        dout = torch.randn(b, h, t, d, generator=g)

        def fwd():
            with torch.no_grad():
                manual_attention(q, k, v)

        def both():
            out = manual_attention(q, k, v)
            out.backward(dout)

        print(f"| {b} | {t} | {h} | {hkv} | {d} | {median_time(fwd) * 1e3:.2f} | {median_time(both) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
