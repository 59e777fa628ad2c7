"""A first look at the BERT family's objectives at equal wall-clock on this CPU (docs/objectives.md,
"The first comparison"): train each system from its `-mini` recipe for the same minutes, one after
the other, on the same corpus and tokenizer, then read every checkpoint with the same analyses.

Training: each system's recipe plus one shared backbone (`BACKBONE`: encoder-mini-cram's model
fields, RoPE, 8 heads, no dropout or biases, lr 1e-3, clip 0.5, the lr schedule on the clock with a
10% warmup), because faithful post-LN BERT with learned positions stays on the unigram plateau for
longer than such a budget here (docs/training.md). BERT trains first and its tokenizer serves every
other run (its token cache is hard-linked, not redone); DistilBERT distils BERT's final checkpoint
(so it is taught by a model that had the same minutes). Each run resumes if the script is killed.

The other families (`--systems elmo,elmo-transformer,t5,bart,xlnet`, issue 64) keep their recipe's
architecture and take the same training settings (dropout off, except ELMo's first run), BERT's
tokenizer and token cache when BERT's run is already in OUT; their rows are added to the tables
beside the BERT family's. An LSTM biLM gets no head analysis; a T5 / BART also gets its
cross-attention heads (`first_look_cross_heads`).

Analyses of each final checkpoint (the analysed model: ELECTRA's discriminator, DistilBERT's
student): the held-out masked-token loss and accuracy of its card (ELECTRA: the generator's; the
other models' on the same fixed rows and mask), POS / dependency-label / NER edge probes per layer
with Hewitt & Liang controls and the cumulative mix (E_delta), head roles, and linear CKA between
consecutive layers (ALBERT's claim of smoother transitions). Tables go to OUT/tables/first_look_*.parquet;
a markdown summary to OUT/summary.md.

    python -m research.scripts.objectives_first_look OUT [--minutes 15] [--systems bert,...] [--skip-train]
        [--dry-run] [--summary-only]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

import plmodels
from plmodels.checkpoint import read_card
from plmodels.training import pretrain
from probes.cka import cka_matrix
from workbench.analyses.cross_heads import analyse_cross_heads
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import probe_model
from workbench.core.results import write_table
from workbench.presentation.report import markdown_table
from workbench.store import extract, load_sentences

BERT_FAMILY = ("bert", "roberta", "spanbert", "electra", "albert", "distilbert")
OTHER_FAMILIES = ("elmo", "elmo-transformer", "t5", "bart", "xlnet")
SYSTEMS = BERT_FAMILY + OTHER_FAMILIES
TRAINING = {"lr": 1e-3, "clip": 0.5, "schedule_clock": "time", "max_steps": 20000, "warmup_steps": 2000,
            "eval_every": 500, "ckpt_every": 0, "ckpt_log_spaced": False, "max_train_texts": 300, "seed": 0}
BACKBONE = {"model": {"n_heads": 8, "dropout": 0.0, "bias": False, "position": "rope", "layer_norm_eps": 1e-5},
            **TRAINING}
# The other families keep their recipe's architecture (its position encoding, norms and widths are
# what makes it that system) and take the shared training settings; dropout is off as in the
# backbone, except ELMo's, whose first look ran with its recipe's.
FAMILY_MODEL = {"elmo": {}, "elmo-transformer": {"dropout": 0.0}, "t5": {"dropout": 0.0},
                "bart": {"dropout": 0.0}, "xlnet": {"dropout": 0.0}}
PROBE = dict(tasks=["pos", "deps", "ner"], modes=["single", "control", "cumulative"], seeds=[0],
             max_train_targets=4000, max_eval_targets=2000, n_boot=200)
HEADS = {"max_sentences": 500, "n_boot": 100}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def train(out: Path, minutes: float, dry: bool, systems: tuple[str, ...] = SYSTEMS) -> dict[str, Path]:
    finals: dict[str, Path] = {}
    bert_tok = out / "train" / "bert" / "tokenizer"
    tok = bert_tok if bert_tok.is_dir() and "bert" not in systems else None
    for name in systems:
        run = out / "train" / name
        base = BACKBONE if name in BERT_FAMILY else {**TRAINING, "model": FAMILY_MODEL[name]}
        over = {**base, "max_minutes": minutes, "name": f"{name}-first-look"}
        if dry:
            over.update(max_steps=3, warmup_steps=1, max_train_texts=5, eval_sequences=16, eval_every=0,
                        schedule_clock="steps")
        if name == "roberta":
            over["warmup_steps"] = over["warmup_steps"] // 4 or 1  # a quarter of the steps (4 micro-batches each)
        if tok is not None:
            over["tokenizer_path"] = str(tok)
            (run / "cache").mkdir(parents=True, exist_ok=True)
            for f in (out / "train" / "bert" / "cache").iterdir():
                if not (run / "cache" / f.name).exists():
                    os.link(f, run / "cache" / f.name)
        if name == "distilbert":
            over["objective_args"] = {"teacher": str(finals.get("bert", out / "train" / "bert" / "final"))}
            over.pop("model")  # the student's shape is the teacher's
        t0 = time.monotonic()
        log(f"training {name} ({minutes} min)")
        finals[name] = pretrain(f"{name}-mini", run, overrides=over)
        log(f"{name} done in {time.monotonic() - t0:.0f} s")
        if name == "bert":
            tok = run / "tokenizer"
    return finals


def consecutive_cka(path: Path, store_root: Path, n_sentences: int) -> pd.DataFrame:
    """Linear CKA between layer l and l+1 of one checkpoint, on EWT dev words (first-subword vectors)."""
    model, tok = plmodels.load(path)
    sents = load_sentences("ewt:dev", n_sentences)
    store = extract(model, tok, sents, store_root, model_id=plmodels.checkpoint_hash(path),
                    key_extra=f"ewt:dev;{n_sentences}", progress=False)
    layers = [np.asarray(store.layer(l), dtype=np.float32) for l in range(store.n_layers)]
    m = cka_matrix(layers)
    return pd.DataFrame([{"layer": l, "value": float(m[l, l + 1])} for l in range(len(layers) - 1)])


TABLES = ("probing", "probing_summary", "heads_classes", "cross_heads", "cka_consecutive", "training_summary")


def analyse(out: Path, finals: dict[str, Path], dry: bool) -> None:
    """Analyse each checkpoint in `finals`; the tables keep the rows of systems analysed before."""
    probe_cfg = {**PROBE, **({"max_train_targets": 200, "max_eval_targets": 100, "n_boot": 0} if dry else {})}
    heads_cfg = {**HEADS, **({"max_sentences": 30, "n_boot": 0} if dry else {})}
    new: dict[str, list[pd.DataFrame]] = {k: [] for k in TABLES}
    for name, final in finals.items():
        log(f"analysing {name}")
        t = probe_model(final, out_dir=out, config=probe_cfg, model_name=name, progress=False)
        new["probing"].append(t["probing"])
        new["probing_summary"].append(t["probing_summary"])
        model = plmodels.load(final)[0]
        if model.kind != "bilm":  # an LSTM biLM has no heads
            new["heads_classes"].append(analyse_heads(final, out_dir=out, config=heads_cfg, model_name=name,
                                                      progress=False)["heads_classes"])
        if model.kind == "seq2seq":
            new["cross_heads"].append(analyse_cross_heads(final, out_dir=out, n_sentences=30 if dry else 500,
                                                          model_name=name, n_boot=0 if dry else 200)["cross_heads"])
        new["cka_consecutive"].append(consecutive_cka(final, out / "store", 100 if dry else 1000).assign(model=name))
        card = read_card(final)
        new["training_summary"].append(pd.DataFrame([{
            "model": name, "steps": card.steps, "tokens": card.tokens,
            **{k: v for k, v in card.metrics.items() if k.startswith("eval_")},
            "params": sum(p.numel() for p in model.parameters()), "objective": card.objective}]))
    tables = {}
    for k, dfs in new.items():
        old = out / "tables" / f"first_look_{k}.parquet"
        keep = [pd.read_parquet(old).query("model not in @finals")] if old.exists() else []
        if keep or dfs:
            tables[k] = pd.concat(keep + dfs, ignore_index=True)
            write_table(out, f"first_look_{k}", tables[k])
    (out / "summary.md").write_text(summary(tables))
    log(f"wrote {out / 'summary.md'}")


def md(df: pd.DataFrame) -> str:
    """A Markdown table, floats to 3 decimals."""
    return markdown_table(df.apply(lambda c: c.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)))


def summary(t: dict[str, pd.DataFrame]) -> str:
    p = t["probing"]
    out = ["## Training", "", md(t["training_summary"].drop(columns=["objective"])), ""]
    single = p[(p["mode"] == "single") & p["metric"].isin(["accuracy", "micro_f1"])]
    by_layer = single.groupby(["model", "task", "layer"])["value"].mean().reset_index()
    best = by_layer.loc[by_layer.groupby(["model", "task"])["value"].idxmax()]
    out += ["## Best layer per task (single-layer probe, in-sample maximum)", "",
            md(best.rename(columns={"layer": "best_layer", "value": "score"})), ""]
    out += ["## Single-layer score by layer", "",
            md(by_layer.pivot_table(index=["model", "task"], columns="layer", values="value").reset_index()), ""]
    sel = p[p["mode"] == "selectivity"]
    if len(sel):
        out += ["## Selectivity (task - control) by layer", "",
                md(sel.pivot_table(index=["model", "task"], columns="layer", values="value").reset_index()), ""]
    s = t["probing_summary"]
    out += ["## Probing summary (E_delta and the other per-task figures)", "",
            md(s.pivot_table(index=["model", "task"], columns="metric", values="value").reset_index()), ""]
    c = t["heads_classes"]
    c = c[c["primary"]] if "primary" in c.columns else c.drop_duplicates(["model", "layer", "head"])
    out += ["## Head roles (heads per primary role)", "",
            md(c.groupby(["model", "role"]).size().unstack(fill_value=0).reset_index()), ""]
    x = t.get("cross_heads")
    if x is not None and len(x):
        top = x.groupby(["model", "score"])["value"].agg(["max", "mean"]).reset_index()
        out += ["## Cross-attention heads (best head and mean over heads per score)", "", md(top), ""]
    k = t["cka_consecutive"]
    out += ["## Linear CKA between layer l and l + 1", "",
            md(k.pivot_table(index="model", columns="layer", values="value").reset_index()), ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--skip-train", action="store_true", help="analyse the finals already in OUT/train")
    ap.add_argument("--dry-run", action="store_true", help="3 steps each and tiny analyses: the plumbing only")
    ap.add_argument("--systems", default=",".join(BERT_FAMILY),
                    help=f"comma-separated, in training order (default the BERT family; all: {','.join(SYSTEMS)})")
    ap.add_argument("--summary-only", action="store_true", help="rewrite OUT/summary.md from OUT/tables/first_look_*")
    a = ap.parse_args()
    if a.summary_only:
        tables = {k: pd.read_parquet(a.out / "tables" / f"first_look_{k}.parquet") for k in TABLES
                  if (a.out / "tables" / f"first_look_{k}.parquet").exists()}
        (a.out / "summary.md").write_text(summary(tables))
        return
    systems = tuple(a.systems.split(","))
    if unknown := set(systems) - set(SYSTEMS):
        ap.error(f"--systems: unknown {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    if a.skip_train:
        finals = {n: a.out / "train" / n / "final" for n in systems if (a.out / "train" / n / "final").is_dir()}
    else:
        finals = train(a.out, a.minutes, a.dry_run, systems)
    analyse(a.out, finals, a.dry_run)


if __name__ == "__main__":
    main()
