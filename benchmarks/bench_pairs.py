"""Benchmark minimal-pair scoring (docs/behaviour.md): every suite on one mini checkpoint within 2 minutes
on this CPU (issue 77).

One checkpoint is scored as `workbench pairs CHECKPOINT` scores it (`score_pairs_model`): the UD and
template suites, original and nonce items, each scorer of the model's kind (or `--scorers`), and all four
floors (chance, frequency and bigram counted on the pretraining corpus, the random-initialised copy), from
a fresh cache (the suites are built from the treebanks inside the timing). Each checkpoint is timed on its
own; the result names wall and CPU seconds per part (the run record's `seconds` / `cpu_seconds`: the
model's scorers together, the random-init copy's, the corpus floors), the suite build, and the total. On
a shared machine the CPU seconds are the fair figure; the load before and after is in `meta`. With
`--tables DIR` each model's tables are kept in DIR/<model folder>/ (to compare scores across commits).

Run: nice python benchmarks/bench_pairs.py [--models ENCODER DECODER ...] [--max-pairs 20]
     [--scorers masked_word clm] [--threads 2] [--tables DIR] [--out benchmarks/results/pairs.json]
Writes benchmarks/results/pairs.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from meta import ROOT, begin, write_result

from workbench.analyses.minimal_pairs import PairsRunConfig, score_pairs_model, select_pairs

RESULTS = Path(__file__).resolve().parent / "results" / "pairs.json"
TARGET_S = 120.0


def bench_one(path: Path, cfg: PairsRunConfig, work: Path) -> dict:
    """Score one checkpoint from an empty cache; its wall and CPU seconds, in parts and in all."""
    cache = work / "cache"
    t0, c0 = time.perf_counter(), time.process_time()
    n_pairs = len(select_pairs(cfg, cache))  # builds the suites into the cache: timed as part of the run
    suites_s, suites_cpu = time.perf_counter() - t0, time.process_time() - c0
    tables = score_pairs_model(path, out_dir=work / "out", config=cfg, progress=False, cache_dir=cache)
    total_s, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    run = json.loads((work / "out" / "minimal_pairs_run.json").read_text())
    rows = tables["minimal_pairs"]
    own = rows[(rows["condition"] == "all") & ~rows["scorer"].str.startswith("floor:")]
    return {"model": str(path), "kind": json.loads((path / "config.json").read_text())["kind"], "model_hash": run["checkpoint_hash"],
            "n_pairs": run["n_pairs"], "n_pairs_selected": n_pairs, "scorers": sorted(set(own["scorer"])),
            "suites_s": suites_s, "suites_cpu_s": suites_cpu, "seconds": run["seconds"],
            "cpu_seconds": run["cpu_seconds"], "total_s": total_s, "total_cpu_s": total_cpu,
            "met": total_s <= TARGET_S}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    demo = Path("/work/ci77/runs/demo/models")
    ap.add_argument("--models", nargs="+", default=[str(demo / "encoder" / "final"), str(demo / "decoder" / "final")],
                    help="mini checkpoints, each timed alone")
    ap.add_argument("--max-pairs", type=int, default=PairsRunConfig.max_pairs_per_condition,
                    help="base items per (suite, phenomenon, condition)")
    ap.add_argument("--scorers", nargs="+", default=None, help="a subset of the kinds' scorers (default: all)")
    ap.add_argument("--corpus-chars", type=int, default=PairsRunConfig.corpus_chars)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tables", default=None, help="keep each model's tables in this folder")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    meta = begin()
    torch.set_num_threads(args.threads)
    cfg = PairsRunConfig.resolve({"max_pairs_per_condition": args.max_pairs, "scorers": args.scorers,
                                  "corpus_chars": args.corpus_chars})
    results = []
    for m in args.models:
        with tempfile.TemporaryDirectory() as d:
            results.append(bench_one(Path(m), cfg, Path(d)))
            if args.tables:
                shutil.copytree(Path(d) / "out" / "tables", Path(args.tables) / Path(m).parent.name, dirs_exist_ok=True)
        r = results[-1]
        print(f"{r['model']}: {r['n_pairs']} pairs, {', '.join(r['scorers'])}: {r['total_s']:.1f} s wall, "
              f"{r['total_cpu_s']:.1f} CPU s  {'PASS' if r['met'] else 'FAIL'} (target {TARGET_S:.0f} s)")
        for k in r["seconds"]:
            print(f"    {k:32s} {r['seconds'][k]:8.1f} s  {r['cpu_seconds'].get(k, float('nan')):8.1f} CPU s")
    write_result(args.out, {"config": cfg.to_dict(), "models": results, "target_s": TARGET_S, "torch_threads": args.threads}, meta)


if __name__ == "__main__":
    main()
