"""How much does the POS target depend on the probe's L2 strength?

The recipe's POS target (docs/recipe.md) reads a logistic-regression probe at a fixed C=1 (scikit-
learn's inverse L2 strength) on the first-subword vectors of 1,250 EWT train sentences, scored on 500
EWT dev sentences. This script fits the same probe twice per layer on the same vectors:

- `C=1`: as `measure_variant` does (the same accuracies);
- `heldout C`: C picked per layer on the training words alone (`workbench.ablate.heldout_c`: fit on
  the first 80% of the training sentences, score on the last 20%, grid 0.01 ... 1), then refitted on
  all training words and scored once on dev. Hewitt & Liang 2019 ("Designing and Interpreting Probes
  with Control Tasks") show that a probe's conclusions can hinge on such choices; this is the
  sensitivity of the recipe's +5 target to one of them, not a new target.

    python scripts/pos_probe_c.py runs/X/encoder/final [runs/Y/encoder/final ...] [--out F.parquet]

The word vectors are cached in <run>/store, the folder `measure_variant` uses, so a measured run is
not read again. Prints one line per run and probe (accuracy per layer, gain of the best layer over
layer 0) and writes a tidy table (run, probe, layer, C, accuracy) when `--out` is given.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch


def main(argv: list[str] | None = None) -> int:
    import plmodels
    from workbench.ablate import C_GRID, AblationEval, heldout_c, pos_vectors, probe_layers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="saved models (a run's final/ folder; vectors cached in its run's store/)")
    ap.add_argument("--train", type=int, default=1250, help="EWT train sentences (the target check's 1,250)")
    ap.add_argument("--test", type=int, default=500, help="EWT dev sentences (the target check's 500)")
    ap.add_argument("--pooling", choices=("first", "last"), default="first",
                    help="word vector: first subword (the encoder target's) or last (a decoder's)")
    ap.add_argument("--grid", default=",".join(str(c) for c in C_GRID), help="values of C to pick from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the tidy table (run, probe, layer, C, accuracy) to this Parquet file")
    a = ap.parse_args(argv)
    grid = [float(c) for c in a.grid.split(",")]
    torch.set_num_threads(a.threads)
    ev = AblationEval(pos_train_sentences=a.train, pos_test_sentences=a.test)
    rows = []
    for path in map(Path, a.models):
        model, tok = plmodels.load(path)
        model.eval()
        (tr, y_tr), (te, y_te) = pos_vectors(model, tok, path.parent / "store", ev, pooling=a.pooling)
        layers = range(int(model.config.n_layers) + 1)
        X_tr, X_te = [tr.layer(l) for l in layers], [te.layer(l) for l in layers]
        picked, _ = heldout_c(X_tr, y_tr, tr.n_kept(), grid=grid)
        for probe, C in (("C=1", {l: 1.0 for l in layers}), ("heldout C", picked)):
            acc = probe_layers(X_tr, y_tr, X_te, y_te, C=C)
            best = max(acc, key=acc.get)
            print(f"{path}  {probe:9s} " + " ".join(f"{100 * v:.2f}" for v in acc.values())
                  + f"  gain {100 * (acc[best] - acc[0]):+.2f} (layer {best})"
                  + (f"  C by layer {[C[l] for l in layers]}" if probe != "C=1" else ""), flush=True)
            rows += [{"run": str(path), "probe": probe, "layer": l, "C": C[l], "accuracy": v} for l, v in acc.items()]
    if a.out:
        from workbench.io import write_parquet_atomic

        write_parquet_atomic(pd.DataFrame(rows), a.out)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
