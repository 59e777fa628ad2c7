"""Head-gated probing of one checkpoint: the causal link from head roles to what the probes find.

Edge probes say that layer l's vectors encode a property; head roles say what a head attends to.
Gating a head off (its head-mask entry set to 0, Michel et al. 2019's `head_mask`, exactly as a
pruned head) and re-reading the same probes says whether the property the probe finds *comes
through* that head. For each unit -- one head, every head of one role (`heads_classes`), every
head of one role family (syntactic, positional, sink, broad, ...), and random sets of as many heads
(the control) -- the model is run on held-out sentences with the unit gated and two things are
measured against the intact model:

- the LM loss (masked-LM loss on a fixed 15% mask for encoders, next-token loss for decoders): how
  much the model's own objective needs the unit;
- each property's probe accuracy at every layer above the unit's lowest head: the probes are fitted
  once on the *intact* model's vectors (train split) and read on the gated run's vectors of the
  held-out words (as amnesic probing reads its downstream probe), so a drop means the information the
  probe uses passed through the gated heads. Layers at or below the unit's lowest head cannot change
  and get no rows.

An encoder whose MLM head was freshly initialised at import (an imported sentence encoder such as
all-MiniLM-L6-v2: its card says so) gets no LM-loss rows; its probe rows stand.

The finding for a role is the gap between its effect and the random sets' effect (mean and spread
over `random_draws` draws of as many heads). The properties are the word-level ones of amnesic
probing: POS, each word's dependency relation, NER type ("O" outside entities).

`gate_model(path, out_dir, config)` -> {"gating", "head_passport"}; `head_passport` joins, per head,
its roles, each importance method's score and pruning rank (from the run's `importance` table when
there is one), and the gating effects (docs/design.md).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.config import Config
from plmodels.families import FAMILIES, family_of
from plmodels.progress import progress as progress_bar
from probes.heads import weighting_rows
from probes.logreg import LogisticRegressionLBFGS
from workbench.analyses.amnesic import (FILL, HELD_OUT_LM, HeldOut, held_out, lm_head_trained, run_model,
                                       without_lm_rows, word_labels)
from workbench.analyses.heads import role_family
from workbench.analyses.probing import ProbeRunConfig, TaskSplit, default_model_name, load_split
from workbench.core.io import atomic_write_json
from workbench.core.results import find_run_table, write_tables

COLUMNS = ["model", "unit", "name", "gate_layer", "gate_head", "n_gated", "draw", "task", "layer", "metric",
           "value"]
UNITS = ("head", "role", "family")


@dataclass(frozen=True)
class GateRunConfig(Config):
    """A head-gating run (defaults: what `workbench gate` uses)."""

    tasks: tuple[str, ...] = ("pos", "deps", "ner")  # word-level properties read by the probes
    units: tuple[str, ...] = UNITS  # head | role | family (role and family need a heads_classes table)
    probe_layers: tuple[int, ...] | None = None  # hidden-state layers the probes read (None: 1..L)
    random_draws: int = 3  # random head sets per group size (the control of role and family units)
    max_train_targets: int = 20000  # words the probes are fitted on (intact model, train split)
    lm_sentences: int = 200  # held-out sentences (eval split) for the LM loss and the gated probes
    batch_size: int = 32  # sentences per forward
    C: float = 1.0  # inverse L2 strength of the probes
    seed: int = 0  # the MLM mask and the random head sets
    heads_classes: str | None = None  # a heads_classes parquet (None: the run's tables/, if any)
    role_weighting: str = "raw"  # roles read from raw or norm-weighted attention (HeadRunConfig.weightings)

    def __post_init__(self) -> None:
        bad = [u for u in self.units if u not in UNITS]
        if bad or not self.units:
            raise ValueError(f"GateRunConfig.units: {bad or '[]'}; choose from {UNITS}")
        for name in ("max_train_targets", "lm_sentences", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GateRunConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.random_draws < 0:
            raise ValueError(f"GateRunConfig.random_draws must be >= 0, got {self.random_draws}")


# ------------------------------------------------------------------------------------ units
@dataclass(frozen=True)
class Unit:
    """Heads gated together: kind head | role | family | random, a name, the (layer, head) pairs."""

    kind: str
    name: str
    heads: tuple[tuple[int, int], ...]
    draw: int = -1

    def mask(self, shape: tuple[int, int]) -> torch.Tensor:
        m = torch.ones(shape)
        for l, h in self.heads:
            m[l, h] = 0.0
        return m


def gating_units(n_layers: int, n_heads: int, classes: pd.DataFrame | None, units: Sequence[str],
                 random_draws: int, seed: int) -> list[Unit]:
    """Every single head; every role and every role family of `classes` (role "none" left out), each
    with `random_draws` random head sets of its size (drawn once per size, shared by equal sizes)."""
    out: list[Unit] = []
    if "head" in units:
        out += [Unit("head", f"L{l}.H{h}", ((l, h),)) for l in range(n_layers) for h in range(n_heads)]
    groups: dict[tuple[str, str], set] = {}
    if classes is not None and ("role" in units or "family" in units):
        for row in classes[classes["role"] != "none"].itertuples(index=False):
            lh = (int(row.layer), int(row.head))
            if "role" in units:
                groups.setdefault(("role", row.role), set()).add(lh)
            if "family" in units:
                groups.setdefault(("family", role_family(row.role)), set()).add(lh)
    out += [Unit(kind, name, tuple(sorted(hs))) for (kind, name), hs in sorted(groups.items())]
    every = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    rng = np.random.default_rng(seed)
    for k in sorted({len(hs) for hs in groups.values()}):
        for d in range(random_draws):
            pick = rng.choice(len(every), size=k, replace=False)
            out.append(Unit("random", f"size {k}", tuple(sorted(every[i] for i in pick)), d))
    return out


# --------------------------------------------------------------------------- the measurement
@dataclass
class ReadOut:
    """Fitted probes {(task, layer): classifier} and the held-out words' labels per task (None where
    a word has no label for that task)."""

    probes: dict[tuple[str, int], LogisticRegressionLBFGS]
    labels: dict[str, np.ndarray]

    def accuracies(self, vecs: Mapping[int, np.ndarray]) -> dict[tuple[str, int], float]:
        out = {}
        for (task, layer), clf in self.probes.items():
            if layer not in vecs:
                continue
            y = self.labels[task]
            if len(y) != len(vecs[layer]):
                raise ValueError(f"gate: {len(y)} {task} labels for {len(vecs[layer])} held-out words "
                                 "(the tokenizer split the sentences into a different number of words)")
            keep = y != None  # noqa: E711 (elementwise on an object array)
            out[(task, layer)] = float((clf.predict(vecs[layer][keep]) == y[keep].astype(str)).mean())
        return out


def gate_effects(model, data: HeldOut, readout: ReadOut, units: Sequence[Unit], model_name: str,
                 bar=None) -> pd.DataFrame:
    """The gating rows (COLUMNS) of `units`: LM loss and probe accuracies gated, and their deltas
    against the intact run (unit "none")."""
    layers = sorted({l for _, l in readout.probes})
    shape = (int(model.config.n_layers), int(max(getattr(model, "n_heads_per_layer", [model.config.n_heads]))))
    base_loss, base_vecs = run_model(model, data, layers=layers)
    base_acc = readout.accuracies(base_vecs)
    rows = [(model_name, "none", "intact", -1, -1, 0, -1, "lm", -1, "lm_loss", base_loss)]
    rows += [(model_name, "none", "intact", -1, -1, 0, -1, t, l, "probe_acc", a) for (t, l), a in base_acc.items()]
    for u in units:
        low = min(l for l, _ in u.heads)
        above = [l for l in layers if l > low]  # hidden_states[l] is block l-1's output
        loss, vecs = run_model(model, data, head_mask=u.mask(shape), layers=above)
        acc = readout.accuracies(vecs) if above else {}
        gl, gh = u.heads[0] if u.kind == "head" else (-1, -1)
        key = (model_name, u.kind, u.name, gl, gh, len(u.heads), u.draw)
        rows += [(*key, "lm", -1, "lm_loss", loss), (*key, "lm", -1, "lm_loss_delta", loss - base_loss)]
        for (t, l), a in sorted(acc.items()):
            rows += [(*key, t, l, "probe_acc", a), (*key, t, l, "probe_acc_delta", a - base_acc[(t, l)])]
        if bar is not None:
            bar.update(1)
    return pd.DataFrame(rows, columns=COLUMNS)


def sentence_words(split: TaskSplit) -> list[tuple[str, ...]]:
    """The words of each sentence of a split's store (as stored: long sentences truncated)."""
    st = split.arrays.store
    return [tuple(map(str, split.words[st.sentence_rows(s)])) for s in range(st.n_sentences)]


def held_out_sentences(tests: Mapping[str, TaskSplit], n: int) -> list[tuple[str, ...]]:
    """`n` eval sentences, in the first task's order, those that every task labels first (the tasks'
    eval splits are different subsets of one treebank: EWT's NER file holds a third of its sentences)."""
    words = {t: set(sentence_words(s)) for t, s in tests.items()}
    pool = list(dict.fromkeys(sentence_words(next(iter(tests.values())))))
    every = [w for w in pool if all(w in ws for ws in words.values())]
    chosen = set(every)
    return (every + [w for w in pool if w not in chosen])[:n]


def fit_readout(tasks: Mapping[str, tuple[TaskSplit, TaskSplit]], layers: Sequence[int],
                sentences: Sequence[tuple[str, ...]], cfg: GateRunConfig) -> ReadOut:
    """Probes per (task, layer) fitted on the intact train-split store, and each task's labels of the
    held-out sentences' words, in order (None for a word the task does not label or a sentence it
    does not hold)."""
    probes, labels = {}, {}
    for task, (train, test) in tasks.items():
        fill = FILL.get(task)
        tr_rows, ytr = word_labels(train, fill)
        tr_rows, ytr = tr_rows[: cfg.max_train_targets], ytr[: cfg.max_train_targets]
        st_tr, st_te = train.arrays.store, test.arrays.store
        for layer in layers:
            X = np.asarray(st_tr.layer(layer)[tr_rows], dtype=np.float32)
            probes[(task, layer)] = LogisticRegressionLBFGS(C=cfg.C).fit(X, ytr)
        te_rows, y_te = word_labels(test, fill)
        lab = np.full(st_te.n_words, None, dtype=object)
        seen = np.isin(y_te, np.unique(ytr))  # labels the probes never saw are left out
        lab[te_rows[seen]] = y_te[seen]
        where = {w: s for s, w in enumerate(sentence_words(test))}
        labels[task] = np.concatenate([lab[st_te.sentence_rows(where[w])] if w in where else
                                       np.full(len(w), None, dtype=object) for w in sentences])
    return ReadOut(probes, labels)


# ----------------------------------------------------------------------------------- passport
def head_passport(gating: pd.DataFrame, classes: pd.DataFrame | None = None,
                  importance: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (model, layer, head): primary role and all roles; per importance method its score
    and pruning rank (0 = pruned first: the least important); the LM loss delta when the head alone is
    gated; per task the accuracy delta at the top probe layer and the largest drop over layers (with
    its layer)."""
    g = gating[gating["unit"] == "head"]
    keys = ["model", "layer", "head"]
    base = g[["model", "gate_layer", "gate_head"]].drop_duplicates().rename(
        columns={"gate_layer": "layer", "gate_head": "head"})
    lm = g[g["metric"] == "lm_loss_delta"][["model", "gate_layer", "gate_head", "value"]].rename(
        columns={"gate_layer": "layer", "gate_head": "head", "value": "lm_loss_delta"})
    out = base.merge(lm, on=keys, how="left")
    acc = g[g["metric"] == "probe_acc_delta"]
    top = int(gating.loc[gating["metric"] == "probe_acc", "layer"].max()) if len(acc) else -1
    for task, sub in acc.groupby("task", sort=True):
        sub = sub.rename(columns={"gate_layer": "layer_", "gate_head": "head"})
        last = sub[sub["layer"] == top][["model", "layer_", "head", "value"]].rename(
            columns={"layer_": "layer", "value": f"{task}_acc_delta"})
        worst = sub.loc[sub.groupby(["model", "layer_", "head"])["value"].idxmin(), ["model", "layer_", "head", "value",
                                                                                      "layer"]]
        worst = worst.rename(columns={"layer": f"{task}_max_drop_layer", "layer_": "layer"})
        worst[f"{task}_max_drop"] = -worst.pop("value")
        out = out.merge(last, on=keys, how="left").merge(worst, on=keys, how="left")
    if classes is not None and len(classes):
        c = classes.copy()
        prim = c[c["primary"]] if "primary" in c else c.drop_duplicates(keys)
        out = out.merge(prim[keys + ["role"]], on=keys, how="left")
        allr = c.groupby(keys)["role"].agg(lambda r: ",".join(sorted(r))).rename("roles").reset_index()
        out = out.merge(allr, on=keys, how="left")
    if importance is not None and len(importance):
        for method, sub in importance.groupby("method", sort=True):
            sub = sub[keys + ["value"]].copy()
            sub[f"prune_rank_{method}"] = sub.groupby("model")["value"].rank(method="first").astype(int) - 1
            out = out.merge(sub.rename(columns={"value": f"importance_{method}"}), on=keys, how="left")
    return out.sort_values(keys, ignore_index=True)


# -------------------------------------------------------------------------------------- entry
def gate_model(model_path: str | Path, out_dir: str | Path | None = None,
               config: GateRunConfig | Mapping | None = None, model_name: str | None = None,
               store_root: str | Path | None = None, heads_classes: pd.DataFrame | None = None,
               importance: pd.DataFrame | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Head-gated probing of a checkpoint -> {"gating", "head_passport"}; with out_dir, the tables are
    upserted into out_dir/tables and the config and timings go to out_dir/gate_run.json. Role and
    family units need `heads_classes` (given, the config's file, or the run's table)."""
    cfg = GateRunConfig.resolve(config)
    t0 = time.perf_counter()
    model, tok = plmodels.load(model_path)
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; head gating needs one")
    fam = family_of(model)
    if not fam.head_mask or fam.lm_inputs not in HELD_OUT_LM:
        raise ValueError(f"{model_path}: head gating needs a head mask and a held-out LM batch it can build; a "
                         f"{model.kind} model has {'no head mask' if not fam.head_mask else 'a ' + fam.lm_inputs + ' LM'} "
                         f"(gating reads {sorted(k for k, f in FAMILIES.items() if f.head_mask and f.lm_inputs in HELD_OUT_LM)})")
    model.eval()
    model_name = model_name or default_model_name(model_path)
    out = Path(out_dir) if out_dir is not None else None
    if heads_classes is None:
        heads_classes = (pd.read_parquet(cfg.heads_classes) if cfg.heads_classes else
                         find_run_table(out, "heads_classes", model_name))
        if heads_classes is not None and cfg.heads_classes:
            heads_classes = heads_classes[heads_classes["model"] == model_name]
            if not len(heads_classes):
                raise ValueError(f"{cfg.heads_classes}: no heads_classes rows of model {model_name!r}")
    if heads_classes is not None:
        heads_classes = weighting_rows(heads_classes, cfg.role_weighting)
        if not len(heads_classes):
            raise ValueError(f"gate: no heads_classes rows with weighting {cfg.role_weighting!r} for {model_name!r}")
    importance = importance if importance is not None else find_run_table(out, "importance", model_name)
    if store_root is None:
        if out is None:
            raise ValueError("gate_model: give out_dir or store_root (where the activation stores go)")
        store_root = out / "store"
    L = int(model.config.n_layers)
    layers = list(range(1, L + 1)) if cfg.probe_layers is None else sorted(set(cfg.probe_layers))
    if any(not 0 <= l <= L for l in layers):
        raise ValueError(f"gate config probe_layers {layers}: the model has layers 0..{L}")
    pcfg = ProbeRunConfig()
    model_id = plmodels.checkpoint_hash(model_path)
    splits = {task: tuple(load_split(model, tok, task, split, pcfg, Path(store_root), model_id, n, progress=progress)
                          for split, n in ((pcfg.train_split, cfg.max_train_targets),
                                           (pcfg.eval_split, None)))
              for task in cfg.tasks}
    sentences = sorted(held_out_sentences({t: test for t, (_, test) in splits.items()}, cfg.lm_sentences),
                       key=len)  # length-sorted batches waste less padding
    readout = fit_readout(splits, layers, sentences, cfg)
    n_sent = len(sentences)
    lm = lm_head_trained(model, model_path)
    data = held_out(model, tok, [list(w) for w in sentences], cfg, lm)
    n_heads = int(max(getattr(model, "n_heads_per_layer", [model.config.n_heads])))
    units = gating_units(L, n_heads, heads_classes, cfg.units, cfg.random_draws, cfg.seed)
    with progress_bar(len(units), f"gate {model_name}", "unit", disable=not progress) as bar:
        gating = without_lm_rows(gate_effects(model, data, readout, units, model_name, bar), lm)
    tables = {"gating": gating, "head_passport": head_passport(gating, heads_classes, importance)}
    if out is not None:
        write_tables(out, tables)
        atomic_write_json(out / "gate_run.json", {
            "model": model_name, "model_path": str(model_path), "checkpoint_hash": model_id,
            "config": cfg.to_dict(), "probe_layers": layers, "units": len(units), "sentences": n_sent,
            "roles_from": "given" if heads_classes is not None else None,
            "lm_loss": "measured" if lm else "left out: the card says the MLM head was freshly initialised at import",
            "seconds": round(time.perf_counter() - t0, 1)})
    return tables
