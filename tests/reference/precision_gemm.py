#!/usr/bin/python3
"""Block-GEMM cross-check driver: python3 precision_gemm.py <dir>

Reads <dir>/gemm.safetensors, whose metadata "cases" is a JSON list of
[name, precision]; per case: <name>/x (M,K), <name>/w (N,K) or (E,N,K),
<name>/dy (M,N) and, for grouped cases, <name>/offsets (E+1) i64.
Writes <dir>/gemm_reference.safetensors with <name>/y, dx, dw from
moe_model.BlockLinear / GroupedLinear (the torch emulation of the precision,
see moe_model.py), and <name>/y32, dx32, dw32 from the same products without
rounding (how far a GEMM that ignored the precision would land).
"""
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_model  # noqa: E402
import safetensors_io  # noqa: E402


def run(x, w, dy, offsets, precision):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    if offsets is None:
        y = moe_model.BlockLinear.apply(x, w, precision)
    else:
        y = moe_model.GroupedLinear.apply(x, w, offsets, precision)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def main():
    d = sys.argv[1]
    t, meta = safetensors_io.load(os.path.join(d, "gemm.safetensors"))
    out = {}
    for name, precision in json.loads(meta["cases"]):
        offsets = t.get(name + "/offsets")
        offsets = None if offsets is None else [int(o) for o in offsets]
        args = (t[name + "/x"], t[name + "/w"], t[name + "/dy"], offsets)
        for suffix, p in (("", precision), ("32", "f32")):
            y, dx, dw = run(*args, p)
            out[f"{name}/y{suffix}"], out[f"{name}/dx{suffix}"], out[f"{name}/dw{suffix}"] = y, dx, dw
    safetensors_io.save(os.path.join(d, "gemm_reference.safetensors"), out)


if __name__ == "__main__":
    main()
