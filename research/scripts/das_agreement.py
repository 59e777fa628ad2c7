"""Distributed alignment search for the subject's number on the agreement items (docs/interventions.md,
"Distributed alignment search"): does a k-dimensional subspace of the residual stream at one layer and
position carry the number that decides the verb form (Geiger et al. 2023, `probes.das`)?

The pairs are `workbench.analyses.interventions`' swap-number items, in both directions: (base u,
source u') with the label 0 (the intervened run should prefer the form agreeing with u', d < 0) and
(base u', source u) with the label 1; d is that analysis' whole-form log-probability difference, the
form agreeing with u counted +. The items are split in two halves (seeded), both directions of an item
on the same side; the rotation is trained on one and the IIA read on the other, per item the mean of its
two directions, with a percentile bootstrap over held-out items. Beside it at each site: the same k with
the untrained random rotation, the whole-site interchange (the k = D ceiling), no intervention (the
base runs' own answers), and the same search on the random-init model.

    python -m research.scripts.das_agreement MODEL OUT.parquet [--n-per-template 100] [--layers 0,1]
        [--positions subject,reading] [--k 1] [--epochs 20] [--lr 0.01] [--seeds 0] [--n-boot 1000]

Writes a tidy table (model, variant, site, layer, position, k, metric, value, ci_low, ci_high, n_items,
seed; metric: iia_das, iia_random_rotation, iia_whole_site, iia_none) and prints it.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.checkpoint import floor_seed, random_init_model, training_seed
from probes.das import DistributedAlignmentSearch, InterchangePairs, whole_site_hits
from probes.mediation import bootstrap_rows
from probes.patching import Site
from workbench.analyses.interventions import (POSITIONS, InterventionsConfig, agreement_items, build_items,
                                              form_logprob_score)

COLUMNS = ["model", "variant", "site", "layer", "position", "k", "metric", "value", "ci_low", "ci_high", "n_items",
           "seed"]


def agreement_pairs(model, tok, n_per_template: int, seed: int):
    """(pairs, y, score, N): the swap-number items in both directions (module docstring); pair n and n + N
    are item n's two directions."""
    cfg = InterventionsConfig(n_per_template=n_per_template, seed=seed)
    items = build_items(model, tok, agreement_items(cfg), "swap_number", seed)
    n, rows = len(items.ids), torch.arange(len(items.owner))
    clean, corrupt = {**items.clean, "row": rows}, {**items.corrupt, "row": rows}
    both = lambda a, b: {k: torch.cat([a[k], b[k]]) for k in a}  # noqa: E731
    pairs = InterchangePairs(both(clean, corrupt), both(corrupt, clean), torch.cat([items.owner, items.owner + n]),
                             torch.cat([items.sign, items.sign]),
                             {"subject": items.subject.repeat(2), "reading": items.position.repeat(2)})
    return pairs, np.r_[np.zeros(n), np.ones(n)], form_logprob_score(items), n


def per_item(hits: np.ndarray) -> np.ndarray:
    """(2M,) hits of M items' two directions (the first M, then the second) -> (M,) their means."""
    m = len(hits) // 2
    return (hits[:m] + hits[m:]) / 2


def run(model_path: str, n_per_template: int, layers: list[int] | None, positions: list[str], k: int,
        epochs: int, lr: float, seeds: list[int], n_boot: int) -> pd.DataFrame:
    model, tok = plmodels.load(model_path)
    name = Path(model_path).parent.name if Path(model_path).name == "final" else Path(model_path).name
    rows = []
    for seed in seeds:
        pairs, y, score, n = agreement_pairs(model, tok, n_per_template, seed)
        order = np.random.default_rng(seed).permutation(n)
        tr, te = np.sort(order[: n // 2]), np.sort(order[n // 2:])
        train, test = pairs.take(np.r_[tr, tr + n]), pairs.take(np.r_[te, te + n])
        y_tr, y_te = y[np.r_[tr, tr + n]], y[np.r_[te, te + n]]
        models = {"trained": model, "random_init": random_init_model(model, floor_seed(seed, training_seed(model_path)))}
        n_layers = len([h for h in model.hook_names() if h.endswith(".resid_post") and h.startswith("blocks.")])
        for variant, m in models.items():
            with torch.no_grad():
                none = per_item(((test.decisions(score(m, test.base)) > 0).double().numpy() == y_te).astype(float))
            for layer in (range(n_layers) if layers is None else layers):
                for pos in positions:
                    site = Site(f"blocks.{layer}.resid_post", position=pos)
                    t0 = time.perf_counter()
                    das = DistributedAlignmentSearch(m, score, site, k=k, epochs=epochs, lr=lr, seed=seed)
                    found = per_item(das.fit(train, y_tr).hits(test, y_te))
                    rnd = DistributedAlignmentSearch(m, score, site, k=k, epochs=0, seed=seed).fit(train, y_tr)
                    values = {"iia_das": found, "iia_random_rotation": per_item(rnd.hits(test, y_te)),
                              "iia_whole_site": per_item(whole_site_hits(m, score, site, test, y_te)),
                              "iia_none": none}
                    mean, lo, hi = bootstrap_rows(np.stack(list(values.values())), n_boot, seed=seed)
                    rows += [(name, variant, site.label, layer, pos, k, metric, mean[i], lo[i], hi[i], len(te), seed)
                             for i, metric in enumerate(values)]
                    print(f"{variant:11s} {site.label:32s} das {mean[0]:.3f} [{lo[0]:.3f}, {hi[0]:.3f}]  random "
                          f"{mean[1]:.3f}  whole {mean[2]:.3f}  none {mean[3]:.3f}  loss {das.loss_curve_[0]:.3f}->"
                          f"{das.loss_curve_[-1]:.3f}  {time.perf_counter() - t0:.1f}s", flush=True)
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--n-per-template", type=int, default=100)
    ap.add_argument("--layers", default=None, help="comma-separated block indices (default: every block)")
    ap.add_argument("--positions", default="subject,reading")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--n-boot", type=int, default=1000)
    a = ap.parse_args(argv)
    bad = [p for p in a.positions.split(",") if p not in POSITIONS]
    if bad:
        ap.error(f"--positions: {bad}; choose from {list(POSITIONS)}")
    if a.k < 1 or a.epochs < 1:
        ap.error(f"--k and --epochs must be >= 1, got {a.k} and {a.epochs}")
    layers = None if a.layers is None else [int(x) for x in a.layers.split(",")]
    table = run(a.model, a.n_per_template, layers, a.positions.split(","), a.k, a.epochs, a.lr,
                [int(s) for s in a.seeds.split(",")], a.n_boot)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(a.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
