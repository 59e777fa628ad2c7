"""Training-step speed: our encoder/decoder vs Hugging Face BERT/GPT-2 (eager, fp32), same shape.

One training step = forward + backward + AdamW step on a batch of 32 x 128 tokens, 4 layers, width
256, 4 heads, FFN 1024, vocabulary 16000 (the `mini` preset), dropout 0.1 on both sides. Ours runs
its real training step (`plmodels.training.loss.lm_loss` + `make_optimizer`): SDPA attention, fused
chunked linear cross-entropy (MLM logits only at the 15% masked positions for the encoder), fused
AdamW. The references run eager fp32 with their own loss and torch's default (foreach) AdamW.

The CPU may be shared, so every variant is built first and the timed steps are interleaved
(A, B, C, A, B, C, ...) in this one process; each figure is the median of `--iters` steps after
`--warmup` steps; "x HF" is the median over rounds of the same-round ratio HF time / our time
(robust to the load drifting between rounds). `--compile` adds `torch.compile` rows (their first call, the compilation, is
reported separately: it is paid once per run). `--ablate` adds rows with one of our changes undone
(foreach AdamW; materialised logits + F.cross_entropy, which also runs the encoder's last block at every
position; for the encoder, the fused loss with the last block at every position). bf16-autocast rows are added where the
trainer's `bf16: "auto"` turns autocast on (CPUs with AVX512-BF16/AMX: it is then what
`workbench pretrain` runs), or with `--bf16`; `--no-bf16` leaves them out. Their GFLOP/s share is
taken against the bf16 matmul peak.
Achieved GFLOP/s uses the analytic count (6 x multiply-adds per parameter-matmul token, Kaplan et
al. 2020, plus attention and LM head) against the fp32 matmul peak measured in the same run.

`--device cuda` (issue 81, part 5) times the GPU table instead, at four shapes (`CUDA_SHAPES`: the
mini and base presets at the batches of the issue), every row in bf16 autocast with fused AdamW:
transformers' BERT / GPT-2 with their SDPA attention, ours eager and ours `compile` (CompiledStep,
with the fixed-size masked slots a compiled run uses). Each step ends in `torch.cuda.synchronize()`;
MFU is the analytic FLOPs against the bf16 matmul peak measured on the device in the same run. It
writes results/train_cuda.json (or `--out`), stamped like every result file (meta.py).

    nice python benchmarks/bench_train.py [--kinds encoder decoder] [--threads N] [--iters 5] [--warmup 1] [--compile] [--ablate] [--recipe CONFIG]
    python benchmarks/bench_train.py --device cuda [--kinds ...] [--shapes mini base] [--iters 20] [--warmup 3]
Writes a table to stdout and benchmarks/results/train.json (with `--recipe NAME` (a shipped recipe, e.g. encoder-mini-cram) or `--recipe FILE.json`:
results/train_X.json, dashes as underscores), or `--out FILE`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from meta import begin, write_result

from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.training.data import Batch, batch_to
from plmodels.training.loop import CompiledStep
from plmodels.training.loss import linear_cross_entropy, lm_loss
from plmodels.training.masking import (IGNORE_INDEX, MaskingConfig, mask_tokens, masked_slots, slot_sizes,
                                       step_generator)
from plmodels.training.runtime import use_bf16

B, T, V, L, D, H, FF = 32, 128, 16000, 4, 256, 4, 1024
OUT = Path(__file__).resolve().parent / "results" / "train.json"
OUT_CUDA = OUT.with_name("train_cuda.json")
REF = {"encoder": ("HF BertForMaskedLM", 2.0), "decoder": ("HF GPT2LMHeadModel", 1.5)}


@dataclasses.dataclass(frozen=True)
class Shape:
    """One timed configuration: our preset and the batch (rows x tokens)."""

    preset: str
    batch: int
    seq_len: int
    vocab: int = V

    def dims(self, kind: str) -> tuple[int, int, int, int]:
        """(layers, width, heads, FFN) of the preset."""
        p = preset(kind, self.preset)
        return p["n_layers"], p["d_model"], p["n_heads"], p["d_ff"]


CPU_SHAPE = Shape("mini", B, T)  # the CPU table: both kinds at 32 x 128
# the GPU table of issue 81: (kind, preset) -> the batch it was measured at
CUDA_SHAPES = {("encoder", "mini"): Shape("mini", 128, 128), ("encoder", "base"): Shape("base", 64, 128),
               ("decoder", "mini"): Shape("mini", 64, 256), ("decoder", "base"): Shape("base", 16, 512)}


def sync(device: torch.device) -> None:
    """Wait for the device's queue (a no-op on the CPU), so a step's time is its kernels' time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, n: int = 2048, iters: int = 5, device: torch.device = torch.device("cpu")) -> float:
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    sync(device)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(ts) / 1e9


def step_flops(n_pred: int, causal: bool, shape: Shape = CPU_SHAPE, kind: str = "encoder") -> float:
    """fwd + bwd FLOPs of one step: 6 per weight per token, attention QK^T and AV, LM head on n_pred."""
    b, t, v = shape.batch, shape.seq_len, shape.vocab
    n_layers, d, _, ff = shape.dims(kind)
    body = 6 * b * t * n_layers * (4 * d * d + 2 * d * ff)
    attn = 3 * 2 * 2 * b * n_layers * t * t * d * (0.5 if causal else 1.0)
    head = 6 * n_pred * (d * v + (0 if causal else d * d))
    return body + attn + head


RECIPE: dict = {}  # --recipe: {"model": overrides for our models, "mask_rate": float}


def batch_for(kind: str, recipe: bool = False, shape: Shape = CPU_SHAPE, fixed_slots: bool = False) -> Batch:
    """The timed batch (on the host): MLM-masked for the encoder, with the slots the trainer builds
    (each batch's own counts, or with `fixed_slots` the config's bounds a compiled run uses)."""
    ids = torch.randint(5, shape.vocab, (shape.batch, shape.seq_len + (kind == "decoder")),
                        generator=torch.Generator().manual_seed(0))
    if kind == "encoder":
        rate = RECIPE.get("mask_rate", 0.15) if recipe else 0.15
        x, y = mask_tokens(ids, mask_id=4, vocab_size=shape.vocab, special_ids={0, 1, 2, 3, 4},
                           generator=step_generator(0, 0), cfg=MaskingConfig(rate=rate))
        sizes = slot_sizes(shape.batch, shape.seq_len, rate) if fixed_slots else None
        return Batch(x, y, slots=masked_slots(y, sizes))
    return Batch(ids[:, :-1], ids[:, 1:])


def unfused_loss(model, batch: Batch) -> torch.Tensor:
    """The loss with materialised logits and F.cross_entropy (the ablation of the fused CE)."""
    sel = batch.labels != IGNORE_INDEX
    if model.kind == "encoder":
        h = model(batch.input_ids, attn_impl="sdpa").last_hidden_state[sel]
        logits, targets = model.mlm_logits(h), batch.labels[sel]
    else:
        logits = model(batch.input_ids, attn_impl="sdpa").logits.flatten(0, 1)
        targets = batch.labels.flatten()
    return F.cross_entropy(logits, targets, reduction="sum") / int(sel.sum())


def dense_last_loss(model, batch: Batch) -> torch.Tensor:
    """The encoder's fused loss after a full forward: the last block at every position (the
    ablation of `Encoder.masked_hidden`, which runs it at the masked positions only)."""
    sel = batch.labels != IGNORE_INDEX
    h = model(batch.input_ids, attn_impl="sdpa").last_hidden_state[sel]
    return linear_cross_entropy(model.mlm_transform(h), *model.mlm_projection(), batch.labels[sel]) / int(sel.sum())


def ours(kind: str, *, compile: bool = False, fused_adamw: bool = True, fused_ce: bool = True,
         autocast: bool = False, dense_last: bool = False, shape: Shape = CPU_SHAPE,
         device: torch.device = torch.device("cpu")) -> tuple[Callable[[], None], int]:
    """(one training step, number of vocabulary-projected positions) for our model."""
    torch.manual_seed(0)
    fields = {**preset(kind, shape.preset), **RECIPE.get("model", {}), "vocab_size": shape.vocab}
    model = build_model(kind, fields).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused_adamw else {"foreach": True}))
    run = CompiledStep(model) if compile else model  # what the trainer's `compile: true` runs
    batch = batch_to(batch_for(kind, recipe=True, shape=shape, fixed_slots=compile), device)

    def step() -> None:
        if dense_last:
            loss = dense_last_loss(run, batch)
        else:
            loss = lm_loss(run, batch, autocast)[0] if fused_ce else unfused_loss(run, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, int((batch.labels != IGNORE_INDEX).sum())


def reference(kind: str, shape: Shape = CPU_SHAPE, device: torch.device = torch.device("cpu"),
              autocast: bool = False) -> tuple[Callable[[], None], int]:
    """transformers' BERT / GPT-2 of the shape's dims: eager attention and foreach AdamW in fp32
    on the CPU; on CUDA its SDPA attention, fused AdamW and bf16 autocast (`autocast`)."""
    import transformers as tf

    torch.manual_seed(0)
    batch = batch_for(kind, shape=shape)
    n_layers, d, heads, ff = shape.dims(kind)
    attn = "sdpa" if device.type == "cuda" else "eager"
    if kind == "encoder":
        cfg = tf.BertConfig(vocab_size=shape.vocab, hidden_size=d, num_hidden_layers=n_layers,
                            num_attention_heads=heads, intermediate_size=ff, max_position_embeddings=512)
        cfg._attn_implementation = attn
        model, ids, labels = tf.BertForMaskedLM(cfg), batch.input_ids, batch.labels
    else:
        cfg = tf.GPT2Config(vocab_size=shape.vocab, n_embd=d, n_layer=n_layers, n_head=heads, n_inner=ff,
                            n_positions=max(512, shape.seq_len))
        cfg._attn_implementation = attn
        ids = batch.input_ids  # GPT-2 shifts the labels inside
        model, labels = tf.GPT2LMHeadModel(cfg), ids
    model = model.to(device).train()
    ids, labels = ids.to(device), labels.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            **({"fused": True} if device.type == "cuda" else {"foreach": True}))

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, shape.batch * shape.seq_len  # the references project every position onto the vocabulary


def variants(a: argparse.Namespace) -> list[dict]:
    out = []
    for kind in a.kinds:
        ref_name, target = REF[kind]
        rows = [(f"{ref_name} (eager fp32)", lambda k=kind: reference(k)),
                (f"ours {kind} fp32", lambda k=kind: ours(k))]
        if a.compile:
            rows.append((f"ours {kind} fp32 + torch.compile", lambda k=kind: ours(k, compile=True)))
        if a.ablate:
            rows += [(f"ours {kind}, foreach AdamW", lambda k=kind: ours(k, fused_adamw=False)),
                     (f"ours {kind}, unfused CE", lambda k=kind: ours(k, fused_ce=False))]
            if kind == "encoder":
                rows.append(("ours encoder, dense last block", lambda: ours("encoder", dense_last=True)))
        if a.bf16:
            rows.append((f"ours {kind} bf16 autocast", lambda k=kind: ours(k, autocast=True)))
            if a.compile:
                rows.append((f"ours {kind} bf16 autocast + torch.compile",
                             lambda k=kind: ours(k, autocast=True, compile=True)))

        for i, (name, make) in enumerate(rows):
            step, n_pred = make()
            out.append({"model": name, "kind": kind, "step": step, "n_pred": n_pred, "is_ref": i == 0,
                        "target": target, "times": [], "first_s": None})
    return out


def cuda_variants(a: argparse.Namespace, device: torch.device) -> list[dict]:
    """The GPU table's rows: for each kind and preset of `CUDA_SHAPES`, transformers (SDPA, bf16
    autocast, fused AdamW), ours eager and ours compiled, all in bf16 autocast."""
    out = []
    for kind in a.kinds:
        for name in a.shapes:
            shape = CUDA_SHAPES[(kind, name)]
            rows = [(f"{REF[kind][0]} (SDPA, bf16)", lambda k=kind, s=shape: reference(k, s, device, autocast=True)),
                    (f"ours {kind} bf16", lambda k=kind, s=shape: ours(k, autocast=True, shape=s, device=device)),
                    (f"ours {kind} bf16 + compile",
                     lambda k=kind, s=shape: ours(k, autocast=True, compile=True, shape=s, device=device))]
            for i, (model, make) in enumerate(rows):
                step, n_pred = make()
                out.append({"model": model, "kind": kind, "shape": shape, "step": step, "n_pred": n_pred,
                            "is_ref": i == 0, "times": [], "first_s": None})
    return out


def measure(vs: list[dict], warmup: int, iters: int, device: torch.device = torch.device("cpu")) -> None:
    def timed(v: dict) -> float:
        t0 = time.perf_counter()
        v["step"]()
        sync(device)
        return time.perf_counter() - t0

    for v in vs:  # warm-up (torch.compile compiles here: the first call's time is reported)
        for w in range(warmup):
            t = timed(v)
            if w == 0:
                v["first_s"] = t
    for i in range(iters):  # interleaved: A, B, C, A, B, C, ...
        for v in vs:
            v["times"].append(timed(v))
        print(f"round {i + 1}/{iters}: " + ", ".join(f"{v['model']} {v['times'][-1]:.3f}s" for v in vs), flush=True)


def cuda_main(a: argparse.Namespace, meta: dict) -> None:
    """`--device cuda`: the GPU table (issue 81, part 5), written to results/train_cuda.json."""
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    load_start = os.getloadavg()
    peak16 = matmul_peak(torch.bfloat16, n=8192, iters=20, device=device)
    vs = cuda_variants(a, device)
    measure(vs, max(1, a.warmup), a.iters, device)
    peak16 = max(peak16, matmul_peak(torch.bfloat16, n=8192, iters=20, device=device))
    rows = []
    for v in vs:
        s, t = v["shape"], statistics.median(v["times"])
        ref = next(r for r in vs if r["kind"] == v["kind"] and r["shape"] == s and r["is_ref"])
        tflops = step_flops(v["n_pred"], v["kind"] == "decoder", s, v["kind"]) / t / 1e12
        rows.append({"model": v["model"], "kind": v["kind"], "preset": s.preset, "batch": s.batch,
                     "seq_len": s.seq_len, "vocab": s.vocab, "seconds_per_step": t, "times": v["times"],
                     "first_call_s": v["first_s"], "tokens_per_s": s.batch * s.seq_len / t,
                     "speedup_vs_hf": statistics.median(x / y for x, y in zip(ref["times"], v["times"])),
                     "tflops": tflops, "mfu": tflops * 1e3 / peak16})
    print(f"bf16 matmul peak {peak16 / 1e3:.0f} TFLOP/s on {torch.cuda.get_device_name(device)}")
    print(f"{'model':36s} {'shape':>16s} {'ms/step':>8s} {'x HF':>6s} {'MFU':>6s} {'1st call':>8s}")
    for r in rows:
        shape = f"{r['preset']} {r['batch']}x{r['seq_len']}"
        print(f"{r['model']:36s} {shape:>16s} {1e3 * r['seconds_per_step']:8.1f} {r['speedup_vs_hf']:6.2f} "
              f"{100 * r['mfu']:5.1f}% {r['first_call_s']:8.1f}")
    result = {"device": torch.cuda.get_device_name(device), "cuda": torch.version.cuda, "torch": torch.__version__,
              "matmul_peak_tflops": {"bf16": peak16 / 1e3}, "load_average": [load_start, os.getloadavg()],
              "rows": rows, "iters": a.iters, "warmup": a.warmup,
              "note": "medians of interleaved steps in one process, each ending in a device sync; MFU against "
                      "the bf16 matmul peak measured here; first_call_s includes torch.compile"}
    write_result(a.out or OUT_CUDA, result, meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, same for all)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="add torch.compile rows")
    ap.add_argument("--ablate", action="store_true", help="add rows with foreach AdamW / unfused CE")
    ap.add_argument("--kinds", nargs="+", default=["encoder", "decoder"], choices=["encoder", "decoder"],
                    help="which models to time (default both)")
    auto = use_bf16("auto", torch.device("cpu"))
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=auto,
                    help=f"bf16 autocast rows (default here: {'on' if auto else 'off'}, as the trainer's bf16='auto')")
    ap.add_argument("--recipe", type=Path, default=None,
                    help="a pretrain config: our rows take its model settings and masking rate (the HF "
                         "reference stays BERT/GPT-2 mini, so its ratios are then across shapes)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the GPU table (bf16, SDPA references, base and mini shapes) instead of the CPU one")
    ap.add_argument("--shapes", nargs="+", default=["mini", "base"], choices=["mini", "base"],
                    help="--device cuda: which presets to time (CUDA_SHAPES)")
    ap.add_argument("--out", type=Path, default=None,
                    help="result file (default results/train.json, or results/train_<recipe>.json with --recipe); "
                         "give one to a variant run (--compile, --ablate) so it does not overwrite another's file")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here")
    meta = begin()
    if a.device == "cuda":
        cuda_main(a, meta)
        return
    if a.recipe:
        from plmodels.training import load_config

        cfg = load_config(a.recipe)
        RECIPE.update(model=dict(cfg.model), mask_rate=cfg.masking.get("rate", 0.15))
        print(f"our models as in {a.recipe}: {RECIPE}")
    if a.threads:
        torch.set_num_threads(a.threads)
    load_start = os.getloadavg()
    peak = matmul_peak(torch.float32)
    peak16 = matmul_peak(torch.bfloat16) if a.bf16 else None
    vs = variants(a)
    measure(vs, max(1, a.warmup), a.iters)
    peak = max(peak, matmul_peak(torch.float32))  # best of before and after
    if a.bf16:
        peak16 = max(peak16, matmul_peak(torch.bfloat16))
    rows = []
    for v in vs:
        t = statistics.median(v["times"])
        ref_times = next(r for r in vs if r["kind"] == v["kind"] and r["is_ref"])["times"]
        paired = statistics.median(a / b for a, b in zip(ref_times, v["times"]))  # same-round ratios
        own = next(r for r in vs if r["model"] == f"ours {v['kind']} fp32")["times"]
        vs_ours = statistics.median(a / b for a, b in zip(v["times"], own))  # > 1: slower than ours
        gflops = step_flops(v["n_pred"], v["kind"] == "decoder") / t / 1e9
        row_peak = peak16 if "bf16" in v["model"] else peak
        rows.append({"model": v["model"], "kind": v["kind"], "seconds_per_step": t, "times": v["times"],
                     "first_call_s": v["first_s"], "tokens_per_s": B * T / t, "speedup_vs_hf": paired,
                     "speedup_of_medians": statistics.median(ref_times) / t, "time_vs_ours_fp32": vs_ours,
                     "target": v["target"], "gflops": gflops, "share_of_peak": gflops / row_peak,
                     "trainer_default": ("bf16" in v["model"]) == auto and not v["is_ref"]
                     and "compile" not in v["model"] and "," not in v["model"]})
    load_end = os.getloadavg()
    print(f"matmul peak fp32 {peak:.1f} GFLOP/s" + (f", bf16 {peak16:.1f}" if a.bf16 else "")
          + f", threads {torch.get_num_threads()}, "
          f"load average {load_start[0]:.1f} -> {load_end[0]:.1f}")
    print("x HF = median over rounds of the same-round time ratio; x HF med = ratio of the median times; "
          "t/ours = median same-round ratio of the row's step time to `ours <kind> fp32`")
    print(f"{'model':44s} {'s/step':>7s} {'tok/s':>7s} {'x HF':>6s} {'x HF med':>8s} {'t/ours':>6s} {'target':>6s} "
          f"{'GFLOP/s':>8s} {'% peak':>7s} {'1st call':>8s}")
    for r in rows:
        print(f"{r['model'] + (' *' if r['trainer_default'] else ''):44s} {r['seconds_per_step']:7.2f} {r['tokens_per_s']:7,.0f} {r['speedup_vs_hf']:6.2f} "
              f"{r['speedup_of_medians']:8.2f} {r['time_vs_ours_fp32']:6.2f} "
              f"{r['target']:6.1f} {r['gflops']:8.1f} {100 * r['share_of_peak']:6.1f}% {r['first_call_s']:8.1f}")
    print("* = what `workbench pretrain` runs on this machine (bf16: 'auto'); the targets are judged on it")
    result = {"shape": {"batch": B, "seq_len": T, "vocab": V, "layers": L, "width": D, "heads": H, "ffn": FF},
              "ours_as_recipe": {"path": str(a.recipe), **RECIPE} if a.recipe else None,
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "load_average": [load_start, load_end],
              "matmul_peak_gflops": {"fp32": peak, "bf16": peak16}, "bf16_auto": auto, "rows": rows, "iters": a.iters, "warmup": a.warmup,
              "note": "medians of interleaved steps in one process; first_call_s includes torch.compile"}
    out = a.out or (OUT if not a.recipe else OUT.with_name(f"train_{a.recipe.stem.replace('-', '_')}.json"))
    write_result(out, result, meta)


if __name__ == "__main__":
    main()
