"""Benchmark: Michel et al. (2019) head importance and real head pruning on the `mini` encoder.

1. Michel importance (token granularity, masked-LM loss) of a randomly initialised `mini` encoder
   (4 layers, width 256, 4 heads, FFN 1024, vocabulary 16,000) over 2,000 sequences of 128 tokens;
   target: under 2 minutes on the shared CPU.
2. Prune the half of the heads with the lowest importance (`prune_model`) and compare inference
   tokens/s, parameters and safetensors bytes against the full model (`measure_speed_and_size`).

Random init is enough for timing (the cost does not depend on the weights). Prints a table and
writes benchmarks/results/pruning.json atomically.

    python benchmarks/bench_pruning.py [--sentences 2000] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from meta import begin, write_result

from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from probes.importance import michel_importance
from probes.pruning import measure_speed_and_size, mlm_loss, prune_model

RESULTS = Path(__file__).resolve().parent / "results" / "pruning.json"


def mlm_batches(n_sentences: int, seq_len: int, batch_size: int, vocab: int, seed: int = 0) -> list[dict]:
    """Random token batches with 15 % of positions as MLM targets (labels -100 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, n_sentences, batch_size):
        b = min(batch_size, n_sentences - start)
        ids = torch.randint(5, vocab, (b, seq_len), generator=g)
        labels = torch.where(torch.rand(b, seq_len, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speed-sentences", type=int, default=256)
    args = parser.parse_args()
    meta = begin()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fields = {**preset("encoder", "mini"), "vocab_size": 16000, "dropout": 0.0}
    model = Encoder(EncoderConfig(**fields)).eval()
    batches = mlm_batches(args.sentences, args.seq_len, args.batch_size, fields["vocab_size"])

    # Wall time depends on what else runs on the shared cores; process CPU time does not.
    load_before = os.getloadavg()[0]
    start, cpu_start = time.perf_counter(), time.process_time()
    scores = michel_importance(model, batches, mlm_loss, granularity="token")
    michel_s, michel_cpu = time.perf_counter() - start, time.process_time() - cpu_start

    n_layers, n_heads = scores.shape
    mask = np.ones(n_layers * n_heads)
    mask[np.argsort(scores.ravel(), kind="stable")[: n_layers * n_heads // 2]] = 0
    pruned = prune_model(model, mask.reshape(n_layers, n_heads))
    speed_batches = mlm_batches(args.speed_sentences, args.seq_len, args.batch_size, fields["vocab_size"], seed=1)
    speed = measure_speed_and_size(model, pruned, speed_batches, repeats=5)

    result = {
        "model": "mini encoder (4 x 256, 4 heads, FFN 1024, vocab 16000), random init",
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "michel": {"sentences": args.sentences, "seq_len": args.seq_len, "batch_size": args.batch_size,
                   "seconds": round(michel_s, 2), "cpu_seconds": round(michel_cpu, 2),
                   "load_average_before": round(load_before, 2), "tokens_per_s": round(args.sentences * args.seq_len / michel_s),
                   "target_seconds": 120, "within_target_wall": michel_s < 120},
        "pruning": {"heads_pruned": int((mask == 0).sum()), "heads_total": int(mask.size),
                    "n_heads_per_layer": pruned.n_heads_per_layer,
                    **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in speed.items()}},
    }
    rows = [
        (f"Michel importance, {args.sentences:,} x {args.seq_len} tokens",
         f"{michel_s:.1f} s wall, {michel_cpu:.1f} s CPU (target < 120 s; load {load_before:.1f})"),
        ("heads pruned", f"{result['pruning']['heads_pruned']} / {mask.size} -> {pruned.n_heads_per_layer}"),
        ("parameters full / pruned", f"{speed['params_full']:,} / {speed['params_pruned']:,} ({speed['params_ratio']:.3f})"),
        ("safetensors bytes full / pruned", f"{speed['bytes_full']:,} / {speed['bytes_pruned']:,} ({speed['bytes_ratio']:.3f})"),
        ("inference tokens/s full / pruned", f"{speed['tokens_per_s_full']:,.0f} / {speed['tokens_per_s_pruned']:,.0f}"),
        ("speed ratio pruned / full", f"{speed['speed_ratio']:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    write_result(RESULTS, result, meta)
    print(f"-> {RESULTS}")


if __name__ == "__main__":
    main()
