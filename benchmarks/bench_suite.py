"""Benchmark the zoo's analysis suite on one mini checkpoint (issue 66: within 5 minutes on this CPU).

The suite is what `workbench zoo` runs on every checkpoint, with a zoo config's own settings
(default configs/zoo-small.json): edge probes with their controls and the structural probes on the
config's tasks (per-item results kept), the head analysis, importance and pruning curves, and
linear CKA against one other checkpoint of the same system. Each part is timed once, in order, each
from a fresh store (extraction included).

The checkpoints: `--models A B` (checkpoint folders of one system, e.g. runs/zoo-small/models/
bert-s0/final and bert-s1/final, trained), or by default two random-initialised encoders of the
config's first system's shape with a WordPiece tokenizer trained on EWT train (self-contained; a
probe on random vectors may stop earlier or later than on trained ones, so prefer trained
checkpoints where a zoo has run). The result file names them.

Run: nice python benchmarks/bench_suite.py [--config configs/zoo-small.json] [--models A B] [--threads 2]
Writes benchmarks/results/suite.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from meta import ROOT, begin, write_result

import plmodels
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import RECORDS_OF, probe_model
from workbench.analyses.prune import prune_model_cli
from workbench.analyses.zoo import cka_between
from workbench.data.tasks import build_all_tasks, ud_sentences
from workbench.zoo import load_zoo

RESULTS = Path(__file__).resolve().parent / "results" / "suite.json"
TARGET_S = 300.0


def _random_models(zoo, out: Path) -> list[Path]:
    """Two random-initialised encoders (seeds 0 and 1) of the mini shape with the first system's model
    overrides (the zoo's BERT: 4 x 256, 8 heads, RoPE, no biases), saved."""
    spec = next(iter(zoo.systems.values()))
    model_cfg = {**preset("encoder", "mini"), **(spec.get("overrides") or {}).get("model", {})}
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:4000]]
    tok = Tokenizer.train_wordpiece(texts, vocab_size=8000)
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = Encoder(EncoderConfig(**{**model_cfg, "vocab_size": tok.vocab_size}))
        paths.append(plmodels.save(net, tok, out / f"random-s{seed}"))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "zoo-small.json"))
    ap.add_argument("--models", nargs=2, default=None, help="two checkpoints of one system (default: random init)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    meta = begin()
    torch.set_num_threads(args.threads)
    zoo = load_zoo(args.config)
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        models = [Path(m) for m in args.models] if args.models else _random_models(zoo, run / "given")
        # cka_between reads run/models/<system>-s<seed>/final, as a zoo lays them out: link them there
        for seed, m in enumerate(models):
            (run / "models" / f"ckpt-s{seed}").mkdir(parents=True)
            (run / "models" / f"ckpt-s{seed}" / "final").symlink_to(m.resolve(), target_is_directory=True)
        build_all_tasks(run / "tasks", tasks=list(dict.fromkeys(RECORDS_OF.get(t, t) for t in zoo.tasks)))
        path, seconds = run / "models" / "ckpt-s0" / "final", {}
        t0 = time.perf_counter()
        probe_model(path, tasks=list(zoo.tasks), out_dir=run / "probe", config={**zoo.probe, "keep_items": True},
                    model_name="ckpt-s0", tasks_dir=run / "tasks", store_root=run / "store", progress=False)
        seconds["probes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        analyse_heads(path, out_dir=run / "heads", config=zoo.heads, model_name="ckpt-s0", store_root=run / "store",
                      progress=False)
        seconds["heads"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prune_model_cli(path, methods=zoo.prune["methods"], out_dir=run / "prune", config=zoo.prune["config"],
                        model_name="ckpt-s0", progress=False)
        seconds["importance_and_pruning"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cka_between(run, {"ckpt": [0, 1]}, n_sentences=zoo.cka.get("sentences", 500),
                    max_words=zoo.cka.get("max_words", 40))
        seconds["cka_against_one_other"] = time.perf_counter() - t0
    total = sum(seconds.values())
    config = Path(args.config).resolve()
    res = {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else args.config,
           "models": [str(m) for m in args.models] if args.models else "random init",
           "model_hash": plmodels.checkpoint_hash(models[0]) if args.models else None, "tasks": list(zoo.tasks),
           "seconds": seconds, "total_s": total, "target_s": TARGET_S}
    write_result(RESULTS, res, meta)
    for k, v in seconds.items():
        print(f"{k:28s} {v:8.1f} s")
    print(f"{'total':28s} {total:8.1f} s   {'PASS' if total <= TARGET_S else 'FAIL'}  (target {TARGET_S:.0f} s)")


if __name__ == "__main__":
    main()
