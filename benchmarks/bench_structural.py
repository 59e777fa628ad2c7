"""Structural probes per model: fitting the distance probe (`probes.structural`, Hewitt & Manning 2019) on
every layer of a MiniLM-sized model, against the reference formulation (john-hewitt/structural-probes'
training loop: one probe per layer, each batch of sentences padded to its longest and projected whole,
the loss masked), in this process.

Data: 7 layers of n = 20,016 words x d = 384 (all-MiniLM-L6-v2's width, the probing runs' 20,000 training
words), in sentences whose lengths follow EWT train's shape (a gamma law, mean about 17 words, at most
140), each layer a noisy linear image of the sentence's tree embedding (so the probes have something to
learn). Both sides run the same epochs (`--epochs`, no early stop), the same seed, batch order and Adam;
the timed unit is all 7 layers' fits. Rounds are interleaved (ours, reference, ours, ...) and the ratio
is the median of same-round ratios. The two sides' B after training agree to float32 rounding
(`max_abs_diff_B`), their validation losses to `max_rel_diff_val`.

    python benchmarks/bench_structural.py [--rounds 3] [--epochs 2] [--threads 2]
Writes a table to stdout and benchmarks/results/structural.json (or `--out FILE`).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result

from probes.edge import span_word_stats
from probes.structural import DistanceProbe, fit_probes, tree_distances

LAYERS, WORDS, D = 7, 20_000, 384
OUT = Path(__file__).resolve().parent / "results" / "structural.json"


def data(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray]]:
    """(LAYERS arrays (N, D) float32, bounds (S, 2), heads) for sentences until WORDS words."""
    rng = np.random.default_rng(seed)
    lens = []
    while sum(lens) < WORDS:
        lens.append(int(min(140, 1 + rng.gamma(1.6, 10.0))))
    heads, tree = [], []
    for n in lens:
        order, h = rng.permutation(n), np.full(n, -1)
        for k in range(1, n):
            h[order[k]] = order[rng.integers(k)]
        heads.append(h)
        v = np.zeros((n, 160), np.float32)       # path-indicator embedding: ||v_i - v_j||^2 = path length
        for i in range(n):
            j = i
            while h[j] >= 0:
                v[i, j] = 1.0
                j = h[j]
        tree.append(v)
    T = np.concatenate(tree)
    ends = np.cumsum(lens)
    layers = [(T @ rng.standard_normal((160, D)) / np.sqrt(160) * (l + 1) / LAYERS
               + rng.standard_normal((len(T), D))).astype(np.float32) for l in range(LAYERS)]
    return layers, np.stack([ends - np.array(lens), ends], 1), heads


def ours(layers, bounds, heads, epochs: int) -> list[DistanceProbe]:
    return fit_probes([DistanceProbe(max_epochs=epochs, patience=epochs + 1) for _ in layers], layers, bounds, heads)


def reference(layers, bounds, heads, epochs: int) -> list[tuple[np.ndarray, list[float]]]:
    """One probe per layer, as the reference trains it (padded batches of 20 read per step, masked L1 loss
    / n^2, Adam 1e-3, x0.1 learning rate on a validation plateau), with the same standardisation, init and
    sentence order as `DistanceProbe`: (B, validation losses) per layer."""
    golds = [tree_distances(h) for h in heads]
    out = []
    for layer in layers:
        mean, scale = span_word_stats([layer], [bounds])
        torch.manual_seed(0)
        B = torch.nn.Parameter(torch.empty(128, D).uniform_(-0.05, 0.05))
        rng = np.random.default_rng(0)
        perm = rng.permutation(len(bounds))
        n_val = int(round(0.1 * len(bounds)))
        train_ids, val_ids = perm[n_val:], np.sort(perm[:n_val])
        opt = torch.optim.Adam([B], lr=1e-3)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.1, patience=0)

        def loss(ids):
            start, lens = bounds[ids, 0], bounds[ids, 1] - bounds[ids, 0]
            offs = np.arange(int(lens.max()))
            mask = offs[None, :] < lens[:, None]
            rows = np.where(mask, start[:, None] + offs[None, :], start[:, None]).ravel()
            x = torch.from_numpy((layer[rows].reshape(len(ids), len(offs), -1) - mean[0]) / scale[0])
            p = x @ B.T
            sq = (p * p).sum(-1)
            pred = sq[:, :, None] + sq[:, None, :] - 2 * p @ p.transpose(1, 2)
            g = np.zeros((len(ids), len(offs), len(offs)), np.float32)
            for b, s in enumerate(ids):
                g[b, :lens[b], :lens[b]] = golds[s]
            m = torch.from_numpy(mask).float()
            n = torch.from_numpy(lens.astype(np.float32))
            return ((pred - torch.from_numpy(g)).abs() * m[:, :, None] * m[:, None, :]).sum((1, 2)).div(n * n).sum()

        history = []
        for _ in range(epochs):
            order = train_ids[rng.permutation(len(train_ids))]
            for s in range(0, len(order), 20):
                ids = order[s:s + 20]
                opt.zero_grad(set_to_none=True)
                (loss(ids) / len(ids)).backward()
                opt.step()
            with torch.no_grad():
                history.append(float(loss(val_ids)) / len(val_ids))
            sched.step(history[-1])
        out.append((B.detach().numpy().copy(), history))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    layers, bounds, heads = data()
    times: dict[str, list[float]] = {"ours": [], "reference": []}
    for i in range(a.rounds):
        for name, fn in (("ours", ours), ("reference", reference)):
            t0 = time.perf_counter()
            got = fn(layers, bounds, heads, a.epochs)
            times[name].append(time.perf_counter() - t0)
            if name == "ours":
                fitted = got
            else:
                ref = got
        print(f"round {i + 1}/{a.rounds}: ours {times['ours'][-1]:.2f} s, reference {times['reference'][-1]:.2f} s",
              flush=True)
    diff_B = max(float(np.abs(p.B_.detach().numpy() - B).max()) for p, (B, _) in zip(fitted, ref))
    diff_val = max(float(np.max(np.abs(np.subtract(p.history_, h)) / np.abs(h))) for p, (_, h) in zip(fitted, ref))
    ratio = statistics.median(r / o for o, r in zip(times["ours"], times["reference"]))
    ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["reference"])
    print(f"distance probes, {LAYERS} layers x {len(layers[0])} words x {D}, {len(bounds)} sentences, {a.epochs} "
          f"epochs: ours {ours_s:.2f} s, reference formulation {ref_s:.2f} s (reference / ours {ratio:.2f}x); "
          f"max |diff| of B {diff_B:.1e}, of validation losses (relative) {diff_val:.1e}")
    write_result(a.out, {"shape": {"layers": LAYERS, "words": len(layers[0]), "d": D, "sentences": len(bounds)},
                         "epochs": a.epochs, "rounds": a.rounds, "times": times, "ours_s": ours_s,
                         "reference_s": ref_s, "reference_over_ours": ratio, "max_abs_diff_B": diff_B,
                         "max_rel_diff_val": diff_val}, meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
