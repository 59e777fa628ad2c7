"""The zoo's cross-system analyses: what one pretraining objective does that another does not, with
pretraining seeds (workbench/zoo.py builds the study; docs/zoo.md reads its results).

Models of a zoo are named "<system>-s<seed>" (`model_name`); every analysis of a single checkpoint
(probing with per-item results, heads, pruning, frozen vs finetuned) runs as in any study, and
these steps then read the run's tables across systems:

- `import_suite` makes one seed of an imported suite (workbench/zoo.py) a pretraining run folder:
  every step's Hugging Face folder imported into checkpoints/step_<step>/ with its provenance,
  the last one as final/; `checkpoints_table` -> `zoo_checkpoints` (system, seed, model, step, tokens,
  checkpoint, source, config_sha256, weights, weights_sha256, claimed_seed, claimed_step): what each
  imported checkpoint was read from.
- `training_table` -> `zoo_training` (system, seed, model, kind, objective, steps, tokens,
  n_parameters, flops_6nd, seconds, eval_loss): what each checkpoint got from the same wall-clock
  budget; flops_6nd = 6 N D (Kaplan et al. 2020) with N the checkpoint's parameters and D the
  tokens the trainer counted (a rough compute figure: ELECTRA's generator and a decoder's shorter
  targets are not counted apart).
- `cka_between` -> `zoo_cka` (model_a, model_b, system_a, system_b, seed_a, seed_b, layer_a, layer_b,
  value): linear CKA (Kornblith et al. 2019, `probes.cka`) between every two checkpoints' layers on the
  same EWT dev words (first-subword vectors; sentences short enough that no model cuts them), so a
  layer of one system can be set beside the layers of another, and beside another seed of its own
  (the seed-to-seed similarity is the yardstick a cross-system similarity is read against).
- `zoo_statistics` -> `zoo_stats` and `zoo_comparisons`: every cross-system number with a
  procedure-level interval, the multi-bootstrap over pretraining seeds x test items of Sellam et al.
  2022 ("The MultiBERTs", `probes.multibootstrap`), kept apart from the items-only interval (which
  treats one seed's checkpoint as if it were the system). Statistics with per-item results (probing:
  the score at each layer, the best-layer score of the layer chosen on held-out items, E_delta of the
  cumulative probes, and the best-layer score of each floor on the same items: the untrained
  architecture's, the structural probes' trees; `probing_floors`) get both; those without (share of heads per primary role, prunable share of
  heads, finetuning gain) are resampled over seeds only, and so are the flow suite's (`flow_statistics`,
  task "flow": per-layer MI and lens curves with their floors, and the scalars systems are compared on). Minimal pairs (`pairs_statistics`, from
  `minimal_pair_items`): each phenomenon's accuracy by a system's own scorer, multi-bootstrap too,
  beside its four floors on the same items and compared with each of them. Interventions
  (`interventions_statistics`, from the `interventions` table): where agreement is mediated, the
  attention outputs' and the last layer's shares of the indirect effect at the reading position, seeds
  only, beside the random-init floor and compared with it.

A comparison is claimed ("A > B") only when both systems have at least three seeds (a bootstrap of S
seeds carries (S - 1) / S of the seed variance), its 95% interval excludes 0, and its p-value survives
Holm's correction within its family (`adjust_claims`: the primary family is each task's comparisons on
the statistic the zoo config declares primary, and the flow suite's declared one, between two systems;
the floor family every system against its floors; the secondary family the rest); `flips` counts the
(seed of A, seed of B) pairs that order the two systems the other way. Beside each comparison: what
the two systems differ in (`contrast`: objective only, architecture only, or both, from their
checkpoints' cards and model configs) and what each got from the budget (updates, tokens, 6 N D FLOPs,
flagged when the FLOPs differ by more than 25%).
"""
from __future__ import annotations

import json
import os
import shutil
from itertools import combinations
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

import plmodels
from plmodels.checkpoint import read_card
from plmodels.hf.registry import import_hf, model_type, provenance
from probes.cka import cka_matrix
from probes.multibootstrap import (
    Comparison,
    Interval,
    compare,
    compare_e_delta,
    compare_seeds_only,
    expected_layer_delta,
    held_out_best,
    holm,
    layer_curve,
    multi_bootstrap,
    seeds_only,
)
from probes.sentence_scores import SCORERS
from workbench.core.io import atomic_dir, atomic_write_json
from workbench.analyses.flow import ZOO_PRIMARY as FLOW_PRIMARY, ZOO_TASK as FLOW_TASK, flow_seed_values
from workbench.analyses.interventions import interventions_seed_values
from workbench.core.results import load_table
from workbench.data.tasks import ud_sentences
from workbench.store import extract

METRIC = "micro_f1"   # Tenney et al.'s edge-probing metric (= accuracy for one label per target)
TRAINING_COLUMNS = ["system", "seed", "model", "kind", "objective", "steps", "tokens", "n_parameters", "flops_6nd",
                    "seconds", "eval_loss"]
CKA_COLUMNS = ["model_a", "model_b", "system_a", "system_b", "seed_a", "seed_b", "layer_a", "layer_b", "value"]
STATS_COLUMNS = ["statistic", "task", "system", "layer", "value", "ci_low", "ci_high", "item_ci_low", "item_ci_high",
                 "interval", "n_seeds", "n_items"]
COMPARED_COLUMNS = ["statistic", "task", "system_a", "system_b", "delta", "ci_low", "ci_high", "p_a_gt_b",
                    "n_seed_pairs", "flips", "claim", "interval", "n_seeds", "p_value"]   # one `compare` each
COMPARISON_COLUMNS = COMPARED_COLUMNS + ["family", "p_holm", "claim_unadjusted", "contrast", "architecture_diff",
                                         "steps_a", "steps_b", "tokens_a", "tokens_b", "flops_a", "flops_b",
                                         "compute_ratio", "budget_differs"]
# the statistics a task's comparisons can be judged on (`ZooConfig.primary`); the rest of the table is a
# second, exploratory family
PRIMARY_STATISTICS = ("best_layer_score", "e_delta")
FAMILY_ALPHA = 0.05       # family-wise error rate of each family's claims (Holm), the 95% intervals' level
BUDGET_TOLERANCE = 1.25   # two systems' FLOPs differ by more than 25%: `budget_differs`
# model-config fields that are not the architecture: regularisation, a padding id, and BERT's NSP head,
# which belongs to the objective (`contrast`)
NOT_ARCHITECTURE = ("dropout", "pad_token_id", "use_nsp")
CHECKPOINT_COLUMNS = ["system", "seed", "model", "step", "tokens", "checkpoint", "source", "config_sha256", "weights",
                      "weights_sha256", "claimed_seed", "claimed_step"]
SUITE_STATE = "train_state.json"   # what emergence reads of a checkpoint: its step and tokens


def model_name(system: str, seed: int) -> str:
    return f"{system}-s{seed}"


def _members(systems: Mapping[str, Sequence[int]]) -> list[tuple[str, int, str]]:
    return [(system, seed, model_name(system, seed)) for system, seeds in systems.items() for seed in seeds]


# ------------------------------------------------------------------------------ training
def training_table(run_dir: Path, systems: Mapping[str, Sequence[int]]) -> pd.DataFrame:
    """`zoo_training`: one row per trained checkpoint of the zoo (module docstring)."""
    rows = []
    for system, seed, name in _members(systems):
        final = run_dir / "models" / name / "final"
        card = read_card(final).fields
        if not card:  # no checkpoint (or no card) for this member
            continue
        log = run_dir / "models" / name / "metrics.jsonl"
        seconds = float("nan")
        if log.is_file():
            times = [json.loads(line).get("time") for line in log.read_text().splitlines() if line.strip()]
            seconds = max((t for t in times if t is not None), default=float("nan"))
        n, tokens = int(card.get("n_parameters", 0)), int(card.get("tokens", 0))
        rows.append({"system": system, "seed": seed, "model": name, "kind": card.get("kind"),
                     "objective": card.get("objective_name", card.get("objective")), "steps": int(card.get("steps", 0)),
                     "tokens": tokens, "n_parameters": n, "flops_6nd": 6.0 * n * tokens, "seconds": seconds,
                     "eval_loss": card.get("metrics", {}).get("eval_loss", float("nan"))})
    return pd.DataFrame(rows, columns=TRAINING_COLUMNS)


# ------------------------------------------------------------------------------ imported suites
def _same_source(folder: Path, prov: Mapping) -> bool:
    """`folder` is a finished import (its step file written last) of the folder `prov` describes, with
    the same config and weights bytes and the same claims."""
    card = read_card(folder)
    return (folder / SUITE_STATE).is_file() and dict(card.provenance or {}) == dict(prov)


def import_suite(checkpoints: Sequence[tuple[int | None, str]], seed: int, out: Path,
                 tokens_per_step: int = 1) -> dict:
    """One seed of an imported suite as a pretraining run folder `out`, which every analysis reads
    like one the workbench trained: each (step, Hugging Face folder) imported into
    out/checkpoints/step_<step>/ with its provenance on the card (`plmodels.hf.registry.provenance`:
    source, config and weights sha256, the seed and step it claims) and a train_state.json with the
    step and tokens = step x tokens_per_step (what `workbench.analyses.emergence.checkpoints` reads),
    and the last one as out/final/ (hard links, or a copy across file systems). A suite without steps
    is imported into final/ alone. A checkpoint whose card already records the same provenance (same
    source, bytes and claims) is kept, not imported again. -> {"imported": n, "kept": n, "final": path}."""
    out = Path(out)
    done = {"imported": 0, "kept": 0}
    last = None
    for step, src in checkpoints:
        dest = out / "final" if step is None else out / "checkpoints" / f"step_{step}"
        prov = provenance(src, seed, step)
        last = dest
        if _same_source(dest, prov):
            done["kept"] += 1
            continue
        (dest / SUITE_STATE).unlink(missing_ok=True)   # an unfinished import is never read as finished
        tokens = None if step is None else step * tokens_per_step
        import_hf(src, dest, card={"steps": step, "tokens": tokens, "seed": seed,
                                   "objective": f"{model_type(src)} pretraining by the suite's authors (imported)"},
                  seed=seed, step=step)
        atomic_write_json(dest / SUITE_STATE, {"step": -1 if step is None else step, "tokens": tokens or 0,
                                               "imported_from": str(src)})
        done["imported"] += 1
    final = out / "final"
    if last is not None and last != final and not _same_source(final, read_card(last).provenance or {}):
        with atomic_dir(final, overwrite=True) as tmp:
            shutil.rmtree(tmp)
            shutil.copytree(last, tmp, copy_function=_link_or_copy)
    return {**done, "final": str(final)}


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:   # another file system
        shutil.copy2(src, dst)


def checkpoints_table(run_dir: Path, systems: Mapping[str, Sequence[int]]) -> pd.DataFrame:
    """`zoo_checkpoints`: one row per imported checkpoint of the zoo (every step of every seed of an
    imported suite) with its card's provenance: the source folder, the sha256 of its config.json and
    of its weight files, and the seed and step the suite's folder pattern says it is; what a user
    compares with the suite's published hashes. Trained systems have no rows."""
    rows = []
    for system, seed, name in _members(systems):
        folder = run_dir / "models" / name
        steps = [p for p in (folder / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
        found = sorted(steps, key=lambda p: int(p.name[5:])) if steps else [folder / "final"]
        for path in found:
            card = read_card(path)
            if not card.provenance:
                continue
            p = card.provenance
            rows.append({"system": system, "seed": seed, "model": name, "step": card.steps, "tokens": card.tokens,
                         "checkpoint": str(path.relative_to(run_dir)), "source": p.get("source"),
                         "config_sha256": p.get("config_sha256"), "weights": ", ".join(p.get("weights") or []),
                         "weights_sha256": p.get("weights_sha256"), "claimed_seed": p.get("claimed_seed"),
                         "claimed_step": p.get("claimed_step")})
    return pd.DataFrame(rows, columns=CHECKPOINT_COLUMNS)


# ----------------------------------------------------------------------------------- CKA
def _word_layers(path: Path, sentences: list[list[str]], store_root: Path, key: str) -> list[np.ndarray]:
    model, tok = plmodels.load(path)
    store = extract(model, tok, sentences, store_root, model_id=plmodels.checkpoint_hash(path), key_extra=key,
                    progress=False)
    if int(store.n_kept().sum()) != sum(len(s) for s in sentences):
        raise ValueError(f"{path}: the model cut some of the {len(sentences)} CKA sentences (too long for it)")
    return [np.asarray(store.layer(l), dtype=np.float32) for l in range(store.n_layers)]


def cka_between(run_dir: Path, systems: Mapping[str, Sequence[int]], n_sentences: int = 500,
                max_words: int = 40, store_root: Path | None = None) -> pd.DataFrame:
    """`zoo_cka`: linear CKA between the layers of every two checkpoints (module docstring), on the
    first `n_sentences` EWT dev sentences of at most `max_words` words."""
    sentences = [list(s.words) for s in ud_sentences("ewt", "dev") if len(s.words) <= max_words][:n_sentences]
    key = f"zoo-cka;ewt:dev;{len(sentences)};{max_words}"
    root = store_root or run_dir / "store"
    layers = {}
    for system, seed, name in _members(systems):
        path = run_dir / "models" / name / "final"
        if (path / "config.json").is_file():
            layers[system, seed, name] = _word_layers(path, sentences, root, key)
    frames = []
    for (sa, ea, na), (sb, eb, nb) in combinations(layers, 2):
        m = cka_matrix(layers[sa, ea, na], layers[sb, eb, nb])
        la, lb = np.meshgrid(np.arange(m.shape[0]), np.arange(m.shape[1]), indexing="ij")
        frames.append(pd.DataFrame({"model_a": na, "model_b": nb, "system_a": sa, "system_b": sb, "seed_a": ea,
                                    "seed_b": eb, "layer_a": la.ravel(), "layer_b": lb.ravel(),
                                    "value": m.ravel().astype(float)}))
    return pd.concat(frames, ignore_index=True)[CKA_COLUMNS] if frames else pd.DataFrame(columns=CKA_COLUMNS)


# ---------------------------------------------------------------------------- statistics
def item_arrays(items: pd.DataFrame, models: Sequence[str], task: str, mode: str) -> tuple[np.ndarray, list[int]]:
    """(S, L, N, 4) per-item counts [correct, tp, fp, fn] of `models` (one per seed; probe seed 0) for
    one task and mode, and the layers. Every model must have the same layers and the same N items."""
    arrays, layers = [], None
    for m in models:
        d = items[(items["model"] == m) & (items["task"] == task) & (items["mode"] == mode) & (items["seed"] == 0)]
        if d.empty:
            raise ValueError(f"probe_items has no {mode} rows of {m} for task {task} (probe with keep_items)")
        ls = sorted(d["layer"].unique())
        if layers is not None and ls != layers:
            raise ValueError(f"{m}, task {task}: layers {ls} differ from another seed's {layers}")
        layers = ls
        d = d.sort_values(["layer", "item"])
        arrays.append(d[["correct", "tp", "fp", "fn"]].to_numpy(np.float64).reshape(len(ls), -1, 4))
    n = {a.shape[1] for a in arrays}
    if len(n) != 1:
        raise ValueError(f"task {task}: the models {list(models)} were scored on different numbers of items {sorted(n)}")
    return np.stack(arrays), layers


def _row(statistic: str, task: str, system: str, layer: int, iv: Interval, items_iv: Interval | None,
         interval: str) -> dict:
    return {"statistic": statistic, "task": task, "system": system, "layer": layer, "value": iv.value,
            "ci_low": iv.low, "ci_high": iv.high, "item_ci_low": items_iv.low if items_iv else float("nan"),
            "item_ci_high": items_iv.high if items_iv else float("nan"), "interval": interval,
            "n_seeds": iv.n_seeds, "n_items": iv.n_items}


def _cmp_row(statistic: str, task: str, a: str, b: str, c: Comparison, interval: str) -> dict:
    return {"statistic": statistic, "task": task, "system_a": a, "system_b": b, "delta": c.delta, "ci_low": c.low,
            "ci_high": c.high, "p_a_gt_b": c.p_a_gt_b, "n_seed_pairs": c.n_seed_pairs, "flips": c.flips,
            "claim": c.claim, "interval": interval, "n_seeds": c.n_seeds, "p_value": c.p_value}


def probing_statistics(items: pd.DataFrame, systems: Mapping[str, Sequence[int]], n_boot: int = 1000,
                       seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows of zoo_stats and zoo_comparisons from `probe_items`: per task and system the score at each
    layer, the best-layer score and E_delta (multi-bootstrap and items-only intervals); per task and pair
    of systems the difference of best-layer scores and of E_delta (paired items).

    The best layer is chosen on held-out items (`probes.multibootstrap.held_out_best`, the main job's
    cross-fitting over two halves of the test items): each item is scored at the layer the other half
    chose, the row's `layer` is the choice of both halves (-1 when they differ), and the multi-bootstrap
    resamples those cross-fitted items. Choosing the layer inside each replicate instead would still
    pick and score on the same (resampled) items: the replicates would carry the optimism of the
    maximum, not remove it.

    Floors (`probing_floors`): where probe_items holds them for every seed of a system, the same
    best-layer score of the untrained architecture (mode "random_init", its layer chosen on held-out
    items the same way), and for a structural task the model-free trees (chain, position, random_tree),
    each as statistic "best_layer_score_floor:<floor>" (plus "layer_score_floor:random_init" per layer)
    and compared with the system on the same items (system_b "floor:<floor>", statistic
    "best_layer_score"): "this system's probe reads more than its untrained architecture" with a
    multi-bootstrap interval, the floor's selection inside it."""
    kw = dict(n_boot=n_boot, seed=seed)
    stats, comps = [], []
    for task in sorted(items["task"].unique()):
        of_task = items[items["task"] == task]   # filtered once: every array below is one task's
        best: dict[str, np.ndarray] = {}
        cumulative: dict[str, tuple[np.ndarray, list[int]]] = {}
        for system, seeds in systems.items():
            models = [model_name(system, s) for s in seeds]
            if not set(models) <= set(of_task["model"]):
                continue
            single, layers = item_arrays(of_task, models, task, "single")
            rows, best[system] = _layer_rows(single, layers, "", task, system, kw)
            s, c = probing_floors(of_task, models, task, system, best[system], **kw)
            stats, comps = stats + rows + s, comps + c
            if (of_task["mode"] == "cumulative").any():  # not structural tasks
                cum, cum_layers = item_arrays(of_task, models, task, "cumulative")
                cumulative[system] = cum, cum_layers
                stats.append(_row("e_delta", task, system, -1,
                                  expected_layer_delta(cum, METRIC, layer_ids=cum_layers, **kw),
                                  expected_layer_delta(cum, METRIC, layer_ids=cum_layers, resample_seeds=False, **kw),
                                  "multi-bootstrap"))
        for a, b in combinations(sorted(best), 2):
            comps.append(_cmp_row("best_layer_score", task, a, b, compare(best[a], best[b], METRIC, **kw),
                                  "multi-bootstrap"))
        for a, b in combinations(sorted(cumulative), 2):
            (ca, la), (cb, lb) = cumulative[a], cumulative[b]
            comps.append(_cmp_row("e_delta", task, a, b, compare_e_delta(ca, cb, METRIC, la, lb, **kw),
                                  "multi-bootstrap"))
    return stats, comps


def _best_row(statistic: str, task: str, system: str, layer: int, items: np.ndarray, kw: dict) -> dict:
    """A zoo_stats row of per-item counts (S, N, 4) with their multi-bootstrap and items-only intervals."""
    return _row(statistic, task, system, layer, multi_bootstrap(items, METRIC, **kw),
                multi_bootstrap(items, METRIC, resample_seeds=False, **kw), "multi-bootstrap")


def _layer_rows(arrays: np.ndarray, layers: list[int], suffix: str, task: str, system: str,
                kw: dict) -> tuple[list[dict], np.ndarray]:
    """The "layer_score<suffix>" row of every layer of `arrays` (S, L, N, 4) and its "best_layer_score<suffix>"
    row, the layer chosen on held-out items (`held_out_best`; -1 when the halves disagree), with those
    cross-fitted items (S, N, 4): a system's (suffix "") and its untrained architecture's alike."""
    curve = layer_curve(arrays, METRIC, **kw)
    items_curve = layer_curve(arrays, METRIC, resample_seeds=False, **kw)
    rows = [_row("layer_score" + suffix, task, system, l, iv, it, "multi-bootstrap")
            for l, iv, it in zip(layers, curve, items_curve)]
    layer, best = held_out_best(arrays, METRIC)
    rows.append(_best_row("best_layer_score" + suffix, task, system, layers[layer] if layer >= 0 else -1, best, kw))
    return rows, best


PROBING_FLOORS = ("random_init", "chain", "position", "random_tree")   # probe_items modes a system is set beside


def probing_floors(items: pd.DataFrame, models: Sequence[str], task: str, system: str, best: np.ndarray,
                   n_boot: int = 1000, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The floor rows of one system and task (`probing_statistics`): for each mode of PROBING_FLOORS
    that probe_items holds for every one of `models`, the floor's best-layer score (random_init: its
    layer chosen on held-out items by `held_out_best`, as the system's; the structural trees have one,
    layer -1) with its multi-bootstrap and items-only intervals, random_init's score per layer, and the
    comparison of the system's held-out best-layer items `best` (S, N, 4) with the floor's on the same
    items. A floor with other items than the system's is a ValueError naming both."""
    kw = dict(n_boot=n_boot, seed=seed)
    stats, comps = [], []
    for floor in PROBING_FLOORS:
        have = items[(items["task"] == task) & (items["mode"] == floor) & (items["seed"] == 0)]
        if not set(models) <= set(have["model"]):
            continue
        arrays, layers = item_arrays(have, models, task, floor)
        if arrays.shape[2] != best.shape[1]:
            raise ValueError(f"task {task}, {system}: the {floor} floor scored {arrays.shape[2]} items, the system "
                             f"{best.shape[1]}: a floor must stand on the system's items")
        if floor == "random_init":
            rows, scores = _layer_rows(arrays, layers, "_floor:random_init", task, system, kw)
        else:   # a model-free tree: one layer, -1
            scores = arrays[:, 0]
            rows = [_best_row(f"best_layer_score_floor:{floor}", task, system, -1, scores, kw)]
        stats += rows
        comps.append(_cmp_row("best_layer_score", task, system, f"floor:{floor}",
                              compare(best, scores, METRIC, **kw), "multi-bootstrap"))
    return stats, comps


def pairs_statistics(items: pd.DataFrame, systems: Mapping[str, Sequence[int]],
                     n_boot: int = 1000, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows of zoo_stats and zoo_comparisons from `minimal_pair_items` (docs/behaviour.md): per
    phenomenon (task "pairs:<suite>:<phenomenon>:<variant>") and system the accuracy of the system's
    first scorer (`probes.sentence_scores.SCORERS` order: a kind's own rule, e.g. clm, pll, bilm) with
    the multi-bootstrap over pretraining seeds x items, beside the items-only interval; per pair of
    systems the difference on the items every model scored (paired items, unpaired seeds). A tie
    counts 0.5, as in `minimal_pairs`.

    Beside each system's accuracy, on the same items and seeds, its floors (statistic
    "pairs_floor:<floor>", the floor:random_init of its own scorer), and one comparison of the system
    against each floor (system_b "floor:<floor>"): the zoo's rule for "this system beats its bigram
    floor" (three seeds, Holm in the floor family)."""
    kw = dict(n_boot=n_boot, seed=seed)
    models = {system: [model_name(system, s) for s in seeds] for system, seeds in systems.items()}
    floors = items["scorer"].str.startswith("floor:")
    own = items[~floors]
    scorer = {}
    for system, names in models.items():
        mine = own[own["model"].isin(names)]
        if set(mine["model"]) == set(names):
            scorer[system] = min(mine["scorer"].unique(), key=lambda n: list(SCORERS).index(n))
    stats, comps = [], []
    cell = items["suite"] + ":" + items["phenomenon"] + ":" + items["variant"]

    def correct_of(rows: pd.DataFrame, names: list[str], label: str) -> pd.DataFrame:
        d = rows[rows["model"].isin(names) & (rows["scorer"] == label)]
        return d.pivot_table(index="id", columns="model", values="correct").reindex(columns=names)

    def as_items(p: pd.DataFrame, common: list[str]) -> np.ndarray:
        correct = p.reindex(common).to_numpy(np.float64).T                          # (S, N)
        return np.concatenate([correct[..., None], np.zeros(correct.shape + (3,))], axis=-1)

    for task in sorted(cell[~floors].unique()):
        rows = items[cell == task]
        per = {system: correct_of(rows, models[system], sc) for system, sc in scorer.items()}
        common = sorted(set.intersection(*(set(p.dropna().index) for p in per.values()))) if per else []
        if not common:
            continue
        arrays = {}
        for system, p in per.items():
            arrays[system] = as_items(p, common)
            stats.append(_row("pairs_accuracy", f"pairs:{task}", system, -1,
                              multi_bootstrap(arrays[system], "accuracy", **kw),
                              multi_bootstrap(arrays[system], "accuracy", resample_seeds=False, **kw),
                              "multi-bootstrap"))
            for floor in _pair_floors(rows, models[system], scorer[system]):
                f = correct_of(rows, models[system], floor)
                if f.reindex(common).isna().to_numpy().any():   # a floor must stand on every item its system scored
                    continue
                name = floor.rsplit(":", 1)[0] if floor.startswith("floor:random_init:") else floor
                fa = as_items(f, common)
                stats.append(_row(f"pairs_{name}", f"pairs:{task}", system, -1, multi_bootstrap(fa, "accuracy", **kw),
                                  multi_bootstrap(fa, "accuracy", resample_seeds=False, **kw), "multi-bootstrap"))
                comps.append(_cmp_row("pairs_accuracy", f"pairs:{task}", system, name,
                                      compare(arrays[system], fa, "accuracy", **kw), "multi-bootstrap"))
        for a, b in combinations(sorted(arrays), 2):
            comps.append(_cmp_row("pairs_accuracy", f"pairs:{task}", a, b,
                                  compare(arrays[a], arrays[b], "accuracy", **kw), "multi-bootstrap"))
    return stats, comps


def _pair_floors(rows: pd.DataFrame, names: list[str], scorer: str) -> list[str]:
    """The floor labels of a system's models in `rows`: the corpus floors and chance, and the
    random-initialised copy scored by the system's own scorer."""
    got = set(rows.loc[rows["model"].isin(names), "scorer"])
    return [f for f in ("floor:chance", "floor:frequency", "floor:bigram", f"floor:random_init:{scorer}") if f in got]


def _per_model(df: pd.DataFrame | None, value: str) -> dict[str, float]:
    return {} if df is None else dict(zip(df["model"], df[value]))


def seed_statistics(run_dir: Path, systems: Mapping[str, Sequence[int]], n_boot: int = 1000,
                    seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows for the statistics without items, resampled over pretraining seeds only: the share of a
    model's heads (the encoder's, for T5 / BART) with each primary role, the share of heads prunable
    for a 5 % loss (Michel order), the finetuning gain (finetune minus the scalar-mix frozen features,
    per task). The flow suite's are `flow_statistics`'."""
    per_stat: dict[tuple[str, str], dict[str, float]] = {}
    classes = load_table(run_dir, "heads_classes")
    if classes is not None and len(classes):
        if "weighting" in classes.columns:
            classes = classes[classes["weighting"].fillna("raw") == "raw"]
        prim = classes[classes["primary"]] if "primary" in classes.columns else classes
        counts = prim.groupby(["model", "role"]).size().unstack(fill_value=0)
        shares = counts.div(counts.sum(axis=1), axis=0)  # systems differ in their number of heads
        for role in shares.columns:
            per_stat["heads_" + role, ""] = shares[role].astype(float).to_dict()
    prunable = load_table(run_dir, "prunable")
    if prunable is not None and len(prunable):
        p = prunable[(prunable["method"] == "michel") & np.isclose(prunable["tolerance"], 0.05)]
        per_stat["prunable_share", ""] = _per_model(p, "max_fraction")
    fvf = load_table(run_dir, "frozen_vs_finetuned")
    if fvf is not None and len(fvf):
        gain = fvf[(fvf["setting"] == "diff:scalar_mix") & (fvf["seed"] == -1)]
        for task, g in gain.groupby("task"):
            per_stat["finetuning_gain", task] = _per_model(g, "value")
    stats, comps = [], []
    kw = dict(n_boot=n_boot, seed=seed)
    for (statistic, task), values in sorted(per_stat.items()):
        by_system = {}
        for system, seeds in systems.items():
            # (a role a model's heads never take is a 0 share: `unstack(fill_value=0)` above)
            vals = [values[m] for m in (model_name(system, s) for s in seeds) if m in values]
            if vals:
                by_system[system] = vals
                stats.append(_row(statistic, task, system, -1, seeds_only(vals, **kw), None, "seeds-only"))
        for a, b in combinations(sorted(by_system), 2):
            comps.append(_cmp_row(statistic, task, a, b, compare_seeds_only(by_system[a], by_system[b], **kw),
                                  "seeds-only"))
    return stats, comps


def _stack_members(names: Sequence[str], got: Mapping[str, float]) -> dict[str, list[str]]:
    """{stack suffix: the models of `names` (one per seed) with that stack in `got`}: "" for the model
    itself, ";decoder" for an encoder-decoder's teacher-forced decoder (`Family.flow_stacks`)."""
    out: dict[str, list[str]] = {}
    for base in names:
        for m in got:
            if m == base or (m.startswith(base) and m[len(base)] == ";"):
                out.setdefault(m[len(base):], []).append(m)
    return out


def flow_statistics(run_dir: Path, systems: Mapping[str, Sequence[int]], n_boot: int = 1000,
                    seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows of zoo_stats and zoo_comparisons (task "flow") from the flow suite's tables, per checkpoint
    as `workbench.analyses.flow.flow_seed_values` reads them, resampled over pretraining seeds only (the
    suite keeps no per-item results): per system (a seq2seq's decoder stack as "<system>;decoder") each
    layer's value of the MI and lens curves and of their floors (`layer` >= 0) and each scalar statistic
    (`layer` -1); per two systems the difference of each compared scalar (`compare_seeds_only`; no
    claim below three seeds a system). The lens' declared primary statistic joins the primary Holm
    family (`adjust_claims`)."""
    values = flow_seed_values(load_table(run_dir, "flow_mi"), load_table(run_dir, "flow_lens"),
                              load_table(run_dir, "flow_attribution"))
    kw = dict(n_boot=n_boot, seed=seed)
    stats, comps = [], []
    for (statistic, layer, compared), per_model in sorted(values.items()):
        by_system = {}
        for system, seeds in systems.items():
            for suffix, models in _stack_members([model_name(system, s) for s in seeds], per_model).items():
                by_system[system + suffix] = [per_model[m] for m in models]
                stats.append(_row(statistic, FLOW_TASK, system + suffix, layer,
                                  seeds_only(by_system[system + suffix], **kw), None, "seeds-only"))
        if compared:
            for a, b in combinations(sorted(by_system), 2):
                comps.append(_cmp_row(statistic, FLOW_TASK, a, b,
                                      compare_seeds_only(by_system[a], by_system[b], **kw), "seeds-only"))
    return stats, comps


def interventions_statistics(run_dir: Path, systems: Mapping[str, Sequence[int]], n_boot: int = 1000,
                             seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows for the interventions' per-checkpoint statistics (`interventions_seed_values`: attention's and
    the last layer's shares of the agreement NIE at the reading position), resampled over pretraining
    seeds only: per system its value, and its random-init floor's (statistic "<statistic>_floor:random_init");
    per pair of systems the difference, and each system against its floor (system_b "floor:random_init")."""
    table = load_table(run_dir, "interventions")
    trained, floor = interventions_seed_values(table), interventions_seed_values(table, "random_init")
    stats, comps = [], []
    kw = dict(n_boot=n_boot, seed=seed)
    for (statistic, task), values in sorted(trained.items()):
        floors = floor.get((statistic, task), {})
        by_system = {}
        for system, seeds in systems.items():
            names = [model_name(system, s) for s in seeds]
            vals = [values[m] for m in names if m in values]
            if not vals:
                continue
            by_system[system] = vals
            stats.append(_row(statistic, task, system, -1, seeds_only(vals, **kw), None, "seeds-only"))
            fv = [floors[m] for m in names if m in floors]
            if fv:
                stats.append(_row(f"{statistic}_floor:random_init", task, system, -1, seeds_only(fv, **kw), None,
                                  "seeds-only"))
                comps.append(_cmp_row(statistic, task, system, "floor:random_init",
                                      compare_seeds_only(vals, fv, **kw), "seeds-only"))
        for a, b in combinations(sorted(by_system), 2):
            comps.append(_cmp_row(statistic, task, a, b, compare_seeds_only(by_system[a], by_system[b], **kw),
                                  "seeds-only"))
    return stats, comps


def system_profiles(run_dir: Path, systems: Mapping[str, Sequence[int]]) -> dict[str, dict]:
    """Per system, from its checkpoints: `objective` (the card's description of it, with its arguments:
    BERT's "+ NSP", ALBERT's "+ SOP" and RoBERTa's neither are three objectives though all are "mlm") and
    `architecture` (the model kind and its config.json `config`, less NOT_ARCHITECTURE), from the first
    seed that has a checkpoint; systems without one are left out."""
    out = {}
    for system, seeds in systems.items():
        for seed in seeds:
            final = run_dir / "models" / model_name(system, seed) / "final"
            card = read_card(final).fields
            if (final / "config.json").is_file() and card:
                meta = json.loads((final / "config.json").read_text())
                arch = {k: v for k, v in meta["config"].items() if k not in NOT_ARCHITECTURE}
                out[system] = {"objective": card.get("objective", card.get("objective_name")),
                               "architecture": {"kind": meta["kind"], **arch}}
                break
    return out


def contrast(a: Mapping, b: Mapping) -> tuple[str, str]:
    """What two systems' profiles (`system_profiles`) differ in: "objective only", "architecture only",
    "objective + architecture" or "training only" (same objective and architecture: the training settings
    differ), and the architecture fields that differ ("position: learned vs rope"; for two kinds of model
    only the kind, their other fields are not comparable)."""
    arch_a, arch_b = a["architecture"], b["architecture"]
    if arch_a["kind"] != arch_b["kind"]:
        diff = [f"kind: {arch_a['kind']} vs {arch_b['kind']}"]
    else:
        diff = [f"{k}: {arch_a.get(k)} vs {arch_b.get(k)}" for k in sorted(set(arch_a) | set(arch_b))
                if arch_a.get(k) != arch_b.get(k)]
    label = {(True, True): "objective + architecture", (True, False): "objective only",
             (False, True): "architecture only", (False, False): "training only"}[
        (a["objective"] != b["objective"], bool(diff))]
    return label, "; ".join(diff)


def _describe(comps: pd.DataFrame, profiles: Mapping[str, dict], training: pd.DataFrame) -> pd.DataFrame:
    """The contrast and the compute columns of every comparison: each system's seed-mean updates, tokens
    and FLOPs (`zoo_training`: 6 N D), their ratio (larger / smaller FLOPs) and the flag above
    BUDGET_TOLERANCE."""
    per_system = training.groupby("system")[["steps", "tokens", "flops_6nd"]].mean() if len(training) else None
    labels = [contrast(profiles[a], profiles[b]) if a in profiles and b in profiles else ("", "")
              for a, b in zip(comps["system_a"], comps["system_b"])]
    comps = comps.assign(contrast=[x for x, _ in labels], architecture_diff=[d for _, d in labels])
    for side in ("a", "b"):
        got = (per_system.reindex(comps[f"system_{side}"]) if per_system is not None
               else pd.DataFrame(np.nan, index=comps[f"system_{side}"], columns=["steps", "tokens", "flops_6nd"]))
        comps[f"steps_{side}"] = got["steps"].to_numpy(float)
        comps[f"tokens_{side}"] = got["tokens"].to_numpy(float)
        comps[f"flops_{side}"] = got["flops_6nd"].to_numpy(float)
    lo = np.minimum(comps["flops_a"], comps["flops_b"])
    comps["compute_ratio"] = np.maximum(comps["flops_a"], comps["flops_b"]) / lo.where(lo > 0)
    comps["budget_differs"] = comps["compute_ratio"] > BUDGET_TOLERANCE
    return comps


def adjust_claims(comps: pd.DataFrame, primary: Mapping[str, str] | None = None,
                  alpha: float = FAMILY_ALPHA) -> pd.DataFrame:
    """Holm's correction (`probes.multibootstrap.holm`) over each family of a comparisons table: the
    "primary" family holds each task's comparisons on its primary statistic (`primary`: task ->
    statistic; "best_layer_score" for a task it does not name, the flow suite's declared statistic for its
    task "flow") between two systems, the "floor" family every comparison of a system with one of its
    floors (system_b "floor:<name>": probing's, minimal pairs', interventions'), the "secondary" family
    everything else (the other statistic of a task, the seeds-only ones). `claim_unadjusted` keeps the interval's claim
    (never made below three seeds a system); `claim` stands only where also the Holm-adjusted p-value
    `p_holm` <= alpha, so each family's chance of any false claim is at most alpha."""
    primary = primary or {}
    default = {FLOW_TASK: FLOW_PRIMARY}
    family = ["floor" if str(b).startswith("floor:") else
              "primary" if st == primary.get(t, default.get(t, "best_layer_score")) else "secondary"
              for st, t, b in zip(comps["statistic"], comps["task"], comps["system_b"])]
    comps = comps.assign(family=family, p_holm=np.nan, claim_unadjusted=comps["claim"])
    for family, idx in comps.groupby("family").groups.items():
        comps.loc[idx, "p_holm"] = holm(comps.loc[idx, "p_value"].to_numpy(float))
    keep = comps["p_holm"] <= alpha
    comps["claim"] = comps["claim_unadjusted"].where(keep, "no claim")
    return comps


def zoo_statistics(run_dir: Path, systems: Mapping[str, Sequence[int]], n_boot: int = 1000,
                   seed: int = 0, primary: Mapping[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """{"zoo_stats", "zoo_comparisons"} of a zoo run (module docstring): the comparisons with their
    families and Holm-adjusted claims (`adjust_claims`), contrast and compute (`_describe`)."""
    stats, comps = [], []
    items = load_table(run_dir, "probe_items")
    if items is not None and len(items):
        s, c = probing_statistics(items, systems, n_boot, seed)
        stats, comps = stats + s, comps + c
    pair_items = load_table(run_dir, "minimal_pair_items")
    if pair_items is not None and len(pair_items) and "phenomenon" in pair_items:
        s, c = pairs_statistics(pair_items, systems, n_boot, seed)
        stats, comps = stats + s, comps + c
    s, c = seed_statistics(run_dir, systems, n_boot, seed)
    stats, comps = stats + s, comps + c
    s, c = flow_statistics(run_dir, systems, n_boot, seed)
    s_i, c_i = interventions_statistics(run_dir, systems, n_boot, seed)
    s, c = s + s_i, c + c_i
    table = pd.DataFrame(comps + c, columns=COMPARED_COLUMNS)
    table = _describe(adjust_claims(table, primary), system_profiles(run_dir, systems),
                      training_table(run_dir, systems))
    return {"zoo_stats": pd.DataFrame(stats + s, columns=STATS_COLUMNS),
            "zoo_comparisons": table[COMPARISON_COLUMNS]}
