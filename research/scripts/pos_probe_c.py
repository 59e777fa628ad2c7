"""How much does the POS target depend on the probe's L2 strength?

The recipe's POS target (docs/recipe.md) reads a logistic-regression probe at a fixed C=1 (scikit-
learn's inverse L2 strength) on the first-subword vectors of 1,250 EWT train sentences, scored on 500
EWT dev sentences. This script fits the same probe twice per layer on the same vectors:

- `C=1`: as `measure_variant` does (the same accuracies);
- `heldout C`: C picked per layer on the training words alone (`research.ablate.heldout_c`: fit on
  the first 80% of the training sentences, score on the last 20%, grid 0.01 ... 1), then refitted on
  all training words and scored once on dev. Hewitt & Liang 2019 ("Designing and Interpreting Probes
  with Control Tasks") show that a probe's conclusions can hinge on such choices; this is the
  sensitivity of the recipe's +5 target to one of them, not a new target.

    python -m research.scripts.pos_probe_c runs/X/encoder/final [runs/Y/encoder/final ...] [--out F.parquet]
    python -m research.scripts.pos_probe_c runs/X/encoder/final --test all --also-first 500

Every gain comes with a 95% paired bootstrap interval over the test sentences
(`research.ablate.gain_interval`: the best layer chosen on the other half of the test sentences;
whole sentences resampled, the layer re-picked each time): the
test words are a sample too, and every run read on them shares their draw. `--test all` scores on
all 2,001 EWT dev sentences; `--also-first N` also reports the first N of them from the same fits
(N = 500: the target check's test words). `--sample spread` takes the train and test sentences
spread evenly over each split instead of the first ones (EWT is stored by genre: the first 1,250
train sentences are all weblog, the first 500 dev sentences weblog and email).

The word vectors are cached in <run>/store, the folder `measure_variant` uses, so a measured run is
not read again. Prints one line per run, probe and test set (accuracy per layer, gain of the best
layer over layer 0 with its interval) and, when `--out` is given, writes a tidy table (run, sample, probe,
test, layer, C, accuracy) and beside it `<out>-gains.parquet` (run, sample, probe, test, gain,
gain_in_sample, lo, hi, best_layer, n_sentences, n_words).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import plmodels
from research.ablate import C_GRID, AblationEval, gain_interval, heldout_c, pos_vectors, probe_correct
from workbench.core.io import write_parquet_atomic
from workbench.data.tasks import ud_sentences


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="saved models (a run's final/ folder; vectors cached in its run's store/)")
    ap.add_argument("--train", type=int, default=1250, help="EWT train sentences (the target check's 1,250)")
    ap.add_argument("--test", default="500", help="EWT dev sentences, a number or 'all' (the target check's 500)")
    ap.add_argument("--also-first", type=int, help="also report the first N test sentences (same fits)")
    ap.add_argument("--sample", choices=("first", "spread"), default="first",
                    help="the first sentences of EWT train and dev (the target check's) or sentences spread "
                         "evenly over each (every genre in proportion)")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for the gain's interval")
    ap.add_argument("--pooling", choices=("first", "last"), default="first",
                    help="word vector: first subword (the encoder target's) or last (a decoder's)")
    ap.add_argument("--grid", default=",".join(str(c) for c in C_GRID), help="values of C to pick from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the tidy table (run, sample, probe, test, layer, C, accuracy) to this "
                                  "Parquet file and the gains with their intervals beside it (<out>-gains.parquet)")
    a = ap.parse_args(argv)
    grid = [float(c) for c in a.grid.split(",")]
    torch.set_num_threads(a.threads)
    if a.test != "all" and not (a.test.isdigit() and int(a.test) > 0):
        ap.error(f"--test must be a positive number of sentences or 'all', got {a.test!r}")
    n_test = len(ud_sentences("ewt", "dev")) if a.test == "all" else int(a.test)
    if a.also_first is not None and not 0 < a.also_first < n_test:
        ap.error(f"--also-first must be between 1 and {n_test - 1} (the test sentences), got {a.also_first}")
    ev = AblationEval(pos_train_sentences=a.train, pos_test_sentences=n_test, pos_sample=a.sample)
    rows, gains = [], []
    for path in map(Path, a.models):
        model, tok = plmodels.load(path)
        model.eval()
        (tr, y_tr), (te, y_te) = pos_vectors(model, tok, path.parent / "store", ev, pooling=a.pooling)
        layers = range(int(model.config.n_layers) + 1)
        X_tr, X_te = [tr.layer(l) for l in layers], [te.layer(l) for l in layers]
        picked, _ = heldout_c(X_tr, y_tr, tr.n_kept(), grid=grid)
        counts = np.asarray(te.n_kept())
        subsets = [(f"dev:{len(counts)}", len(counts))]
        if a.also_first is not None:
            subsets.append((f"dev:{a.also_first}", a.also_first))
        for probe, C in (("C=1", {l: 1.0 for l in layers}), ("heldout C", picked)):
            correct, keep = probe_correct(X_tr, y_tr, X_te, y_te, C=C)
            for test, n in subsets:
                n_words = int(counts[:n].sum())                 # the first n sentences' words ...
                n_kept = int(keep[:n_words].sum())              # ... of which these were scored
                sub = {l: c[:n_kept] for l, c in correct.items()}
                acc = {l: float(c.mean()) for l, c in sub.items()}
                g = gain_interval(sub, counts[:n], keep=keep[:n_words], n_boot=a.n_boot)
                print(f"{path}  {probe:9s} {test:9s} " + " ".join(f"{100 * v:.2f}" for v in acc.values())
                      + f"  gain {100 * g['gain']:+.2f} [{100 * g['lo']:+.2f}, {100 * g['hi']:+.2f}]"
                      + f" (layer {g['best_layer']})"
                      + (f"  C by layer {[C[l] for l in layers]}" if probe != "C=1" else ""), flush=True)
                rows += [{"run": str(path), "sample": a.sample, "probe": probe, "test": test, "layer": l,
                          "C": C[l], "accuracy": v} for l, v in acc.items()]
                gains.append({"run": str(path), "sample": a.sample, "probe": probe, "test": test, **g})
    if a.out:
        gains_out = Path(a.out).with_name(Path(a.out).stem + "-gains.parquet")
        write_parquet_atomic(pd.DataFrame(rows), a.out)
        write_parquet_atomic(pd.DataFrame(gains), gains_out)
        print(f"wrote {a.out} and {gains_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
