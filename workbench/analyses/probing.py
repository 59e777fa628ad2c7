"""Edge probing of one checkpoint on the edge-probing tasks: the glue between the task records, the
activation store and the layer-wise analyses of `probes` (Tenney et al. 2019a, "What do you learn
from context?"; Tenney et al. 2019b, "BERT rediscovers the classical NLP pipeline"; Hewitt & Liang
2019 control tasks; Voita & Titov 2020 MDL).

For each task: the train and eval records are capped (a seeded shuffle of the records, then whole
records until `max_*_targets` targets), their sentences are extracted once into the activation
store (one store per task and split, keyed by checkpoint hash and data, so a second run reuses it),
and the probes read every layer l = 0..L (0 = embeddings, the lexical baseline) from the store:

- "single":     one probe per layer                                         (`per_layer_scores`)
- "mix":        one probe on a scalar mix of all layers; E_s[l] = sum_l l s_l  (`scalar_mix_probe`)
- "cumulative": P^(l) on a mix of layers 0..l; E_delta = sum_l l d_l / sum_l d_l (`cumulative_scores`)
- "control":    the same probe on per-word-type random labels; selectivity = acc - control acc
- "mdl":        online codelength per layer (off by default: 10 fits per layer)
- "random_init": the same probe per layer on the same architecture at random initialisation (one
                model per probe seed s, `random_init_model` under t + s for a checkpoint pretrained
                under seed t, s when t is unknown: `plmodels.checkpoint.floor_seed`; Zhang & Bowman
                2018, Hewitt & Liang 2019's random-weights baseline), extracted from the same capped
                records; off by default

The best single layer ("best" rows) is chosen on held-out test items (`probes.layers.cross_fit_best`).
The `arcs` task (which word is each word's head?) is probed by `probes.arcs` instead: a bilinear
probe per layer ("single", "best"), Hewitt & Liang's arc control task ("control", selectivity),
punctuation left out of the score; mix, cumulative and mdl do not apply to it. The structural
tasks `structural_distance` and `structural_depth` (Hewitt & Manning 2019, `probes.structural`)
read the same EWT records, whole trees per sentence (`structural_train_words` training words,
not `max_train_targets`); their metrics are UUAS / DSpr and root accuracy / NSpr (mode "single"; not
in the default task list), beside their floors (`structural_baselines`: a random tree, the chain,
the probe on position alone, and the same architecture at random initialisation, one model per seed;
mode = the floor's name).

Seeds give per-seed rows (bootstrap CIs over test items) and a seed = -1 row with the mean over
seeds and its t interval. Tables follow docs/design.md: `probing`, `probing_summary`, `mix_weights`.

Eval labels never seen in the (capped) training set cannot be scored: with `unseen_labels="drop"`
those targets are removed and counted (in the run record `probe_run.json` and a warning); with
"error" the probe's ValueError is raised, prefixed with the task and split.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.checkpoint import floor_seed, random_init_model, training_seed
from plmodels.config import Config
from plmodels.families import family_of
from plmodels.progress import Bar, write
from plmodels.progress import progress as progress_bar
from plmodels.seq2seq import TeacherForcedDecoder
from probes.arcs import ArcData, arc_layer_scores
from probes.controls import control_task_scores, span_types
from probes.edge import PROBES, make_probe
from probes.layers import (
    MIX_COLUMNS,
    PROBING_COLUMNS,
    SUMMARY_COLUMNS,
    ProbeData,
    cumulative_scores,
    per_layer_scores,
    scalar_mix_probe,
)
from probes.mdl import online_codelength
from probes.structural import (
    STRUCTURAL_BASELINES,
    STRUCTURAL_TASKS,
    StructuralData,
    structural_baseline_scores,
    structural_layer_scores,
)
from workbench.core.results import write_analysis_outputs, write_tables
from workbench.data.tasks import load_task
from workbench.store import POOLINGS, TaskArrays, extract, task_arrays

log = logging.getLogger(__name__)

MODES = ("single", "mix", "cumulative", "control", "mdl", "random_init")
# the structural probes' floors: those of probes.structural, and the same architecture at random init
STRUCTURAL_FLOORS = (*STRUCTURAL_BASELINES, "random_init")
# span_pooling "auto" per LM form of the family: a causal LM's span is its last token, which has read
# the whole span; the others pool with self-attention (Tenney et al. pool ELMo so too)
SPAN_POOLING_AUTO = {"causal": "last", "masked": "self_attn", "bidirectional": "self_attn",
                     "denoising": "self_attn", "permutation": "self_attn"}
UNSEEN_POLICIES = ("drop", "error")
STACKS = ("encoder", "decoder")  # which stack of a seq2seq model is probed


# ------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class ProbeRunConfig(Config):
    """A probing run. The defaults here are the canonical values (configs/probe.json is a copy of
    them to edit and pass with --config; a test keeps the two equal)."""

    tasks: tuple[str, ...] = ("pos", "deps", "arcs", "const", "ner", "entities", "coref")
    pooling: str = "first"              # subword -> word pooling in the store (first | last | mean)
    span_pooling: str = "auto"          # edge-probe span pooling; auto = self_attn (encoder) / last (decoder)
    probes: tuple[str, ...] = ("edge",)  # probes.edge.PROBES: "edge" (MLP, Tenney) and/or "linear"
    layers: Any = "all"                 # "all" = 0..L, or a list of layer indices (0 = embeddings)
    stack: str = "encoder"              # seq2seq models: "encoder", or "decoder" under teacher forcing
    modes: tuple[str, ...] = ("single", "mix", "cumulative", "control")
    seeds: tuple[int, ...] = (0, 1, 2)
    train_split: str = "train"
    eval_split: str = "test"
    max_train_targets: int | None = 5000  # cap per task (whole records until reached); None = all
    max_eval_targets: int | None = 2000
    record_seed: int = 0                # seeded shuffle of records before capping
    max_epochs: int = 10
    patience: int = 2
    arc_rank: int | None = None         # rank of the arcs task's bilinear map (None = full D x D)
    hidden: int = 256                   # MLP hidden width (edge probe)
    proj_dim: int = 256                 # per-span projection (edge probe)
    batch_size: int = 256
    n_boot: int = 1000                  # bootstrap resamples over test items (0 = no item CI)
    unseen_labels: str = "drop"         # eval labels missing from train: "drop" (counted) | "error"
    store_max_bytes: int | None = 4 * 2**30  # disk budget of one store extraction
    batch_tokens: int = 8192            # extraction batch size in tokens
    keep_items: bool = False            # write per-item results of single and cumulative probes (probe_items)
    standardize: bool = False           # z-score each layer on the training words first (not Tenney's; see probes.edge)
    # the structural tasks: training words (whole EWT sentences until reached; None = all of EWT train),
    # in place of max_train_targets; their floors (probes.structural.STRUCTURAL_BASELINES and
    # "random_init", the same architecture with fresh weights per seed), rows of mode = the floor's name
    structural_train_words: int | None = 20000
    structural_baselines: tuple[str, ...] = ("random_tree", "chain", "position", "random_init")

    def __post_init__(self) -> None:
        for name in ("tasks", "probes", "modes", "seeds"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"ProbeRunConfig.{name} must be a non-empty list, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        if self.pooling not in POOLINGS:
            raise ValueError(f"ProbeRunConfig.pooling={self.pooling!r}; choose one of {sorted(POOLINGS)}")
        bad = [p for p in self.probes if p not in PROBES]
        if bad:
            raise ValueError(f"ProbeRunConfig.probes: unknown {bad}; choose from {sorted(PROBES)}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"ProbeRunConfig.modes: unknown {bad}; choose from {list(MODES)}")
        if self.layers != "all":
            if isinstance(self.layers, (str, bytes)) or not all(isinstance(l, int) for l in self.layers):
                raise ValueError(f"ProbeRunConfig.layers must be 'all' or a list of ints, got {self.layers!r}")
            object.__setattr__(self, "layers", tuple(self.layers))
        if self.stack not in STACKS:
            raise ValueError(f"ProbeRunConfig.stack={self.stack!r}; choose one of {STACKS}")
        if self.unseen_labels not in UNSEEN_POLICIES:
            raise ValueError(f"ProbeRunConfig.unseen_labels={self.unseen_labels!r}; choose one of {UNSEEN_POLICIES}")
        for name in ("max_train_targets", "max_eval_targets"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 2):
                raise ValueError(f"ProbeRunConfig.{name} must be an int >= 2 or null, got {v!r}")
        for name in ("max_epochs", "patience", "hidden", "proj_dim", "batch_size", "batch_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ProbeRunConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.n_boot < 0:
            raise ValueError(f"ProbeRunConfig.n_boot must be >= 0, got {self.n_boot}")
        if self.arc_rank is not None and (not isinstance(self.arc_rank, int) or self.arc_rank < 1):
            raise ValueError(f"ProbeRunConfig.arc_rank must be a positive int or null, got {self.arc_rank!r}")
        v = self.structural_train_words
        if v is not None and (not isinstance(v, int) or v < 2):
            raise ValueError(f"ProbeRunConfig.structural_train_words must be an int >= 2 or null, got {v!r}")
        object.__setattr__(self, "structural_baselines", tuple(self.structural_baselines))
        bad = [b for b in self.structural_baselines if b not in STRUCTURAL_FLOORS]
        if bad:
            raise ValueError(f"ProbeRunConfig.structural_baselines: unknown {bad}; choose from {list(STRUCTURAL_FLOORS)}")

# ------------------------------------------------------------------------------------ data
def select_records(records: Sequence[dict], max_targets: int | None, seed: int = 0) -> list[dict]:
    """Whole records, in a seeded random order, until `max_targets` targets are reached; returned in
    their original order (so the choice does not depend on the cap's neighbours in the file)."""
    if max_targets is None:
        return list(records)
    order = np.random.default_rng(seed).permutation(len(records))
    keep, total = [], 0
    for i in order:
        if total >= max_targets:
            break
        keep.append(int(i))
        total += len(records[i]["targets"])
    return [records[i] for i in sorted(keep)]


def _cap(arr: TaskArrays, n: int | None) -> TaskArrays:
    if n is None or len(arr.labels) <= n:
        return arr
    return TaskArrays(arr.store, arr.span1[:n], None if arr.span2 is None else arr.span2[:n],
                      arr.labels[:n], arr.sent_index[:n], arr.n_skipped)


def _keep(arr: TaskArrays, mask: np.ndarray) -> TaskArrays:
    return TaskArrays(arr.store, arr.span1[mask], None if arr.span2 is None else arr.span2[mask],
                      arr.labels[mask], arr.sent_index[mask], arr.n_skipped)


def row_words(store, records: Sequence[dict]) -> np.ndarray:
    """(N_words,) the word string of each global store row (kept words only), for control types."""
    kept = store.n_kept()
    out = np.empty(store.n_words, dtype=object)
    for s, rec in enumerate(records):
        out[store.sentence_rows(s)] = rec["words"][: kept[s]]
    return out


@dataclass
class TaskSplit:
    """One task split ready for the probes: arrays over the store, and the word string per row."""

    arrays: TaskArrays
    words: np.ndarray
    n_records: int

    def probe_data(self) -> ProbeData:
        st = self.arrays.store
        return ProbeData([st.layer(l) for l in range(st.n_layers)], self.arrays.labels, self.arrays.span1,
                         self.arrays.span2)

    def types(self) -> list[tuple]:
        return span_types(self.words, self.arrays.span1, self.arrays.span2)


def load_split(model, tokenizer, task: str, split: str, cfg: ProbeRunConfig, store_root: Path,
               model_id: str, max_targets: int | None, tasks_dir=None, progress: bool = True,
               loaded: dict | None = None) -> TaskSplit:
    """Capped records of `task`/`split` -> store (extracted once, reused) -> task arrays. `loaded`: a dict
    that keeps each (task, split)'s records once read, for the next split of the same records (the arcs
    task and both structural tasks, for the model and its random-init floor, read EWT's arcs)."""
    if loaded is None:
        loaded = {}
    if (task, split) not in loaded:
        loaded[task, split] = load_task(task, split, out_dir=tasks_dir)
    records = select_records(loaded[task, split], max_targets, cfg.record_seed)
    if not records:
        raise ValueError(f"task {task!r} split {split!r} has no records")
    store = extract(model, tokenizer, [r["words"] for r in records], store_root, model_id=model_id,
                    key_extra=f"probe:{task}:{split}", pooling=cfg.pooling, max_bytes_disk=cfg.store_max_bytes,
                    batch_tokens=cfg.batch_tokens, progress=progress)
    store.check_tokenizer(tokenizer)
    arrays = _cap(task_arrays(store, records), max_targets)
    return TaskSplit(arrays, row_words(store, records), len(records))


# ------------------------------------------------------------------------------------ probing
def probe_params(name: str, cfg: ProbeRunConfig, span_pooling: str) -> dict:
    """The config's probe settings that probe `name` accepts (the linear probe has no hidden layer)."""
    wanted = dict(pooling=span_pooling, max_epochs=cfg.max_epochs, patience=cfg.patience, hidden=cfg.hidden,
                  proj_dim=cfg.proj_dim, batch_size=cfg.batch_size, standardize=cfg.standardize)
    accepted = make_probe(name).get_params()
    return {k: v for k, v in wanted.items() if k in accepted}


def resolve_layers(cfg: ProbeRunConfig, n_blocks: int) -> list[int]:
    """Layer indices 0..L (0 = embeddings); ValueError for one the model does not have."""
    if cfg.layers == "all":
        return list(range(n_blocks + 1))
    bad = [l for l in cfg.layers if not 0 <= l <= n_blocks]
    if bad:
        raise ValueError(f"probe config layers {bad}: the model has layers 0..{n_blocks} "
                         f"(0 = embeddings, {n_blocks} = last block)")
    return sorted(set(cfg.layers))


def probe_task(train: TaskSplit, test: TaskSplit, cfg: ProbeRunConfig, layers: list[int], model_name: str,
               task: str, span_pooling: str, bar: Bar | None = None,
               random_init: Mapping[int, tuple[TaskSplit, TaskSplit]] | None = None,
               record: dict | None = None) -> dict[str, list[pd.DataFrame]]:
    """All configured modes for one task; returns lists of frames per table. `bar` advances by one
    per (probe, mode), a mode that does not apply to the task included. `random_init`: the splits of a
    random-init model per probe seed (`random_init_splits`), read by mode "random_init" and by the
    structural tasks' floor; `record`: the structural tasks' (`probe_structural`)."""
    out: dict[str, list[pd.DataFrame]] = {"probing": [], "probing_summary": [], "mix_weights": [], "probe_items": []}
    if task in ARC_TASKS:
        return probe_arcs(train, test, cfg, layers, model_name, task, bar)
    if task in STRUCTURAL_TASKS:
        return probe_structural(train, test, cfg, layers, model_name, task, bar, random_init, record)
    tr, te = train.probe_data(), test.probe_data()

    def done(mode: str) -> None:
        if bar is not None and mode in cfg.modes:
            bar.update(1)

    for name in cfg.probes:
        params = probe_params(name, cfg, span_pooling)
        common = dict(probe=name, probe_params=params, seeds=cfg.seeds, model=model_name, task=task, n_boot=cfg.n_boot)
        items: dict | None = {} if cfg.keep_items else None
        single = None
        if "single" in cfg.modes:
            single = per_layer_scores(tr, te, layers=layers, items_out=items, **common)
            out["probing"].append(single)
        done("single")
        if "mix" in cfg.modes and len(layers) > 1:
            r = scalar_mix_probe(tr, te, layers=layers, **common)
            out["probing"].append(r.probing)
            out["probing_summary"].append(r.summary)
            out["mix_weights"].append(r.mix_weights)
        done("mix")
        if "cumulative" in cfg.modes:
            r = cumulative_scores(tr, te, layers=layers, items_out=items, **common)
            out["probing"].append(r.probing)
            out["probing_summary"].append(r.summary)
        done("cumulative")
        if "control" in cfg.modes and _word_level(tr):
            # Hewitt & Liang (2019) define control tasks for word-level tasks (one label per word
            # type); span and span-pair tasks (deps, const, ner, coref, ...) get no control row.
            r = control_task_scores(tr, te, train.types(), test.types(), layers=layers, task_scores=single, **common)
            out["probing"].append(r.probing)
            out["probing_summary"].append(r.summary)
        done("control")
        if "mdl" in cfg.modes:
            rows = []
            for l in layers:
                res = online_codelength(tr.layers([l]), tr.y, tr.span1, tr.span2, probe=name,
                                        probe_params=params, seed=cfg.seeds[0])
                rows += res.rows(model_name, task, name, params.get("pooling", ""), l, cfg.seeds[0])
            out["probing"].append(pd.DataFrame(rows, columns=PROBING_COLUMNS))
        done("mdl")
        if "random_init" in cfg.modes and random_init:
            out["probing"].append(random_init_scores(random_init, layers, common, items))
        done("random_init")
        if items:
            out["probe_items"].append(item_frame(items, model_name, task, name))
    return out


def random_init_scores(random_init: Mapping[int, tuple[TaskSplit, TaskSplit]], layers: list[int],
                       common: dict, items_out: dict | None = None) -> pd.DataFrame:
    """Mode "random_init" rows: per probe seed s, the probe per layer on the splits of the random-init
    model drawn for probe seed s (`random_init[s]`: under the checkpoint's training seed + s,
    `plmodels.checkpoint.floor_seed`), as `per_layer_scores` scores the model's own ("single").
    `items_out` receives each fit's per-item test counts under ("random_init", layer, seed): the same
    test items as the model's (same records, tokenizer and cap), so the zoo can resample the floor and
    choose its best layer on held-out items as it does the model's."""
    frames = []
    for seed, (tr, te) in sorted(random_init.items()):
        got: dict | None = {} if items_out is not None else None
        df = per_layer_scores(tr.probe_data(), te.probe_data(), layers=layers, items_out=got,
                              **{**common, "seeds": [seed]})
        frames.append(df[df["mode"] == "single"].assign(mode="random_init"))
        for (_, layer, s), a in (got or {}).items():
            items_out["random_init", layer, s] = a
    return pd.concat(frames, ignore_index=True)


ITEM_COLUMNS = ["model", "task", "probe", "mode", "layer", "seed", "item", "correct", "tp", "fp", "fn"]


def item_frame(items: dict, model: str, task: str, probe: str) -> pd.DataFrame:
    """The `probe_items` rows of one task and probe: each fit's per-item test counts ({(mode, layer,
    seed): (N, 4) [correct, tp, fp, fn]}), item = the target's index in the (capped) test split, the
    same for every model that reads the same tokenizer and records."""
    frames = []
    for (mode, layer, seed), a in items.items():
        a = np.asarray(a, dtype=np.float32)
        frames.append(pd.DataFrame({"model": model, "task": task, "probe": probe, "mode": mode, "layer": layer,
                                    "seed": seed, "item": np.arange(len(a), dtype=np.int32), "correct": a[:, 0],
                                    "tp": a[:, 1], "fp": a[:, 2], "fn": a[:, 3]}))
    return pd.concat(frames, ignore_index=True)[ITEM_COLUMNS]


ARC_TASKS = ("arcs",)       # probed by probes.arcs (head attachment), not by the edge probe


def arc_data(split: TaskSplit) -> ArcData:
    """An arcs split as probes.arcs reads it: dependent and head rows, the dependent's sentence rows
    (the kept words: a sentence cut at the model's length loses its tail), punctuation not scored."""
    arr, st = split.arrays, split.arrays.store
    start = np.asarray(st.sent_offsets)[arr.sent_index]
    bounds = np.stack([start, start + st.n_kept()[arr.sent_index]], axis=1)
    return ArcData([st.layer(l) for l in range(st.n_layers)], arr.span1[:, 0], arr.span2[:, 0], bounds,
                   score_mask=arr.labels != "punct")


def probe_arcs(train: TaskSplit, test: TaskSplit, cfg: ProbeRunConfig, layers: list[int], model_name: str,
               task: str, bar: Bar | None = None) -> dict[str, list[pd.DataFrame]]:
    """The arcs task: one bilinear probe per layer and seed, with the arc control task when "control"
    is among the modes. Counts as len(probes) x len(modes) units of `bar`, as the other tasks do."""
    tr, te = arc_data(train), arc_data(test)
    # the edge probe's epochs and patience do not carry over: a bilinear map over whole sentences
    # learns per sentence, not per target, and keeps ArcProbe's own (30 epochs, patience 3)
    res = arc_layer_scores(tr, te, layers=layers, rank=cfg.arc_rank, seeds=cfg.seeds,
                           control="control" in cfg.modes, model=model_name, task=task, n_boot=cfg.n_boot,
                           train_types=list(train.words[tr.dep]), test_types=list(test.words[te.dep]))
    if bar is not None:
        bar.update(len(cfg.probes) * len(cfg.modes))
    probing = res.probing if "single" in cfg.modes else res.probing[res.probing["mode"] == "control"]
    return {"probing": [probing], "probing_summary": [res.summary], "mix_weights": []}


RECORDS_OF = {task: "arcs" for task in STRUCTURAL_TASKS}   # tasks that read another task's records


def structural_data(split: TaskSplit) -> tuple[StructuralData, int]:
    """The split's whole sentences as probes.structural reads them, and how many sentences were left
    out because the model's length cut them (a tree needs every word)."""
    arr, st = split.arrays, split.arrays.store
    kept = st.n_kept()
    bounds, heads, punct, cut = [], [], [], 0
    for s in np.unique(arr.sent_index):
        rows = np.flatnonzero(arr.sent_index == s)
        start = int(st.sent_offsets[s])
        n = int(kept[s])
        if len(rows) != n or n == 0:       # a word or its head fell past the cut: no whole tree
            cut += 1
            continue
        dep, head = arr.span1[rows, 0] - start, arr.span2[rows, 0] - start
        order = np.argsort(dep)
        h = np.where(head[order] == dep[order], -1, head[order])   # the root attaches to itself in arcs
        bounds.append((start, start + n))
        heads.append(h.astype(np.int64))
        punct.append(arr.labels[rows][order] == "punct")
    layers = [st.layer(l) for l in range(st.n_layers)]
    return StructuralData(layers, np.asarray(bounds, dtype=np.int64).reshape(-1, 2), heads, punct), cut


def _same_sentences(a: StructuralData, b: StructuralData, what: str) -> None:
    if not (np.array_equal(a.bounds, b.bounds) and all(np.array_equal(x, y) for x, y in zip(a.heads, b.heads))):
        raise ValueError(f"{what}: the random-init model's store holds other sentences than the model's")


def probe_structural(train: TaskSplit, test: TaskSplit, cfg: ProbeRunConfig, layers: list[int], model_name: str,
                     task: str, bar: Bar | None = None,
                     random_init: Mapping[int, tuple[TaskSplit, TaskSplit]] | None = None,
                     record: dict | None = None) -> dict[str, list[pd.DataFrame]]:
    """A structural probe (distance or depth) per layer and seed (mode "single") and its floors
    (`cfg.structural_baselines`): the layer-free ones of `probes.structural.STRUCTURAL_BASELINES` (mode =
    their name, layer -1) and "random_init", the same probe per layer on `random_init[seed]`, the splits
    of a freshly initialised model per seed (mode "random_init"). Every per-seed row carries `cfg.n_boot`
    bootstrap resamples of the test sentences (seeded by the probe's seed, as the other tasks' intervals
    over test items are); counts as len(probes) x len(modes) units of `bar`, as the other tasks do.
    Sentences cut by the model's length are left out (logged, and counted in `record` with the sentences
    and words read). With `keep_items`, the per-sentence counts of UUAS (distance) or root accuracy
    (depth) go to `probe_items`, under the same modes (`probes.structural.item_counts`: their micro-F1 is
    the metric)."""
    (tr, cut_tr), (te, cut_te) = structural_data(train), structural_data(test)
    if cut_tr or cut_te:
        log.info(f"probe {task}: {cut_tr} train / {cut_te} test sentences left out (cut by the model's length)")
    if record is not None:
        record.update(train_sentences=len(tr.bounds), train_words=int(np.diff(tr.bounds, axis=1).sum()),
                      eval_sentences=len(te.bounds), eval_words=int(np.diff(te.bounds, axis=1).sum()),
                      train_sentences_cut=cut_tr, eval_sentences_cut=cut_te)
    items: dict | None = {} if cfg.keep_items else None
    common = dict(seeds=cfg.seeds, model=model_name, task=task, n_boot=cfg.n_boot, items_out=items)
    frames = [structural_layer_scores(tr, te, layers=layers, **common).probing]
    floors = [b for b in cfg.structural_baselines if b in STRUCTURAL_BASELINES]
    frames.append(structural_baseline_scores(tr, te, baselines=floors, **common).probing)
    if "random_init" in cfg.structural_baselines:
        if random_init is None or set(random_init) != set(cfg.seeds):
            raise ValueError(f"probe {task}: the random_init floor needs a random-init model's splits per seed")
        r_tr = {s: structural_data(a)[0] for s, (a, _) in random_init.items()}
        r_te = {s: structural_data(b)[0] for s, (_, b) in random_init.items()}
        for s in cfg.seeds:
            _same_sentences(tr, r_tr[s], f"probe {task} train")
            _same_sentences(te, r_te[s], f"probe {task} test")
        frames.append(structural_layer_scores(r_tr, r_te, layers=layers, mode="random_init", **common).probing)
    if bar is not None:
        bar.update(len(cfg.probes) * len(cfg.modes))
    out = {"probing": frames, "probing_summary": [], "mix_weights": [], "probe_items": []}
    if items:
        out["probe_items"].append(item_frame(items, model_name, task, STRUCTURAL_TASKS[task][1]))
    return out


def _word_level(split) -> bool:
    """True when every target is one word and there is no second span (POS-like tasks)."""
    span1 = np.asarray(split.span1)
    return split.span2 is None and bool(np.all(span1[:, 1] - span1[:, 0] == 1))


def _drop_unseen(train: TaskSplit, test: TaskSplit) -> int:
    """Remove eval targets whose label is absent from train; returns how many."""
    seen = set(train.arrays.labels.tolist())
    mask = np.array([y in seen for y in test.arrays.labels.tolist()], dtype=bool)
    test.arrays = _keep(test.arrays, mask)
    return int((~mask).sum())


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]


def _say(progress: bool, msg: str) -> None:
    log.info(msg)
    if progress:
        write(msg)


def default_model_name(model_path: str | Path) -> str:
    p = Path(model_path)
    return p.parent.name if p.name in ("final", "model") else p.name


def probe_model(model_path: str | Path, tasks: Sequence[str] | None = None, out_dir: str | Path | None = None,
                config: "ProbeRunConfig | Mapping | str | Path | None" = None, model_name: str | None = None,
                run_dir: str | Path | None = None, store_root: str | Path | None = None,
                tasks_dir: str | Path | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Edge-probe a checkpoint on `tasks` (default: the config's) -> {"probing", "probing_summary",
    "mix_weights"} DataFrames (docs/design.md schemas, every row with `model`).

    Stores go to `store_root` (default out_dir/store). Tables are upserted (per model) into
    run_dir/tables (default out_dir/tables) when either is given, and the resolved config with
    per-task counts to out_dir/probe_run.json (`workbench probe` also draws the figures:
    `workbench.presentation.analysis_figures`).
    """

    cfg = ProbeRunConfig.resolve(config)
    tasks = list(tasks) if tasks is not None else list(cfg.tasks)
    model, tokenizer = plmodels.load(model_path)
    if tokenizer is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; probing needs one")
    model_name = model_name or default_model_name(model_path)
    model_id = plmodels.checkpoint_hash(model_path)
    # the random-init floor of probe seed s is drawn under floor_seed(s, the checkpoint's pretraining seed)
    trained_under = training_seed(model_path)
    floor_seeds = {s: floor_seed(s, trained_under) for s in cfg.seeds}
    base_model = model
    if cfg.stack == "decoder":  # a seq2seq's decoder, teacher-forced on the sentence itself
        if not family_of(model).cross_attention:
            raise ValueError(f"{model_path}: stack='decoder' reads an encoder-decoder's decoder; this is a {model.kind}")
        model, model_id = TeacherForcedDecoder(model), f"{model_id};decoder"
    layers = resolve_layers(cfg, int(model.config.n_layers))
    span_pooling = SPAN_POOLING_AUTO[family_of(model).lm_inputs] if cfg.span_pooling == "auto" else cfg.span_pooling
    if store_root is None:
        if out_dir is None:
            raise ValueError("probe_model: give out_dir or store_root (where the activation stores go)")
        store_root = Path(out_dir) / "store"
    store_root = Path(store_root)
    frames: dict[str, list[pd.DataFrame]] = {"probing": [], "probing_summary": [], "mix_weights": [], "probe_items": []}
    counts: dict[str, dict] = {}
    loaded: dict = {}       # each task split's records, read once (arcs serves three tasks and the floor)
    # one unit: one probe in one mode, over every layer and seed (extraction has its own bars)
    bar = progress_bar(len(tasks) * len(cfg.probes) * len(cfg.modes), f"probe {model_name}", "fit",
                       disable=not progress)
    with bar:
        for i, task in enumerate(tasks):
            t0 = time.perf_counter()
            bar.set_postfix_str(task, refresh=False)
            ahead = {RECORDS_OF.get(t, t) for t in tasks[i:]}
            for key in [k for k in loaded if k[0] not in ahead]:   # records no task ahead reads
                del loaded[key]
            log.info(f"probe {model_name}: task {task}: extracting")
            records = RECORDS_OF.get(task, task)
            train_cap = cfg.structural_train_words if task in STRUCTURAL_TASKS else cfg.max_train_targets
            train = load_split(model, tokenizer, records, cfg.train_split, cfg, store_root, model_id,
                               train_cap, tasks_dir, progress, loaded)
            test = load_split(model, tokenizer, records, cfg.eval_split, cfg, store_root, model_id,
                              cfg.max_eval_targets, tasks_dir, progress, loaded)
            # arcs: the label (deprel) only marks punctuation; any head can be scored
            dropped = (_drop_unseen(train, test) if cfg.unseen_labels == "drop" and records not in ARC_TASKS
                       else 0)
            if dropped:
                warnings.warn(f"probe {task}: {dropped} {cfg.eval_split} targets have labels not seen in the "
                              f"capped train split and were left out (unseen_labels='drop')", stacklevel=2)
            counts[task] = {"train_records": train.n_records, "eval_records": test.n_records,
                            "train_targets": int(len(train.arrays.labels)),
                            "eval_targets": int(len(test.arrays.labels)),
                            "train_truncated_targets": train.arrays.n_skipped,
                            "eval_truncated_targets": test.arrays.n_skipped, "eval_unseen_label_dropped": dropped,
                            "train_store": str(train.arrays.store.path), "eval_store": str(test.arrays.store.path)}
            if len(test.arrays.labels) == 0:
                raise ValueError(f"probe {task}: no {cfg.eval_split} targets left to score")
            _say(progress, f"probe {model_name}: task {task}: {counts[task]['train_targets']} train / "
                           f"{counts[task]['eval_targets']} eval targets, probing layers {layers[0]}..{layers[-1]}")
            random_init = None
            if (task in STRUCTURAL_TASKS and "random_init" in cfg.structural_baselines) or (
                    task not in STRUCTURAL_TASKS and records not in ARC_TASKS and "random_init" in cfg.modes):
                random_init = {seed: random_init_splits(base_model, tokenizer, records, cfg, floor_seeds[seed],
                                                        store_root, model_id, train_cap, tasks_dir, progress, loaded)
                               for seed in cfg.seeds}
                if dropped and task not in STRUCTURAL_TASKS:   # the same records: the same unseen labels
                    for r_tr, r_te in random_init.values():
                        _drop_unseen(r_tr, r_te)
            try:
                res = probe_task(train, test, cfg, layers, model_name, task, span_pooling, bar, random_init,
                                 counts[task])
            except ValueError as e:
                raise ValueError(f"probe {task} ({cfg.train_split} -> {cfg.eval_split}): {e}") from e
            for k, v in res.items():
                frames[k] += v
            counts[task]["seconds"] = round(time.perf_counter() - t0, 1)
            _say(progress, f"probe {model_name}: task {task}: done in {counts[task]['seconds']} s")
            if run_dir is not None or out_dir is not None:  # tasks done so far survive a killed run

                write_tables(run_dir if run_dir is not None else out_dir, _tables(frames))
    tables = _tables(frames)
    _write_outputs(tables, out_dir, run_dir, {
        "model": model_name, "model_path": str(model_path), "checkpoint_hash": model_id, "kind": model.kind,
        "stack": cfg.stack, "random_init_seeds": {str(s): t for s, t in floor_seeds.items()},
        "word_pooling": cfg.pooling, "span_pooling": span_pooling, "layers": layers, "tasks": tasks,
        "config": cfg.to_dict(), "counts": counts})
    return tables


def _tables(frames: dict[str, list[pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    tables = {"probing": _concat(frames["probing"], PROBING_COLUMNS),
              "probing_summary": _concat(frames["probing_summary"], SUMMARY_COLUMNS),
              "mix_weights": _concat(frames["mix_weights"], MIX_COLUMNS)}
    if frames["probe_items"]:
        tables["probe_items"] = _concat(frames["probe_items"], ITEM_COLUMNS)
    return tables


def _write_outputs(tables: dict[str, pd.DataFrame], out_dir, run_dir, record: dict) -> None:
    write_analysis_outputs(tables, out_dir, run_dir, record, "probe_run.json")


# ------------------------------------------------------------------------------------ baseline
def random_init_splits(model: torch.nn.Module, tokenizer, records: str, cfg: ProbeRunConfig, seed: int,
                       store_root: Path, model_id: str, train_cap: int | None, tasks_dir=None,
                       progress: bool = True, loaded: dict | None = None) -> tuple[TaskSplit, TaskSplit]:
    """The train and eval splits of `records` read by `random_init_model(model, seed)` (the "random_init"
    floor of probe seed s: `seed` = `plmodels.checkpoint.floor_seed(s, training_seed)`, the seed drawn):
    the same capped records and tokenizer as the model's, their own stores (model id
    `<model_id>;random_init:<seed>`; a seq2seq's decoder stack teacher-forced as the model's)."""
    fresh, fresh_id = random_init_model(model, seed), f"{model_id};random_init:{seed}"
    if cfg.stack == "decoder":
        fresh = TeacherForcedDecoder(fresh)
    return (load_split(fresh, tokenizer, records, cfg.train_split, cfg, store_root, fresh_id, train_cap, tasks_dir,
                       progress, loaded),
            load_split(fresh, tokenizer, records, cfg.eval_split, cfg, store_root, fresh_id, cfg.max_eval_targets,
                       tasks_dir, progress, loaded))


def random_baseline_checkpoint(model_path: str | Path, out: str | Path, seed: int = 0) -> Path:
    """Save the same architecture with fresh random weights (the model's own init, drawn under
    `plmodels.checkpoint.floor_seed(seed, training_seed(model_path))`, as the analyses' random-init
    floor of seed `seed` is) and the same tokenizer: the random-weights baseline of Hewitt & Liang
    2019 / Tenney et al. 2019a, probed like any model. Its card's "seed" is the seed drawn. Returns the
    new checkpoint folder."""
    model, tokenizer = plmodels.load(model_path)
    drawn = floor_seed(seed, training_seed(model_path))
    fresh = random_init_model(model, drawn)
    card = {"data": "none (random initialisation)", "random_init_of": str(model_path),
            "random_init_of_hash": plmodels.checkpoint_hash(model_path), "seed": drawn, "steps": 0, "tokens": 0}
    return plmodels.save(fresh.eval(), tokenizer, out, card=card)
