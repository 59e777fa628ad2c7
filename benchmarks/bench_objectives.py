"""Training-step time of each BERT-family objective against the masked-LM step at the same shape.

Every system is built from its shipped `-mini` recipe (plmodels/recipes/pretrain/<system>-mini.json:
4 layers x 256, 4 heads, FFN 1024, vocabulary 16,000, batches of 32 x 128) through the trainer's own
objective (plmodels/training/objectives.py): batch construction (masking, span masking, sentence
pairs) + loss + backward + fused AdamW step, exactly what `workbench pretrain` runs per step. The
reference is `encoder-mini` (MLM, no NSP) in the same process. DistilBERT's teacher is a random
`encoder-mini` (4 layers; its student has 2), saved to a temporary folder.

The CPU may be shared, so the timed steps are interleaved (ref, A, B, ..., ref, A, B, ...) and each
ratio is the median over rounds of the same-round time ratio (row / MLM). Target (issue 63): the
ELECTRA step with its quarter-width generator within 1.5x of the MLM step. The other architectures
(issue 64) are reported with no target: the biLMs (ELMo's LSTMs, `elmo-mini`, and its transformer
control, `elmo-transformer-mini`) predict every token in both directions where the MLM predicts 15%;
T5 and BART (`t5-mini`, `bart-mini`: 2 encoder + 2 decoder layers, the decoder with cross-attention)
run a second stack over the target (T5's targets are short: the spans and their sentinels; BART's
are the whole row); XLNet (`xlnet-mini`) runs two attention streams with relative positions.

    nice python benchmarks/bench_objectives.py [--iters 7] [--warmup 2] [--threads N] [--bf16/--no-bf16]
                                               [--systems encoder,elmo,...]  (encoder, the reference, always runs)
Writes a table to stdout and benchmarks/results/objectives.json (or `--out FILE`).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from meta import begin, write_result

from plmodels.checkpoint import build_model, save
from plmodels.families import preset
from plmodels.training import load_config
from plmodels.training.loop import build_model_config
from plmodels.training.masking import step_generator
from plmodels.training.objectives import objective_for
from plmodels.training.runtime import make_optimizer, use_bf16

B, T, V = 32, 128, 16000
SYSTEMS = ("encoder", "bert", "roberta", "spanbert", "electra", "albert", "distilbert", "elmo", "elmo-transformer",
           "t5", "bart", "xlnet")
TARGETS = {"electra": 1.5}
OUT = Path(__file__).resolve().parent / "results" / "objectives.json"
# a WordPiece-like stand-in: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; "." = 5; ids 12,000..15,899 are "##"
# pieces; T5's sentinels <extra_id_0..99> are the last 100 ids (never in the text rows)
SENTINEL0, PERIOD = V - 100, 5
TOKENS = {".": PERIOD, **{f"<extra_id_{i}>": SENTINEL0 + i for i in range(100)}}
TOK = SimpleNamespace(kind="wordpiece", vocab_size=V, pad_id=0, cls_id=2, sep_id=3, mask_id=4,
                      special_ids={0, 1, 2, 3, 4}, hf=SimpleNamespace(token_to_id=TOKENS.get))
CONT_IDS = torch.arange(12000, SENTINEL0)


def rows_for(seed: int) -> torch.Tensor:
    """(B, T) packed rows: [CLS] text [SEP], about one word in four split into two pieces."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 12000, (B, T), generator=g)
    cont = torch.rand(B, T, generator=g) < 0.25
    ids = torch.where(cont, torch.randint(12000, SENTINEL0, (B, T), generator=g), ids)
    ids[:, 0], ids[:, -1] = TOK.cls_id, TOK.sep_id
    return ids


def system_step(name: str, teacher_dir: Path, autocast: bool):
    """(one training step, the objective's name) for system `name`."""
    overrides = {"objective_args": {"teacher": str(teacher_dir)}} if name == "distilbert" else None
    cfg = load_config(f"{name}-mini", overrides)
    objective = objective_for(cfg)
    torch.manual_seed(0)
    module = objective.build(cfg.kind, objective.model_config(build_model_config(cfg, TOK))).train()
    opt = make_optimizer(module, cfg)
    masking, counter = cfg.masking_config, iter(range(10**9))

    def step() -> None:
        i = next(counter)
        batch = objective.batch(rows_for(i), TOK, masking, step_generator(0, i), CONT_IDS, torch.device("cpu"))
        loss, _, _ = objective.loss(module, batch, autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, objective.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    auto = use_bf16("auto", torch.device("cpu"))
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=auto,
                    help=f"bf16 autocast (default here: {'on' if auto else 'off'}, as the trainer's bf16='auto')")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    a = ap.parse_args()
    systems = ["encoder"] + [s for s in a.systems.split(",") if s and s != "encoder"]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    meta = begin()
    if a.threads:
        torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        teacher = build_model("encoder", {**preset("encoder", "mini"), "vocab_size": V})
        save(teacher, None, Path(tmp) / "teacher", card={"name": "random encoder-mini teacher"})
        steps = {name: system_step(name, Path(tmp) / "teacher", a.bf16) for name in systems}
        times: dict[str, list[float]] = {name: [] for name in systems}
        for name, (step, _) in steps.items():
            for _ in range(a.warmup):
                step()
        for i in range(a.iters):  # interleaved rounds
            for name, (step, _) in steps.items():
                t0 = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t0)
            print(f"round {i + 1}/{a.iters}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in systems), flush=True)
    ref = times["encoder"]
    rows = []
    for name in systems:
        ratio = statistics.median(t / r for t, r in zip(times[name], ref))
        rows.append({"system": name, "objective": steps[name][1], "seconds_per_step": statistics.median(times[name]),
                     "times": times[name], "time_vs_mlm": ratio, "target_max": TARGETS.get(name),
                     "meets_target": None if name not in TARGETS else ratio <= TARGETS[name]})
    print(f"{'system':12s} {'objective':10s} {'s/step':>7s} {'x MLM':>6s} {'target':>7s}")
    for r in rows:
        target = "" if r["target_max"] is None else f"<= {r['target_max']}"
        print(f"{r['system']:12s} {r['objective']:10s} {r['seconds_per_step']:7.3f} {r['time_vs_mlm']:6.2f} {target:>7s}")
    result = {"shape": {"batch": B, "seq_len": T, "vocab": V, "recipes": [f"{n}-mini" for n in systems]},
              "bf16": a.bf16, "iters": a.iters, "warmup": a.warmup, "rows": rows}
    write_result(a.out, result, meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
