"""Print docs/zoo.md's result figures from a finished zoo run: the best-layer table (seed mean,
multi-bootstrap interval, items-only interval for POS), the claim counts, the E_delta rows and the
last-layer seed-to-seed CKA.

    PYTHONPATH=. python research/scripts/zoo_tables.py runs/zoo-small
"""
from __future__ import annotations

import sys
from pathlib import Path

from workbench.core.results import load_table

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
    gain = stats[stats.statistic == "finetuning_gain"]
    if len(gain):
        print("\nfinetuning gain (seeds-only):")
        print(gain[["task", "system", "value", "ci_low", "ci_high", "n_seeds"]].to_string(index=False))
    print("\nwidth POS multi vs items (BERT):",
          best.loc[("bert", "pos"), "ci_high"] - best.loc[("bert", "pos"), "ci_low"],
          best.loc[("bert", "pos"), "item_ci_high"] - best.loc[("bert", "pos"), "item_ci_low"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
