"""Benchmark the edge probe's span pre-pooling: width-sorted chunks (`probes.edge._SpanFeatures._pooled`)
against one chunk in file order padded to its widest span (the path it replaced, eea5028's parent), paired
in one process on all-MiniLM-L6-v2's stores (7 layers x 384, mean pooling, as configs/demo/probe.json), for
the span tasks whose widths vary (const, entities, coref). Each pair is checked equal to the bit.
Writes benchmarks/results/pooling.json.
Run: python benchmarks/bench_pooling.py [--train 2000] [--eval 1000] [--rounds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from bench_probe import _minilm
from meta import begin, write_result

import plmodels
from probes.edge import _SpanFeatures
from probes.pooling import make_pooler
from workbench.analyses.probing import ProbeRunConfig, load_split

RESULTS = Path(__file__).resolve().parent / "results" / "pooling.json"
TASKS = ("const", "entities", "coref")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--store", default="runs/store")
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = _minilm(Path(tmp))
        model, tok = plmodels.load(path)
        mid = plmodels.checkpoint_hash(path)
        cfg = ProbeRunConfig(max_train_targets=a.train, max_eval_targets=a.eval, seeds=(0,), n_boot=0)
        for task in a.tasks.split(","):
            for split, cap in (("train", a.train), ("test", a.eval)):
                s = load_split(model, tok, task, split, cfg, Path(a.store), mid, cap, progress=False)
                layers = [s.arrays.store.layer(l) for l in range(s.arrays.store.n_layers)]
                spans = [x for x in (s.arrays.span1, s.arrays.span2) if x is not None]
                fns = [make_pooler("mean", layers[0].shape[1]).pieces for _ in spans]
                feats = _SpanFeatures(layers, spans, True, fns, torch.device("cpu"), cache=False)
                idx = np.arange(len(spans[0]))
                ours, ref, equal = [], [], True
                with torch.no_grad():
                    for _ in range(a.rounds):
                        t = time.perf_counter()
                        old = [fn(*feats._tokens(sp, idx)) for sp, fn in zip(spans, fns)]
                        ref.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        new = [x for x, _ in feats._pooled(idx)]
                        ours.append(time.perf_counter() - t)
                        equal &= all(torch.equal(p, q) for p, q in zip(old, new))
                widths = np.max([sp[:, 1] - sp[:, 0] for sp in spans], axis=0)
                rows.append({"task": task, "split": split, "targets": int(len(idx)), "layers": len(layers),
                             "mean_width": round(float(widths.mean()), 2), "max_width": int(widths.max()),
                             "file_order_s": ref, "sorted_s": ours,
                             "speedup_paired": statistics.median(r / o for r, o in zip(ref, ours)),
                             "bit_equal": bool(equal)})
                print(f"{task} {split}: {statistics.median(ref):.2f} s -> {statistics.median(ours):.2f} s "
                      f"({rows[-1]['speedup_paired']:.1f}x paired), equal {equal}", flush=True)
    write_result(RESULTS, {"model": "all-MiniLM-L6-v2", "pooling": "mean", "rounds": a.rounds, "rows": rows}, meta)


if __name__ == "__main__":
    main()
