"""The decoder's training step with the full softmax against the adaptive softmax (Grave et al. 2017).

The softmax model is `decoder-mini-cram`'s and the adaptive one `decoder-mini-cram-fp32`'s (4 x 256,
4 heads, FFN 1024, RoPE, no dropout or biases, vocabulary 16,000), each in the trainer's own step: `plmodels.training.loss.lm_loss` (the fused chunked
cross-entropy for the softmax, `Decoder.adaptive_loss` for the adaptive output), backward, gradient
clipping, fused AdamW; batch 32 x 128; fp32, or with `--bf16` under the trainer's bf16 autocast
(`bf16: "auto"` on a CPU with native bf16). The adaptive output's cost depends on how many targets fall
in its tail clusters, so the targets are not uniform: by default they follow Zipf's law over the
16,000 ranks (p(rank r) proportional to 1 / (r + 1); the top 2,000 cover 80% of tokens, the
recipe's 16k BPE tokenizer on Gutenberg train 84%), or, with `--ids`, come from a token cache that
`workbench pretrain` wrote (`<run>/cache/*.ids`, uint16). The two steps alternate in one process;
the speedup is the median of the same-round time ratios.

    python benchmarks/bench_adaptive.py [--rounds 10] [--threads 2] [--bf16]
        [--ids runs/<run>/decoder/cache/<train>.ids] [--out benchmarks/results/adaptive_bf16.json]
Writes a table to stdout and benchmarks/results/adaptive.json (or `--out`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result

from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.recipes import RECIPES
from plmodels.training import load_config
from plmodels.training.data import Batch
from plmodels.training.loss import lm_loss
from plmodels.training.runtime import make_optimizer

B, T, V = 32, 128, 16000
CONFIGS = {name: RECIPES / "pretrain" / f"{stem}.json"
           for name, stem in (("softmax", "decoder-mini-cram"), ("adaptive", "decoder-mini-cram-fp32"))}
OUT = Path(__file__).resolve().parent / "results" / "adaptive.json"


def token_stream(ids_path: str | None, n: int, gen: torch.Generator) -> torch.Tensor:
    """n token ids: a random slice of a token cache, or Zipf-distributed ranks (rank = id)."""
    if ids_path:
        ids = np.memmap(ids_path, dtype=np.uint16, mode="r")
        if int(ids.max(initial=0)) >= V or len(ids) < n:
            raise ValueError(f"{ids_path}: need >= {n} uint16 ids below {V} (got {len(ids)} ids)")
        start = int(torch.randint(0, len(ids) - n + 1, (1,), generator=gen))
        return torch.from_numpy(np.asarray(ids[start: start + n]).astype(np.int64))
    p = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    return torch.multinomial(p / p.sum(), n, replacement=True, generator=gen)


def make_step(config: Path, batch: Batch, counts: torch.Tensor, autocast: bool):
    """The trainer's step for the model of a shipped config (its preset and `model` fields)."""
    cfg = load_config(config)
    torch.manual_seed(0)
    model = build_model("decoder", {**preset("decoder", cfg.preset), **cfg.model, "vocab_size": V}).train()
    if model.config.output == "adaptive":
        model.set_vocab_order(counts)  # as the trainer does, from the corpus counts
    opt = make_optimizer(model, cfg)

    def step() -> float:
        loss = lm_loss(model, batch, autocast=autocast)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ids", default=None, help="a uint16 token cache to draw the batch from (default: Zipf)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast, as the trainer on a CPU with native bf16")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    stream = token_stream(a.ids, B * (T + 1), gen).view(B, T + 1)
    batch = Batch(stream[:, :-1], stream[:, 1:])
    counts = torch.bincount(token_stream(a.ids, 2_000_000, gen), minlength=V)  # what the trainer ranks by
    shortlist = float(counts.sort(descending=True).values[:2000].sum() / counts.sum())
    steps = {name: make_step(config, batch, counts, a.bf16) for name, config in CONFIGS.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    load = [os.getloadavg()[0]]
    for r in range(a.warmup + a.rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
        if r >= a.warmup:
            print(f"round {r - a.warmup + 1}/{a.rounds}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()),
                  flush=True)
    load.append(os.getloadavg()[0])
    ratio = statistics.median(s / d for s, d in zip(times["softmax"], times["adaptive"]))
    rows = {n: {"seconds_per_step": statistics.median(t), "tokens_per_s": B * T / statistics.median(t), "times": t}
            for n, t in times.items()}
    precision = "bf16 autocast" if a.bf16 else "fp32"
    print(f"targets: {'token cache ' + a.ids if a.ids else 'Zipf'}; top 2,000 ranks cover {shortlist:.1%}; "
          f"{precision}; threads {torch.get_num_threads()}; load {load[0]:.1f} -> {load[1]:.1f}")
    for n, row in rows.items():
        print(f"{n:9s} {row['seconds_per_step']:6.2f} s/step {row['tokens_per_s']:8,.0f} tok/s")
    print(f"adaptive / softmax speed: {ratio:.2f}x (median of same-round ratios)")
    write_result(a.out, {"shape": {"batch": B, "seq_len": T, "vocab": V}, "targets": a.ids or "zipf",
                              "shortlist_share": shortlist, "bf16": a.bf16, "threads": torch.get_num_threads(),
                              "torch": torch.__version__, "load_average": load, "rows": rows,
                              "speedup": ratio, "rounds": a.rounds}, meta)


if __name__ == "__main__":
    main()
