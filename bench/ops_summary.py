#!/usr/bin/env python3
"""Sums up the kernel benchmarks' tables in one table for docs/performance.md.

Reads what bench/run_ops_bench.sh collects on stdin (bench_ops_kernels' tables,
then bench/ops_attention_torch.py's) and prints one markdown table: per
kernel family the range of coremesh's rate, its peer's and of their ratio
(above 1: coremesh faster), attention per shape against PyTorch, the
bandwidth kernels against memcpy.
  usage: ... | ops_summary.py
"""
import re
import statistics
import sys


def tables(text):
    """{heading: [row dicts]} of every '### heading' followed by a markdown table."""
    out, heading, header = {}, None, None
    for line in text.splitlines():
        if line.startswith("### "):
            heading, header = line[4:].strip(), None
        elif line.startswith("|") and heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|-: "):
                out.setdefault(heading, []).append(dict(zip(header, cells)))
        elif not line.strip():
            header = None
    return out


def find(t, prefix):
    return next((rows for h, rows in t.items() if h.startswith(prefix)), [])


def heading_cores(t, prefix):
    h = next((h for h in t if h.startswith(prefix)), "")
    m = re.search(r"(\d+) (?:cores?|OpenBLAS threads)", h)
    return m.group(1) if m else "?"


def span(xs, fmt="{:.1f}"):
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def ratios(xs):
    return f"{span(xs, '{:.2f}')} (median {statistics.median(xs):.2f})" if len(xs) > 1 else f"{xs[0]:.2f}"


def num(s):
    return float(s.rstrip("%x").replace(",", ""))


def main():
    t = tables(sys.stdin.read())
    print("| kernel | case | cores | coremesh | peer | coremesh / peer |")
    print("|---|---|---|---:|---:|---:|")
    hot = find(t, "f32 GEMM vs OpenBLAS")
    for cores in sorted({r["cores"] for r in hot}, key=int):
        rows = [r for r in hot if r["cores"] == cores]
        ms, kn = [int(r["M"]) for r in rows], [int(r[k]) for r in rows for k in ("K", "N")]
        print(f"| f32 GEMM vs OpenBLAS sgemm, hot operands | {len(rows)} shapes, M {min(ms)}-{max(ms)}, "
              f"K and N {min(kn)}-{max(kn)} | {cores} | "
              f"{span([num(r['coremesh GFLOP/s']) for r in rows])} GFLOP/s | "
              f"{span([num(r['sgemm GFLOP/s']) for r in rows])} GFLOP/s | {ratios([num(r['ratio']) for r in rows])} |")
    cold = find(t, "f32 GEMM with cold operands")
    if cold:
        print(f"| f32 GEMM vs OpenBLAS sgemm, cold operands | {len(cold)} training shapes (fwd, dgrad, wgrad) | 1 | "
              f"{span([num(r['coremesh GFLOP/s']) for r in cold])} GFLOP/s | "
              f"{span([num(r['sgemm GFLOP/s']) for r in cold])} GFLOP/s | {ratios([num(r['ratio']) for r in cold])} |")
    grouped = find(t, "Grouped GEMM")
    if grouped:
        experts = sorted({int(r["experts"].split()[0]) for r in grouped})
        fp8 = sum("fp8" in r["experts"] for r in grouped)
        print(f"| grouped GEMM vs a loop of sgemm | {len(grouped)} cases ({len(grouped) - fp8} f32, {fp8} fp8), "
              f"{span(experts, '{:d}')} experts | {heading_cores(t, 'Grouped GEMM')} | "
              f"{span([num(r['coremesh GFLOP/s']) for r in grouped])} GFLOP/s | "
              f"{span([num(r['sgemm loop GFLOP/s']) for r in grouped])} GFLOP/s | "
              f"{ratios([num(r['ratio']) for r in grouped])} |")
    shape = lambda r: tuple(r[k] for k in ("B", "T", "H", "Hkv", "D"))
    torch = {shape(r): r for r in find(t, "PyTorch")}
    for r in find(t, "Causal flash attention"):
        p = torch.get(shape(r))
        if not p:
            continue
        ours, theirs = num(r["coremesh fwd+bwd ms"]), num(p["torch fwd+bwd ms"])
        print(f"| causal attention fwd+bwd vs PyTorch manual attention | B {r['B']}, T {r['T']}, H {r['H']}, "
              f"Hkv {r['Hkv']}, D {r['D']} | {heading_cores(t, 'Causal flash attention')} | {ours:.2f} ms | "
              f"{theirs:.2f} ms | {theirs / ours:.2f} |")
    bw = find(t, "RMSNorm")
    for op in dict.fromkeys(r["op"] for r in bw):
        rows = sorted((r for r in bw if r["op"] == op), key=lambda r: int(r["cores"]))
        join = lambda xs: " / ".join(xs)
        print(f"| {op} vs memcpy | {rows[0]['shape']} | {join(r['cores'] for r in rows)} | "
              f"{join(r['GB/s'] for r in rows)} GB/s | {join(r['memcpy GB/s'] for r in rows)} GB/s | "
              f"{join('%.2f' % (num(r['share']) / 100) for r in rows)} |")


if __name__ == "__main__":
    main()
