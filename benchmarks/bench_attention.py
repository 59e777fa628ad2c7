"""Attention fwd + bwd on the CPU: SDPA against the eager path, fp32 and bf16, causal and not.

Why `plmodels.components.attention.sdpa_attention` sends bf16 inputs on the CPU to the eager path: CPU SDPA
picks its flash kernel, whose bf16 backward is slow. One training-shaped call: q, k, v of
(64, 4 heads, 128, 64), forward + backward, median of `--iters` calls after two warm-up calls, all
variants interleaved in this one process.

    python benchmarks/bench_attention.py [--threads 2] [--iters 7]
Writes a table to stdout and benchmarks/results/attention.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from meta import begin, write_result

from plmodels.components.attention import attention, sdpa_attention

B, H, T, DH = 64, 4, 128, 64
OUT = Path(__file__).resolve().parent / "results" / "attention.json"


def sdpa_kernel(q, k, v, causal: bool):
    """torch's SDPA itself (what sdpa_attention ran for every dtype before)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def eager(q, k, v, causal: bool):
    mask = None
    if causal:
        mask = torch.zeros(T, T, dtype=q.dtype).masked_fill_(~torch.ones(T, T, dtype=torch.bool).tril(),
                                                             torch.finfo(q.dtype).min)
    return attention(q, k, v, mask)[0]


def ours(q, k, v, causal: bool):
    """What training calls: sdpa_attention (eager for bf16 on the CPU, SDPA for fp32)."""
    return sdpa_attention(q, k, v, is_causal=causal)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, T, DH, generator=g).to(dtype).requires_grad_() for _ in range(3))
            grad = torch.randn(B, H, T, DH, generator=g).to(dtype)
            for name, fn in (("torch SDPA", sdpa_kernel), ("eager", eager), ("sdpa_attention (ours)", ours)):
                cases.append({"dtype": str(dtype).split(".")[-1], "causal": causal, "name": name,
                              "call": lambda fn=fn, q=q, k=k, v=v, grad=grad, c=causal: fn(q, k, v, c).backward(grad),
                              "times": []})
    for c in cases:
        for _ in range(2):
            c["call"]()
    for _ in range(a.iters):  # interleaved rounds
        for c in cases:
            t0 = time.perf_counter()
            c["call"]()
            c["times"].append(time.perf_counter() - t0)
    print(f"fwd + bwd, q/k/v ({B}, {H}, {T}, {DH}), {torch.get_num_threads()} threads, median of {a.iters}")
    print(f"{'dtype':9s} {'causal':6s} {'path':24s} {'ms':>7s}")
    for c in cases:
        print(f"{c['dtype']:9s} {c['causal']!s:6s} {c['name']:24s} {1000 * statistics.median(c['times']):7.1f}")
    rows = [{"dtype": c["dtype"], "causal": c["causal"], "path": c["name"],
             "median_ms": 1000 * statistics.median(c["times"]), "times": c["times"]} for c in cases]
    write_result(OUT, {"shape": {"batch": B, "heads": H, "seq_len": T, "head_dim": DH}, "iters": a.iters,
                       "rows": rows}, meta)


if __name__ == "__main__":
    main()
