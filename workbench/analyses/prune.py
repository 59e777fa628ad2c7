"""Head importance and pruning runs on a checkpoint: the glue around `probes.importance`,
`probes.l0` and `probes.pruning` (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better
than One?"; Voita et al. 2019, "Analyzing Multi-Head Self-Attention").

`prune_model_cli(path, methods, out_dir, config)`:
1. builds the evaluation batches the checkpoint's objective needs (`EVAL_DATA` registry):
   masked-LM loss on Gutenberg-valid windows or EWT-dev sentences with a fixed mask seed (encoders),
   perplexity on the same text (decoders), or dev accuracy of a finetuned classifier (a folder with
   `finetune.json` + `head.safetensors`, see `plmodels.training.finetune`);
2. scores every head with each method (`METHODS` registry: michel, ablation, confidence, l0; random
   is the baseline order) -> `importance` (model, method, layer, head, value);
3. masks 0, 10, ..., 100 % of the heads in increasing score order (random orders per seed; with
   `rescore` Michel scores are recomputed after each step, Michel Sec. 4.2), measured on *held-out*
   batches: the scores come from the first `n_sequences` evaluation sequences, the curves and the
   real pruning from the next `n_sequences` (`heldout: false` is the variant that measures on the
   scoring batches, which flatters every method's order) -> `pruning` (model,
   method, fraction, metric, value, seed); the L0 lambda sweep adds method "l0_sweep" rows whose
   fraction is the share of closed gates; `prunable` says how many heads can go for 1 % / 5 % loss;
4. Kendall tau between the methods' orders -> `kendall`; a join with head roles (`heads_classes`
   given or found in the run) -> `roles_importance`;
5. really prunes `prune_fraction` (default half) of the heads in Michel order with
   `model.prune_heads`, saves the smaller checkpoint under out_dir/pruned (safetensors), checks its
   outputs equal masking and measures parameters, bytes and tokens/s against the full model ->
   `pruned_speed` (model, variant, params, bytes, tokens_per_s).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

import plmodels
from plmodels.components.pruning import shared_attention_groups
from plmodels.config import Config
from plmodels.checkpoint import read_card
from plmodels.families import FAMILIES, family_of
from plmodels.progress import progress as progress_bar
from plmodels.progress import write
from plmodels.training.config import PLMArgs
from plmodels.training.corpus import iter_texts
from plmodels.training.data import plm_batch
from plmodels.training.finetune import HEAD_FILE, INFO_FILE, collate, encode, load_classifier
from plmodels.training.masking import mask_tokens, step_generator
from probes.heads import weighting_rows
from probes.importance import (
    ablation_importance,
    confidence_importance,
    forward,
    importance_frame,
    michel_importance,
    ones_mask,
)
from probes.l0 import l0_importance, l0_sweep
from probes.pruning import (
    DEFAULT_FRACTIONS,
    METRICS,
    Metric,
    heads_to_prune_for_loss,
    kendall_table,
    measure_speed_and_size,
    prune_model,
    pruning_curve,
    random_pruning_curves,
    roles_vs_importance,
)
from workbench.analyses.cross_heads import denoising_objective, noise_rows
from workbench.analyses.probing import default_model_name
from workbench.core.io import atomic_write_json
from workbench.core.paths import dataset_dir
from workbench.core.results import find_run_table, write_table
from workbench.data.finetuning import load_task_data
from workbench.data.tasks import ud_sentences

SPEED_COLUMNS = ["model", "variant", "params", "bytes", "tokens_per_s"]
IGNORE = -100


# ------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class PruneRunConfig(Config):
    """A pruning run. The defaults here are the canonical values (configs/prune.json is a copy of
    them to edit and pass with --config); unknown keys and wrong types are errors."""

    methods: tuple[str, ...] = ("michel", "ablation", "confidence", "l0", "random")
    eval_data: str = "auto"              # auto | gutenberg | ewt | classifier (auto: classifier for a
                                         # finetuned folder, else gutenberg)
    n_sequences: int = 64                # evaluation sequences (LM) or dev examples (classifier) to score
                                         # heads on; as many again, held out, measure the curves
    heldout: bool = True                 # curves on held-out batches (False: on the scoring batches)
    seq_len: int = 128                   # tokens per sequence
    batch_size: int = 16
    mask_seed: int = 0                   # fixed MLM corruption of the evaluation batches
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    random_seeds: tuple[int, ...] = (0, 1, 2)
    rescore: bool = False                # iterative Michel pruning (re-score after every step)
    granularity: str = "token"           # Michel |dL/dxi| per token | example | batch
    l0_lambdas: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1)
    l0_lambda: float = 0.03              # lambda whose learned log_alpha is the "l0" importance
    l0_steps: int = 100
    l0_lr: float = 0.1
    tolerances: tuple[float, ...] = (0.01, 0.05)
    prune_fraction: float = 0.5          # share of heads really cut out (Michel order)
    speed_repeats: int = 3
    speed_batches: int = 2
    num_threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("methods", "fractions", "random_seeds", "l0_lambdas", "tolerances"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
                raise ValueError(f"PruneRunConfig.{name} must be a list, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        bad = [m for m in self.methods if m not in METHODS and m != "random"]
        if bad or not self.methods:
            raise ValueError(f"PruneRunConfig.methods: unknown {bad}; choose from {sorted(METHODS) + ['random']}")
        if self.eval_data not in ("auto", *EVAL_DATA):
            raise ValueError(f"PruneRunConfig.eval_data={self.eval_data!r}; choose auto or one of {sorted(EVAL_DATA)}")
        if self.granularity not in ("token", "example", "batch"):
            raise ValueError(f"PruneRunConfig.granularity={self.granularity!r}; choose token, example or batch")
        if 0.0 not in self.fractions or any(not 0 <= f <= 1 for f in self.fractions):
            raise ValueError(f"PruneRunConfig.fractions must lie in [0, 1] and include 0, got {self.fractions}")
        if not 0 < self.prune_fraction < 1:
            raise ValueError(f"PruneRunConfig.prune_fraction must be in (0, 1), got {self.prune_fraction}")
        for name in ("n_sequences", "seq_len", "batch_size", "l0_steps", "speed_repeats", "speed_batches"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"PruneRunConfig.{name} must be a positive int, got {getattr(self, name)!r}")

# ------------------------------------------------------------------------- evaluation data
@dataclass
class Objective:
    """What the heads are scored against: batches, the differentiable loss and the curve metric."""

    batches: list[dict]                 # the heads are scored on these
    loss: Callable                      # BatchStat (model, batch, head_mask) -> (total, count)
    metric: Metric
    description: str
    curve_batches: list[dict] = None    # pruning curves and real pruning are measured on these
    special_ids: tuple[int, ...] = ()   # [CLS]/[SEP]/BOS ids: not words, for Voita's confidence

    def __post_init__(self) -> None:
        if self.curve_batches is None:
            self.curve_batches = self.batches


def is_finetuned(path: str | Path) -> bool:
    """A `plmodels.training.finetune` checkpoint folder (finetune.json + head.safetensors)."""

    return (Path(path) / INFO_FILE).is_file() and (Path(path) / HEAD_FILE).is_file()


def _pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def gutenberg_sequences(tok, n: int, seq_len: int) -> list[list[int]]:
    """n windows of seq_len tokens from the start of Gutenberg valid (with [CLS]/[SEP] or BOS)."""

    pre, post = tok.special_affixes   # [CLS] ... [SEP] (BERT, RoBERTa) or BOS ... (GPT-2 style)
    body = seq_len - len(pre) - len(post)
    ids: list[int] = []
    for text in iter_texts(dataset_dir("gutenberg_pd"), "valid"):
        for k in range(0, len(text), 20_000):  # books are long: encode in slices until enough
            ids += tok.encode(text[k:k + 20_000], add_special=False)
            if len(ids) >= n * body:
                break
        if len(ids) >= n * body:
            break
    chunks = [ids[i * body:(i + 1) * body] for i in range(min(n, len(ids) // body))]
    return [pre + c + post for c in chunks]


def ewt_sequences(tok, n: int, seq_len: int) -> list[list[int]]:
    """The first n EWT-dev sentences as subword ids (specials added), truncated to seq_len."""

    out = []
    for s in ud_sentences("ewt", "dev")[:n]:
        ids = tok.encode(" ".join(s.words))
        out.append(ids[:seq_len])
    return out


def _halves(items: list, heldout: bool) -> tuple[list, list]:
    """(scoring, curve) parts: the first and second halves, or the same list twice without heldout."""
    if not heldout:
        return items, items
    if len(items) < 2:
        raise ValueError(f"held-out pruning curves need at least 2 evaluation items, got {len(items)}")
    half = (len(items) + 1) // 2
    return items[:half], items[half:]


def lm_objective(model, tok, seqs: list[list[int]], cfg: PruneRunConfig, source: str,
                 plm: PLMArgs | None = None) -> Objective:
    """MLM loss with a fixed corruption (encoder) or causal-LM perplexity (decoder) batches; the
    first half of `seqs` scores the heads, the second half (held out) measures the curves."""

    score, curve = _halves(seqs, cfg.heldout)
    batches = _lm_batches(model, tok, score, cfg, 0, plm)
    curve_batches = batches if curve is score else _lm_batches(model, tok, curve, cfg, len(batches), plm)
    split = (f"heads scored on {len(score)}, curves on {len(curve)} held-out {source} sequences" if cfg.heldout
             else f"{len(seqs)} {source} sequences (scores and curves on the same)")
    metric = METRICS[family_of(model).lm_metric]  # the family's LM statistic (plmodels/families.py)
    return Objective(batches, metric.stat, metric, f"{family_of(model).lm_name}: {split} (mask seed {cfg.mask_seed})",
                     curve_batches, tuple(tok.special_ids))


def seq2seq_objective(model, tok, path: Path, seqs: list[list[int]], cfg: PruneRunConfig, source: str) -> Objective:
    """The checkpoint's own denoising loss (T5 span corruption, BART infilling, replayed with
    `mask_seed`), teacher-forced: heads of the encoder's self-, the decoder's self- and the
    cross-attention are scored together (rows of `Seq2Seq.all_heads_per_layer`)."""
    objective, args, _ = denoising_objective(path)
    score, curve = _halves(seqs, cfg.heldout)
    gen = torch.Generator().manual_seed(cfg.mask_seed)
    limit = int(model.config.max_positions)

    def batched(part: list[list[int]]) -> list[dict]:
        examples = noise_rows([torch.tensor(s, dtype=torch.long) for s in part], tok, objective, args, gen)
        examples = [e for e in examples if len(e.inputs) <= limit and len(e.targets) <= limit]
        out = []
        for i in range(0, len(examples), cfg.batch_size):
            chunk = examples[i:i + cfg.batch_size]
            ids, mask = _pad([e.inputs.tolist() for e in chunk], tok.pad_id if tok.pad_id is not None else 0)
            labels, dec_mask = _pad([e.targets.tolist() for e in chunk], IGNORE)
            out.append({"input_ids": ids, "attention_mask": mask, "labels": labels,
                        "decoder_input_ids": model.shift_right(labels), "decoder_attention_mask": dec_mask})
        return out

    batches = batched(score)
    curve_batches = batches if curve is score else batched(curve)
    split = (f"heads scored on {len(score)}, curves on {len(curve)} held-out {source} sequences" if cfg.heldout
             else f"{len(seqs)} {source} sequences (scores and curves on the same)")
    metric = METRICS["denoising_loss"]
    return Objective(batches, metric.stat, metric, f"{objective} denoising loss, teacher-forced: {split} "
                     f"(noise seed {cfg.mask_seed})", curve_batches, tuple(tok.special_ids))


def _masked_batch(ids, mask, tok, cfg: PruneRunConfig, b: int, plm: PLMArgs | None) -> dict:
    """An encoder's batch: its fixed MLM corruption, seeded by the batch index."""
    specials = set(tok.special_ids) | {tok.pad_id}
    ids, labels = mask_tokens(ids, mask_id=tok.mask_id, vocab_size=tok.vocab_size, special_ids=specials,
                              generator=step_generator(cfg.mask_seed, b))
    labels[mask == 0] = IGNORE
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _permutation_batch(ids, mask, tok, cfg: PruneRunConfig, b: int, plm: PLMArgs | None) -> dict:
    """XLNet's batch: a fixed factorisation order and targets per row, seeded by the batch index."""
    pb = plm_batch(ids, tok, plm or PLMArgs(), step_generator(cfg.mask_seed, b), torch.device("cpu"))
    return {"input_ids": pb.input_ids, "labels": pb.labels, **{k: v for k, v in pb.extras.items() if v is not None}}


def _plain_batch(ids, mask, tok, cfg: PruneRunConfig, b: int, plm: PLMArgs | None) -> dict:
    """A causal or bidirectional LM's batch: the ids themselves are the targets."""
    return {"input_ids": ids, "attention_mask": mask}


# an LM batch per form of the family's LM input (plmodels.families.Family.lm_inputs)
LM_BATCHES: dict[str, Callable] = {"masked": _masked_batch, "permutation": _permutation_batch,
                                   "causal": _plain_batch, "bidirectional": _plain_batch}


def _lm_batches(model, tok, seqs: list[list[int]], cfg: PruneRunConfig, first_batch: int,
                plm: PLMArgs | None = None) -> list[dict]:
    """Padded batches of `seqs` in the form the model's LM statistic reads (`LM_BATCHES`)."""
    make = LM_BATCHES[family_of(model).lm_inputs]
    batches = []
    for b, i in enumerate(range(0, len(seqs), cfg.batch_size), start=first_batch):
        ids, mask = _pad(seqs[i:i + cfg.batch_size], tok.pad_id if tok.pad_id is not None else 0)
        batches.append(make(ids, mask, tok, cfg, b, plm))
    return batches


def classifier_stats(head: torch.nn.Module, kind: str) -> tuple[Callable, Callable]:
    """(loss, correct) batch statistics of a finetuned head on the (head-masked) base model.

    Sentence tasks use the pooled [CLS] (encoder) or the last real token (decoder), token tasks
    every first subword (labels -100 elsewhere), as in `plmodels.training.finetune.Classifier`.
    """
    def logits_labels(model, batch, head_mask):
        out = forward(model, batch, head_mask)
        labels = batch["labels"]
        if kind == "token":
            keep = labels != IGNORE
            return head(out.last_hidden_state[keep]), labels[keep]
        # the sentence vector the classifier was trained on (Classifier.features: the family's)
        return head(family_of(model).sentence_features(model, out, batch["attention_mask"])), labels

    def loss(model, batch, head_mask):
        logits, labels = logits_labels(model, batch, head_mask)
        return F.cross_entropy(logits.float(), labels, reduction="sum"), torch.tensor(len(labels))

    def correct(model, batch, head_mask):
        logits, labels = logits_labels(model, batch, head_mask)
        return (logits.argmax(-1) == labels).sum().float(), torch.tensor(len(labels))

    return loss, correct


def classifier_objective(path: Path, cfg: PruneRunConfig):
    """(base model, tokenizer, Objective) for a finetuned folder: accuracy on its task's dev split."""

    clf = load_classifier(path)
    info = clf.info
    data = load_task_data(info["task"], max_train=1, max_dev=cfg.n_sequences * (2 if cfg.heldout else 1))
    dev, n_trunc = encode(data.dev, data.kind, clf.tokenizer, cfg.seq_len)
    score, curve = _halves(dev, cfg.heldout)

    def batched(examples):
        out = []
        for i in range(0, len(examples), cfg.batch_size):
            ids, mask, labels = collate(examples[i:i + cfg.batch_size], data.kind, clf.pad_id)
            out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
        return out

    batches = batched(score)
    curve_batches = batches if curve is score else batched(curve)
    for p in clf.head.parameters():
        p.requires_grad_(False)
    loss, correct = classifier_stats(clf.head, data.kind)
    metric = Metric(f"{info['task']}_accuracy", correct, higher_is_better=True)
    split = (f"heads scored on {len(score)}, curves on {len(curve)} held-out dev examples" if cfg.heldout
             else f"{len(dev)} dev examples (scores and curves on the same)")
    desc = f"{info['task']} dev accuracy: {split} ({n_trunc} truncated to {cfg.seq_len})"
    return clf.base, clf.tokenizer, Objective(batches, loss, metric, desc, curve_batches,
                                              tuple(clf.tokenizer.special_ids))


EVAL_DATA: dict[str, Callable] = {"gutenberg": gutenberg_sequences, "ewt": ewt_sequences,
                                  "classifier": classifier_objective}


def build_objective(path: Path, cfg: PruneRunConfig):
    """(model, tokenizer, Objective) for the checkpoint at `path` (see EVAL_DATA and module docstring)."""

    source = cfg.eval_data
    if source == "auto":
        source = "classifier" if is_finetuned(path) else "gutenberg"
    if source == "classifier":
        if not is_finetuned(path):
            raise ValueError(f"{path}: eval_data='classifier' needs a finetuned folder (finetune.json + head.safetensors)")
        return classifier_objective(path, cfg)
    model, tok = plmodels.load(path)
    fam = family_of(model)
    if not fam.head_mask:
        raise ValueError(f"{path}: a {model.kind} model has no head mask; head importance and pruning read the "
                         f"families that take one: {sorted(k for k, f in FAMILIES.items() if f.head_mask)}")
    if tok is None:
        raise ValueError(f"{path}: the checkpoint has no tokenizer/ folder; pruning needs one")
    card = read_card(path)
    if not card.lm_head_trained:
        raise ValueError(f"{path}: its card says the LM head is untrained (import: "
                         f"{(card.import_report or {}).get('mlm_head', 'fresh init')}; objective: {card.objective_name}); "
                         "an LM loss would score heads against noise. Finetune it (plmodels.training.finetune) and prune "
                         "the finetuned folder, or set eval_data='classifier' on one.")
    n = cfg.n_sequences * (2 if cfg.heldout else 1)
    seqs = EVAL_DATA[source](tok, n, min(cfg.seq_len, int(model.config.max_positions)))
    if not seqs:
        raise ValueError(f"eval_data={source!r} gave no sequences")
    if fam.cross_attention:  # an encoder-decoder: its own denoising objective, replayed
        return model, tok, seq2seq_objective(model, tok, path, seqs, cfg, source)
    # XLNet: the partial prediction it was trained with (the card's objective_args), else PLMArgs' default
    plm = PLMArgs.from_dict(dict(card.objective_args)) if card.objective_name == "plm" else None
    return model, tok, lm_objective(model, tok, seqs, cfg, source, plm)


# --------------------------------------------------------------------------------- methods
def _michel(model, obj: Objective, cfg: PruneRunConfig) -> np.ndarray:
    return michel_importance(model, obj.batches, obj.loss, granularity=cfg.granularity)


def _ablation(model, obj: Objective, cfg: PruneRunConfig) -> np.ndarray:
    return ablation_importance(model, obj.batches, obj.metric)


def _confidence(model, obj: Objective, cfg: PruneRunConfig) -> np.ndarray:
    return confidence_importance(model, obj.batches, special_ids=obj.special_ids)


def _l0(model, obj: Objective, cfg: PruneRunConfig) -> np.ndarray:
    return l0_importance(model, obj.batches, obj.loss, lam=cfg.l0_lambda, steps=cfg.l0_steps, lr=cfg.l0_lr)


METHODS: dict[str, Callable[[Any, Objective, PruneRunConfig], np.ndarray]] = {
    "michel": _michel, "ablation": _ablation, "confidence": _confidence, "l0": _l0,
}


def _say(progress: bool, msg: str) -> None:
    if progress:
        write(f"[prune] {msg}")


def score_and_curves(model, obj: Objective, cfg: PruneRunConfig, methods: Sequence[str], name: str,
                     progress: bool = False) -> dict[str, pd.DataFrame]:
    """`importance`, `pruning` (+ "l0_sweep" rows) and `prunable` tables for one loaded model."""
    imp, curves = [], []
    n_heads = int(np.prod(ones_mask(model).shape))
    scored = [m for m in methods if m != "random"]
    rescore, sweep = "michel" in methods and cfg.rescore, "l0" in methods and bool(cfg.l0_lambdas)
    # one unit: one pruning curve (a method's scoring included), every fraction evaluated
    with progress_bar(len(scored) + rescore + ("random" in methods) + sweep, f"prune {name}", "curve",
                      disable=not progress) as bar:
        for m in scored:
            bar.set_postfix_str(m, refresh=False)
            t0 = time.perf_counter()
            scores = METHODS[m](model, obj, cfg)
            imp.append(importance_frame(scores, name, m))
            curves.append(pruning_curve(model, obj.curve_batches, obj.metric, scores, fractions=cfg.fractions,
                                        method=m, model_name=name))
            _say(progress, f"{name}: {m} scored and pruned in {time.perf_counter() - t0:.1f} s")
            bar.update(1)
        if rescore:
            bar.set_postfix_str("michel_rescored", refresh=False)
            scorer = lambda mask: michel_importance(model, obj.batches, obj.loss, head_mask=mask,  # noqa: E731
                                                    granularity=cfg.granularity)
            curves.append(pruning_curve(model, obj.curve_batches, obj.metric, scorer=scorer,
                                        fractions=cfg.fractions, method="michel_rescored", model_name=name))
            bar.update(1)
        if "random" in methods:
            bar.set_postfix_str("random", refresh=False)
            curves.append(random_pruning_curves(model, obj.curve_batches, obj.metric, seeds=cfg.random_seeds,
                                                fractions=cfg.fractions, model_name=name))
            bar.update(1)
        if sweep:
            bar.set_postfix_str("l0_sweep", refresh=False)
            res = l0_sweep(model, obj.batches, obj.loss, obj.metric, lams=cfg.l0_lambdas, model_name=name,
                           eval_batches=obj.curve_batches,
                           steps=cfg.l0_steps, lr=cfg.l0_lr)
            curves.append(pd.DataFrame({"model": name, "method": "l0_sweep",
                                        "fraction": 1.0 - res["n_open"] / n_heads, "metric": res["metric"],
                                        "value": res["value"], "seed": res["seed"]}))
            bar.update(1)
    pruning = pd.concat(curves, ignore_index=True)
    importance = pd.concat(imp, ignore_index=True) if imp else pd.DataFrame(
        columns=["model", "method", "layer", "head", "value"])
    ordered = pruning[pruning.method != "l0_sweep"]
    prunable = pd.concat([heads_to_prune_for_loss(ordered, tol, n_heads=n_heads,
                                                  higher_is_better=obj.metric.higher_is_better)
                          for tol in cfg.tolerances], ignore_index=True) if cfg.tolerances else pd.DataFrame()
    return {"importance": importance, "pruning": pruning, "prunable": prunable}


def michel_order_mask(scores: np.ndarray, fraction: float, groups: Sequence[Sequence[int]] = ()) -> torch.Tensor:
    """(L, H) mask with 0 at the round(fraction * L * H) lowest-scored heads (ties by flat index).

    `groups`: layers that share their attention weights (ALBERT's `share_layers`; `shared_attention_groups`).
    A head of such a group can only be removed from every layer of the group at once, so it is ranked
    as one unit by its mean score over the group's layers, and units are taken in increasing order
    while the heads removed stay within round(fraction * L * H)."""
    L, H = scores.shape
    budget = int(round(fraction * L * H))
    mask = torch.ones(L * H)
    if not groups:
        mask[np.argsort(scores.ravel(), kind="stable")[:budget]] = 0.0
        return mask.view(L, H)
    grouped = {l for g in groups for l in g}
    units = [(float(scores[list(g), h].mean()), [(l, h) for l in g]) for g in groups for h in range(H)]
    units += [(float(scores[l, h]), [(l, h)]) for l in range(L) if l not in grouped for h in range(H)]
    removed = 0
    for _, cells in sorted(units, key=lambda u: u[0]):  # a stable sort: ties keep the order above
        if removed + len(cells) <= budget:
            for l, h in cells:
                mask[l * H + h] = 0.0
            removed += len(cells)
    return mask.view(L, H)


def real_prune(model, tok, obj: Objective, scores: np.ndarray, cfg: PruneRunConfig, name: str,
               out: Path | None, src: Path | None = None) -> tuple[pd.DataFrame, dict]:
    """Cut out `prune_fraction` of the heads (lowest scores first), check outputs equal masking, save
    the pruned checkpoint to `out` (and a finetuned head beside it), and measure size and speed."""

    groups = shared_attention_groups(model.blocks) if hasattr(model, "blocks") else []
    mask = michel_order_mask(scores, cfg.prune_fraction, groups).to(next(model.parameters()))
    pruned = prune_model(model, mask).eval()
    batch = obj.curve_batches[0]
    with torch.no_grad():
        a = forward(model, batch, mask).last_hidden_state
        b = forward(pruned, batch).last_hidden_state
    real = batch["attention_mask"].bool()
    max_diff = float((a - b)[real].abs().max())
    check = {"max_abs_diff_vs_masking": max_diff, "metric_masked": obj.metric(model, obj.curve_batches, mask),
             "metric_pruned": obj.metric(pruned, obj.curve_batches), "pruned_heads": {
                 int(l): [int(h) for h in torch.nonzero(mask[l] == 0).ravel()] for l in range(mask.shape[0])}}
    if out is not None:
        card = {"pruned_from": str(src) if src else None, "prune_fraction": cfg.prune_fraction,
                "order": "michel", "metrics": {obj.metric.name: check["metric_pruned"]}}
        plmodels.save(pruned, tok, out, card=card)
        if src is not None and is_finetuned(src):
            for f in (HEAD_FILE, INFO_FILE):
                shutil.copyfile(src / f, out / f)
    speed = measure_speed_and_size(model, pruned, obj.curve_batches[: cfg.speed_batches], repeats=cfg.speed_repeats)
    rows = [(name, v, speed[f"params_{v}"], speed[f"bytes_{v}"], speed[f"tokens_per_s_{v}"])
            for v in ("full", "pruned")]
    check.update({k: speed[k] for k in ("params_ratio", "bytes_ratio", "speed_ratio")})
    return pd.DataFrame(rows, columns=SPEED_COLUMNS), check


def find_heads_classes(out_dir: Path | None, model_name: str) -> pd.DataFrame | None:
    """The run's raw-attention `heads_classes` rows of this model, when out_dir sits in a run
    (runs/<run>/prune/<model>; tables without a weighting column are all raw)."""
    df = find_run_table(out_dir, "heads_classes", model_name)
    return None if df is None or not len(df := weighting_rows(df)) else df


# ------------------------------------------------------------------------------------- entry
def prune_model_cli(model_path: str | Path, methods: Sequence[str] | None = None, out_dir: str | Path | None = None,
                    config: "PruneRunConfig | Mapping | str | Path | None" = None, model_name: str | None = None,
                    heads_classes: pd.DataFrame | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Importance, pruning curves, Kendall tau, roles join and real pruning of one checkpoint.

    Returns {"importance", "pruning", "prunable", "kendall", "pruned_speed"[, "roles_importance"]};
    with out_dir, also writes them to out_dir/tables/*.parquet, the pruned checkpoint to
    out_dir/pruned and the resolved config with checks to out_dir/prune_run.json.
    """

    cfg = PruneRunConfig.resolve(config)
    methods = list(methods) if methods is not None else list(cfg.methods)
    if methods != list(cfg.methods):
        cfg = PruneRunConfig.from_dict({**cfg.to_dict(), "methods": methods})
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    path = Path(model_path)
    name = model_name or default_model_name(path)
    out = Path(out_dir) if out_dir is not None else None
    t0 = time.perf_counter()
    model, tok, obj = build_objective(path, cfg)
    model.eval()
    notes = []
    two_streams = family_of(model).lm_inputs == "permutation"  # XLNet: content and query stream
    if two_streams and cfg.granularity != "batch":  # a gate acts on both streams, which have no
        cfg = PruneRunConfig.from_dict({**cfg.to_dict(), "granularity": "batch"})  # per-token site in common
        notes.append("Michel's importance with granularity 'batch' (|dL/dxi| per batch, as HF's run_bertology): "
                     "XLNet's head gates act on the content and the query stream, which share no per-token site")
    if family_of(model).cross_attention and "confidence" in methods:  # Voita's confidence reads self-attention maps
        methods = [m for m in methods if m != "confidence"]
        notes.append("confidence left out: it is defined on self-attention maps over the input's tokens, "
                     "not on a seq2seq model's three kinds of attention")
    _say(progress, f"{name}: {obj.description}; unmasked {obj.metric.name} = "
                   f"{obj.metric(model, obj.curve_batches):.4f}")
    tables = score_and_curves(model, obj, cfg, methods, name, progress)
    imp = tables["importance"]
    if family_of(model).cross_attention:  # name each row of the all-heads grid: which attention, which layer of its stack
        rows = model.attention_rows()
        imp["attention"] = [rows[l][0] for l in imp["layer"]]
        imp["stack_layer"] = [rows[l][1] for l in imp["layer"]]
    tables["kendall"] = (kendall_table(imp) if imp["method"].nunique() > 1 else
                         pd.DataFrame(columns=["model", "method_a", "method_b", "tau", "p_value", "n_heads"]))
    roles = weighting_rows(heads_classes) if heads_classes is not None else find_heads_classes(out, name)
    if roles is not None and len(imp):
        tables["roles_importance"] = roles_vs_importance(imp, roles)
    if not callable(getattr(model, "prune_heads", None)):
        tables["pruned_speed"] = pd.DataFrame(columns=SPEED_COLUMNS)
        check = {"skipped": f"a {model.kind} model cannot cut heads out yet (no prune_heads): its curves mask "
                            "heads, nothing is removed"}
        notes.append(check["skipped"])
    else:
        if "michel" in set(imp["method"]):
            sub = imp[imp.method == "michel"].sort_values(["layer", "head"])
            scores = sub["value"].to_numpy().reshape(ones_mask(model).shape)
        else:
            scores = _michel(model, obj, cfg)
        speed, check = real_prune(model, tok, obj, scores, cfg, name, out / "pruned" if out else None, path)
        tables["pruned_speed"] = speed
        _say(progress, f"{name}: pruned {cfg.prune_fraction:.0%} of heads: outputs differ from masking by "
                       f"{check['max_abs_diff_vs_masking']:.2e}; params x{check['params_ratio']:.3f}, "
                       f"speed x{check['speed_ratio']:.2f}")
    for note in notes:
        _say(progress, f"{name}: {note}")
    if out is not None:
        for tname, df in tables.items():
            write_table(out, tname, df)
        atomic_write_json(out / "prune_run.json", {
            "model": name, "model_path": str(path), "objective": obj.description, "config": cfg.to_dict(),
            "real_pruning": check, "notes": notes, "seconds": round(time.perf_counter() - t0, 1)})
    return tables
