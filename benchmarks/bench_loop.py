"""Host overhead of the training loop: `workbench pretrain`'s loop time per step against the bare step
on the same batches (issue 81, "a loop that does not wait on the host"), on the CPU.

For each recipe (encoder-mini, decoder-mini by default) the real trainer (`run_training`) runs
`--warmup + --steps` steps in a fresh folder (no held-out evaluation, no checkpoint before the final
one), and its loop time per step is read from its own metrics.jsonl: the `time` of the last step's
row minus that of the last warm-up step's, over `--steps`. Everything the loop does between two
steps is in it: building the batch (masking, span sampling, packing rows), the optimizer step, the
loss read back, the metrics append and the progress bar. The bare step is forward + backward +
clipping + AdamW on the same batches of the same model, built before the clock starts (the loop's
own `Batches.get` for each step), with no read of the loss. Rounds alternate loop and bare in
this one process (A, B, A, B, ...) so a load change on a shared CPU hits both; each figure is a
median over `--rounds`, and "overhead" is the median over rounds of the same-round ratio
loop / bare - 1. `batch_s` is the host time to build one step's batch (`Batches.get`), timed alone.

The run reads the corpus of the recipe (capped at `--max-texts` documents) with the tokenizer of
`--tokenizer-from` (a checkpoint's tokenizer/ folder: the recipe's own would first be trained on
5 M characters), so the vocabulary is that tokenizer's.

    nice python benchmarks/bench_loop.py [--recipes encoder-mini decoder-mini] [--steps 16] [--warmup 2] [--rounds 3]
Writes a table to stdout and benchmarks/results/loop.json (or `--out FILE`).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from meta import begin, write_result

from plmodels.tokenizer import Tokenizer
from plmodels.training.config import load_config
from plmodels.training.corpus import PackedDataset
from plmodels.training.data import Batches, token_cache
from plmodels.training.distributed import Dist
from plmodels.training.loop import build_model_config, run_training
from plmodels.training.objectives import objective_for
from plmodels.training.runtime import make_optimizer, read_jsonl, use_bf16

DEMO = Path("/work/ci2/runs/demo/models")
DEFAULT_TOKENIZERS = {"encoder-mini": DEMO / "encoder/final/tokenizer", "decoder-mini": DEMO / "decoder/final/tokenizer"}


def overrides(tokenizer: Path, steps: int, max_texts: int) -> dict:
    """The recipe as a timing run: no held-out evaluation, one checkpoint (the final one)."""
    return {"tokenizer_path": str(tokenizer), "max_steps": steps, "max_minutes": None, "warmup_steps": 1,
            "eval_source": None, "eval_every": 0, "ckpt_every": 0, "ckpt_log_spaced": False,
            "max_train_texts": max_texts}


def loop_seconds(cfg, folder: Path, warmup: int) -> float:
    """One trainer run in `folder` (started over; its token cache is kept); seconds per step after
    `warmup` steps, from its metrics.jsonl."""
    run_training(cfg, folder, resume=False)
    times = {r["step"]: r["time"] for r in read_jsonl(folder / "metrics.jsonl").rows
             if r["split"] == "train" and r["metric"] == "loss"}
    return (times[cfg.max_steps] - times[warmup]) / (cfg.max_steps - warmup)


class Bare:
    """The bare step of a recipe: its model, optimizer and batches, built as `run_training` builds them."""

    def __init__(self, cfg, folder: Path):
        self.cfg, d = cfg, Dist()
        tok = Tokenizer.load(Path(cfg.tokenizer_path))
        self.objective = objective_for(cfg)
        ids = token_cache(cfg.train_source, cfg.train_split, cfg, tok, folder, d, cfg.max_train_texts)
        self.batches = Batches(PackedDataset.for_tokenizer(ids, cfg.seq_len, cfg.seed, tok), cfg, d, tok, None,
                               self.objective)
        torch.manual_seed(cfg.seed)
        self.model = self.objective.build(cfg.kind, self.objective.model_config(build_model_config(cfg, tok)))
        self.opt = make_optimizer(self.model, cfg)
        self.autocast = use_bf16(cfg.bf16, torch.device("cpu"))
        self.vocab_size = tok.vocab_size

    def batch(self, step: int):
        return self.batches.get(step, 0, torch.device("cpu"), step / self.cfg.max_steps)

    def step(self, batch) -> None:
        loss, _, _ = self.objective.loss(self.model, batch, self.autocast)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def seconds(self, warmup: int) -> tuple[float, float]:
        """(seconds per bare step, seconds per batch build) over the steps after `warmup`."""
        t0 = time.perf_counter()
        batches = [self.batch(s) for s in range(self.cfg.max_steps)]
        build = (time.perf_counter() - t0) / self.cfg.max_steps
        for b in batches[:warmup]:
            self.step(b)
        t0 = time.perf_counter()
        for b in batches[warmup:]:
            self.step(b)
        return (time.perf_counter() - t0) / (self.cfg.max_steps - warmup), build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["encoder-mini", "decoder-mini"])
    ap.add_argument("--tokenizer-from", nargs="+", type=Path, default=None,
                    help="a tokenizer folder per recipe (default: the demo run's encoder / decoder tokenizers)")
    ap.add_argument("--steps", type=int, default=16, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-texts", type=int, default=40, help="corpus documents read (books: 40 make ~1 M tokens)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "loop.json")
    a = ap.parse_args()
    tokenizers = a.tokenizer_from or [DEFAULT_TOKENIZERS[r] for r in a.recipes]
    if len(tokenizers) != len(a.recipes):
        raise SystemExit(f"--tokenizer-from: {len(tokenizers)} folders for {len(a.recipes)} recipes")
    for t in tokenizers:
        if not Path(t).is_dir():
            raise SystemExit(f"--tokenizer-from: {t} is not a tokenizer folder")
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="bench_loop_"))
    try:
        for recipe, tokenizer in zip(a.recipes, tokenizers):
            # extra_eval is merged by overrides, so it is emptied here: no held-out evaluation at all
            cfg = replace(load_config(recipe, overrides(Path(tokenizer), a.warmup + a.steps, a.max_texts)), extra_eval={})
            bare = Bare(cfg, scratch / recipe)  # tokenizes the corpus once, into the folder the runs reuse
            loops, bares, builds = [], [], []
            for _ in range(a.rounds):
                loops.append(loop_seconds(cfg, scratch / recipe, a.warmup))
                b, build = bare.seconds(a.warmup)
                bares.append(b)
                builds.append(build)
            ratios = [lo / b for lo, b in zip(loops, bares)]
            rows.append({"recipe": recipe, "kind": cfg.kind, "batch": [cfg.batch_size, cfg.seq_len],
                         "vocab_size": bare.vocab_size, "bf16": bare.autocast,
                         "loop_s": statistics.median(loops), "bare_s": statistics.median(bares),
                         "batch_s": statistics.median(builds), "overhead": statistics.median(ratios) - 1,
                         "loop_times": loops, "bare_times": bares, "batch_times": builds})
            r = rows[-1]
            print(f"{recipe:14s} loop {r['loop_s'] * 1e3:7.1f} ms/step  bare {r['bare_s'] * 1e3:7.1f} ms  "
                  f"batch build {r['batch_s'] * 1e3:6.1f} ms  overhead {100 * r['overhead']:+.1f}% "
                  f"(rounds: {', '.join(f'{100 * (x - 1):+.1f}%' for x in ratios)})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "max_texts": a.max_texts,
              "tokenizers": [str(t) for t in tokenizers], "rows": rows}
    print(f"wrote {write_result(a.out, result, meta)}")


if __name__ == "__main__":
    main()
