"""Amnesic probing of one checkpoint (Elazar, Ravfogel, Jacovi & Goldberg 2021, "Amnesic Probing:
Behavioral Explanation with Amnesic Counterfactuals"): does the model *use* what a probe finds? For
each word-level property (POS; the dependency label of the word; its NER type, "O" outside
entities) and layer l:

1. fit an eraser on layer l's word vectors of the train split (`probes.amnesic`: LEACE, closed
   form; INLP, iterative, stopping on a dev part of the train words: the last `inlp_dev_fraction` of
   them, whole sentences but the first, as the reference stops on a dev split), and its controls
   (`controls`, each drawn `draws` times, seeds 0..draws-1 in the `seed` column):
   - `matched`: random directions that move the vectors as far as the eraser does
     (`MatchedRandomEraser`: the same rank and the same mean squared move E||x - x'||^2 on the train
     words). The control the gap is read against.
   - `shuffled`: the eraser fitted on permuted labels (`ShuffledLabelEraser`).
   - `same_rank`: Elazar et al.'s control, an orthogonal projection off as many uniformly random
     directions (`RandomEraser`); it moves the vectors less than LEACE does (on MiniLM's embedding
     layer, POS, half as far), so a gap against it overstates what the property costs;
2. check the removal: a probe for the property trained and tested on erased vectors (`probe_acc`,
   chance when the removal worked), and how far each map moves the test words' vectors
   (`displacement`, mean ||x - x'||, and `displacement_sq`, mean ||x - x'||^2);
3. apply the eraser inside the model through a hook on layer l's output (`embed` for l = 0,
   `blocks.{l-1}.resid_post` after), at every token, and measure what the model loses: its masked-LM
   loss (encoders; a fixed 15% mask) or next-token loss (decoders) on held-out sentences
   (`lm_loss`, and `lm_loss_delta` against the intact model), and a downstream probe: the property
   probe trained on the intact model's last layer, read on the last layer of the erased run
   (`last_layer_acc`).

An encoder whose MLM head was freshly initialised at import (an imported sentence encoder such as
all-MiniLM-L6-v2: its card says so) gets no LM-loss rows, since its MLM loss would be noise; the
probe rows stand.

The finding is the gap between an eraser and its matched control: a property the model uses costs
more loss when erased than random directions that move the vectors as far (Elazar et al.'s amnesic
vs. random comparison, with a control of the same size). Where this differs from the paper: the paper erases with INLP only and reports LM
accuracy and the KL divergence of the LM distribution; here LEACE is the default (exact and in closed
form) and the loss is the cross-entropy.

`amnesic_model(path, out_dir, config)` -> {"amnesic": (model, task, layer, eraser, metric, seed, value)};
eraser in none | leace | inlp | {leace,inlp}_{matched,shuffled,same_rank}; metric in rank | probe_acc |
displacement | displacement_sq | lm_loss | lm_loss_delta | last_layer_acc | majority_acc (the test
words' majority-label share: where probe_acc falls when the removal works); seed: the control's draw,
-1 for rows without one (docs/design.md).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.config import Config
from plmodels.checkpoint import read_card
from plmodels.families import family_of
from plmodels.progress import progress as progress_bar
from plmodels.training.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, step_generator
from probes.amnesic import (Eraser, INLPEraser, LeaceEraser, MatchedRandomEraser, RandomEraser, ShuffledLabelEraser,
                            displacement)
from probes.logreg import LogisticRegressionLBFGS
from workbench.analyses.probing import ProbeRunConfig, TaskSplit, default_model_name, load_split
from workbench.core.io import atomic_write_json
from workbench.core.results import write_tables

COLUMNS = ["model", "task", "layer", "eraser", "metric", "seed", "value"]
FILL = {"ner": "O"}  # words outside every target span get this label (None: left out)
ERASERS = ("leace", "inlp")
CONTROLS = ("matched", "shuffled", "same_rank")


@dataclass(frozen=True)
class AmnesicRunConfig(Config):
    """An amnesic-probing run (defaults: the values configs/amnesic.json would hold)."""

    tasks: tuple[str, ...] = ("pos", "deps", "ner")  # word-level properties (deps: each word's relation)
    layers: tuple[int, ...] | None = None  # layers 0..L to erase at (None: all)
    erasers: tuple[str, ...] = ERASERS  # leace | inlp; each with its controls
    controls: tuple[str, ...] = CONTROLS  # matched (the same rank and move) | shuffled (labels) | same_rank
    draws: int = 2  # draws of each control (seeds 0..draws-1)
    inlp_iter: int = 20  # INLP's iterations at most
    inlp_dev_fraction: float = 0.2  # the last share of the train words: INLP's dev set (its stopping rule)
    max_train_targets: int = 20000  # words to fit the erasers and probes on
    max_eval_targets: int = 4000  # words to test the probes on
    lm_sentences: int = 300  # held-out sentences (the eval split's) for the LM loss
    batch_size: int = 32  # sentences per forward
    C: float = 1.0  # inverse L2 strength of the property probes
    seed: int = 0  # the MLM mask and the random erasers

    def __post_init__(self) -> None:
        bad = [e for e in self.erasers if e not in ERASERS]
        if bad or not self.erasers:
            raise ValueError(f"AmnesicRunConfig.erasers: {bad or '[]'}; choose from {ERASERS}")
        bad = [c for c in self.controls if c not in CONTROLS]
        if bad or not self.controls:
            raise ValueError(f"AmnesicRunConfig.controls: {bad or '[]'}; choose from {CONTROLS}")
        if not 0 < self.inlp_dev_fraction < 1:
            raise ValueError(f"AmnesicRunConfig.inlp_dev_fraction must be in (0, 1), got {self.inlp_dev_fraction}")
        for name in ("draws", "inlp_iter", "max_train_targets", "max_eval_targets", "lm_sentences", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"AmnesicRunConfig.{name} must be >= 1, got {getattr(self, name)}")


def word_labels(split: TaskSplit, fill: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(global word rows, labels) with one label per word: each target labels the words of its first
    span (the first target wins); with `fill`, every other kept word gets `fill`."""
    a = split.arrays
    n = a.store.n_words
    labels = np.full(n, None, dtype=object) if fill is None else np.full(n, fill, dtype=object)
    done = np.zeros(n, dtype=bool)
    for (s, e), y in zip(a.span1, a.labels):
        for w in range(int(s), int(e)):
            if not done[w]:
                labels[w], done[w] = y, True
    rows = np.arange(n) if fill is not None else np.flatnonzero(done)
    return rows, labels[rows].astype(str)


def hook_site(layer: int) -> str:
    """The hook whose output is hidden_states[layer]."""
    return "embed" if layer == 0 else f"blocks.{layer - 1}.resid_post"


def eraser_hook(eraser):
    """fn(h, name) applying `eraser`'s affine map to every position of h (B, T, D)."""
    mu, left, right = (torch.as_tensor(np.asarray(a), dtype=torch.float32) for a in
                       (eraser.mean_, eraser.left_, eraser.right_))

    def fn(h: torch.Tensor, name: str) -> torch.Tensor:
        return h - ((h - mu.to(h)) @ right.T.to(h)) @ left.T.to(h)

    return fn


@dataclass
class HeldOut:
    """Held-out sentences as padded batches, dicts of "ids" and "mask" (B, T), "lm" (the batch the
    family's LM statistic reads: an encoder's masked ids and labels, else the ids) and "firsts" (N, 2:
    each word's first subword); `lm` False when the model's LM head is untrained (an imported
    sentence encoder): no loss is computed."""

    batches: list[dict]
    lm: bool = True


def held_out(model, tok, sentences: list[list[str]], cfg: AmnesicRunConfig, lm: bool = True) -> HeldOut:
    encs = tok.encode_words_batch(sentences)
    pad = tok.pad_id if tok.pad_id is not None else 0
    gen = step_generator(cfg.seed, 0, stream=7)
    out = []
    for i in range(0, len(encs), cfg.batch_size):
        chunk = encs[i: i + cfg.batch_size]
        T = max(len(e.ids) for e in chunk)
        ids = torch.full((len(chunk), T), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        for b, e in enumerate(chunk):
            ids[b, : len(e.ids)], mask[b, : len(e.ids)] = torch.tensor(e.ids), 1
        if family_of(model).lm_inputs == "masked":  # BERT's fixed 15% corruption, labels at the masked positions
            masked, labels = mask_tokens(ids, mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                                         special_ids=set(tok.special_ids) | {pad}, generator=gen, cfg=MaskingConfig())
            labels[mask == 0] = IGNORE_INDEX
            lm_batch = {"input_ids": masked, "attention_mask": mask, "labels": labels}
        else:  # the ids are their own (next-token, both directions') targets
            lm_batch = {"input_ids": ids, "attention_mask": mask}
        firsts = [(b, w0) for b, e in enumerate(chunk) for (w0, _) in e.word_spans]
        out.append({"ids": ids, "mask": mask, "lm": lm_batch,
                    "firsts": torch.tensor(firsts, dtype=torch.long).reshape(-1, 2)})
    return HeldOut(out, lm)


@torch.no_grad()
def run_model(model, data: HeldOut, hooks=(), head_mask: torch.Tensor | None = None,
              layers: list[int] | None = None) -> tuple[float, dict[int, np.ndarray]]:
    """(mean LM loss over labelled positions, {layer: (N_words, D) first-subword vectors}) of the
    model run on the held-out batches with `hooks` and `head_mask` (L, H) in place. The loss is the
    family's LM statistic (`Family.lm_stat`, plmodels/families.py): an encoder's masked-LM loss on the
    masked input, a decoder's next-token loss, a biLM's mean of the two directions' next-token losses
    (`plmodels.elmo.bilm_loss`); the vectors come from a forward on the unmasked input. layers:
    hidden-state indices 0..L (None: the last only)."""
    total, count = 0.0, 0
    want = [int(model.config.n_layers)] if layers is None else list(layers)
    vecs: dict[int, list[np.ndarray]] = {l: [] for l in want}
    hooks = list(hooks)
    unpad = not hooks  # hooks must see (B, T, D), not the packed real tokens
    fam = family_of(model)
    with model.hooks(hooks):
        for b in data.batches:
            if data.lm:
                t, c = fam.lm_stat(model, b["lm"], head_mask, unpad=unpad)
                total, count = total + float(t), count + int(c)
            out = model(b["ids"], attention_mask=b["mask"], head_mask=head_mask, output_hidden_states=True,
                        unpad=unpad, **fam.analysis_kwargs)
            for l in want:
                vecs[l].append(out.hidden_states[l][b["firsts"][:, 0], b["firsts"][:, 1]].float().numpy())
    loss = total / max(1, count) if data.lm else float("nan")
    return loss, {l: np.concatenate(v) for l, v in vecs.items()}


def run_erased(model, data: HeldOut, hooks) -> tuple[float, np.ndarray]:
    """(mean LM loss, (N_words, D) last-layer first-subword vectors) with `hooks` in place."""
    loss, vecs = run_model(model, data, hooks)
    return loss, next(iter(vecs.values()))


def _probe_acc(Xtr, ytr, Xte, yte, C: float) -> float:
    clf = LogisticRegressionLBFGS(C=C).fit(np.asarray(Xtr, dtype=np.float32), ytr)
    return float((clf.predict(np.asarray(Xte, dtype=np.float32)) == yte).mean())


@dataclass(frozen=True)
class EraserKind:
    """How to build an eraser of the config (`make`), and whether it stops on a dev set (INLP)."""

    make: Callable[[AmnesicRunConfig], Eraser]
    uses_dev: bool


ERASER_KINDS: dict[str, EraserKind] = {
    "leace": EraserKind(lambda cfg: LeaceEraser(), uses_dev=False),
    "inlp": EraserKind(lambda cfg: INLPEraser(n_iter=cfg.inlp_iter, C=cfg.C, seed=cfg.seed), uses_dev=True),
}


def fit_eraser(name: str, est: Eraser, X: np.ndarray, y: np.ndarray, cfg: AmnesicRunConfig) -> Eraser:
    """Fit `est` (an eraser of kind `name`, or a control wrapping one) on the train words X (N, D), y
    (N,); an eraser that stops on a dev set (INLP) is fitted on the first 1 - inlp_dev_fraction of the
    rows and stops on the rest (the words are in sentence order, so these are later sentences)."""
    if not ERASER_KINDS[name].uses_dev:
        return est.fit(X, y)
    n_dev = max(1, int(round(cfg.inlp_dev_fraction * len(X))))
    return est.fit(X[:-n_dev], y[:-n_dev], X[-n_dev:], y[-n_dev:])


def _matched(name: str, eraser: Eraser, X, y, cfg: AmnesicRunConfig, seed: int) -> Eraser:
    return MatchedRandomEraser(rank=eraser.rank_, target=displacement(eraser, X)[1], seed=seed).fit(X)


def _shuffled(name: str, eraser: Eraser, X, y, cfg: AmnesicRunConfig, seed: int) -> Eraser:
    return fit_eraser(name, ShuffledLabelEraser(ERASER_KINDS[name].make(cfg), seed=seed), X, y, cfg)


def _same_rank(name: str, eraser: Eraser, X, y, cfg: AmnesicRunConfig, seed: int) -> Eraser:
    return RandomEraser(rank=eraser.rank_, seed=seed).fit(X)


# control -> fn(eraser kind, the fitted eraser, train X, train y, config, seed) -> the fitted control
CONTROL_FITS: dict[str, Callable[..., Eraser]] = {"matched": _matched, "shuffled": _shuffled, "same_rank": _same_rank}


def control_seed(cfg: AmnesicRunConfig, layer: int, draw: int) -> int:
    """The random seed of a control's draw at a layer (distinct per layer and draw, fixed by cfg.seed)."""
    return int(np.random.SeedSequence([cfg.seed, layer, draw]).generate_state(1)[0])


def amnesic_task(model, tok, train: TaskSplit, test: TaskSplit, task: str, cfg: AmnesicRunConfig,
                 model_name: str, layers: list[int], bar=None, lm: bool = True) -> pd.DataFrame:
    """The rows of one property at every layer of `layers` (without the LM-loss rows when `lm` is
    False: the model's LM head is untrained)."""
    fill = FILL.get(task)
    tr_rows, ytr = word_labels(train, fill)
    te_all, y_all = word_labels(test, fill)
    tr_rows, ytr = tr_rows[: cfg.max_train_targets], ytr[: cfg.max_train_targets]
    seen = np.isin(y_all, np.unique(ytr))
    te_rows, yte = te_all[seen][: cfg.max_eval_targets], y_all[seen][: cfg.max_eval_targets]
    n_sent = min(cfg.lm_sentences, test.arrays.store.n_sentences)
    sentences = [[str(w) for w in test.words[test.arrays.store.sentence_rows(s)]] for s in range(n_sent)]
    data = held_out(model, tok, sentences, cfg, lm)
    # the downstream probe: trained on the intact last layer (train split), read on erased runs
    st_tr, st_te = train.arrays.store, test.arrays.store
    last_clf = LogisticRegressionLBFGS(C=cfg.C).fit(
        np.asarray(st_tr.layer(st_tr.n_layers - 1)[tr_rows], dtype=np.float32), ytr)
    every = np.arange(st_te.n_words)
    last_rows = np.concatenate([every[st_te.sentence_rows(s)] for s in range(n_sent)])  # the held-out words, in order
    lab = np.full(st_te.n_words, None, dtype=object)
    lab[te_all[seen]] = y_all[seen]
    keep = lab[last_rows] != None  # noqa: E711 (elementwise on an object array)
    y_last = lab[last_rows][keep].astype(str)

    def last_layer_acc(last: np.ndarray) -> float:
        return float((last_clf.predict(last[keep]) == y_last).mean())

    base_loss, base_last = run_erased(model, data, [])
    majority = float(pd.Series(yte).value_counts(normalize=True).iloc[0]) if len(yte) else float("nan")
    rows = [(model_name, task, -1, "none", "majority_acc", -1, majority),  # what a removed property leaves
            (model_name, task, -1, "none", "lm_loss", -1, base_loss),
            (model_name, task, -1, "none", "last_layer_acc", -1, last_layer_acc(base_last))]
    for layer in layers:
        Xtr, Xte = np.asarray(st_tr.layer(layer)[tr_rows]), np.asarray(st_te.layer(layer)[te_rows])
        rows.append((model_name, task, layer, "none", "probe_acc", -1, _probe_acc(Xtr, ytr, Xte, yte, cfg.C)))

        def measure(label: str, e: Eraser, seed: int) -> list[tuple]:
            acc = _probe_acc(e.transform(Xtr), ytr, e.transform(Xte), yte, cfg.C)
            dist, dist_sq = displacement(e, Xte)  # on the test words: held out from every fit
            loss, last = run_erased(model, data, [(hook_site(layer), eraser_hook(e))])
            return [(model_name, task, layer, label, metric, seed, value) for metric, value in (
                ("rank", float(e.rank_)), ("probe_acc", acc), ("displacement", dist), ("displacement_sq", dist_sq),
                ("lm_loss", loss), ("lm_loss_delta", loss - base_loss), ("last_layer_acc", last_layer_acc(last)))]

        for name in cfg.erasers:
            eraser = fit_eraser(name, ERASER_KINDS[name].make(cfg), Xtr, ytr, cfg)
            rows += measure(name, eraser, -1)
            for control in cfg.controls:
                for draw in range(cfg.draws):
                    fitted = CONTROL_FITS[control](name, eraser, Xtr, ytr, cfg, control_seed(cfg, layer, draw))
                    rows += measure(f"{name}_{control}", fitted, draw)
            if bar is not None:
                bar.update(1)
    return without_lm_rows(pd.DataFrame(rows, columns=COLUMNS), lm)


LM_METRICS = ("lm_loss", "lm_loss_delta")


def without_lm_rows(table: pd.DataFrame, lm: bool) -> pd.DataFrame:
    """The table, less its LM-loss rows when the LM head is untrained (`lm` False)."""
    return table if lm else table[~table["metric"].isin(LM_METRICS)].reset_index(drop=True)


# the LM batch forms `held_out` builds (plmodels.families.Family.lm_inputs); the others (XLNet's
# permutations, an encoder-decoder's denoising) get no LM rows
HELD_OUT_LM = ("masked", "causal", "bidirectional")


def lm_head_trained(model, model_path) -> bool:
    """Whether the LM-loss rows are measured: the card's `lm_head_trained` (plmodels.checkpoint.
    lm_head_rule: False for a model whose LM head was freshly initialised at import, an imported
    sentence encoder such as all-MiniLM-L6-v2, or is never trained, ELECTRA's discriminator, whose
    LM loss would be noise), for a family whose LM batch `held_out` builds (`HELD_OUT_LM`)."""
    return family_of(model).lm_inputs in HELD_OUT_LM and read_card(model_path).lm_head_trained


def amnesic_model(model_path: str | Path, out_dir: str | Path | None = None,
                  config: AmnesicRunConfig | Mapping | None = None, model_name: str | None = None,
                  store_root: str | Path | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Amnesic probing of a checkpoint -> {"amnesic": table}; with out_dir, the table is upserted into
    out_dir/tables and the config and timings go to out_dir/amnesic_run.json."""
    cfg = AmnesicRunConfig.resolve(config)
    model, tok = plmodels.load(model_path)
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; amnesic probing needs one")
    model_name = model_name or default_model_name(model_path)
    n_blocks = int(model.config.n_layers)
    layers = list(range(n_blocks + 1)) if cfg.layers is None else sorted(set(cfg.layers))
    if any(not 0 <= l <= n_blocks for l in layers):
        raise ValueError(f"amnesic config layers {layers}: the model has layers 0..{n_blocks}")
    if store_root is None:
        if out_dir is None:
            raise ValueError("amnesic_model: give out_dir or store_root (where the activation stores go)")
        store_root = Path(out_dir) / "store"
    pcfg = ProbeRunConfig()
    model_id = plmodels.checkpoint_hash(model_path)
    lm = lm_head_trained(model, model_path)
    frames, seconds = [], {}
    with progress_bar(len(cfg.tasks) * len(layers) * len(cfg.erasers), f"amnesic {model_name}", "eraser",
                      disable=not progress) as bar:
        for task in cfg.tasks:
            t0 = time.perf_counter()
            train = load_split(model, tok, task, pcfg.train_split, pcfg, Path(store_root), model_id,
                               cfg.max_train_targets, progress=progress)
            test = load_split(model, tok, task, pcfg.eval_split, pcfg, Path(store_root), model_id,
                              cfg.max_eval_targets, progress=progress)
            frames.append(amnesic_task(model, tok, train, test, task, cfg, model_name, layers, bar, lm))
            seconds[task] = round(time.perf_counter() - t0, 1)
    table = pd.concat(frames, ignore_index=True)
    if out_dir is not None:
        write_tables(out_dir, {"amnesic": table})
        atomic_write_json(Path(out_dir) / "amnesic_run.json", {
            "model": model_name, "model_path": str(model_path), "checkpoint_hash": model_id,
            "config": cfg.to_dict(), "layers": layers, "seconds": seconds,
            "lm_loss": "measured" if lm else "left out: the card says the MLM head was freshly initialised at import"})
    return {"amnesic": table}
