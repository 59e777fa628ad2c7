"""Training-step speed: our encoder/decoder vs Hugging Face BERT/GPT-2 (eager, fp32), same shape.

One training step = forward + backward + AdamW step on a batch of 32 x 128 tokens, 4 layers, width
256, 4 heads, FFN 1024, vocabulary 16000 (the `mini` preset). Ours runs its real training step
(`plmodels.train.lm_loss`: MLM logits only at the 15% masked positions; SDPA attention), in fp32
and with bf16 autocast; the references run eager fp32 with their own loss. Each timing is the
median of `--iters` steps after `--warmup` steps. Achieved GFLOP/s uses the analytic count
(6 x multiply-adds per parameter-matmul token, Kaplan et al. 2020, plus attention and LM head) and
is reported against the matmul peak measured in the same run (2048^2 GEMMs, fp32 and bf16).

    python benchmarks/bench_train.py [--threads N] [--iters 5] [--warmup 2]
Writes a table to stdout and benchmarks/results/train.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from plmodels.checkpoint import build_model
from plmodels.masking import MaskingConfig, mask_tokens, step_generator
from plmodels.presets import preset
from plmodels.train import Batch, lm_loss

B, T, V, L, D, H, FF = 32, 128, 16000, 4, 256, 4, 1024
OUT = Path(__file__).resolve().parent / "results" / "train.json"


def timed(step, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def matmul_peak(dtype: torch.dtype, n: int = 2048, iters: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / timed(lambda: a @ b, 2, iters) / 1e9


def step_flops(n_pred: int, causal: bool) -> float:
    """fwd + bwd FLOPs of one step: 6 per weight per token, attention QK^T and AV, LM head on n_pred."""
    body = 6 * B * T * L * (4 * D * D + 2 * D * FF)
    attn = 3 * 2 * 2 * B * L * T * T * D * (0.5 if causal else 1.0)
    head = 6 * n_pred * (D * V + (0 if causal else D * D))
    return body + attn + head


def ours(kind: str, autocast: bool, warmup: int, iters: int) -> tuple[float, int]:
    torch.manual_seed(0)
    fields = {**preset(kind, "mini"), "vocab_size": V}
    model = build_model(kind, fields).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(5, V, (B, T + (kind == "decoder")))
    if kind == "encoder":
        x, y = mask_tokens(ids, mask_id=4, vocab_size=V, special_ids={0, 1, 2, 3, 4},
                           generator=step_generator(0, 0), cfg=MaskingConfig())
        batch = Batch(x, y)
    else:
        batch = Batch(ids[:, :-1], ids[:, 1:])
    n_pred = int((batch.labels != -100).sum())

    def step():
        loss, _ = lm_loss(model, batch, autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return timed(step, warmup, iters), n_pred


def reference(kind: str, warmup: int, iters: int) -> tuple[float, int]:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "encoder":
        cfg = tf.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                            intermediate_size=FF, max_position_embeddings=512)
        cfg._attn_implementation = "eager"
        model = tf.BertForMaskedLM(cfg).train()
        ids = torch.randint(5, V, (B, T))
        _, labels = mask_tokens(ids, mask_id=4, vocab_size=V, special_ids={0, 1, 2, 3, 4},
                                generator=step_generator(0, 0), cfg=MaskingConfig())
    else:
        cfg = tf.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_inner=FF, n_positions=512)
        cfg._attn_implementation = "eager"
        model = tf.GPT2LMHeadModel(cfg).train()
        ids = torch.randint(5, V, (B, T))
        labels = ids
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step():
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    n_pred = B * T  # the references project every position onto the vocabulary
    return timed(step, warmup, iters), n_pred


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    rows = []
    for kind, ref_name, target in (("encoder", "BertForMaskedLM", 2.0), ("decoder", "GPT2LMHeadModel", 1.5)):
        t_ref, n_ref = reference(kind, a.warmup, a.iters)
        t32, n = ours(kind, False, a.warmup, a.iters)
        t16, _ = ours(kind, True, a.warmup, a.iters)
        for name, t, npred, dt in ((f"HF {ref_name} (eager fp32)", t_ref, n_ref, "fp32"),
                                   (f"ours {kind} fp32", t32, n, "fp32"), (f"ours {kind} bf16 autocast", t16, n, "bf16")):
            gflops = step_flops(npred, kind == "decoder") / t / 1e9
            rows.append({"model": name, "kind": kind, "seconds_per_step": t, "tokens_per_s": B * T / t,
                         "speedup_vs_hf": t_ref / t, "target": target, "gflops": gflops,
                         "share_of_peak": gflops / peak[dt], "peak_dtype": dt})
    print(f"matmul peak: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s, threads {torch.get_num_threads()}")
    print(f"{'model':40s} {'s/step':>8s} {'tok/s':>9s} {'x HF':>6s} {'GFLOP/s':>8s} {'% peak':>7s}")
    for r in rows:
        print(f"{r['model']:40s} {r['seconds_per_step']:8.3f} {r['tokens_per_s']:9,.0f} {r['speedup_vs_hf']:6.2f} "
              f"{r['gflops']:8.1f} {100 * r['share_of_peak']:6.1f}%")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    result = {"shape": {"batch": B, "seq_len": T, "vocab": V, "layers": L, "width": D, "heads": H, "ffn": FF},
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "matmul_peak_gflops": peak, "rows": rows, "iters": a.iters, "warmup": a.warmup}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(OUT)


if __name__ == "__main__":
    main()
