"""Benchmark: the layer x layer CKA matrix of two 6-layer models over 20,000 words (target < 30 s).

Two stacks of 7 layers (embeddings + 6 blocks) of float16 word vectors of width 384 (the shape of
all-MiniLM-L6-v2 in the activation store) are compared with `workbench.analyses.compare.layer_cka`:
"linear" (Kornblith et al. 2019, exact, feature-space products, no n x n matrix) and "linear_mb"
(the debiased minibatch estimator of Nguyen et al. 2021, minibatches of 1,000 words). Model b's
layer l is a rotation of model a's layer l plus noise growing with l, so CKA falls with depth
(a sanity check printed next to the timings). Writes benchmarks/results/cka.json atomically.

    python benchmarks/bench_cka.py [--words 20000] [--threads 2]
"""
from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result

from workbench.analyses.compare import CompareRunConfig, layer_cka


def stacks(n: int, d: int = 384, layers: int = 7, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    a, b = [], []
    h = rng.standard_normal((n, d)).astype(np.float32)
    for l in range(layers):
        h = np.tanh(h @ (rng.standard_normal((d, d)).astype(np.float32) / np.sqrt(d)) + 0.5 * h)
        a.append(h.astype(np.float16))
        b.append((h @ q + 0.3 * l * rng.standard_normal((n, d))).astype(np.float16))
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    meta = begin()
    torch.set_num_threads(args.threads)
    a, b = stacks(args.words)
    cfg = CompareRunConfig(minibatch_size=1000)
    result = {"words": args.words, "layers": len(a), "width": a[0].shape[1], "threads": args.threads,
              "machine": platform.processor() or platform.machine()}
    for kind in ("linear", "linear_mb"):
        t0 = time.perf_counter()
        m = layer_cka(a, b, kind, cfg)
        result[f"{kind}_seconds"] = round(time.perf_counter() - t0, 2)
        result[f"{kind}_diagonal"] = [round(float(v), 3) for v in np.diag(m)]
        print(f"{kind:10s} {m.shape[0]}x{m.shape[1]} CKA over {args.words} words: {result[f'{kind}_seconds']:.2f} s; "
              f"diagonal {result[f'{kind}_diagonal']}")
    result["target_seconds"] = 30
    result["ok"] = result["linear_seconds"] < 30 and result["linear_mb_seconds"] < 30
    out = Path(__file__).resolve().parent / "results" / "cka.json"
    write_result(out, result, meta)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
