"""What rotary position embeddings cost in a training step of the encoder recipe, and what two
cheaper ways of computing the same rotation would save.

The model is the `encoder-mini-cram` recipe's as it was when the figures were taken (4 x 256 x 4
heads, FFN 1024, pre-LN, no biases, no dropout, vocabulary 16,000; the recipe is post-LN since),
one training step = `plmodels.training.loss.lm_loss` + backward + fused AdamW on
64 x 128 tokens with the recipe's 25% masking, under bf16 autocast where the trainer turns it on
(`bf16: "auto"`). Rows, built first and then timed interleaved (A, B, C, A, B, C, ...) in this one
process, each the median of `--iters` steps:

- learned positions: no rotation at all (the floor RoPE is measured against);
- RoPE as the models compute it: `plmodels.components.positions.apply_rope`, x * cos + rotate_half(x) * sin;
- candidate "roll": rotate_half(x) * sin written as roll(x, Dh/2) * [-sin1, sin2] (bit-identical,
  one full-size pass fewer);
- candidate "roll + addcmul": the same with the multiply-add fused (not bit-identical in bf16).
The candidates replace `plmodels.components.attention.apply_rope` for their row only.

"x learned" is the median over rounds of the same-round ratio; the RoPE overhead is 1 - that.

    python benchmarks/bench_rope.py [--iters 15] [--threads 2]
Writes a table to stdout and benchmarks/results/rope.json.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from bench_train import measure  # the interleaved warm-up + timed rounds (benchmarks/ is on sys.path)
from meta import begin, write_result

import plmodels.components.attention as attention_module
from plmodels.checkpoint import build_model
from plmodels.components.positions import apply_rope
from plmodels.families import preset
from plmodels.training.data import Batch
from plmodels.training.loss import lm_loss
from plmodels.training.masking import MaskingConfig, mask_tokens, step_generator
from plmodels.training.runtime import use_bf16

B, T, V = 64, 128, 16000
RECIPE = {"norm": "pre", "dropout": 0.0, "bias": False, "layer_norm_eps": 1e-5}
OUT = Path(__file__).resolve().parent / "results" / "rope.json"


def _roll_terms(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """(x * cos, roll(x, Dh/2), [-sin1, sin2]): rotate_half(x) * sin == roll(x) * signed sin."""
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos, x.roll(half, dims=-1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope_roll(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rope with rotate_half(x) * sin as roll(x, Dh/2) * [-sin1, sin2] (bit-identical)."""
    xc, rolled, signed = _roll_terms(x, cos, sin)
    return xc + rolled * signed


def rope_addcmul(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rope_roll with the multiply-add fused (not bit-identical in bf16)."""
    return torch.addcmul(*_roll_terms(x, cos, sin))


def make_step(position: str, rope_fn, autocast: bool):
    torch.manual_seed(0)
    model = build_model("encoder", {**preset("encoder", "mini"), **RECIPE, "position": position,
                                    "vocab_size": V}).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(0))
    x, y = mask_tokens(ids, mask_id=4, vocab_size=V, special_ids={0, 1, 2, 3, 4},
                       generator=step_generator(0, 0), cfg=MaskingConfig(rate=0.25))
    batch = Batch(x, y)

    def step() -> None:
        attention_module.apply_rope = rope_fn  # looked up at call time by MultiHeadAttention.forward
        try:
            lm_loss(model, batch, autocast)[0].backward()
        finally:
            attention_module.apply_rope = apply_rope
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    autocast = use_bf16("auto", torch.device("cpu"))
    rows = {"learned positions": make_step("learned", apply_rope, autocast),
            "RoPE (apply_rope)": make_step("rope", apply_rope, autocast),
            "RoPE, roll": make_step("rope", rope_roll, autocast),
            "RoPE, roll + addcmul": make_step("rope", rope_addcmul, autocast)}
    vs = [{"model": k, "step": step, "times": [], "first_s": None} for k, step in rows.items()]
    measure(vs, a.warmup, a.iters)
    times = {v["model"]: v["times"] for v in vs}
    base = times["learned positions"]
    table = []
    for k, v in times.items():
        med = statistics.median(v)
        table.append({"variant": k, "median_s": med, "tokens_per_s": B * T / med,
                      "x_learned": statistics.median(b / t for b, t in zip(base, v))})
    print(f"\nbf16 autocast: {autocast}, threads: {torch.get_num_threads()}, {a.iters} rounds")
    print("| variant | median step | tokens/s | speed vs learned (paired) |\n|---|---|---|---|")
    for r in table:
        print(f"| {r['variant']} | {r['median_s']:.3f} s | {r['tokens_per_s']:,.0f} | {r['x_learned']:.3f}x |")
    write_result(OUT, {"bf16": autocast, "threads": torch.get_num_threads(), "iters": a.iters, "rows": table}, meta)


if __name__ == "__main__":
    main()
