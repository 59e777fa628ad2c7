"""Benchmark activation patching (probes/patching.py): every head of a `mini`-shape decoder (4 layers x
256, 4 heads, 16k vocabulary, random init) patched on 200 aligned pairs of 12 tokens, in both
directions (noising and denoising: what the mediation table needs), against a naive loop that runs
one forward per (pair, head) after caching each pair's source run once. Both give the same numbers
(the largest difference is recorded). Target (issue 80): all heads on 200 pairs within 3 min (180 s).
Writes benchmarks/results/patching.json.
Run: python benchmarks/bench_patching.py [--threads 1] [--pairs 200]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from meta import begin, write_result

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.families import preset
from probes.patching import cache_activations, patch_sites, site_grid

RESULTS = Path(__file__).resolve().parent / "results" / "patching.json"
TARGET_S = 180.0
VOCAB, LENGTH = 16000, 12


def pairs(n: int) -> tuple[dict, dict]:
    """(clean, corrupt): random sentences differing at token 2 (the subject of an agreement prefix)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (n, LENGTH), generator=g)
    other = ids.clone()
    other[:, 2] = torch.randint(5, VOCAB, (n,), generator=g)
    return ({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            {"input_ids": other, "attention_mask": torch.ones_like(other)})


def score(model, batch):
    """The logit difference of two fixed tokens at the last position (a verb's two forms); the 16k-way
    output layer runs at that position only, as the agreement analysis reads it."""
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], return_logits=False)
    logits = model.lm_logits(out.last_hidden_state[:, -1])  # (N, V)
    return logits[:, 7] - logits[:, 8]


def naive(model, base, source, sites) -> torch.Tensor:
    """(S, N): one forward per (pair, site), the source run of each pair cached once."""
    n = len(base["input_ids"])
    out = torch.zeros(len(sites), n)
    with torch.no_grad():
        for i in range(n):
            b = {k: v[i: i + 1] for k, v in base.items()}
            s = {k: v[i: i + 1] for k, v in source.items()}
            _, cache = cache_activations(model, score, s, {site.hook for site in sites})
            for j, site in enumerate(sites):
                def put(t, name, site=site):
                    t = t.clone()
                    t[:, :, site.head] = cache[name][:, :, site.head]
                    return t
                with model.hooks([(site.hook, put)]):
                    out[j, i] = score(model, b)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=200)
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(**{**preset("decoder", "mini"), "vocab_size": VOCAB, "dropout": 0.0})).eval()
    clean, corrupt = pairs(a.pairs)
    sites = site_grid(model, kinds=("head_out",))
    t = time.perf_counter()
    _, _, noised = patch_sites(model, score, clean, corrupt, sites, batch_size=a.pairs)
    _, _, denoised = patch_sites(model, score, corrupt, clean, sites, batch_size=a.pairs)
    batched = time.perf_counter() - t
    t = time.perf_counter()
    ref_noised = naive(model, clean, corrupt, sites)
    ref_denoised = naive(model, corrupt, clean, sites)
    loop = time.perf_counter() - t
    diff = max((noised - ref_noised).abs().max().item(), (denoised - ref_denoised).abs().max().item())
    out = {"model": "mini decoder (4x256, 4 heads, 16k vocabulary, random init)", "threads": a.threads,
           "pairs": a.pairs, "tokens": LENGTH, "sites": len(sites), "directions": 2,
           "batched_s": round(batched, 1), "naive_s": round(loop, 1), "speedup": round(loop / batched, 1),
           "max_abs_diff": diff, "target_s": TARGET_S, "within_target": batched <= TARGET_S}
    print(out)
    write_result(RESULTS, out, meta)


if __name__ == "__main__":
    main()
