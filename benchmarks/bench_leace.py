"""LEACE per layer: fitting and applying `probes.amnesic.LeaceEraser` on one layer of word vectors,
against EleutherAI's concept-erasure `LeaceFitter` (the reference, run without its covariance
shrinkage and trace cap so both compute the same eraser) on the same data, in this process.

Data: n = 20,000 words x d = 384 (one all-MiniLM-L6-v2 layer of the probing runs' size), K = 17
classes (UPOS), vectors with correlated noise and a class signal in random directions. The timed
unit is fit + transform of all n rows; rounds are interleaved (ours, reference, ours, ...) and the
ratio is the median of same-round ratios. Target (issue 65): LEACE per layer in seconds (< 5 s).

    python benchmarks/bench_leace.py [--rounds 5] [--threads 2]
Writes a table to stdout and benchmarks/results/leace.json (or `--out FILE`).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result

from probes.amnesic import LeaceEraser

N, D, K = 20_000, 384, 17
TARGET_S = 5.0
OUT = Path(__file__).resolve().parent / "results" / "leace.json"


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((D, D)) / np.sqrt(D)
    y = rng.integers(0, K, N)
    X = rng.standard_normal((N, D)) @ mix + 0.5 * rng.standard_normal((K, D))[y]
    return X.astype(np.float32), y


def ours(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return LeaceEraser().fit(X, y).transform(X)


def reference(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    import concept_erasure as ce

    x = torch.as_tensor(X, dtype=torch.float64)
    z = torch.nn.functional.one_hot(torch.as_tensor(y), K).double()
    fitter = ce.LeaceFitter(D, K, shrinkage=False, constrain_cov_trace=False, svd_tol=1e-8, dtype=torch.float64)
    fitter.update(x, z)
    return fitter.eraser(x).float().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    X, y = data()
    diff = float(np.abs(ours(X, y) - reference(X, y)).max())  # also the warm-up
    times: dict[str, list[float]] = {"ours": [], "reference": []}
    for i in range(a.rounds):
        for name, fn in (("ours", ours), ("reference", reference)):
            t0 = time.perf_counter()
            fn(X, y)
            times[name].append(time.perf_counter() - t0)
        print(f"round {i + 1}/{a.rounds}: ours {times['ours'][-1]:.2f} s, reference {times['reference'][-1]:.2f} s",
              flush=True)
    ratio = statistics.median(r / o for o, r in zip(times["ours"], times["reference"]))
    ours_s = statistics.median(times["ours"])
    print(f"LEACE fit + transform, {N} x {D}, {K} classes: ours {ours_s:.2f} s, concept-erasure "
          f"{statistics.median(times['reference']):.2f} s (reference / ours {ratio:.2f}x); max |diff| {diff:.2e}")
    write_result(a.out, {"shape": {"n": N, "d": D, "classes": K}, "rounds": a.rounds, "times": times,
                         "ours_s": ours_s, "reference_s": statistics.median(times["reference"]),
                         "reference_over_ours": ratio, "max_abs_diff": diff, "target_s": TARGET_S}, meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
