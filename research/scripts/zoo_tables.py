"""Print docs/zoo.md's result figures from a finished zoo run: the best-layer table (seed mean,
multi-bootstrap interval, items-only interval for POS), the claim counts (per family, after Holm), the
E_delta rows, each system minus each of its floors (`zoo_comparisons`, floor family), each
checkpoint's structural best layer beside its four floors, the head roles under
the floor rule (rare-token heads counted per checkpoint) and the last-layer seed-to-seed CKA.

    PYTHONPATH=. python research/scripts/zoo_tables.py runs/zoo-small
"""
from __future__ import annotations

import sys
from pathlib import Path

from workbench.core.results import load_table
from workbench.presentation import views

NAMES = {"bert": "BERT", "electra": "ELECTRA", "elmo": "ELMo", "elmo-transformer": "transformer biLM",
         "t5": "T5 (encoder)", "bart": "BART (encoder)", "xlnet": "XLNet", "roberta": "RoBERTa",
         "spanbert": "SpanBERT", "albert": "ALBERT", "distilbert": "DistilBERT", "gpt": "GPT"}


def main(run: Path) -> None:
    stats, comps = load_table(run, "zoo_stats"), load_table(run, "zoo_comparisons")
    best = stats[stats.statistic == "best_layer_score"].set_index(["system", "task"])
    order = ("pos", "deps", "ner", "const", "coref", "structural_distance", "structural_depth")
    tasks = [t for t in order if t in set(best.index.get_level_values(1))]
    print("| system | " + " | ".join(tasks) + " | POS items only |")
    for system in best.index.get_level_values(0).unique():
        cells = [f"{best.loc[(system, t), 'value']:.3f} [{best.loc[(system, t), 'ci_low']:.3f}, "
                 f"{best.loc[(system, t), 'ci_high']:.3f}]" for t in tasks]
        pos = best.loc[(system, "pos")]
        print(f"| {NAMES.get(system, system)} | " + " | ".join(cells)
              + f" | [{pos.item_ci_low:.3f}, {pos.item_ci_high:.3f}] |")
    probe = comps[comps.statistic == "best_layer_score"]
    claimed = probe[probe.claim != "no claim"]
    print(f"\nbest-layer comparisons: {len(probe)}, claimed {len(claimed)}, unclaimed with flips "
          f"{int(((probe.claim == 'no claim') & (probe.flips > 0)).sum())} of {int((probe.claim == 'no claim').sum())}")
    for task in tasks:
        sub = probe[probe.task == task]
        print(task, "claimed:", "; ".join(f"{r.system_a if r.claim == 'A > B' else r.system_b} > "
                                          f"{r.system_b if r.claim == 'A > B' else r.system_a}"
                                          for r in sub.itertuples() if r.claim != "no claim"))
    ed = stats[stats.statistic == "e_delta"]
    print("\nE_delta:")
    print(ed[["task", "system", "value", "ci_low", "ci_high"]].to_string(index=False))
    print("\nclaims by family (Holm within each; 'claim' after it, 'claim_unadjusted' before):")
    for family, g in comps.groupby("family"):
        print(f"  {family}: {len(g)} comparisons, claimed {int((g.claim != 'no claim').sum())}, "
              f"unadjusted {int((g.claim_unadjusted != 'no claim').sum())}, seeds {sorted(set(g.n_seeds))}")
        for r in g[g.claim != "no claim"].itertuples():
            print(f"    {r.statistic} {r.task}: {r.system_a} vs {r.system_b} {r.claim} delta {r.delta:.3f} "
                  f"[{r.ci_low:.3f}, {r.ci_high:.3f}] p_holm {r.p_holm:.4f} {r.contrast} budget_differs {r.budget_differs}")
    fl = comps[comps.system_b.str.startswith("floor:") & (comps.statistic == "best_layer_score")]
    if len(fl):
        print("\neach system minus its floor on the same items (held-out best layers, multi-bootstrap; claim after "
              "Holm in the floor family, unadjusted = the interval alone):")
        floor_best = stats[stats.statistic.str.startswith("best_layer_score_floor:")]
        for r in fl.sort_values(["task", "system_b"]).itertuples():
            f = floor_best[(floor_best.task == r.task) & (floor_best.system == r.system_a)
                           & (floor_best.statistic == "best_layer_score_floor:" + r.system_b[len("floor:"):])].iloc[0]
            print(f"  {r.task:20s} {r.system_a:17s} {r.system_b:18s} floor {f.value:.3f} (L{f.layer}) "
                  f"delta {r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] {r.claim} (unadjusted {r.claim_unadjusted}, "
                  f"p_holm {r.p_holm:.3g})")
    floors = views.structural_floors(run)
    if floors is not None:
        print("\nstructural best layer beside the floors (per checkpoint; above = its interval above the floor's):")
        for (model, task, metric), g in floors.groupby(["model", "task", "metric"]):
            if metric not in ("uuas", "root_acc"):
                continue
            top = g[g.source == "model"].iloc[0]
            rest = "; ".join(f"{r.source} {r.value:.3f} {'above' if r.above == 1 else 'not above'}"
                             for r in g[g.source != "model"].itertuples())
            print(f"  {model} {metric} L{top.layer} {top.value:.3f} [{top.ci_low:.3f}, {top.ci_high:.3f}]: {rest}")
    classes = load_table(run, "heads_classes")
    if classes is not None:
        prim = classes[classes["primary"]] if "primary" in classes.columns else classes
        if "weighting" in prim.columns:
            prim = prim[prim["weighting"].fillna("raw") == "raw"]
        counts = prim.groupby(["model", "role"]).size().unstack(fill_value=0)
        print("\nprimary head roles per checkpoint (a role only above its floors):")
        print(counts.to_string())
    heads = stats[stats.statistic.str.startswith("heads_")]
    if len(heads):
        print("\nhead-role shares (seeds-only):")
        print(heads[["statistic", "system", "value", "ci_low", "ci_high", "n_seeds"]].to_string(index=False))
    gain = stats[stats.statistic == "finetuning_gain"]
    if len(gain):
        print("\nfinetuning gain (seeds-only):")
        print(gain[["task", "system", "value", "ci_low", "ci_high", "n_seeds"]].to_string(index=False))
    cka = load_table(run, "zoo_cka")
    if cka is not None:
        own = cka[(cka.system_a == cka.system_b) & (cka.seed_a != cka.seed_b)]
        top = own.groupby("system_a").apply(lambda g: g[(g.layer_a == g.layer_a.max()) & (g.layer_b == g.layer_b.max())]
                                            ["value"].mean(), include_groups=False)
        print("\nlast-layer linear CKA between seeds of one system (mean over seed pairs):")
        print(top.round(2).to_string())
    print("\nwidth POS multi vs items (BERT):",
          best.loc[("bert", "pos"), "ci_high"] - best.loc[("bert", "pos"), "ci_low"],
          best.loc[("bert", "pos"), "item_ci_high"] - best.loc[("bert", "pos"), "item_ci_low"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
