"""Finetuning a pretrained checkpoint on sentence classification (SST-2) or token classification
(UD POS), in two modes: "full" (every weight trained; Devlin et al. 2019, Sec. 4) and "frozen" (only
a new linear head on frozen features, the feature-based approach of Peters et al. 2018 / Devlin et
al. 2019 Sec. 5.3).

Library entry points (the CLI `workbench finetune` calls the first):

    finetune(config, out_dir, overrides=None, *, data) -> Path   # the finetuned checkpoint folder
    load_classifier(path) -> Classifier                            # base model + head, eval mode

Features:
- sentence tasks: encoder -> BERT's pooled [CLS] (`pooler_output`, tanh(W h_[CLS] + b));
  decoder -> the hidden state of the last non-pad token (GPT-style classification);
  ELMo's biLM -> [forward LM at the last token; backward LM at the first token], each direction's
  state after reading the whole sentence (2 d_proj = D wide);
- token tasks: the hidden state of the first subword of each word (Devlin et al. 2019, Sec. 5.3).
The head is dropout + Linear(D, n_labels). Frozen mode computes the features once with the base in
eval mode under no_grad and trains only the head on them (fast; the base weights stay bit-exact).
Early stopping on dev accuracy: the best head/model state seen at an evaluation is kept.

Checkpoint folder (`out_dir`): the `plmodels.save` layout for the base model (updated or not) +
`head.safetensors` + `finetune.json` {task, mode, labels, dev metrics, base checkpoint hash, ...}.

Data: the caller passes the examples as `TaskData`; plmodels reads no data set itself
(`workbench.data.finetuning` loads SST-2 and UD POS through the data root and calls `finetune`).
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

import plmodels
from plmodels import recipes
from plmodels.checkpoint import CheckpointError, check_weights, read_meta, training_seed
from plmodels.config import Config, merge
from plmodels.families import family_of
from plmodels.files import save_safetensors, write_json_atomic

from .masking import IGNORE_INDEX
from .runtime import fmt_time, log
from .schedule import lr_at

TASK_KINDS = {"sst2": "sentence", "pos": "token"}
HEAD_FILE, INFO_FILE = "head.safetensors", "finetune.json"


@dataclass(frozen=True)
class FinetuneConfig(Config):
    """A finetuning run; unknown keys are errors."""

    base: str                                   # pretrained checkpoint folder
    task: Literal["sst2", "pos"]                # SST-2 sentence sentiment or UD-EWT UPOS tagging
    mode: Literal["full", "frozen"] = "full"    # train everything, or only the head on frozen features
    max_train_examples: int | None = None       # cap on training examples (None: all)
    max_dev_examples: int | None = None
    seq_len: int = 128                          # subword limit; longer inputs are truncated (counted)
    batch_size: int = 32
    lr: float = 5e-5                            # peak lr (BERT finetuning range 2e-5..5e-5; frozen: ~1e-3)
    head_lr: float | None = None                # peak lr of the new task head in full mode (None: lr)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1                   # share of max steps spent warming up
    epochs: int = 3
    max_steps: int | None = None                # cap on optimizer steps (None: epochs decide)
    max_minutes: float | None = None            # wall-clock budget
    eval_every: int = 200                       # steps between dev evaluations (and at each epoch end)
    patience: int = 5                           # evaluations without improvement before stopping
    head_dropout: float = 0.1
    seed: int = 0
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.task not in TASK_KINDS:
            raise ValueError(f"task must be one of {sorted(TASK_KINDS)}, got {self.task!r}")
        if self.mode not in ("full", "frozen"):
            raise ValueError(f"mode must be 'full' or 'frozen', got {self.mode!r}")
        for name in ("seq_len", "batch_size", "epochs", "eval_every", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_lr is not None and self.head_lr <= 0:
            raise ValueError(f"head_lr must be > 0 or null, got {self.head_lr}")
        if self.lr <= 0 or not 0 <= self.warmup_ratio < 1 or not 0 <= self.head_dropout < 1:
            raise ValueError(f"need lr > 0, warmup_ratio and head_dropout in [0, 1); got {self.lr}, "
                             f"{self.warmup_ratio}, {self.head_dropout}")


def load_finetune_config(config, overrides: dict | None = None) -> FinetuneConfig:
    """A FinetuneConfig from an object, a JSON path or a recipe name (plmodels/recipes/finetune/),
    with overrides."""
    if isinstance(config, FinetuneConfig):
        return FinetuneConfig.from_dict(merge(config.to_dict(), overrides), "overrides")
    return FinetuneConfig.load(recipes.find("finetune", config), overrides)


# --------------------------------------------------------------------------------------------- data
@dataclass
class TaskData:
    """Examples of one task. sentence: (text, label_index); token: (words, [label_index per word])."""

    kind: Literal["sentence", "token"]
    labels: list[str]
    train: list
    dev: list


def encode(examples: list, kind: str, tok, seq_len: int) -> tuple[list[tuple[list[int], object]], int]:
    """Subword ids + targets per example, truncated to seq_len; returns (encoded, n_truncated).

    sentence: target = label index. token: target = list of (subword position, label) for the first
    subword of each word that fits (later words of a truncated sentence are dropped and counted).
    """
    out, n_trunc = [], 0
    end = tok.special_affixes[1]   # [SEP] (BERT, RoBERTa's </s>) or nothing (GPT-2 style)
    if kind == "sentence":
        for ids, (_, y) in zip(tok.encode_batch([t for t, _ in examples]), examples):
            if len(ids) > seq_len:
                ids, n_trunc = ids[: seq_len - len(end)] + end, n_trunc + 1
            out.append((ids, y))
        return out, n_trunc
    for enc, (_, ys) in zip(tok.encode_words_batch([w for w, _ in examples]), examples):
        ids, targets = enc.ids, [(s, y) for (s, _), y in zip(enc.word_spans, ys)]
        if len(ids) > seq_len:
            n_trunc += 1
            ids = ids[: seq_len - len(end)] + end
            targets = [(s, y) for s, y in targets if s < seq_len - len(end)]
        out.append((ids, targets))
    return out, n_trunc


def collate(batch: list, kind: str, pad_id: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids (B, T), attention_mask (B, T), labels (B,) or (B, T) with -100 off first subwords)."""
    T = max(len(ids) for ids, _ in batch)
    # a tokenizer without a pad (GPT-2) pads with id 0: the mask hides it
    ids = torch.full((len(batch), T), 0 if pad_id is None else pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    labels = torch.full((len(batch),) if kind == "sentence" else (len(batch), T), IGNORE_INDEX, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        if kind == "sentence":
            labels[i] = y
        else:
            for pos, lab in y:
                labels[i, pos] = lab
    return ids, mask, labels


# -------------------------------------------------------------------------------------- the model
class Classifier(nn.Module):
    """A pretrained model plus a linear head. forward(ids (B, T), mask (B, T)) -> logits
    (B, C) for sentence tasks or (B, T, C) for token tasks."""

    def __init__(self, base: nn.Module, n_labels: int, kind: str, dropout: float = 0.1):
        super().__init__()
        self.base, self.kind = base, kind
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(base.config.d_model, n_labels)

    def features(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, D) sentence features or (B, T, D) token features (see module docstring)."""
        out = self.base(ids, attention_mask=mask)
        if self.kind == "token":
            return out.last_hidden_state
        # the family's sentence vector: [CLS]'s pooled vector, the last real token (right padding), or
        # a biLM's [forward after the last token; backward after the first]
        return family_of(self.base).sentence_features(self.base, out, mask)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(ids, mask)))


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    sel = labels != IGNORE_INDEX
    return int((logits.argmax(-1)[sel] == labels[sel]).sum()), int(sel.sum())


@torch.no_grad()
def frozen_features(clf: Classifier, encoded: list, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of the frozen base (eval mode): sentence (N, D), (N,) or token (N_words, D), (N_words,)."""
    clf.base.eval()
    feats, labs = [], []
    for i in range(0, len(encoded), batch_size):
        ids, mask, labels = collate(encoded[i: i + batch_size], clf.kind, clf.pad_id)
        f = clf.features(ids, mask)
        if clf.kind == "token":
            sel = labels != IGNORE_INDEX
            f, labels = f[sel], labels[sel]
        feats.append(f.float())
        labs.append(labels)
    return torch.cat(feats), torch.cat(labs)


def _fit(cfg: FinetuneConfig, params: list, n_train: int, loss_of, evaluate, state_of, load_state,
         head_params: list | None = None) -> dict:
    """AdamW with warmup + linear decay over index batches, dev evaluation every `eval_every` steps
    and at each epoch end, early stopping after `patience` evaluations without a better dev accuracy;
    the best state is restored. `head_params` (a subset of `params`) peak at `cfg.head_lr` instead of
    `cfg.lr` when it is set. Returns {"dev_acc", "best_step", "steps", "stopped_by"}."""
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    total = min(cfg.max_steps or 10**12, steps_per_epoch * cfg.epochs)
    head_ids = {id(p) for p in head_params or []} if cfg.head_lr is not None else set()
    groups = []
    for is_head in (False, True):
        peak = cfg.head_lr if is_head else cfg.lr
        mine = [p for p in params if (id(p) in head_ids) == is_head]
        groups += [{"params": [p for p in mine if p.dim() >= 2], "weight_decay": cfg.weight_decay, "peak": peak},
                   {"params": [p for p in mine if p.dim() < 2], "weight_decay": 0.0, "peak": peak}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)
    best = {"dev_acc": -1.0, "best_step": 0}
    best_state, bad, step, t0, stopped_by = None, 0, 0, time.monotonic(), "epochs"
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(cfg.epochs):
        order = torch.randperm(n_train, generator=gen)
        for i in range(0, n_train, cfg.batch_size):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, peak=g["peak"], warmup=int(cfg.warmup_ratio * total), total=total)
            loss = loss_of(order[i: i + cfg.batch_size])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            end_of_epoch = i + cfg.batch_size >= n_train
            if step % cfg.eval_every == 0 or end_of_epoch or step >= total:
                acc = evaluate()
                log(f"  step {step}/{total} epoch {epoch} | loss {loss.item():.4f} | dev acc {acc:.4f} | "
                    f"{fmt_time(time.monotonic() - t0)}")
                if acc > best["dev_acc"]:
                    best, best_state, bad = {"dev_acc": acc, "best_step": step}, state_of(), 0
                else:
                    bad += 1
            if bad >= cfg.patience:
                stopped_by = "early stopping"
            elif step >= total:
                stopped_by = "max_steps" if cfg.max_steps and step >= cfg.max_steps else "epochs"
            elif cfg.max_minutes is not None and time.monotonic() - t0 >= 60 * cfg.max_minutes:
                stopped_by = "time budget"
            else:
                continue
            break
        else:
            continue
        break
    if stopped_by == "time budget" and step > best["best_step"]:  # a last look at dev before leaving
        acc = evaluate()
        if acc > best["dev_acc"]:
            best, best_state = {"dev_acc": acc, "best_step": step}, state_of()
    load_state(best_state)
    return {**best, "steps": step, "stopped_by": stopped_by}


def check_base(cfg: FinetuneConfig, field: str = "base") -> None:
    """The base checkpoint is whole (config.json readable, model.safetensors matching checksums.json or
    its own header), checked before any data is read, model loaded or folder made: one error naming
    `field` (where the value came from: "base", "--set base", "<config file>: base") and the folder or
    file otherwise."""
    try:
        read_meta(cfg.base)
        check_weights(cfg.base)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{field}: {e}") from None
    except CheckpointError as e:
        raise CheckpointError(f"{field}: {e}") from None


def finetune(config, out_dir: str | Path, overrides: dict | None = None, *, data: TaskData) -> Path:
    """Finetune `config.base` on `config.task` in `config.mode`; returns the checkpoint folder out_dir."""

    cfg = load_finetune_config(config, overrides)
    check_base(cfg)
    out_dir = Path(out_dir)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if data.kind != TASK_KINDS[cfg.task]:
        raise ValueError(f"task {cfg.task!r} needs {TASK_KINDS[cfg.task]} data, got {data.kind!r}")
    base, tok = plmodels.load(cfg.base)
    if tok is None:
        raise ValueError(f"{cfg.base} holds no tokenizer")
    torch.manual_seed(cfg.seed)
    clf = Classifier(base, len(data.labels), data.kind, cfg.head_dropout)
    clf.pad_id = tok.pad_id
    train, n_tr = encode(data.train, data.kind, tok, cfg.seq_len)
    dev, n_dv = encode(data.dev, data.kind, tok, cfg.seq_len)
    log(f"finetune {cfg.task} ({cfg.mode}) on {cfg.base}: {len(train)} train / {len(dev)} dev examples, "
        f"{n_tr} + {n_dv} truncated to {cfg.seq_len} subwords")

    if cfg.mode == "frozen":
        for p in clf.base.parameters():
            p.requires_grad_(False)
        Xtr, ytr = frozen_features(clf, train, cfg.batch_size)
        Xdv, ydv = frozen_features(clf, dev, cfg.batch_size)
        params = list(clf.head.parameters())

        def loss_of(idx):
            clf.train()
            return F.cross_entropy(clf.head(clf.drop(Xtr[idx])), ytr[idx])

        @torch.no_grad()
        def evaluate():
            clf.eval()
            return float((clf.head(Xdv).argmax(-1) == ydv).float().mean())

        n_train = len(Xtr)
        state_of = lambda: copy.deepcopy(clf.head.state_dict())  # noqa: E731
        load_state = lambda s: clf.head.load_state_dict(s)  # noqa: E731
    else:
        params = [p for p in clf.parameters() if p.requires_grad]

        def loss_of(idx):
            clf.train()
            ids, mask, labels = collate([train[int(i)] for i in idx], data.kind, tok.pad_id)
            logits = clf(ids, mask)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)

        evaluate = lambda: dev_accuracy(clf, dev, cfg.batch_size)  # noqa: E731
        n_train = len(train)
        state_of = lambda: copy.deepcopy(clf.state_dict())  # noqa: E731
        load_state = lambda s: clf.load_state_dict(s)  # noqa: E731

    result = _fit(cfg, params, n_train, loss_of, evaluate, state_of, load_state, head_params=list(clf.head.parameters()))
    info = {"task": cfg.task, "kind": data.kind, "mode": cfg.mode, "labels": data.labels,
            "dev_metrics": {"accuracy": result["dev_acc"]}, "best_step": result["best_step"],
            "steps": result["steps"], "stopped_by": result["stopped_by"], "n_train": len(train),
            "n_dev": len(dev), "truncated": {"train": n_tr, "dev": n_dv}, "head_dropout": cfg.head_dropout,
            "base": str(cfg.base), "base_hash": plmodels.checkpoint_hash(cfg.base), "config": asdict(cfg)}
    card = {"finetuned": {k: info[k] for k in ("task", "mode", "dev_metrics", "base_hash")},
            "metrics": {f"{cfg.task}_dev_accuracy": result["dev_acc"]}}
    pretrained_under = training_seed(cfg.base)   # the base's: its random-init floor is the finetuned one's too
    if pretrained_under is not None:
        card["seed"] = pretrained_under
    plmodels.save(clf.base, tok, out_dir, card=card)
    save_safetensors({k: v.contiguous() for k, v in clf.head.state_dict().items()}, out_dir / HEAD_FILE)
    write_json_atomic(out_dir / INFO_FILE, info)
    log(f"finetuned: dev accuracy {result['dev_acc']:.4f} (best step {result['best_step']}, "
        f"{result['stopped_by']}) -> {out_dir}")
    return out_dir


@torch.no_grad()
def dev_accuracy(clf: Classifier, encoded: list, batch_size: int) -> float:
    """Accuracy over sentences, or over first subwords of words for token tasks."""
    clf.eval()
    correct = count = 0
    for i in range(0, len(encoded), batch_size):
        ids, mask, labels = collate(encoded[i: i + batch_size], clf.kind, clf.pad_id)
        c, n = _accuracy(clf(ids, mask), labels)
        correct, count = correct + c, count + n
    return correct / max(1, count)


def load_classifier(path: str | Path, map_location: str = "cpu") -> Classifier:
    """A finetuned checkpoint folder -> Classifier in eval mode, with `.tokenizer` and `.info`."""


    path = Path(path)
    if not (path / INFO_FILE).is_file() or not (path / HEAD_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a finetuned checkpoint (needs {INFO_FILE} and {HEAD_FILE})")
    info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    base, tok = plmodels.load(path, map_location)
    clf = Classifier(base, len(info["labels"]), info["kind"], info.get("head_dropout", 0.1))
    clf.head.load_state_dict(load_file(str(path / HEAD_FILE)))
    clf.pad_id, clf.tokenizer, clf.info = tok.pad_id, tok, info
    return clf.to(map_location).eval()
