"""Frozen features with a trained head vs full finetuning, on SST-2 and UD POS.

The classic comparison of Peters, Ruder & Smith (2019), "To Tune or Not to Tune?", and Devlin et
al. (2019), BERT, Table 7 (feature-based approach): a small head is trained on features of the
frozen pretrained model, taken as
- "last": the last layer ([CLS] for sentence tasks, the first subword of each word for tokens),
- "mean_last": the mean over real tokens of the last layer (sentence tasks only),
- "layer:k": a single chosen layer k (0 = embeddings; negative counts from the top),
- "scalar_mix": a learned softmax-weighted sum of all layers times gamma (Peters et al. 2018,
  ELMo; `probes.scalar_mix.ScalarMix`),
- "concat_last4": the last four layers concatenated (Devlin et al. 2019 Table 7's best),
and compared with "finetune", every weight trained through `plmodels.training.finetune` (full mode). The
head is a linear layer trained with Adam on the cached features (`FrozenHead`). Rows for each seed,
a mean row per setting (seed = -1, Student-t 95 % interval over seeds, `probes.stats.mean_ci`) and
"diff:<setting>" rows = finetune minus frozen (seed = -1; Welch interval from both groups' seeds).

Table `frozen_vs_finetuned` (model, task, setting, metric, value, seed, ci_low, ci_high).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats as st
from torch import nn

import plmodels
from plmodels.config import Config
from plmodels.families import family_of
from plmodels.progress import progress as progress_bar
from plmodels.progress import write
from plmodels.training.finetune import collate, dev_accuracy, encode, finetune, load_classifier
from probes.scalar_mix import ScalarMix
from probes.stats import mean_ci
from workbench.analyses.probing import default_model_name
from workbench.core.io import atomic_write_json
from workbench.core.results import write_table
from workbench.data.finetuning import load_task_data

COLUMNS = ["model", "task", "setting", "metric", "value", "seed", "ci_low", "ci_high"]
IGNORE = -100


@dataclass(frozen=True)
class FvFConfig(Config):
    """A frozen-vs-finetuned run; unknown keys are errors. Caps keep the demo at ~2 minutes."""

    tasks: tuple[str, ...] = ("sst2", "pos")
    settings: tuple[str, ...] = ("last", "mean_last", "layer:-2", "scalar_mix", "concat_last4")
    finetune: bool = True
    seeds: tuple[int, ...] = (0, 1, 2)             # frozen-head seeds
    finetune_seeds: tuple[int, ...] = (0,)         # full finetuning is the expensive part
    max_train_examples: int = 2000                 # sentences (SST-2) or sentences of words (POS)
    max_dev_examples: int = 500
    seq_len: int = 64
    batch_size: int = 32
    head_epochs: int = 20
    head_lr: float = 1e-3
    # full finetuning: the body at a BERT finetuning rate, the fresh task head at the frozen heads' rate
    # (with one head lr for both, a short run leaves the new head nearly untrained)
    finetune_overrides: dict = field(default_factory=lambda: {"epochs": 1, "max_minutes": 2.0, "lr": 5e-5,
                                                              "head_lr": 1e-3})
    finetuned: dict = field(default_factory=dict)  # {task: existing finetuned folder} instead of training
    num_threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("tasks", "settings", "seeds", "finetune_seeds"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
                raise ValueError(f"FvFConfig.{name} must be a list, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        bad = [t for t in self.tasks if t not in ("sst2", "pos")]
        if bad:
            raise ValueError(f"FvFConfig.tasks: unknown {bad}; choose from ['sst2', 'pos']")
        for s in self.settings:
            base = s.split(":")[0]
            if base not in ("last", "mean_last", "layer", "scalar_mix", "concat_last4"):
                raise ValueError(f"FvFConfig.settings: unknown {s!r}")
            if base == "layer":
                try:
                    int(s.split(":", 1)[1])
                except (IndexError, ValueError):
                    raise ValueError(f"FvFConfig.settings: {s!r} must be 'layer:<int>'") from None
        for name in ("max_train_examples", "max_dev_examples", "seq_len", "batch_size", "head_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"FvFConfig.{name} must be a positive int, got {getattr(self, name)!r}")

# ---------------------------------------------------------------------------------- features
@torch.no_grad()
def layer_features(model, encoded: list, kind: str, pad_id: int, batch_size: int) -> dict[str, torch.Tensor]:
    """Frozen features of every layer: {"first": (L+1, N, D), "mean": (L+1, N, D) sentence only,
    "labels": (N,)}. N = sentences, or words (first subword) for token tasks."""

    model.eval()
    first, mean, labels = [], [], []
    for i in range(0, len(encoded), batch_size):
        ids, mask, y = collate(encoded[i:i + batch_size], kind, pad_id)
        hs = torch.stack(model(ids, attention_mask=mask, output_hidden_states=True).hidden_states).float()  # (L+1, B, T, D)
        if kind == "token":
            keep = y != IGNORE
            first.append(hs[:, keep])
            labels.append(y[keep])
        else:
            first.append(hs[:, :, 0] if family_of(model).summary_token == "first" else  # [CLS] / last real token
                         hs[:, torch.arange(len(ids)), mask.sum(1) - 1])
            m = mask[None, :, :, None].float()
            mean.append((hs * m).sum(2) / m.sum(2))
            labels.append(y)
    out = {"first": torch.cat(first, 1), "labels": torch.cat(labels)}
    if mean:
        out["mean"] = torch.cat(mean, 1)
    return out


def setting_input(feats: dict, setting: str) -> torch.Tensor | None:
    """The head's input for a setting: (N, D) / (N, 4D) or (N, L+1, D) for the scalar mix; None if n/a."""
    X = feats["first"]  # (L+1, N, D)
    if setting == "last":
        return X[-1]
    if setting == "mean_last":
        return feats["mean"][-1] if "mean" in feats else None
    if setting.startswith("layer:"):
        return X[int(setting.split(":")[1])]
    if setting == "scalar_mix":
        return X.transpose(0, 1)  # (N, L+1, D)
    if setting == "concat_last4":
        return torch.cat(list(X[-4:]), dim=-1)
    raise ValueError(f"unknown setting {setting!r}")


class FrozenHead:
    """A linear classifier (optionally behind a scalar mix) on frozen features; fit / score."""

    def __init__(self, n_labels: int, mix: bool = False, epochs: int = 20, lr: float = 1e-3,
                 batch_size: int = 32, seed: int = 0) -> None:
        self.n_labels, self.mix, self.epochs, self.lr, self.batch_size, self.seed = n_labels, mix, epochs, lr, batch_size, seed

    def _net(self, X: torch.Tensor) -> nn.Module:
        lin = nn.Linear(X.shape[-1], self.n_labels)
        return nn.Sequential(ScalarMix(X.shape[1]), lin) if self.mix else lin

    def fit(self, X: torch.Tensor, y: torch.Tensor) -> "FrozenHead":
        torch.manual_seed(self.seed)
        self.net_ = self._net(X)
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr)
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epochs):
            for idx in torch.randperm(len(X), generator=g).split(self.batch_size):
                loss = F.cross_entropy(self.net_(X[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        return self

    @torch.no_grad()
    def score(self, X: torch.Tensor, y: torch.Tensor) -> float:
        return float((self.net_(X).argmax(-1) == y).float().mean())


# ------------------------------------------------------------------------------------- runs
def _say(progress: bool, msg: str) -> None:
    if progress:
        write(f"[frozen-vs-finetuned] {msg}")


def _task_data(base: Path, task: str, cfg: FvFConfig):
    return load_task_data(task, cfg.max_train_examples, cfg.max_dev_examples)


def frozen_rows(model, tok, data, task: str, cfg: FvFConfig, name: str) -> list[tuple]:
    """Per-seed dev accuracy of a frozen head for each setting."""

    train, _ = encode(data.train, data.kind, tok, cfg.seq_len)
    dev, _ = encode(data.dev, data.kind, tok, cfg.seq_len)
    ftr = layer_features(model, train, data.kind, tok.pad_id, cfg.batch_size)
    fdv = layer_features(model, dev, data.kind, tok.pad_id, cfg.batch_size)
    rows = []
    for setting in cfg.settings:
        Xtr, Xdv = setting_input(ftr, setting), setting_input(fdv, setting)
        if Xtr is None:
            continue  # e.g. mean_last on a token task
        for seed in cfg.seeds:
            head = FrozenHead(len(data.labels), mix=setting == "scalar_mix", epochs=cfg.head_epochs,
                              lr=cfg.head_lr, batch_size=cfg.batch_size, seed=seed).fit(Xtr, ftr["labels"])
            rows.append((name, task, setting, "accuracy", head.score(Xdv, fdv["labels"]), seed, math.nan, math.nan))
    return rows


def finetune_rows(base: Path, data, task: str, cfg: FvFConfig, name: str, out_dir: Path | None) -> list[tuple]:
    """Per-seed dev accuracy of full finetuning (or of a given finetuned folder, re-scored on our dev)."""

    rows = []
    if task in cfg.finetuned:
        clf = load_classifier(cfg.finetuned[task])
        dev, _ = encode(data.dev, data.kind, clf.tokenizer, cfg.seq_len)
        return [(name, task, "finetune", "accuracy", dev_accuracy(clf, dev, cfg.batch_size), 0, math.nan, math.nan)]
    for seed in cfg.finetune_seeds:
        over = {"base": str(base), "task": task, "mode": "full", "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                "max_train_examples": cfg.max_train_examples, "max_dev_examples": cfg.max_dev_examples,
                "seed": seed, **cfg.finetune_overrides}
        folder = (out_dir if out_dir is not None else Path("/tmp")) / "finetuned" / f"{task}-seed{seed}"
        path = finetune(f"{task}-full", folder, overrides=over, data=data)
        info = json.loads((Path(path) / "finetune.json").read_text())
        rows.append((name, task, "finetune", "accuracy", info["dev_metrics"]["accuracy"], seed, math.nan, math.nan))
    return rows


def summarise(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean rows (seed -1, t interval) per setting and diff:<setting> rows = finetune minus frozen."""
    rows = []
    for (model, task, setting, metric), g in per_seed.groupby(["model", "task", "setting", "metric"], sort=False):
        m, lo, hi = mean_ci(g["value"].to_numpy())
        rows.append((model, task, setting, metric, m, -1, lo, hi))
    for (model, task, metric), g in per_seed.groupby(["model", "task", "metric"], sort=False):
        ft = g[g.setting == "finetune"]["value"].to_numpy()
        if len(ft) == 0:
            continue
        for setting, fr in g[g.setting != "finetune"].groupby("setting", sort=False):
            lo, hi = welch_ci(ft, fr["value"].to_numpy())
            rows.append((model, task, f"diff:{setting}", f"{metric}_diff", float(ft.mean() - fr["value"].mean()), -1, lo, hi))
    return pd.DataFrame(rows, columns=COLUMNS)


def welch_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Welch t interval for mean(a) - mean(b); a group with one value adds no variance (documented)."""
    va = a.var(ddof=1) / len(a) if len(a) > 1 else 0.0
    vb = b.var(ddof=1) / len(b) if len(b) > 1 else 0.0
    se = math.sqrt(va + vb)
    if se == 0 or (len(a) < 2 and len(b) < 2):
        return math.nan, math.nan
    num = (va + vb) ** 2
    den = (va ** 2 / (len(a) - 1) if len(a) > 1 else 0) + (vb ** 2 / (len(b) - 1) if len(b) > 1 else 0)
    half = st.t.ppf(0.5 + level / 2, num / den) * se
    d = float(a.mean() - b.mean())
    return d - half, d + half


def frozen_vs_finetuned(model_path: str | Path, out_dir: str | Path | None = None, config=None,
                        model_name: str | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """The `frozen_vs_finetuned` table for one pretrained checkpoint (see module docstring)."""

    cfg = FvFConfig.resolve(config)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    path = Path(model_path)
    name = model_name or default_model_name(path)
    out = Path(out_dir) if out_dir is not None else None
    model, tok = plmodels.load(path)
    rows: list[tuple] = []
    with progress_bar(len(cfg.tasks), f"frozen-vs-finetuned {name}", "task", disable=not progress) as bar:
        for task in cfg.tasks:
            bar.set_postfix_str(task, refresh=False)
            t0 = time.perf_counter()
            data = _task_data(path, task, cfg)
            rows += frozen_rows(model, tok, data, task, cfg, name)
            _say(progress, f"{name}: {task}: frozen heads done in {time.perf_counter() - t0:.0f} s")
            if cfg.finetune:
                rows += finetune_rows(path, data, task, cfg, name, out)
                _say(progress, f"{name}: {task}: finetuning done in {time.perf_counter() - t0:.0f} s")
            bar.update(1)
    per_seed = pd.DataFrame(rows, columns=COLUMNS)
    table = pd.concat([per_seed, summarise(per_seed)], ignore_index=True)
    tables = {"frozen_vs_finetuned": table}
    if out is not None:
        write_table(out, "frozen_vs_finetuned", table)
        atomic_write_json(out / "fvf_run.json", {"model": name, "model_path": str(path), "config": cfg.to_dict()})
    return tables
