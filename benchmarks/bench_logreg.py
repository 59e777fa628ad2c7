"""The POS probe's logistic regression: scikit-learn's lbfgs against `probes.logreg.LogisticRegressionLBFGS`
(the same objective in torch), on a problem of the probe's shape.

`research.ablate.pos_by_layer` fits one multinomial logistic regression per layer (C = 1, at most
300 L-BFGS iterations) on ~27k standardised word vectors of 256 dimensions with 17 UPOS labels. Here
the words are synthetic, so the script runs anywhere (see `data`). Each
round fits both (alternating which goes first) on the same data; the table gives the median time of
each, the paired median ratio, and how often the two agree on held-out predictions.

    python benchmarks/bench_logreg.py [--rounds 3] [--threads 2] [--device cpu|cuda]
Writes a table to stdout and benchmarks/results/logreg.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from probes.logreg import LogisticRegressionLBFGS

OUT = Path(__file__).resolve().parent / "results" / "logreg.json"
N_TRAIN, N_TEST, D, K = 27000, 8000, 256, 17


def data(seed: int = 0):
    """17 Zipf-frequent Gaussian classes, mixed by a random rotation of an ill-conditioned scaling
    (singular values 0.01 to 1), with 15% of the labels redrawn at random, then standardised with
    the train statistics: held-out accuracy ~85% and 200-300 lbfgs iterations, as on POS features."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(K, D)) * 12.0 / np.sqrt(D)
    p = 1.0 / np.arange(1, K + 1)
    y = rng.choice(K, N_TRAIN + N_TEST, p=p / p.sum())
    rotation, _ = np.linalg.qr(rng.normal(size=(D, D)))
    X = ((means[y] + rng.normal(size=(len(y), D))) * np.logspace(-2, 0, D)) @ rotation
    y = np.where(rng.random(len(y)) < 0.15, rng.integers(0, K, len(y)), y)
    mu, sd = X[:N_TRAIN].mean(0), X[:N_TRAIN].std(0)
    X = ((X - mu) / sd).astype(np.float32)
    return X[:N_TRAIN], y[:N_TRAIN], X[N_TRAIN:], y[N_TRAIN:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    meta = begin()
    torch.set_num_threads(a.threads)
    Xtr, ytr, Xte, yte = data()
    times: dict[str, list[float]] = {"sklearn": [], "torch": []}
    acc: dict[str, float] = {}
    pred: dict[str, np.ndarray] = {}
    n_iter: dict[str, object] = {}

    def fit(name: str) -> None:
        t = time.perf_counter()
        if name == "sklearn":
            clf = LogisticRegression(max_iter=300, C=1.0, random_state=0)
        else:
            clf = LogisticRegressionLBFGS(max_iter=300, C=1.0, device=a.device)
        with warnings.catch_warnings(), threadpool_limits(a.threads):
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(Xtr, ytr)
        times[name].append(time.perf_counter() - t)
        pred[name] = clf.predict(Xte)
        n_iter[name] = clf.n_iter_
        acc[name] = float((pred[name] == yte).mean())

    for r in range(a.rounds):
        for name in (("sklearn", "torch") if r % 2 == 0 else ("torch", "sklearn")):
            fit(name)
    ratio = statistics.median(s / t for s, t in zip(times["sklearn"], times["torch"]))
    result = {
        "device": a.device, "threads": a.threads, "rounds": a.rounds, "shape": [N_TRAIN, D, K],
        "sklearn_s": statistics.median(times["sklearn"]), "torch_s": statistics.median(times["torch"]),
        "speedup_paired_median": ratio, "sklearn_times": times["sklearn"], "torch_times": times["torch"],
        "test_acc_sklearn": acc["sklearn"], "test_acc_torch": acc["torch"],
        "prediction_agreement": float((pred["sklearn"] == pred["torch"]).mean()),
        "sklearn_n_iter": int(np.max(n_iter["sklearn"])), "torch_n_iter": int(n_iter["torch"]),
        "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t")
        if Path("/proc/cpuinfo").exists() else "unknown",
    }
    print(f"{'solver':<10}{'median s':>10}{'test acc':>10}{'iterations':>12}")
    for name in ("sklearn", "torch"):
        print(f"{name:<10}{result[name + '_s']:>10.2f}{acc[name]:>10.4f}{result[name + '_n_iter']:>12}")
    print(f"torch is {ratio:.2f}x faster (paired median); predictions agree on "
          f"{100 * result['prediction_agreement']:.2f}% of {N_TEST} held-out rows")
    write_result(OUT, result, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
