"""How information moves through one checkpoint (issue 78, docs/flow.md): token identity and the token
to predict per layer (Voita, Sennrich & Titov 2019), the logit and tuned lens (nostalgebraist 2020;
Belrose et al. 2023), and the attribution of one prediction a sentence to its inputs with each method's
faithfulness (Abnar & Zuidema 2020; Mohebbi et al. 2023; Sundararajan et al. 2017), each beside its
floor: a random-initialisation model of the same architecture (drawn under `seed` offset by the
checkpoint's pretraining seed: `plmodels.checkpoint.floor_seed`), a shuffled-token control, a random
attribution.

`flow_model(path, out_dir, config)` reads UD English-EWT sentences (the test split for the numbers, the
dev split as the tuned lens' held-out training text), runs `probes.flow`, `probes.lens` and
`probes.attribution`, and writes three tidy tables:

- `flow_mi`: model, variant ("trained" | "random_init"), estimator ("kmeans" | "probe"), label ("input"
  | "predict"), control ("none" | "shuffled"), layer, metric ("mi_bits" | "entropy_bits" |
  "mi_fraction"), value, ci_low, ci_high (bootstrap over sentences; NaN for entropy), seed.
- `flow_lens`: model, variant, lens ("logit" | "tuned"), layer, metric ("kl" | "top1_agree" |
  "lm_loss"), value, ci_low, ci_high, seed.
- `flow_attribution`: model, target ("lm" | a classifier's task), method ("rollout" | "flow" |
  "value_zeroing" | "input_x_gradient" | "integrated_gradients" | "random"), metric ("spearman_loo" |
  "aopc" | "aopc_insertion" | "completeness_error"), value, ci_low, ci_high, n_items, seed.

The attributed prediction of a sentence is a `Prediction`: the LM's (`lm_prediction`) for a pretrained
checkpoint with a trained LM head, or a finetuned sentence classifier's decision, the logit of its
predicted class (`classifier_prediction`, on its task's dev sentences: SST-2).

What differs per family is read off its record (plmodels/families.py): the stacks whose layers are
read (`Family.flow_stacks`: an encoder-decoder's encoder and teacher-forced decoder, the model name
suffixed ";decoder"), its lens readout (`Family.residual_logits`), and its LM batch form
(`Family.lm_inputs`) in two tables here: `PREDICTION_VIEW` (which positions predict which token, on what
input) and `ATTRIBUTION_TARGET` (the one prediction per sentence whose inputs are attributed), "masked"
(an MLM encoder) and "causal" (a decoder) today (`flow_kinds`). Every family gets the input-token MI
curves; the "predict" curve needs a view, the lens and LM attribution a readout, a view and a trained
LM head (`Card.lm_head_trained`). The lens is read per stack: an encoder-decoder's teacher-forced
decoder is a decoder (its `final_norm` and `lm_logits` are the model's), so its layers are read
through the LM head, teacher forced (its next token is a copy of its source, so no "predict" MI curve).
`flow_seed_values` turns the tables into the zoo's per-checkpoint curves and statistics.

`flow_run.json` beside the tables records the config, the checkpoint hash and each stage's wall and CPU
seconds. `flow_sentence` is the same suite's view of one typed text (the app's Flow page): the
attributed prediction, the lens' top tokens per layer, every method's score of each token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.checkpoint import floor_seed, random_init_model, read_card, training_seed
from plmodels.config import Config
from plmodels.families import FAMILIES, family_of
from plmodels.training.finetune import HEAD_FILE, INFO_FILE, load_classifier
from plmodels.training.masking import MaskingConfig, mask_tokens, step_generator
from probes.attribution import (EmbedTarget, aopc, attention_flow, faithfulness, input_x_gradient, insertion_aopc,
                                integrated_gradients, rank_correlation, rollout, value_zeroing)
from probes.flow import MI_ESTIMATORS
from probes.lens import TunedLens, lens_metrics, lm_readout
from probes.stats import bootstrap_ci
from workbench.analyses.probing import default_model_name
from workbench.core.io import atomic_write_json
from workbench.core.results import write_tables
from workbench.data.finetuning import load_task_data
from workbench.data.tasks import ud_sentences

MI_COLUMNS = ["model", "variant", "estimator", "label", "control", "layer", "metric", "value", "ci_low", "ci_high", "seed"]
LENS_COLUMNS = ["model", "variant", "lens", "layer", "metric", "value", "ci_low", "ci_high", "seed"]
ATTR_COLUMNS = ["model", "target", "method", "metric", "value", "ci_low", "ci_high", "n_items", "seed"]
ATTRIBUTION_METHODS = ("rollout", "flow", "value_zeroing", "input_x_gradient", "integrated_gradients")


@dataclass(frozen=True)
class FlowRunConfig(Config):
    """One checkpoint's flow suite (defaults: what configs/flow.json would hold)."""

    treebank: str = "ewt"  # UD English treebank of the sentences (test: the numbers; dev: the tuned lens)
    n_sentences: int = 200  # test sentences for the MI curves, the lenses and the attributions
    lens_train_sentences: int = 300  # dev sentences the tuned lens is trained on (held-out text)
    max_tokens: int = 48  # sentences longer than this many subword tokens are skipped
    attr_sentences: int = 200  # test sentences (the first ones) whose one prediction is attributed
    n_tokens: int = 50  # the fixed token set: the most frequent labels among the items (Voita et al.)
    n_clusters: int = 50  # k-means' K
    estimators: tuple[str, ...] = ("kmeans", "probe")  # probes.flow.MI_ESTIMATORS
    n_boot: int = 200  # bootstrap resamples over sentences
    tuned_steps: int = 100  # Adam steps per layer of the tuned lens
    tuned_batch: int = 256  # tokens per step
    tuned_lr: float = 1e-3
    ig_steps: int = 32  # Gauss-Legendre nodes of integrated gradients (16 left 2.5% completeness error)
    deletion_k: int = 5  # deletion-curve steps (AOPC over 1..k, capped by the sentence's tokens)
    random_draws: int = 5  # random attributions per sentence (the faithfulness floor)
    batch_size: int = 32  # sentences per forward
    seed: int = 0  # the MLM mask, the random-init model (+ pretraining seed), k-means, bootstraps, controls

    def __post_init__(self) -> None:
        bad = [e for e in self.estimators if e not in MI_ESTIMATORS]
        if bad or not self.estimators:
            raise ValueError(f"FlowRunConfig.estimators: {bad or '[]'}; choose from {sorted(MI_ESTIMATORS)}")
        for name in ("n_sentences", "attr_sentences", "lens_train_sentences", "n_tokens", "n_clusters", "n_boot", "tuned_steps",
                     "tuned_batch", "ig_steps", "deletion_k", "random_draws", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"FlowRunConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens < 4:
            raise ValueError(f"FlowRunConfig.max_tokens must be >= 4, got {self.max_tokens}")


# ----------------------------------------------------------------------------------- per-family views
def _mlm_view(model, tok, ids: torch.Tensor, real: torch.Tensor, gen: torch.Generator):
    """MLM: the training masking (15%, 80/10/10); predict positions are the chosen ones, label = the original."""
    masked, labels = mask_tokens(ids, mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                                 special_ids=set(tok.special_ids) | {tok.pad_id}, generator=gen, cfg=MaskingConfig())
    pos = (labels >= 0) & real
    return masked, pos, torch.where(pos, ids, 0)


def _clm_view(model, tok, ids: torch.Tensor, real: torch.Tensor, gen: torch.Generator):
    """CLM: every position whose next token is a real non-special token predicts it."""
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    ok = torch.zeros_like(real)
    ok[:, :-1] = real[:, 1:] & ~torch.isin(ids[:, 1:], torch.tensor(sorted(tok.special_ids)))
    return ids, ok & real, nxt


def _previous_view(model, tok, ids: torch.Tensor, real: torch.Tensor, gen: torch.Generator):
    """A backward LM (a biLM's backward direction): every position whose previous token is a real
    non-special token predicts it."""
    prev = torch.zeros_like(ids)
    prev[:, 1:] = ids[:, :-1]
    ok = torch.zeros_like(real)
    ok[:, 1:] = real[:, :-1] & ~torch.isin(ids[:, :-1], torch.tensor(sorted(tok.special_ids)))
    return ids, ok & real, prev


# form -> view(model, tok, ids (B, T), real (B, T) bool, generator) -> (input ids, predict positions (B, T)
# bool, label (B, T) token to predict there); the form is a stack's Family.lm_inputs, or Family.flow_views'
PREDICTION_VIEW: dict[str, Callable] = {"masked": _mlm_view, "causal": _clm_view, "previous": _previous_view}


def _words(tok, ids: torch.Tensor) -> list[int]:
    return [t for t in range(len(ids)) if int(ids[t]) not in tok.special_ids]


def _mlm_target(tok, ids: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, int, int, np.ndarray]:
    """MLM: one random non-special position is masked; F reads the original token there; every other
    non-special token is attributed."""
    cand = _words(tok, ids)
    p = int(rng.choice(cand))
    inp = ids.clone()
    inp[p] = tok.mask_id
    return inp, p, int(ids[p]), np.array([t for t in cand if t != p])


def _clm_target(tok, ids: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, int, int, np.ndarray]:
    """CLM: F is log p(last token | the rest), read at the position before it; the non-special tokens up
    to that position are attributed."""
    p = len(ids) - 2
    return ids, p, int(ids[-1]), np.array([t for t in _words(tok, ids) if t <= p])


# kind -> target(tok, ids (T,), rng) -> (input ids (T,), read position, token whose log-prob is F,
# the attributed positions)
ATTRIBUTION_TARGET: dict[str, Callable] = {"masked": _mlm_target, "causal": _clm_target}  # Family.lm_inputs ->


def _family(table: dict, model, what: str):
    """table's entry for the model's LM batch form; a family without one is one line naming the kinds that have one."""
    fam = family_of(model)
    if fam.lm_inputs not in table:
        have = sorted(k for k, f in FAMILIES.items() if f.lm_inputs in table)
        raise ValueError(f"workbench flow: {what} is not defined for model kind {fam.kind!r}; kinds: {have}")
    return table[fam.lm_inputs]


# ----------------------------------------------------------------------------------- data
@dataclass
class Batches:
    """Padded test batches: ids, real (B, T) bool, predict inputs/positions/labels, sentence index."""
    items: list[dict]


def _sentences(cfg: FlowRunConfig, tok, split: str, n: int) -> list[list[int]]:
    encs = tok.encode_words_batch([list(s.words) for s in ud_sentences(cfg.treebank, split)])
    return [e.ids for e in encs if 4 <= len(e.ids) <= cfg.max_tokens][:n]


def _batches(model, tok, sents: list[list[int]], cfg: FlowRunConfig, form: str | None = None) -> Batches:
    """The padded batches; with the "predict" items when the prediction form (default: the family's LM
    batch form) has a view."""
    view = PREDICTION_VIEW.get(form or family_of(model).lm_inputs)
    gen = step_generator(cfg.seed, 0, stream=78)
    out = []
    for i in range(0, len(sents), cfg.batch_size):
        chunk = sents[i: i + cfg.batch_size]
        T = max(map(len, chunk))
        ids = torch.full((len(chunk), T), tok.pad_id if tok.pad_id is not None else 0, dtype=torch.long)
        real = torch.zeros((len(chunk), T), dtype=torch.bool)
        for b, s in enumerate(chunk):
            ids[b, : len(s)], real[b, : len(s)] = torch.tensor(s), True
        b = {"ids": ids, "real": real, "sent": torch.arange(i, i + len(chunk))[:, None].expand(-1, T)}
        if view is not None:
            b["pred_in"], b["pred_pos"], b["pred_label"] = view(model, tok, ids, real, gen)
        out.append(b)
    return Batches(out)


@torch.no_grad()
def _collect(model, data: Batches, special: torch.Tensor,
             labels: tuple[str, ...] = ("input", "predict")) -> dict[str, dict[str, np.ndarray | torch.Tensor]]:
    """{"input": {...}, "predict": {...}} (of `labels`, "predict" when the batches have it), each with H
    (L+1, N, D) float32 tensor, label (N,), group (N,)."""
    labels = tuple(k for k in labels if k == "input" or "pred_in" in data.items[0])
    got: dict[str, dict[str, list]] = {k: {"H": [], "label": [], "group": []} for k in labels}
    kw = family_of(model).analysis_kwargs  # no (B, T, V) logits: the lens reads the items it needs
    for b in data.items:
        runs = (("input", b["ids"], b["real"] & ~torch.isin(b["ids"], special), b["ids"]),
                ("predict", b.get("pred_in"), b.get("pred_pos"), b.get("pred_label")))
        for name, inp, sel, lab in (r for r in runs if r[0] in labels):
            hs = model(inp, attention_mask=b["real"].long(), output_hidden_states=True, **kw).hidden_states
            got[name]["H"].append(torch.stack([h[sel] for h in hs]).float())
            got[name]["label"].append(lab[sel].numpy())
            got[name]["group"].append(b["sent"][sel].numpy())
    return {k: {"H": torch.cat(v["H"], 1), "label": np.concatenate(v["label"]), "group": np.concatenate(v["group"])}
            for k, v in got.items()}


# ----------------------------------------------------------------------------------- part 1: MI
def mi_rows(model_name: str, variant: str, reps: dict, cfg: FlowRunConfig) -> list[tuple]:
    rows = []
    for label, r in reps.items():
        y = r["label"]
        values, counts = np.unique(y, return_counts=True)
        keep = np.isin(y, values[np.argsort(-counts, kind="stable")[: cfg.n_tokens]])
        y, groups = y[keep], r["group"][keep]
        for l in range(r["H"].shape[0]):
            X = r["H"][l][torch.as_tensor(keep)].numpy()
            for name in cfg.estimators:
                est = MI_ESTIMATORS[name](**_estimator_kw(name, cfg)).fit(X, y, groups)
                for control, est in (("none", est), ("shuffled", est.fit_shuffled(X, y, groups, seed=cfg.seed + l))):
                    rows += [(model_name, variant, name, label, control, l, "mi_bits", est.mi_, *est.ci_, cfg.seed),
                             (model_name, variant, name, label, control, l, "entropy_bits", est.entropy_,
                              np.nan, np.nan, cfg.seed),
                             (model_name, variant, name, label, control, l, "mi_fraction", est.mi_ / est.entropy_,
                              est.ci_[0] / est.entropy_, est.ci_[1] / est.entropy_, cfg.seed)]
    return rows


# estimator -> its settings from the run config (beside n_boot and seed, which all take)
ESTIMATOR_KW: dict[str, Callable[[FlowRunConfig], dict]] = {
    "kmeans": lambda cfg: {"n_clusters": cfg.n_clusters},
    "probe": lambda cfg: {},
}


def _estimator_kw(name: str, cfg: FlowRunConfig) -> dict:
    return {"n_boot": cfg.n_boot, "seed": cfg.seed, **ESTIMATOR_KW[name](cfg)}


# ----------------------------------------------------------------------------------- part 2: lenses
def _per_sentence(values: torch.Tensor, groups: np.ndarray, cfg: FlowRunConfig) -> tuple[float, float, float]:
    """Mean over items with a bootstrap interval over sentences (per-sentence means resampled)."""
    df = pd.DataFrame({"g": groups, "v": values.double().numpy()}).groupby("g")["v"].agg(["sum", "count"])
    stat = lambda a: a[:, 0].sum() / a[:, 1].sum()
    return bootstrap_ci(df.to_numpy(), stat, n_boot=cfg.n_boot, seed=cfg.seed)


def lens_rows(model_name: str, variant: str, readout, reps: dict, lens: TunedLens | None,
              cfg: FlowRunConfig, chunk: int = 1024) -> list[tuple]:
    """Per layer and lens, the `lens_metrics` of the "predict" items, read `chunk` items at a time (the
    (L+1, N, V) logits of every layer at once would hold gigabytes)."""
    r = reps["predict"]
    H, targets = r["H"], torch.as_tensor(r["label"])
    names = ["logit"] + (["tuned"] if lens is not None else [])
    per: dict[tuple[str, int, str], list[torch.Tensor]] = {}
    with torch.no_grad():
        for s in range(0, H.shape[1], chunk):
            h, t = H[:, s: s + chunk], targets[s: s + chunk]
            final = readout(h[-1])
            final_logp = torch.log_softmax(final.float(), -1)
            last = H.shape[0] - 1
            for l in range(H.shape[0]):
                read = {"logit": h[l]} | ({"tuned": lens.translate(l, h[l])} if lens is not None else {})
                for name in names:
                    # the last layer through either lens is the model itself (the tuned lens' last
                    # translator is the identity): the logits already computed
                    logits = final if l == last else readout(read[name])
                    for metric, vals in lens_metrics(logits, final, t, final_logp).items():
                        per.setdefault((name, l, metric), []).append(vals)
    return [(model_name, variant, name, l, metric, *_per_sentence(torch.cat(v), r["group"], cfg), cfg.seed)
            for (name, l, metric), v in per.items()]


def train_tuned_lens(model, readout, tok, cfg: FlowRunConfig, form: str | None = None) -> TunedLens:
    """The tuned lens of a stack, trained on the "predict" items (of prediction form `form`) of the dev
    sentences."""
    sents = _sentences(cfg, tok, "dev", cfg.lens_train_sentences)
    reps = _collect(model, _batches(model, tok, sents, cfg, form), torch.tensor(sorted(tok.special_ids)))
    lens = TunedLens(readout=readout, n_steps=cfg.tuned_steps, lr=cfg.tuned_lr, batch_size=cfg.tuned_batch,
                     seed=cfg.seed)
    return lens.fit(reps["predict"]["H"])


# ----------------------------------------------------------------------------------- part 3: attribution
@dataclass
class Prediction:
    """The one prediction of a sentence whose inputs are attributed: F = score(ids) of `input`."""

    input: torch.Tensor  # (T,) the ids the model reads
    read: int  # the position F is read at (rollout's and flow's row)
    label: int  # the token whose log-prob is F (LM), or the class whose logit is F (classifier)
    positions: np.ndarray  # (P,) the attributed positions
    score: Callable[[torch.Tensor], torch.Tensor]  # ids (S, T) -> F (S,) float64


def lm_prediction(model, readout, tok) -> Callable[[torch.Tensor, np.random.Generator], Prediction]:
    """The family's LM prediction of a sentence (`ATTRIBUTION_TARGET`): F = log p(token) at the read position."""
    target, kw = _family(ATTRIBUTION_TARGET, model, "the attributed prediction"), family_of(model).analysis_kwargs

    def predict(ids: torch.Tensor, rng: np.random.Generator) -> Prediction:
        inp, p, token, pos = target(tok, ids, rng)

        def score(batch: torch.Tensor) -> torch.Tensor:
            h = model(batch, output_hidden_states=True, **kw).hidden_states[-1][:, p]
            return torch.log_softmax(readout(h).double(), -1)[:, token]
        return Prediction(inp, p, token, pos, score)
    return predict


# the family's summary token ([CLS] or the last real token) -> its position in a sentence of T tokens
SUMMARY_POSITION: dict[str, Callable[[int], int]] = {"first": lambda T: 0, "last": lambda T: T - 1}


def classifier_prediction(clf, tok) -> Callable[[torch.Tensor, np.random.Generator], Prediction]:
    """A sentence classifier's decision (`plmodels.training.finetune.Classifier`): F = the logit of the
    class it predicts on the intact sentence, read at the family's summary token (`Family.summary_token`:
    an encoder's [CLS], a decoder's last token); every non-special token is attributed."""
    read = SUMMARY_POSITION[family_of(clf.base).summary_token]

    def predict(ids: torch.Tensor, rng: np.random.Generator) -> Prediction:
        logits = lambda batch: clf(batch, torch.ones_like(batch)).double()  # (S, C); one sentence, no padding
        with torch.no_grad():
            c = int(logits(ids[None])[0].argmax())
        return Prediction(ids, read(len(ids)), c, np.array(_words(tok, ids)), lambda batch: logits(batch)[:, c])
    return predict


def _attributions(model, tok, pred: Prediction, cfg: FlowRunConfig) -> dict:
    """{method: scores (P,)} of one prediction, with the `EmbedTarget` of F and IG's completeness error."""
    kw = family_of(model).analysis_kwargs
    inp, p = pred.input, pred.read
    target = EmbedTarget(model, pred.score, inp, tok.pad_id if tok.pad_id is not None else 0)
    with torch.no_grad():
        out = model(inp[None], output_attentions=True, **kw)
        attn = torch.stack([a[0].nanmean(0) for a in out.attentions]).double().numpy()  # (L, T, T)
        run = lambda b: model(b, output_hidden_states=True, **kw).hidden_states
        mix = value_zeroing(model, run, inp)
    ig, err = integrated_gradients(target, target.x, target.baseline, n_steps=cfg.ig_steps, batch=cfg.ig_steps)
    scores = {"rollout": rollout(attn)[p], "flow": attention_flow(attn, p), "value_zeroing": rollout(mix, 0.0)[p],
              "input_x_gradient": input_x_gradient(target, target.x), "integrated_gradients": ig}
    return {"target": target, "pos": pred.positions, "scores": {k: v[pred.positions] for k, v in scores.items()},
            "ig_error": err, "input": inp, "read": p, "token": pred.label}


def attribution_rows(model_name: str, model, tok, sents: list[list[int]], cfg: FlowRunConfig,
                     predict: Callable[[torch.Tensor, np.random.Generator], Prediction], target: str = "lm") -> list[tuple]:
    """Each method's faithfulness over the sentences, for the prediction `predict` makes of each
    (`lm_prediction`, `classifier_prediction`; `target` names it in the table): per sentence, the
    leave-one-out effects, deletion and insertion curves of every method and random draw come from
    one batched pass (`faithfulness`)."""
    rng = np.random.default_rng(cfg.seed)
    per: dict[str, dict[str, list[float]]] = {m: {"spearman_loo": [], "aopc": [], "aopc_insertion": []}
                                              for m in (*ATTRIBUTION_METHODS, "random")}
    errors = []
    for s in sents:
        a = _attributions(model, tok, predict(torch.tensor(s), rng), cfg)
        pos, f = a["pos"], a["target"]
        if len(pos) < 3:
            continue
        k = min(cfg.deletion_k, len(pos))
        draws = {f"random{i}": rng.random(len(pos)) for i in range(cfg.random_draws)}
        loo, curves, inserted = faithfulness(f, f.x, f.baseline, pos, a["scores"] | draws, k)
        for m, sc in a["scores"].items():
            per[m]["spearman_loo"].append(rank_correlation(sc, loo))
            per[m]["aopc"].append(aopc(curves[m]))
            per[m]["aopc_insertion"].append(insertion_aopc(inserted[m]))
        per["random"]["spearman_loo"].append(float(np.nanmean([rank_correlation(d, loo) for d in draws.values()])))
        per["random"]["aopc"].append(float(np.mean([aopc(curves[d]) for d in draws])))
        per["random"]["aopc_insertion"].append(float(np.mean([insertion_aopc(inserted[d]) for d in draws])))
        errors.append(a["ig_error"])
    rows = []
    for m, metrics in per.items():
        for metric, vals in metrics.items():
            v = np.asarray(vals, dtype=float)
            v = v[np.isfinite(v)]
            rows.append((model_name, target, m, metric, *bootstrap_ci(v, n_boot=cfg.n_boot, seed=cfg.seed), len(v),
                         cfg.seed))
    e = np.asarray(errors)
    rows.append((model_name, target, "integrated_gradients", "completeness_error",
                 *bootstrap_ci(e, n_boot=cfg.n_boot, seed=cfg.seed), len(e), cfg.seed))
    return rows


def sentence_classifier(path: str | Path):
    """The `plmodels.training.finetune.Classifier` of a finetuned sentence-classification checkpoint
    (finetune.json + head.safetensors, kind "sentence"), else None."""
    path = Path(path)
    if not ((path / INFO_FILE).is_file() and (path / HEAD_FILE).is_file()):
        return None
    clf = load_classifier(path)
    return clf if clf.kind == "sentence" else None


def classifier_sentences(clf, tok, cfg: FlowRunConfig) -> list[list[int]]:
    """The first `attr_sentences` dev sentences of the classifier's task (SST-2) of 4..max_tokens tokens."""
    data = load_task_data(clf.info["task"])
    encs = tok.encode_batch([text for text, _ in data.dev])
    return [e for e in encs if 4 <= len(e) <= cfg.max_tokens][: cfg.attr_sentences]


# ----------------------------------------------------------------------------------- the run
def stack_readout(stack, form: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The lens readout of one stack (`Family.flow_stacks`) whose prediction form is `form`: its record's
    `residual_logits` when it has one and the form a view (`PREDICTION_VIEW`), else None (the MI curves
    only)."""
    return lm_readout(stack) if family_of(stack).residual_logits is not None and form in PREDICTION_VIEW else None


def flow_model(model_path: str | Path, out_dir: str | Path | None = None,
               config: FlowRunConfig | Mapping | None = None, model_name: str | None = None,
               lens_dir: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The flow suite of one checkpoint -> {"flow_mi", "flow_lens", "flow_attribution"}; with out_dir the
    tables are upserted into out_dir/tables and the config and timings go to out_dir/flow_run.json. The
    tuned lens is saved in lens_dir (None: `<checkpoint>/tuned_lens/`), a further stack's in its
    subfolder (an encoder-decoder's teacher-forced decoder: `decoder/`).

    A finetuned sentence classifier (finetune.json + head.safetensors) has its decision attributed, on
    its task's dev sentences (target = the task, "sst2"), and no lens: its body was trained on past its
    LM head. A checkpoint whose card says its LM head is untrained (an imported sentence encoder,
    ELECTRA's discriminator) gets the MI curves only. Every stack with a lens readout (`stack_readout`:
    an encoder, a decoder, an encoder-decoder's teacher-forced decoder) gets the lens rows; a model whose
    own stack has one has its LM prediction attributed (target "lm")."""
    cfg = FlowRunConfig.resolve(config)
    clf = sentence_classifier(model_path)
    model, tok = (clf.base, clf.tokenizer) if clf is not None else plmodels.load(model_path)
    model.requires_grad_(False)  # gradients are taken with respect to inputs and lens translators only
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; workbench flow needs one")
    model.eval()
    model_name = model_name or default_model_name(model_path)
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}  # this process' CPU seconds: on a shared box the wall time is not the cost
    t0, c0 = time.perf_counter(), time.process_time()
    sents = _sentences(cfg, tok, "test", cfg.n_sentences)
    special = torch.tensor(sorted(tok.special_ids))
    # the floor of every number here: the same architecture with fresh weights, drawn under the analysis seed
    # offset by the pretraining seed (`floor_seed`); an encoder-decoder's decoder stack is that of the fresh
    # encoder-decoder (`Family.flow_stacks`)
    fresh_seed = floor_seed(cfg.seed, training_seed(model_path))
    floor = random_init_model(model, fresh_seed).requires_grad_(False)
    fam = family_of(model)
    stacks, floor_stacks = fam.flow_stacks(model), family_of(floor).flow_stacks(floor)
    # each stack's prediction form (a biLM's backward LM: the previous token), and the lens (and, for the
    # model itself, the LM attribution) of each stack whose LM head is trained and reads its every layer
    # (an encoder-decoder's `TeacherForcedDecoder` and a biLM's `BiLMDirection` are read as decoders)
    forms = {suffix: fam.flow_views.get(suffix, family_of(m).lm_inputs) for suffix, m in stacks.items()}
    lens = clf is None and read_card(model_path).lm_head_trained
    readouts = {suffix: stack_readout(m, forms[suffix]) if lens else None for suffix, m in stacks.items()}
    readout = readouts[""]
    data = {suffix: _batches(m, tok, sents, cfg, forms[suffix]) for suffix, m in stacks.items()}
    # "predict" items: for an MI curve (`Family.flow_predict_mi`) or the lens (the teacher-forced
    # decoder's next token is a copy of its source: the lens only, docs/flow.md)
    predict_mi = set(fam.flow_predict_mi)
    labels = {suffix: ("input", "predict") if suffix in predict_mi or readouts[suffix] is not None else ("input",)
              for suffix in stacks}
    reps = {suffix: _collect(m, data[suffix], special, labels[suffix]) for suffix, m in stacks.items()}
    floor_reps = {suffix: _collect(m, data[suffix], special, labels[suffix]) for suffix, m in floor_stacks.items()}
    seconds["forward"], cpu["forward"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    mi_labels = lambda suffix, r: {k: v for k, v in r[suffix].items() if suffix in predict_mi or k == "input"}  # noqa: E731
    mi = [row for suffix in stacks for variant, r in (("trained", reps), ("random_init", floor_reps))
          for row in mi_rows(model_name + suffix, variant, mi_labels(suffix, r), cfg)]
    seconds["mi"], cpu["mi"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    lens_tab, lens_paths = [], {}
    base = Path(model_path) / "tuned_lens" if lens_dir is None else Path(lens_dir)
    for suffix, stack in stacks.items():
        if readouts[suffix] is None:
            continue
        lens = train_tuned_lens(stack, readouts[suffix], tok, cfg, forms[suffix])
        lens_paths[suffix] = str(lens.save(base / suffix.lstrip(";") if suffix else base))
        lens_tab += lens_rows(model_name + suffix, "trained", readouts[suffix], reps[suffix], lens, cfg) + \
            lens_rows(model_name + suffix, "random_init", lm_readout(floor_stacks[suffix]), floor_reps[suffix], None, cfg)
    seconds["lens"], cpu["lens"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    attr = []
    if clf is not None:
        attr = attribution_rows(model_name, model, tok, classifier_sentences(clf, tok, cfg), cfg,
                                classifier_prediction(clf, tok), clf.info["task"])
    elif readout is not None and family_of(model).lm_inputs in ATTRIBUTION_TARGET:
        attr = attribution_rows(model_name, model, tok, sents[: cfg.attr_sentences], cfg,
                                lm_prediction(model, readout, tok))
    seconds["attribution"], cpu["attribution"] = time.perf_counter() - t0, time.process_time() - c0
    tables = {"flow_mi": pd.DataFrame(mi, columns=MI_COLUMNS), "flow_lens": pd.DataFrame(lens_tab, columns=LENS_COLUMNS),
              "flow_attribution": pd.DataFrame(attr, columns=ATTR_COLUMNS)}
    if out_dir is not None:
        write_tables(out_dir, tables)
        atomic_write_json(Path(out_dir) / "flow_run.json", {
            "model": model_name, "model_path": str(model_path), "checkpoint_hash": plmodels.checkpoint_hash(model_path),
            "config": cfg.to_dict(), "random_init_seed": fresh_seed, "n_sentences": len(sents),
            "tuned_lens": lens_paths.get(""),
            "tuned_lenses": {model_name + k: v for k, v in lens_paths.items()},
            "attribution_target": clf.info["task"] if clf is not None else "lm" if readout is not None else None,
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "cpu_seconds": {k: round(v, 1) for k, v in cpu.items()}})
    return tables


# ----------------------------------------------------------------------------------- one typed sentence
def flow_sentence(model, tok, text: str, lens: TunedLens | None = None, k: int = 5,
                  config: FlowRunConfig | Mapping | None = None) -> dict[str, pd.DataFrame]:
    """The flow suite's per-sentence view of one typed text (the app's Flow page): the prediction the
    tables attribute (`ATTRIBUTION_TARGET`: a decoder's last token given the rest, an encoder's one
    masked word piece, drawn with the config's seed), what each layer would predict there through the
    logit lens (and the tuned lens, when given), and every attribution method's score of each token.

    -> {"target": one row (position, token, log_prob), "lens": layer, lens, rank, token, prob (top k),
    "attributions": method, position, token, score (the attributed positions)}."""
    cfg = FlowRunConfig.resolve(config)
    ids = tok.encode(text)[: int(model.config.max_positions)]
    words = [t for t in range(len(ids)) if ids[t] not in tok.special_ids]
    if len(words) < 2:
        raise ValueError(f"flow: type at least two word pieces (got {len(words)} in {text!r})")
    readout = lm_readout(model)
    pred = lm_prediction(model, readout, tok)(torch.tensor(ids), np.random.default_rng(cfg.seed))
    a = _attributions(model, tok, pred, cfg)
    inp, p, token = a["input"], a["read"], a["token"]
    with torch.no_grad():
        hs = model(inp[None], output_hidden_states=True, **family_of(model).analysis_kwargs).hidden_states
        H = torch.stack([h[0, p] for h in hs])  # (L+1, D)
        reads = {"logit": H} | ({"tuned": torch.stack([lens.translate(l, h) for l, h in enumerate(H)])}
                                if lens is not None else {})
        rows = []
        for name, h in reads.items():
            probs = torch.softmax(readout(h).float(), -1)  # (L+1, V)
            top = probs.topk(min(k, probs.shape[-1]), -1)
            rows += [(l, name, r + 1, tok.decode([int(top.indices[l, r])]), float(top.values[l, r]))
                     for l in range(len(H)) for r in range(top.indices.shape[1])]
        log_prob = float(a["target"](a["target"].x[None])[0])
    pieces = [tok.decode([int(i)]) for i in inp]
    attributions = pd.DataFrame([(m, int(t), pieces[int(t)], float(v)) for m, sc in a["scores"].items()
                                 for t, v in zip(a["pos"], sc)], columns=["method", "position", "token", "score"])
    return {"target": pd.DataFrame([(p, tok.decode([token]), log_prob)], columns=["position", "token", "log_prob"]),
            "lens": pd.DataFrame(rows, columns=["layer", "lens", "rank", "token", "prob"]),
            "attributions": attributions}


# the zoo's flow statistics (`workbench.analyses.zoo.flow_statistics`): their task in zoo_stats and
# zoo_comparisons, and the one declared primary statistic among them (Holm's primary family,
# `workbench.analyses.zoo.adjust_claims`): the tuned lens' mean KL to the final distribution below the
# last layer, how far from its own prediction a system's layers are (Belrose et al. 2023 read a model
# through the tuned lens because the logit lens misreads some families' layers outright)
ZOO_TASK = "flow"
ZOO_PRIMARY = "flow_lens_kl_tuned_mean"
# (variant, control) of a flow_mi curve -> its statistic's suffix: the trained model and its two floors
MI_CURVE_SUFFIX = {("trained", "none"): "", ("random_init", "none"): "_random_init", ("trained", "shuffled"): "_shuffled"}


def flow_seed_values(mi: pd.DataFrame | None, lens: pd.DataFrame | None = None,
                     attribution: pd.DataFrame | None = None) -> dict[tuple[str, int, bool], dict[str, float]]:
    """The zoo's per-checkpoint flow values, which `workbench.analyses.zoo.flow_statistics` resamples
    over pretraining seeds: {(statistic, layer, compared): {model: value}}, layer -1 for a scalar,
    compared: whether systems are compared on it (False for the curves and the floors, which stand beside).

    Curves (one value per layer):
    - "flow_mi_<label>_<e>": the input-token ("input") or token-to-predict ("predict") MI as a share of
      H(Y) (`mi_fraction`) by estimator e, with its floors "..._random_init" and "..._shuffled";
    - "flow_lens_<metric>_<lens>": the logit or tuned lens' kl / top1_agree / lm_loss, with the floor
      "flow_lens_<metric>_logit_random_init".
    Scalars:
    - "flow_input_mi_top_<e>": the input-token share at the last layer (Voita et al. 2019: a CLM ends
      lowest, an MLM higher), and "flow_input_mi_rebuild_<e>": the last layer's minus the lowest
      layer's (0 when the curve only falls; an MLM's loss-then-rebuild is > 0);
    - "flow_lens_kl_<lens>_mean": the mean over the layers below the last of KL(p_final || p_l), nats
      (`ZOO_PRIMARY` for the tuned lens), with the floor "flow_lens_kl_logit_random_init_mean";
    - "flow_attr_spearman_loo_<method>": each attribution method's Spearman with leave-one-out on the
      LM prediction (target "lm"), with the floor "flow_attr_spearman_loo_random".
    A seq2seq's ";decoder" stack is its own model name."""
    out: dict[tuple[str, int, bool], dict[str, float]] = {}

    def put(statistic: str, layer: int, compared: bool, model: str, value: float) -> None:
        out.setdefault((statistic, layer, compared), {})[model] = float(value)

    if mi is not None and len(mi):
        g = mi[mi["metric"] == "mi_fraction"]
        for (model, label, est, variant, control), c in g.groupby(["model", "label", "estimator", "variant", "control"]):
            suffix = MI_CURVE_SUFFIX.get((variant, control))
            if suffix is None:
                continue
            c = c.sort_values("layer")
            for layer, v in zip(c["layer"], c["value"]):
                put(f"flow_mi_{label}_{est}{suffix}", int(layer), False, model, v)
            if label == "input" and suffix == "":
                top = float(c["value"].iloc[-1])
                put(f"flow_input_mi_top_{est}", -1, True, model, top)
                put(f"flow_input_mi_rebuild_{est}", -1, True, model, top - float(c["value"].min()))
    if lens is not None and len(lens):
        for (model, variant, name, metric), c in lens.groupby(["model", "variant", "lens", "metric"]):
            floor = "" if variant == "trained" else f"_{variant}"
            c = c.sort_values("layer")
            for layer, v in zip(c["layer"], c["value"]):
                put(f"flow_lens_{metric}_{name}{floor}", int(layer), False, model, v)
            if metric == "kl" and len(c) > 1:
                put(f"flow_lens_kl_{name}{floor}_mean", -1, not floor, model, float(c["value"].iloc[:-1].mean()))
    if attribution is not None and len(attribution):
        a = attribution[(attribution["target"] == "lm") & (attribution["metric"] == "spearman_loo")]
        for model, method, v in zip(a["model"], a["method"], a["value"]):
            put(f"flow_attr_spearman_loo_{method}", -1, method != "random", model, v)
    return out


def flow_kinds() -> list[str]:
    """The model kinds the flow suite reads whole (MI, lens, attribution: the app's sentence view): a
    family with an LM readout (`Family.residual_logits`) and an entry in `PREDICTION_VIEW` and
    `ATTRIBUTION_TARGET` for its LM batch form. Every other kind gets the MI curves of its stacks, and the
    lens of those that have a readout (`Family.flow_stacks`: a seq2seq's decoder, XLNet's query stream,
    ELMo's directions)."""
    return sorted(k for k, f in FAMILIES.items() if f.residual_logits is not None
                  and f.lm_inputs in PREDICTION_VIEW and f.lm_inputs in ATTRIBUTION_TARGET)


def saved_tuned_lens(model, checkpoint: str | Path) -> TunedLens | None:
    """The tuned lens `flow_model` saved beside `checkpoint` (its tuned_lens/ folder), or None."""
    folder = Path(checkpoint) / "tuned_lens"
    return TunedLens.load(folder, lm_readout(model)) if (folder / "tuned_lens.json").is_file() else None
