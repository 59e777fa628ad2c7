"""How structure emerges during pretraining: probes and head scores over the log-spaced checkpoints of
one run (checkpoints/step_1, step_2, step_4, ... written by `plmodels.training`), against tokens seen.

Per checkpoint (and `final` when its step is not already a checkpoint):
- "lm":    held-out loss and accuracy on the run's own evaluation rows with the fixed mask
           (`plmodels.training.evaluation.Evaluator`: masked-token for encoders, next-token for decoders), plus
           the unigram loss on the same targets — the "unigram plateau" a model first sits on;
- "pos", "deps", ...: layer-wise linear probes (`workbench.analyses.probing.probe_model`, small caps, one
           seed, mode "single"): the best layer's score, layer 0's, and their difference
           (Tenney et al. 2019: layer 0 = the lexical baseline);
- "heads": `workbench.analyses.heads` on a few hundred UD EWT sentences: the largest share of one
           head's argmax at offset -1 / +1 on words (`positional_max`) and on tokens
           (`positional_max_tokens`; Voita et al. 2019: >= 0.9 is a positional head), and the det /
           case head margins over the best fixed offset (Clark et al. 2019, sec. 4.2). A model
           without heads (ELMo's LSTMs) has no "heads" rows.
- "pairs:<suite>:<phenomenon>:<variant>" (with `pairs`: PairsRunConfig fields): minimal-pair accuracy
           (`workbench.analyses.minimal_pairs`, docs/behaviour.md) by the kind's first scorer, pooled over
           the phenomenon's conditions: metrics accuracy, accuracy_low, accuracy_high (bootstrap over
           items), n_items, and its floors (floor:chance, floor:frequency, floor:bigram,
           floor:random_init). The floors are scored once, on the first checkpoint analysed, and
           repeated on every step: none of them reads the trained weights (the corpus, the run's one
           tokenizer and the freshly initialised architecture are the same at every step). Does
           behaviour lag the probes (Zhang et al. 2021)? The pairs rows beside the probe rows say.

The tidy `emergence` table: model, step, tokens, task_or_score, metric, value (`workbench emergence`
also draws each score against tokens seen into out_dir/emergence.html).

Also here: `bigram_baseline`, the perplexity a smoothed bigram model gets on a decoder's evaluation
targets — the next rung above the unigram baseline that `plmodels.training` reports.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.checkpoint import training_seed
from plmodels.config import Config
from plmodels.families import family
from plmodels.progress import progress as progress_bar
from plmodels.tokenizer import Tokenizer
from plmodels.training import load_config
from plmodels.training.corpus import PackedDataset
from plmodels.training.data import token_cache
from plmodels.training.distributed import Dist
from plmodels.training.evaluation import Evaluator
from plmodels.training.loop import read_run_config
from plmodels.training.masking import IGNORE_INDEX
from probes.sentence_scores import SCORERS
from workbench.analyses.heads import analyse_loaded, summarise_heads
from workbench.analyses.minimal_pairs import CORPUS_FLOORS, PairsRunConfig, score_pairs_model
from workbench.analyses.probing import probe_model
from workbench.core.results import write_table

COLUMNS = ["model", "step", "tokens", "task_or_score", "metric", "value"]
_STEP_RE = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class EmergenceConfig(Config):
    """Caps that keep one checkpoint's analysis to a minute or two on a CPU."""

    tasks: tuple[str, ...] = ("pos", "deps")  # edge-probing tasks (workbench.data.tasks)
    probe: str = "linear"                     # probes.edge.PROBES name
    max_train_targets: int = 2000
    max_eval_targets: int = 1000
    max_epochs: int = 5
    head_sentences: int | None = 200          # UD EWT dev/test sentences for the head scores (None = skip)
    lm: bool = True                           # held-out loss / accuracy per checkpoint
    eval_sequences: int | None = 64           # held-out rows for "lm" (None = the run's own setting)
    include_final: bool = True
    steps: tuple[int, ...] | None = None      # analyse only these checkpoint steps (None = all)
    pairs: dict | None = None                 # PairsRunConfig fields: minimal-pair accuracy per checkpoint (None = skip)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if self.pairs is not None:
            PairsRunConfig.resolve(self.pairs)   # bad fields fail here, before any checkpoint is read
        if self.steps is not None:
            object.__setattr__(self, "steps", tuple(int(s) for s in self.steps))
        for name, low in (("max_train_targets", 2), ("max_eval_targets", 2), ("max_epochs", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"EmergenceConfig.{name} must be >= {low}, got {getattr(self, name)}")
        if self.head_sentences is not None and self.head_sentences < 1:
            raise ValueError(f"EmergenceConfig.head_sentences must be >= 1 or null, got {self.head_sentences}")


def checkpoints(run_folder: str | Path, include_final: bool = True) -> list[tuple[int, int, Path]]:
    """(step, tokens, folder) of every finished checkpoint of a run, by step; `final` is added when
    its step is not already there. Unfinished folders (no train_state.json) are skipped."""
    run = Path(run_folder)
    found: dict[int, tuple[int, int, Path]] = {}
    folders = sorted((run / "checkpoints").glob("step_*")) + ([run / "final"] if include_final else [])
    for d in folders:
        state = d / "train_state.json"
        if not state.is_file() or (d.name != "final" and not _STEP_RE.match(d.name)):
            continue
        info = json.loads(state.read_text(encoding="utf-8"))
        found.setdefault(int(info["step"]), (int(info["step"]), int(info["tokens"]), d))
    if not found:
        raise FileNotFoundError(f"{run}: no finished checkpoint under checkpoints/step_*/ or final/")
    return [found[s] for s in sorted(found)]


# ------------------------------------------------------------------------------------ the scores
def _rows(model: str, step: int, tokens: int, task: str, values: Mapping[str, float]) -> list[dict]:
    return [{"model": model, "step": step, "tokens": tokens, "task_or_score": task, "metric": k,
             "value": float(v)} for k, v in values.items()]


class HeldOutEval:
    """The run's own held-out rows and fixed mask, built once and scored on each checkpoint
    (`self.evaluator` is the trainer's `Evaluator`, so any model with the run's tokenizer can be
    scored on the same task; `__call__` scores in fp32). `eval_sequences` and `eval_seq_len`
    (None: the run's) score on more rows or on rows of another length."""

    def __init__(self, run: Path, eval_sequences: int | None, eval_name: str = "eval",
                 eval_seq_len: int | None = None):


        cfg = read_run_config(run)
        if cfg is None:
            raise FileNotFoundError(f"{run}: not a pretraining run folder (no resolved config)")
        # more rows, or rows of another length (the same stream, seed and mask rule)
        over = {k: v for k, v in (("eval_sequences", eval_sequences), ("eval_seq_len", eval_seq_len)) if v is not None}
        cfg = load_config(cfg, over)
        sources = {"eval": (cfg.eval_source, cfg.eval_split), **{k: tuple(v) for k, v in cfg.extra_eval.items()}}
        if eval_name not in sources:
            raise ValueError(f"{run}: no held-out set {eval_name!r}; the run has {sorted(sources)}")
        src, split = sources[eval_name]
        self.ok = src is not None
        if not self.ok:
            return
        tok = Tokenizer.load(run / "tokenizer")
        train = token_cache(cfg.train_source, cfg.train_split, cfg, tok, run, Dist(), cfg.max_train_texts)
        counts = torch.from_numpy(np.bincount(train, minlength=tok.vocab_size)).double()
        log_unigram = ((counts + 1) / (counts.sum() + tok.vocab_size)).log()
        ids = token_cache(src, split, cfg, tok, run, Dist())
        ds = PackedDataset.for_tokenizer(ids, cfg.heldout_len, cfg.seed, tok)
        self.evaluator = Evaluator(eval_name, ds, cfg, tok, log_unigram, torch.device("cpu"))
        self.train_ids, self.kind, self.tokenizer = train, cfg.kind, tok

    def __call__(self, model) -> dict[str, float]:
        m = self.evaluator(model, autocast=False)
        return {k: m[k] for k in ("loss", "acc", "unigram_loss")}


def probe_scores(path: Path, out_dir: Path, cfg: EmergenceConfig) -> dict[str, dict[str, float]]:
    """{task: {"best": best-layer score, "layer0": layer-0 score, "gain": best - layer0,
    "best_layer": l}} from linear probes on every layer (metric: the probing table's first metric);
    the best layer is chosen on held-out items (l = -1 when the two halves of them disagree)."""

    pcfg = {"tasks": list(cfg.tasks), "probes": [cfg.probe], "modes": ["single"], "seeds": [0],
            "max_train_targets": cfg.max_train_targets, "max_eval_targets": cfg.max_eval_targets,
            "max_epochs": cfg.max_epochs, "n_boot": 0}
    t = probe_model(path, out_dir=out_dir, config=pcfg, model_name=path.name, progress=False)["probing"]
    t = t[t["mode"].isin(["single", "best"]) & (t["seed"] != -1)]
    out = {}
    for task, g in t.groupby("task"):
        metric = "accuracy" if "accuracy" in set(g["metric"]) else sorted(g["metric"])[0]
        g = g[g["metric"] == metric]
        by_layer = g[(g["mode"] == "single") & (g["layer"] >= 0)].groupby("layer")["value"].mean()
        held_out = g[g["mode"] == "best"]       # chosen on held-out items (probes.layers.cross_fit_best)
        if len(held_out):
            best, layer = float(held_out["value"].mean()), int(held_out["layer"].iloc[0])
        else:                                   # a single layer: nothing to choose
            layer = int(by_layer.idxmax())
            best = float(by_layer[layer])
        out[task] = {f"{metric}_best": best, f"{metric}_layer0": by_layer.get(0, np.nan),
                     f"{metric}_gain": best - by_layer.get(0, np.nan), "best_layer": layer}
    return out


def head_scores(model, tokenizer, out_dir: Path, n_sentences: int,
                trained_under: int | None = None) -> dict[str, float]:
    """Positional share (max over heads of offset -1 / +1, on words and on tokens), det / case margins
    (Clark et al. 2019) and the number of heads with a syntactic role (a role beats the random-init floor
    drawn under the checkpoint's pretraining seed `trained_under` plus the heads' seed)."""

    cfg = {"max_sentences": n_sentences, "freq_source": "ewt:train", "similarity_max_words": 100, "n_boot": 0,
           "induction_sequences": 2, "induction_length": 20}
    tables = analyse_loaded(model, tokenizer, out_dir=out_dir, config=cfg, store_root=out_dir / "store",
                            progress=False, trained_under=trained_under)
    out = summarise_heads(tables["heads"], tables["relations"])
    out["n_syntactic_heads"] = float(tables["heads_classes"]["role"].str.startswith("syntactic").sum())
    return out


def pair_scores(path: Path, cfg: PairsRunConfig, cache_dir: Path,
                floors: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    """{"pairs:<suite>:<phenomenon>:<variant>": {"accuracy", "accuracy_low", "accuracy_high", "n_items",
    and "floor:<name>" for each floor}} of one checkpoint, by the first scorer (SCORERS order) of its
    kind, pooled over conditions. With `floors` (this function's output on another checkpoint of the
    same run) the floors are not scored again but copied from it."""
    run_cfg = PairsRunConfig.resolve({**cfg.to_dict(), "floors": ()}) if floors is not None else cfg
    t = score_pairs_model(path, config=run_cfg, model_name=path.name, progress=False,
                          cache_dir=cache_dir)["minimal_pairs"]
    t = t[t["condition"] == "all"]
    own = [s for s in t["scorer"].unique() if not s.startswith("floor:")]
    scorer = min(own, key=lambda n: list(SCORERS).index(n))
    # each floor on the scorer's own items (floor:<floor>:<scorer>) where the table has it, else pooled
    floor_of = {**{f"floor:{f}": f"floor:{f}" for f in CORPUS_FLOORS},
                **{f"floor:{f}:{scorer}": f"floor:{f}" for f in (*CORPUS_FLOORS, "random_init")}}
    out: dict[str, dict[str, float]] = {}
    for (suite, phenomenon, variant), g in t.groupby(["suite", "phenomenon", "variant"]):
        key = f"pairs:{suite}:{phenomenon}:{variant}"
        r = g[g["scorer"] == scorer]
        if not len(r):   # no item of this phenomenon could be scored by this scorer
            continue
        r = r.iloc[0]
        out[key] = {"accuracy": r["value"], "accuracy_low": r["ci_low"], "accuracy_high": r["ci_high"],
                    "n_items": r["n_items"]}
        if floors is not None:
            out[key].update({k: v for k, v in floors.get(key, {}).items() if k.startswith("floor:")})
        else:
            value = dict(zip(g["scorer"], g["value"]))
            out[key].update({to: float(value[f]) for f, to in floor_of.items() if f in value})  # own after pooled
    return out


# ------------------------------------------------------------------------------------ the run
def emergence(run_folder: str | Path, out_dir: str | Path, tasks: Sequence[str] = ("pos", "deps"),
              config: "EmergenceConfig | Mapping | None" = None, model_name: str | None = None,
              progress: bool = True) -> pd.DataFrame:
    """The `emergence` table over every checkpoint of one pretraining run (see module docstring).

    Writes out_dir/tables/emergence.parquet; returns the table, sorted by (step, task_or_score, metric).
    """

    cfg = config if isinstance(config, EmergenceConfig) else EmergenceConfig.from_dict(
        {"tasks": tuple(tasks), **dict(config or {})})
    run, out_dir = Path(run_folder), Path(out_dir)
    name = model_name or run.name
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpts = checkpoints(run, cfg.include_final)
    if cfg.steps is not None:
        missing = sorted(set(cfg.steps) - {s for s, _, _ in ckpts})
        if missing:
            raise ValueError(f"{run}: no checkpoint at steps {missing}; found {[s for s, _, _ in ckpts]}")
        ckpts = [c for c in ckpts if c[0] in cfg.steps]
    lm = HeldOutEval(run, cfg.eval_sequences) if cfg.lm and read_run_config(run) is not None else None
    pairs_cfg = PairsRunConfig.resolve(cfg.pairs) if cfg.pairs is not None else None
    pair_floors = None
    rows: list[dict] = []
    with progress_bar(len(ckpts), f"emergence {name}", "ckpt", disable=not progress) as bar:
        for step, tokens, path in ckpts:
            bar.set_postfix_str(f"step {step}", refresh=False)
            model, tok = plmodels.load(path)
            work = out_dir / "work" / path.name
            if lm is not None and lm.ok:
                rows += _rows(name, step, tokens, "lm", lm(model))
            if cfg.tasks:
                for task, vals in probe_scores(path, work / "probes", cfg).items():
                    rows += _rows(name, step, tokens, task, vals)
            if cfg.head_sentences and any(model.n_heads_per_layer):  # an LSTM biLM has no heads to score
                heads = head_scores(model, tok, work / "heads", cfg.head_sentences, training_seed(path))
                rows += _rows(name, step, tokens, "heads", heads)
            if pairs_cfg is not None:
                got = pair_scores(path, pairs_cfg, out_dir / "cache" / "minimal_pairs", pair_floors)
                pair_floors = pair_floors if pair_floors is not None else got
                for task, vals in got.items():
                    rows += _rows(name, step, tokens, task, vals)
            bar.update(1)
    df = pd.DataFrame(rows, columns=COLUMNS).sort_values(["step", "task_or_score", "metric"], kind="stable")
    df = df.reset_index(drop=True)

    write_table(out_dir, "emergence", df)
    return df


def emergence_cli(run_folder: str | Path, out_dir: str | Path, config=None,
                  overrides: dict | None = None) -> dict[str, pd.DataFrame]:
    """CLI / pipeline entry: config is None, a dict of EmergenceConfig fields, a JSON path or an
    EmergenceConfig; `overrides` apply last."""
    return {"emergence": emergence(run_folder, out_dir, config=EmergenceConfig.resolve(config, overrides))}


# ------------------------------------------------------------------------------------ n-gram baseline
def _bigram_counts(ids: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = ids[:-1].astype(np.int64) * vocab + ids[1:].astype(np.int64)
    uniq, cnt = np.unique(keys, return_counts=True)
    ctx = np.bincount(ids[:-1].astype(np.int64), minlength=vocab).astype(np.float64)
    return uniq, cnt.astype(np.float64), ctx


def _bigram_logp(prev: np.ndarray, nxt: np.ndarray, counts, log_uni: np.ndarray, beta: float, vocab: int) -> np.ndarray:
    uniq, cnt, ctx = counts
    keys = prev.astype(np.int64) * vocab + nxt.astype(np.int64)
    pos = np.clip(np.searchsorted(uniq, keys), 0, len(uniq) - 1)
    c = np.where(uniq[pos] == keys, cnt[pos], 0.0)
    return np.log((c + beta * np.exp(log_uni[nxt])) / (ctx[prev] + beta))


def bigram_baseline(train_ids: np.ndarray, prev: np.ndarray, targets: np.ndarray, vocab: int,
                    betas: Sequence[float] = (0.1, 1.0, 10.0, 100.0, 1000.0)) -> dict[str, float]:
    """Unigram and bigram cross-entropy (nats) and perplexity on (prev -> target) pairs.

    Unigram: p(w) = (c(w) + 1) / (N + V) (add-one, as `plmodels.training`). Bigram with a Dirichlet
    prior on the unigram (MacKay & Peto 1995): p(w | v) = (c(v, w) + beta p(w)) / (c(v) + beta).
    beta is chosen from `betas` on the last 5% of `train_ids` with counts from the first 95%, then
    the counts are redone on all of `train_ids`. Returns unigram_loss, unigram_ppl, bigram_loss,
    bigram_ppl, beta.
    """
    train_ids = np.asarray(train_ids)
    prev, targets = np.asarray(prev, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    if prev.shape != targets.shape or prev.size == 0:
        raise ValueError(f"prev and targets must be equal, non-empty shapes; got {prev.shape}, {targets.shape}")
    if len(train_ids) < 40:
        raise ValueError(f"train_ids too short for a bigram baseline ({len(train_ids)} ids)")

    def log_unigram(ids):
        c = np.bincount(ids.astype(np.int64), minlength=vocab).astype(np.float64)
        return np.log((c + 1) / (c.sum() + vocab))

    cut = int(len(train_ids) * 0.95)
    fit, held = train_ids[:cut], train_ids[cut:]
    counts, lu = _bigram_counts(fit, vocab), log_unigram(fit)
    losses = {b: -_bigram_logp(held[:-1], held[1:], counts, lu, b, vocab).mean() for b in betas}
    beta = min(losses, key=losses.get)
    counts, lu = _bigram_counts(train_ids, vocab), log_unigram(train_ids)
    uni = float(-lu[targets].mean())
    bi = float(-_bigram_logp(prev, targets, counts, lu, beta, vocab).mean())
    return {"unigram_loss": uni, "unigram_ppl": math.exp(uni), "bigram_loss": bi, "bigram_ppl": math.exp(bi),
            "beta": float(beta)}


def decoder_baselines(run_folder: str | Path, eval_sequences: int | None = None,
                      eval_name: str = "eval") -> dict[str, float]:
    """`bigram_baseline` on exactly the held-out targets the decoder run is evaluated on: its main
    held-out set ("eval") or one of its `extra_eval` sets by name (e.g. "wikitext2"). With a
    byte-level BPE tokenizer it also gives `bytes_per_target` and the baselines in bits per byte
    (`unigram_bpb`, `bigram_bpb`); `bits_per_byte(card eval_loss, bytes_per_target)` is the model's."""


    ev = HeldOutEval(Path(run_folder), eval_sequences, eval_name)
    if not ev.ok or family(ev.kind).lm_inputs != "causal":
        raise ValueError(f"{run_folder}: a bigram baseline needs a decoder run with an eval_source")
    prev, tgt = [], []
    for b in ev.evaluator.batches:
        sel = b.labels != IGNORE_INDEX
        prev.append(b.input_ids[sel].cpu())
        tgt.append(b.labels[sel].cpu())
    targets = torch.cat(tgt).numpy()
    out = bigram_baseline(np.asarray(ev.train_ids), torch.cat(prev).numpy(), targets, ev.tokenizer.vocab_size)
    if ev.tokenizer.kind == "bpe":  # byte-level: a loss per byte compares runs with other vocabularies
        out["bytes_per_target"] = float(token_bytes(ev.tokenizer)[targets].mean())
        for name in ("unigram", "bigram"):
            out[f"{name}_bpb"] = bits_per_byte(out[f"{name}_loss"], out["bytes_per_target"])
    return out


def token_bytes(tok) -> np.ndarray:
    """(V,) UTF-8 bytes each id of a byte-level BPE tokenizer stands for (0 for special tokens).
    Every character of a byte-level token string stands for one byte (GPT-2's byte-to-unicode map)."""
    if tok.kind != "bpe":
        raise ValueError(f"token_bytes needs a byte-level BPE tokenizer, got kind {tok.kind!r}")
    special = tok.special_ids
    return np.array([0 if i in special else len(tok.id_to_token(i) or "") for i in range(tok.vocab_size)],
                    dtype=np.int64)


def bits_per_byte(loss_nats: float, bytes_per_target: float) -> float:
    """Mean loss per target token (nats) -> bits per UTF-8 byte of the text those targets spell:
    loss / ln 2 / bytes per target. Unlike perplexity per token it does not depend on the vocabulary,
    so decoders with different tokenizers compare on the same held-out text."""
    return loss_nats / math.log(2) / bytes_per_target
