#!/usr/bin/python3
"""Cross-check driver: python3 crosscheck.py <dir>

Reads <dir>/config.json (model config + "train": {lr, beta1, beta2, eps,
weight_decay, grad_clip, steps, micro_batches}), <dir>/weights.safetensors
(param/<name>, buffer/<name>) and <dir>/batch.safetensors (tokens, targets:
(S, M, B, T) int32 for S steps of M micro-batches).
Writes <dir>/reference.safetensors with logits, ce, aux (step 0, micro-batch
0 forward), grad/<name> (step 0 gradients of the accumulated loss), losses
(S,) and final param/<name> and buffer/<name> after S AdamW steps.
"""
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_model  # noqa: E402
import safetensors_io  # noqa: E402


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    tr = cfg.pop("train")
    w, _ = safetensors_io.load(os.path.join(d, "weights.safetensors"))
    batch, _ = safetensors_io.load(os.path.join(d, "batch.safetensors"))
    P = {k[6:]: v.clone().requires_grad_(True) for k, v in w.items() if k.startswith("param/")}
    Bufs = {k[7:]: v.clone() for k, v in w.items() if k.startswith("buffer/")}
    names = [k[6:] for k in w if k.startswith("param/")]
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"])
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    S, M = tokens.shape[0], tokens.shape[1]
    out, losses, grad_norms = {}, [], []
    for s in range(S):
        opt.zero_grad()
        stats, total = {}, 0.0
        for m in range(M):
            logits, ce, aux = moe_model.forward(cfg, P, Bufs, tokens[s, m], targets[s, m], stats)
            loss = (ce + aux) / M
            loss.backward()
            total += float(ce) / M
            if s == 0 and m == 0:
                out["logits"] = logits.detach()
                out["ce"] = ce.detach().reshape(1)
                out["aux"] = aux.detach().reshape(1)
        losses.append(total)
        if s == 0:
            for n in names:
                out["grad/" + n] = P[n].grad.detach().clone()
        gn = torch.nn.utils.clip_grad_norm_([P[n] for n in names], tr["grad_clip"])
        grad_norms.append(float(gn))
        opt.step()
        moe_model.update_bias(cfg, Bufs, stats)
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out["grad_norms"] = torch.tensor(grad_norms, dtype=torch.float32)
    for n in names:
        out["param/" + n] = P[n].detach()
    for n, b in Bufs.items():
        out["buffer/" + n] = b
    safetensors_io.save(os.path.join(d, "reference.safetensors"), out)


if __name__ == "__main__":
    main()
