#!/usr/bin/python3
"""PyTorch 1.13 side of the training benchmarks: trains the same model
(tests/reference/moe_model.py) on the same config and byte data with AdamW
and prints steady-state tokens/s of the global batch (steps after the first two).

  single process (bench/train_vs_torch.sh):  train_torch.py config.json steps
  data parallel (bench/train_parallel.sh):    train_torch.py config.json steps --ddp N
      N processes (torch.multiprocessing), DistributedDataParallel over gloo;
      each reads batch_size sequences of the step's N x batch_size.
  expert parallel:                           train_torch.py config.json steps --ep N [--slices R]
      each of N processes holds E / N routed experts of every MoE layer and
      reads its batch_size sequences; tokens go to their experts' process and
      back with all_to_all_single (gloo) in an autograd Function whose
      backward is the reverse exchange; dense gradients are averaged with one
      all_reduce, the global-norm clip sums the expert shards' squares.
Run with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS = threads per process and
OMP_WAIT_POLICY=passive.
"""
import functools
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import moe_model  # noqa: E402


def build_params(cfg):
    """The model's parameters (name -> tensor) and router-bias buffers."""
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
    return P, B_


def batches(tr, steps, ranks=1, rank=0):
    """Per step, this rank's batch_size sequences of the step's ranks x batch_size."""
    data = open(tr["data"][0], "rb").read()
    B, T = tr["batch_size"], tr["seq_len"]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (ranks * B,), generator=g)[rank * B:(rank + 1) * B]
        chunk = torch.tensor([list(data[i:i + T + 1]) for i in starts.tolist()], dtype=torch.long)
        yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def timed_steps(tr, steps, ranks, rank, step):
    """Seconds of each step(x, y) over this rank's batches."""
    times = []
    for x, y in batches(tr, steps, ranks, rank):
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return times


def tokens_per_s(tr, ranks, times):
    steady = times[2:] if len(times) > 3 else times
    return ranks * tr["batch_size"] * tr["seq_len"] * len(steady) / sum(steady)


def forward_backward(cfg, P, B_, x, y):
    """Loss of one batch and its backward; returns the expert loads."""
    stats = {}
    _, ce, aux = moe_model.forward(cfg, P, B_, x, y, stats)
    (ce + aux).backward()
    return stats


def single(cfg, tr, steps):
    P, B_ = build_params(cfg)
    for t in P.values():
        t.requires_grad_(True)
    opt = torch.optim.AdamW(P.values(), lr=tr["lr"], weight_decay=tr["weight_decay"])

    def step(x, y):
        opt.zero_grad()
        stats = forward_backward(cfg, P, B_, x, y)
        torch.nn.utils.clip_grad_norm_(list(P.values()), tr["grad_clip"])
        opt.step()
        moe_model.update_bias(cfg, B_, stats)
    return tokens_per_s(tr, 1, timed_steps(tr, steps, 1, 0, step))


class Params(torch.nn.Module):
    """The parameter dict as a module, for DistributedDataParallel."""

    def __init__(self, cfg, P, B_):
        super().__init__()
        self.cfg, self.B_, self.names = cfg, B_, list(P)
        self.p = torch.nn.ParameterList([torch.nn.Parameter(t) for t in P.values()])

    def forward(self, x, y, stats):
        _, ce, aux = moe_model.forward(self.cfg, dict(zip(self.names, self.p)), self.B_, x, y, stats)
        return ce + aux


def sum_load(stats):
    """Expert loads summed over the ranks: the bias update is the same everywhere."""
    for l in sorted(stats):
        dist.all_reduce(stats[l])


def ddp_steps(rank, world, cfg, tr, steps):
    P, B_ = build_params(cfg)  # the same on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.parallel.DistributedDataParallel(Params(cfg, P, B_))
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], weight_decay=tr["weight_decay"])

    def step(x, y):
        opt.zero_grad()
        stats = {}
        model(x, y, stats).backward()  # gradients averaged over the ranks, bucket by bucket
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), tr["grad_clip"])
        opt.step()
        sum_load(stats)
        moe_model.update_bias(cfg, B_, stats)
    return timed_steps(tr, steps, world, rank, step)


class AllToAll(torch.autograd.Function):
    """Rows to other ranks (all_to_all_single); the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty(sum(out_splits), x.shape[1])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        dx = g.new_empty(sum(in_splits), g.shape[1])
        dist.all_to_all_single(dx, g.contiguous(), in_splits, out_splits)
        return dx, None, None


def ep_routed_experts(rank, world, cfg, P, l, xf, idx, w, keep):
    """moe_model.routed_experts with the experts spread over the ranks:
    this rank's P holds experts [rank * El, (rank + 1) * El)."""
    N, K = idx.shape
    E = cfg["n_routed_experts"]
    El = E // world
    kept = keep.reshape(-1)
    tok = torch.arange(N).repeat_interleave(K)[kept]
    ex, wt = idx.reshape(-1)[kept], w.reshape(-1)[kept]
    ex, order = torch.sort(ex, stable=True)  # rows grouped by expert: each rank's contiguous
    tok, wt = tok[order], wt[order]
    counts = torch.bincount(ex, minlength=E)
    got = torch.empty_like(counts)  # got[s * El + e]: rows of source s for my expert e
    dist.all_to_all_single(got, counts)
    send, recv = counts.view(world, El).sum(1).tolist(), got.view(world, El).sum(1).tolist()
    rows = AllToAll.apply(xf[tok], recv, send)  # by source, by expert inside one
    start = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), got]), 0)[:-1].view(world, El)
    out = torch.zeros_like(rows)
    for e in range(El):  # each expert on its rows from every source
        pos = torch.cat([torch.arange(int(start[s, e]), int(start[s, e] + got[s * El + e])) for s in range(world)])
        w1, w3 = P[f"layers.{l}.experts.w13"][e].chunk(2)
        out = out.index_add(0, pos, moe_model.swiglu(rows[pos], w1, w3, P[f"layers.{l}.experts.w2"][e]))
    back = AllToAll.apply(out, send, recv)
    return torch.zeros_like(xf).index_add(0, tok, back * wt[:, None])


def sliced(routed, slices, cfg, P, l, xf, idx, w, keep):
    """The routed experts on `slices` token slices in turn (coremesh's
    moe_replicas split), each with its own exchange; gloo's CPU all_to_all
    leaves nothing to overlap them with."""
    N = xf.shape[0]
    bounds = [N * r // slices for r in range(slices + 1)]
    return torch.cat([routed(cfg, P, l, xf[a:b], idx[a:b], w[a:b], keep[a:b]) for a, b in zip(bounds, bounds[1:])])


def ep_steps(rank, world, cfg, tr, steps, slices=1):
    P, B_ = build_params(cfg)
    El = cfg["n_routed_experts"] // world
    for name in P:
        if ".experts." in name:
            P[name] = P[name][rank * El:(rank + 1) * El].clone()
    for t in P.values():
        t.requires_grad_(True)
    moe_model.routed_experts = functools.partial(ep_routed_experts, rank, world)
    if slices > 1:
        moe_model.routed_experts = functools.partial(sliced, moe_model.routed_experts, slices)
    dense = [t for n, t in P.items() if ".experts." not in n]
    experts = [t for n, t in P.items() if ".experts." in n]
    opt = torch.optim.AdamW(P.values(), lr=tr["lr"], weight_decay=tr["weight_decay"])

    def step(x, y):
        opt.zero_grad()
        stats = forward_backward(cfg, P, B_, x, y)
        # the global loss is the ranks' mean: dense gradients averaged, expert ones scaled
        flat = torch._utils._flatten_dense_tensors([t.grad for t in dense])
        dist.all_reduce(flat)
        for t, g in zip(dense, torch._utils._unflatten_dense_tensors(flat, dense)):
            t.grad.copy_(g).div_(world)
        for t in experts:
            t.grad.div_(world)
        sq = torch.stack([t.grad.pow(2).sum() for t in experts]).sum()
        dist.all_reduce(sq)
        norm = (sq + torch.stack([t.grad.pow(2).sum() for t in dense]).sum()).sqrt()
        coef = min(1.0, tr["grad_clip"] / (float(norm) + 1e-6))
        for t in P.values():
            t.grad.mul_(coef)
        opt.step()
        sum_load(stats)
        moe_model.update_bias(cfg, B_, stats)
    return timed_steps(tr, steps, world, rank, step)


def worker(rank, world, mode, config, steps, port, slices):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full = json.load(open(config))
    cfg, tr = full["model"], full["train"]
    times = ddp_steps(rank, world, cfg, tr, steps) if mode == "--ddp" else ep_steps(rank, world, cfg, tr, steps, slices)
    if rank == 0:
        print("%.1f" % tokens_per_s(tr, world, times), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    config, steps = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        mode, world = sys.argv[3], int(sys.argv[4])
        assert mode in ("--ddp", "--ep"), "mode: --ddp N or --ep N"
        slices = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--slices" else 1
        mp.spawn(worker, args=(world, mode, config, steps, free_port(), slices), nprocs=world)
        return
    full = json.load(open(config))
    print("%.1f" % single(full["model"], full["train"], steps))


if __name__ == "__main__":
    main()
