"""The research report of a run: one self-contained HTML page and a Markdown summary.

`write_report(run_dir)` reads the run's tables only through `workbench.core.results` / `workbench.presentation.views`
(docs/design.md, "Runs and the results store"), draws them with the app's figure builders
(`workbench.figures`), and writes `report/report.html` and `report/summary.md` atomically.

Each section has a heading, its figures, a compact table and one sentence computed from the
numbers (never hard-coded), so the page reads as the study's findings. The run's own sections come
first (run, models and training curves); then each analysis record of `workbench.analyses.registry`
names its sections (`Analysis.sections`, keys of `SECTION_BUILDERS`; a record that names none gets
`default_section`: its figures and its tables' first rows) and the report follows the records' order: per-layer probing (Tenney et al. 2019, expected layer and center of gravity; Hewitt
and Liang 2019, selectivity), the zoo's objectives and structural probes (Hewitt and Manning 2019,
each best layer beside its four floors: a random tree, the chain, position alone, the untrained
model) -> attention heads (Clark et al. 2019, best head per relation against a fixed-offset
baseline) -> pruning (Michel et al. 2019) -> head gating (a head role's effect against random heads
of the same number) -> amnesic probing (Elazar et al. 2021) -> frozen vs finetuned (Peters et al.
2019), CKA (Kornblith et al. 2019) and head change -> emergence -> behaviour: minimal pairs (Marvin &
Linzen 2018, Warstadt et al. 2020) beside chance, frequency, bigram and random-init floors -> flow
and interventions.
Every section but the run's opens with the competence line: each pretrained model's held-out LM loss
beside a unigram and a bigram model's on the same targets (the `competence` table), so a reader sees
first how far each model got.
A table that does not exist yet is named with the CLI command that writes it (`views.missing_command`).

The HTML needs no network: plotly.js is embedded once in <head> and every figure is a <div> with
`include_plotlyjs=False`.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from plotly.offline import get_plotlyjs

from probes.multibootstrap import MIN_SEEDS
from probes.pruning import METRICS, heads_to_prune_for_loss
from workbench import figures
from workbench.analyses.registry import ANALYSES, analysis
from workbench.core import results
from workbench.core.io import atomic_write_text
from workbench.figures import zoo as zoo_figures
from workbench.presentation import views
from workbench.presentation.analysis_figures import figure_builders

FINETUNED = ("finetune", "finetuned")     # settings of `frozen_vs_finetuned` that mean full finetuning
TOLERANCES = (0.01, 0.05)                  # "how many heads can go for 1 % / 5 % loss"


@dataclass
class Section:
    """One part of the report: a heading, its findings (short sentences with numbers, shown as a
    list; the first `n_key` also go to the key findings at the top), figures, compact
    tables, notices."""

    title: str
    findings: list[str] = field(default_factory=list)                 # clauses; rendered as sentences
    figs: list = field(default_factory=list)                          # plotly Figures
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    details: list[tuple[str, str]] = field(default_factory=list)      # (summary, text) shown collapsed
    missing: list[str] = field(default_factory=list)                  # table names not written yet
    n_key: int = 2                                                     # findings repeated at the top
    lead: str = ""                                                     # the competence line, before the findings

    @property
    def sentence(self) -> str:
        """The findings as one sentence (clauses joined by '; ')."""
        return _sentence(self.findings)

    @property
    def anchor(self) -> str:
        return "sec-" + re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


# ---------------------------------------------------------------------------------- helpers
def _f(x, d: int = 3) -> str:
    """A number as the report prints it (tables and sentences use the same rounding)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "n/a" if not np.isfinite(x) else f"{x:.{d}f}"


def _pct(x: float) -> str:
    return f"{100 * float(x):.0f}%"


def _sentence(clauses: list[str]) -> str:
    """Join clauses into one sentence: first letter upper case, '; ' between, a final period."""
    text = "; ".join(c for c in clauses if c)
    return (text[0].upper() + text[1:] + ".") if text else ""


LAYER_COLUMNS = ("expected_layer", "center_of_gravity")   # layer positions: 2 decimals, scores: 3
# Counts and indices print as integers (1,280, not 1280.000); seconds with one decimal.
INT_COLUMNS = {"steps", "tokens", "params", "layers", "heads", "d_model", "layer", "head", "step", "seed",
               "best_layer", "best_head", "baseline_offset", "bytes", "tokens_per_s", "layer_a", "layer_b", "rank",
               "random_init_layer"}
ONE_DECIMAL = {"seconds"}
INTERVALS = (("value", "ci_low", "ci_high"), ("test_acc", "ci_low", "ci_high"), ("best", "best_low", "best_high"))


def _cell(col: str, v) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return ""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return f"{int(v):,}"
    if not isinstance(v, (float, np.floating)):
        return str(v)
    if col in INT_COLUMNS or col.startswith("n_"):
        return f"{int(round(v)):,}" if float(v).is_integer() or col in INT_COLUMNS else _f(v)
    return _f(v, 1 if col in ONE_DECIMAL else 2 if col in LAYER_COLUMNS else 3)


def _compact(df: pd.DataFrame) -> pd.DataFrame:
    """Cells as the report prints them, so HTML, Markdown and sentences agree: counts as integers,
    scores with 3 decimals, layer positions with 2, and a score with its interval in one cell
    ("0.880 [0.842, 0.918]")."""
    out = df.copy()
    for value, lo, hi in INTERVALS:
        if {value, lo, hi} <= set(out.columns):
            out[value] = [f"{_f(v)} [{_f(a)}, {_f(b)}]" if np.isfinite(a) and np.isfinite(b) else _f(v)
                          for v, a, b in zip(out[value], out[lo].astype(float), out[hi].astype(float))]
            out = out.drop(columns=[lo, hi])
    for c in out.columns:
        out[c] = [_cell(c, v) for v in out[c]]
    return out.reset_index(drop=True)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (pandas' to_markdown needs `tabulate`, not a dependency)."""
    def cell(v) -> str:
        return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).replace("|", "\\|").replace("\n", " ")
    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def _higher_is_better(metric: str) -> bool:
    if metric in METRICS:
        return METRICS[metric].higher_is_better
    return not any(w in metric for w in ("loss", "perplexity", "ppl", "error"))


# ----------------------------------------------------------------------------- training data
def training_table(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's training curves (model, step, tokens, split, metric, value): `views.training_curves`."""
    return views.training_curves(run_dir)


def _safetensors_params(path: Path) -> int | None:
    """Number of parameters in a .safetensors file, read from its JSON header (no tensors loaded)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    return int(sum(np.prod(v["shape"], dtype=np.int64) for k, v in header.items() if k != "__metadata__"))


def _card_data(card: dict) -> str:
    """The training data of a card: 'source:split' of a pretraining card, or the card's string."""
    data = card.get("data")
    if isinstance(data, dict) and isinstance(data.get("train"), (list, tuple)):
        return ":".join(str(x) for x in data["train"])
    return "" if data is None else str(data) if not isinstance(data, (dict, list)) else json.dumps(data)[:80]


def model_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per checkpoint: name, kind, layers, heads, width, parameters, MB, steps, tokens and
    one column per held-out metric of its card."""
    rows = []
    for m in results.list_models(run_dir):
        cfg = json.loads((m.path / "config.json").read_text()).get("config", {})   # list_models checked it exists
        weights = m.path / "model.safetensors"
        metrics = m.card.get("metrics") if isinstance(m.card.get("metrics"), dict) else {}
        rows.append({"model": m.name, "kind": m.kind, "layers": cfg.get("n_layers"), "heads": cfg.get("n_heads"),
                     "d_model": cfg.get("d_model"), "params": _safetensors_params(weights),
                     "MB": f"{weights.stat().st_size / 2**20:.1f}" if weights.exists() else None,
                     "data": _card_data(m.card), "steps": m.card.get("steps"), "tokens": m.card.get("tokens"),
                     **{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------- sections
def run_section(run_dir: Path) -> Section:
    info = results.run_info(run_dir)
    s = Section("Run")
    if not info:
        s.findings = [f"{run_dir.name} has no run.json (it was not written by `workbench run`), "
                      "so its config, seed and data checksums are unknown"]
        return s
    name = info.get("config", {}).get("name", run_dir.name)
    steps = info.get("steps", {}) or {}
    rows = [(k, v.get("status", "?"), v.get("seconds", np.nan)) if isinstance(v, dict) else (k, str(v), np.nan)
            for k, v in steps.items() if k != "report"]   # the report step is the one writing this page
    table = pd.DataFrame(rows, columns=["step", "status", "seconds"])
    done = int((table["status"] == "done").sum())
    clauses = [f"run {name} (seed {info.get('seed', '?')}, code {info.get('code_version', '?')}) "
               f"has {done} of {len(table)} steps done"]
    if table["seconds"].notna().any():
        longest = table.loc[table["seconds"].idxmax()]
        clauses.append(f"the longest step was {longest['step']} ({_f(longest['seconds'], 1)} s of "
                       f"{_f(table['seconds'].sum(), 1)} s)")
    s.findings = [c for c in clauses if c]
    s.tables.append(("Steps", table))
    s.details.append(("Config", json.dumps(info.get("config", {}), indent=2)))
    s.details.append(("Data checksums", json.dumps(info.get("data_checksums", {}), indent=2)))
    return s


def models_section(run_dir: Path) -> Section:
    s = Section("Models and training")
    cards, train = model_table(run_dir), training_table(run_dir)
    if len(cards):
        s.tables.append(("Model cards", cards))
    else:
        s.missing.append("models")
    if train is None:
        imported = [m.name for m in results.list_models(run_dir) if "import" in m.card]
        if not len(cards) or len(imported) < len(cards):   # imported checkpoints have no curves to show
            s.missing.append("training")
        s.findings = [f"the run has {len(cards)} checkpoint{'s' * (len(cards) != 1)} "
                      f"({len(imported)} imported) and no training curves"]
        return s
    s.figs.append(figures.training_figure(train))
    clauses = []
    for model, g in train.groupby("model"):    # one finding per model
        metric = "loss" if (g["metric"] == "loss").any() else g["metric"].iloc[0]
        g = g[g["metric"] == metric]
        tr = g[g["split"] == "train"].sort_values("step")
        parts = []
        if len(tr):
            parts.append(f"the train {metric} of {model} went from {_f(tr['value'].iloc[0])} (step "
                         f"{int(tr['step'].iloc[0])}) to {_f(tr['value'].iloc[-1])} (step {int(tr['step'].iloc[-1])})")
        for split, h in g[g["split"] != "train"].groupby("split"):
            last = h.sort_values("step").iloc[-1]
            parts.append(f"the last {split} {metric} of {model} is {_f(last['value'])}")
        clauses.append("; ".join(parts))
    s.findings = [c for c in clauses if c]
    return s


def _probing_metric(run_dir: Path) -> str:
    """The edge probes' metric (the structural probes' own metrics have their section)."""
    structural = {m for pair in views.STRUCTURAL_METRICS.values() for m in pair}
    metrics = [m for m in views.probing_metrics(run_dir) if m not in structural]
    for m in ("accuracy", "micro_f1"):
        if m in metrics:
            return m
    return metrics[0] if metrics else "accuracy"


PROBING_COLUMNS = ["model", "task", "best_layer", "best", "best_low", "best_high", "lexical", "random_init",
                   "random_init_layer", "mix", "control", "selectivity", "expected_layer", "center_of_gravity"]


def probing_section(run_dir: Path) -> Section:
    s = Section("Per-layer probing")
    metric = _probing_metric(run_dir)
    summary = views.layer_summary(run_dir, metric)
    if summary is None or not len(summary):
        if views.structural_summary(run_dir) is None:
            s.missing.append("probing")
        else:
            s.findings = ["the probing table holds only structural probes (their section follows)"]
        return s
    scores, mix = views.layer_scores(run_dir, metric), views.mix_weights(run_dir)
    if scores is not None:
        s.figs.append(figures.layer_scores_figure(scores, metric))
    clauses = []
    for model, t in summary.groupby("model"):
        if mix is not None and (mix["model"] == model).any():
            s.figs.append(figures.pipeline_figure(mix[mix["model"] == model], t).update_layout(
                title=f"{model}: where each task is solved (expected layer, center of gravity)"))
        s.figs.append(figures.summary_figure(summary, model))
        clauses.append(_model_probing_clause(model, t, metric))
    for model, t in summary.groupby("model"):   # Tenney et al.'s pipeline question, a second finding
        if "expected_layer" in t and t["expected_layer"].notna().sum() > 1:
            e = t.dropna(subset=["expected_layer"]).sort_values("expected_layer")
            clauses.append(f"by expected layer (scalar-mix weights), {model} orders its tasks "
                           + " < ".join(f"{r.task} {_f(r.expected_layer, 2)}" for r in e.itertuples()))
    if "expected_layer" not in summary:
        s.missing.append("probing_summary")
    s.findings = [c for c in clauses if c]
    s.n_key = summary["model"].nunique()
    s.tables.append((f"Probing summary ({metric}; best = best single layer, chosen on held-out items; "
                     "lexical = layer 0; random_init = the same probe's best layer on the untrained architecture)",
                     summary[[c for c in PROBING_COLUMNS if c in summary]]))
    return s


def _model_probing_clause(model: str, t: pd.DataFrame, metric: str) -> str:
    """'in enc, pos peaks at layer 2 (accuracy 0.880 [0.842, 0.918]), ner at layer 3 (...); deps and
    coref have no single best layer (...)': tasks in the order of their best layer."""
    known = t[t["best_layer"].notna()].sort_values(["best_layer", "task"]) if "best_layer" in t else t.iloc[:0]
    open_ = t[t["best_layer"].isna()].sort_values("task") if "best_layer" in t else t
    parts = [_task_clause(r, metric) for r in known.itertuples()]
    text = f"in {model}, " + ", ".join(parts) if parts else f"in {model}"
    if len(open_):
        names = list(open_["task"])
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        verb = "has" if len(names) == 1 else "have"
        text += (f"{';' if parts else ','} {listed} {verb} no single best layer (the two halves of the test "
                 f"items choose differently)")
    return text


def _task_clause(r, metric: str) -> str:
    """'pos peaks at layer 3 (accuracy 0.900 [0.870, 0.930]; untrained 0.700)': the best layer chosen on
    held-out items, its score and interval, beside the untrained architecture's best layer when the run
    has one; the other columns (E_s, E_delta, selectivity) are in the table."""
    lo, hi = getattr(r, "best_low", np.nan), getattr(r, "best_high", np.nan)
    interval = f" [{_f(lo)}, {_f(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else ""
    floor = getattr(r, "random_init", np.nan)
    floor = f"; untrained {_f(floor)}" if isinstance(floor, float) and np.isfinite(floor) else ""
    score = f"{metric} {_f(r.best)}{interval}{floor}"
    if not np.isfinite(r.best_layer):
        return f"{r.task} has no single best layer ({score}; the halves of its test items disagree)"
    return f"{r.task} peaks at layer {int(r.best_layer)} ({score})"


def heads_section(run_dir: Path) -> Section:
    s = Section("Attention heads")
    classes, rel = views.table(run_dir, "heads_classes"), views.table(run_dir, "relations")
    s.missing += [n for n, t in (("heads_classes", classes), ("relations", rel)) if t is None]
    models = sorted(set(classes["model"] if classes is not None else []) | set(rel["model"] if rel is not None else []))
    clauses = []
    for model in models:                   # one finding per model: its roles, then its best relation
        parts = []
        grid = views.head_grid(run_dir, model, "role") if classes is not None else None
        if grid is not None:
            s.figs.append(figures.head_grid_figure(grid, title=f"{model}: primary role of each head"))
            parts.append(_roles_clause(model, grid))
        floors = views.head_floors(run_dir, model)
        if floors is not None:
            s.tables.append((f"{model}: each role score's best head beside the floors a head with no mechanism scores on "
                             "the same sentences (uniform, random argmax, random initialisation; n_pass: heads whose "
                             "95% interval lies above the floor)", floors))
        best = views.best_heads(run_dir, model) if rel is not None else None
        best = best.dropna(subset=["test_acc"]) if best is not None else None
        if best is not None and len(best):
            s.figs.append(figures.relations_figure(best))
            parts.append(_relations_clause(model, best))
            cols = [c for c in ("model", "relation", "direction", "best_layer", "best_head", "dev_acc", "test_acc",
                                "ci_low", "ci_high", "baseline_offset", "baseline_acc", "n_test") if c in best]
            s.tables.append((f"{model}: best head per relation (picked on dev, scored on test, 95% CI)", best[cols]))
        clauses.append("; ".join(parts))
    cross = views.cross_heads_best(run_dir)
    if cross is not None:
        clauses += [_cross_clause(model, g) for model, g in cross.groupby("model", sort=True)]
        s.tables.append(("Cross-attention heads of the encoder-decoders: the best head per score (where each target "
                         "position looks in the source, on the model's own noising of EWT test sentences; 95% CI over "
                         "sentences; mean over the model's heads)", cross))
    s.findings = [c for c in clauses if c]
    s.n_key = len(s.findings)
    return s


def _cross_clause(model: str, g: pd.DataFrame) -> str:
    """"t5's best cross-attention head (layer 1, head 2) sends 0.31 [0.25, 0.37] of the target tokens
    to their source position (mean over heads 0.12)"."""
    r = g.set_index("score")
    if "align_acc" not in r.index:
        return ""
    b = r.loc["align_acc"]  # T5: its aligned target tokens are its sentinels (sentinel_acc = align_acc)
    what = "of the sentinels to their sentinel in the input" if "sentinel_acc" in r.index else \
        "of the surviving target tokens to their copy in the input"
    ci = f" [{_f(b['ci_low'])}, {_f(b['ci_high'])}]" if np.isfinite(b["ci_low"]) else ""
    return (f"{model}'s best cross-attention head (layer {int(b['layer'])}, head {int(b['head'])}) attends most "
            f"{_f(b['value'])}{ci} {what} (mean over its heads {_f(b['mean'])})")


def _roles_clause(model: str, grid) -> str:
    labels = [str(x) for x in grid.labels.ravel() if str(x)]
    fam = pd.Series([x.split(":")[0] for x in labels if x != "none"], dtype=object)
    if not len(fam):
        return f"in {model}, none of the {len(labels)} heads has a role"
    counts = fam.value_counts()
    return (f"in {model}, {len(fam)} of {len(labels)} heads have a role, most often "
            f"{counts.index[0]} ({int(counts.iloc[0])} heads)")


def _relations_clause(model: str, best: pd.DataFrame) -> str:
    gain = best["test_acc"] - best["baseline_acc"]
    top = best.loc[gain.idxmax()]
    rel = f"{top['relation']} ({top['direction']})" if "direction" in best else str(top["relation"])
    return (f"its best head beats the fixed-offset baseline on {int((gain > 0).sum())} of {len(best)} relations, "
            f"most clearly for {rel}: layer {int(top['best_layer'])} head {int(top['best_head'])} scores "
            f"{_f(top['test_acc'])} [{_f(top['ci_low'])}, {_f(top['ci_high'])}] on test against "
            f"{_f(top['baseline_acc'])} for offset {int(top['baseline_offset'])}")


def prunable_table(run_dir: Path, pruning: pd.DataFrame) -> pd.DataFrame:
    """model, method, metric, tolerance, max_fraction, n_prunable: the stored `prunable` table, or
    the same computed from the curves (probes.pruning.heads_to_prune_for_loss, Michel et al. 2019)."""
    stored = views.table(run_dir, "prunable")
    if stored is not None:
        return stored

    imp = views.table(run_dir, "importance")
    out = []
    for (model, metric), curve in pruning[pruning["method"] != "l0_sweep"].groupby(["model", "metric"]):
        n = None
        if imp is not None and (imp["model"] == model).any():
            n = int(imp[imp["model"] == model][["layer", "head"]].drop_duplicates().shape[0])
        for tol in TOLERANCES:
            out.append(heads_to_prune_for_loss(curve, tol, n_heads=n, higher_is_better=_higher_is_better(metric)))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def pruning_section(run_dir: Path) -> Section:
    s = Section("Head importance and pruning")
    pruning = views.table(run_dir, "pruning")
    speed = views.table(run_dir, "pruned_speed")
    if pruning is None:
        s.missing.append("pruning")
    else:
        metric = str(pruning["metric"].iloc[0])
        s.figs.append(figures.pruning_curves_figure(views.pruning_curves(run_dir, metric)))
        prunable = prunable_table(run_dir, pruning[pruning["metric"] == metric])
        if len(prunable):
            s.tables.append((f"Share of heads that can go while {metric} stays within the tolerance",
                             _prunable_wide(prunable)))
    if speed is None:
        s.missing.append("pruned_speed")
    else:
        for model, g in speed.groupby("model"):
            s.figs.append(figures.speed_figure(g).update_layout(title=f"{model}: pruned model size and speed"))
        s.tables.append(("Pruned models: size and speed", speed))
    models = sorted(set(pruning["model"] if pruning is not None else []) | set(speed["model"] if speed is not None else []))
    s.findings = [c for m in models for c in (
        _prunable_clause(m, prunable) if pruning is not None and len(prunable) else "",
        _speed_clause(m, speed) if speed is not None else "") if c]
    return s


def _prunable_wide(prunable: pd.DataFrame) -> pd.DataFrame:
    p = prunable.assign(cell=[_pct(f) + (f" ({int(n)} heads)" if "n_prunable" in prunable and pd.notna(n) else "")
                              for f, n in zip(prunable["max_fraction"], prunable.get("n_prunable", prunable["max_fraction"]))],
                        tol=[f"within {_pct(t)}" for t in prunable["tolerance"]])
    return p.pivot_table(index=["model", "method", "metric"], columns="tol", values="cell", aggfunc="first").reset_index()


def _prunable_clause(model: str, prunable: pd.DataFrame) -> str:
    p = prunable[prunable["model"] == model]
    if not len(p):
        return ""
    tols = sorted(p["tolerance"].unique())
    frac = p.pivot_table(index="method", columns="tolerance", values="max_fraction")
    learned = frac.drop(index="random", errors="ignore")
    if not len(learned):
        return ""
    best = learned.sort_values(tols[::-1], ascending=False).index[0]

    def share(method: str) -> str:
        return " and ".join(f"{_pct(frac.loc[method, t])} within {_pct(t)}" for t in tols)
    clause = f"pruning {model}'s heads in {best} order removes {share(best)} of the unpruned {p['metric'].iloc[0]}"
    return clause + (f", against {share('random')} in random order" if "random" in frac.index else "")


def _speed_clause(model: str, speed: pd.DataFrame) -> str:
    g = speed[speed["model"] == model].reset_index(drop=True)
    if len(g) < 2:
        return ""
    full = g[g["variant"] == "full"].iloc[0] if (g["variant"] == "full").any() else g.iloc[0]
    small = g[g["variant"] != full["variant"]].iloc[-1]
    return (f"the {small['variant']} model of {model} has {_f(small['params'] / full['params'], 2)}x the parameters "
            f"and {_f(small['bytes'] / full['bytes'], 2)}x the bytes, and runs at "
            f"{_f(small['tokens_per_s'] / full['tokens_per_s'], 2)}x the tokens per second")


def compare_section(run_dir: Path) -> Section:
    s = Section("Frozen vs finetuned")
    clauses = [_fvf(run_dir, s), *_cka(run_dir, s), _head_change(run_dir, s)]
    s.findings = [c for c in clauses if c]
    return s


def _fvf(run_dir: Path, s: Section) -> str:
    df = views.frozen_vs_finetuned(run_dir)
    if df is None:
        s.missing.append("frozen_vs_finetuned")
        return ""
    df = df[~df["setting"].astype(str).str.startswith("diff:")].dropna(subset=["value"])
    s.figs.append(figures.fvf_figure(df))
    s.tables.append(("Frozen vs finetuned (mean over seeds)",
                     df.pivot_table(index=["model", "task", "metric"], columns="setting", values="value").reset_index()))
    ft, fr = df[df["setting"].isin(FINETUNED)], df[~df["setting"].isin(FINETUNED)]
    if not len(ft) or not len(fr):
        return ""
    keys = ["model", "task", "metric"]
    best_fr = fr.loc[fr.groupby(keys)["value"].idxmax(), keys + ["setting", "value"]]
    both = ft[keys + ["value"]].merge(best_fr, on=keys, suffixes=("_ft", "_fr"))
    both["gain"] = both["value_ft"] - both["value_fr"]
    top = both.loc[both["gain"].abs().idxmax()]
    return (f"finetuning beats the best frozen setting on {int((both['gain'] > 0).sum())} of {len(both)} tasks, "
            f"with the largest gap on {top['task']} ({top['model']}, {top['metric']} {_f(top['value_ft'])} "
            f"finetuned vs {_f(top['value_fr'])} for {top['setting']})")


def _cka(run_dir: Path, s: Section) -> list[str]:
    pairs = views.cka_pairs(run_dir)
    if not pairs:
        s.missing.append("cka")
        return []
    clauses, diag = [], {}
    for a, b, kind in pairs:
        m = views.cka_matrix(run_dir, a, b, kind)
        s.figs += [figures.cka_heatmap(m, a, b, kind), figures.cka_diagonal_figure(m, a, b)]
        d = np.diag(m[: min(m.shape), : min(m.shape)])
        diag[f"{kind} CKA {a} vs {b}"] = d
        if np.isnan(d).all():
            continue
        lo, hi = int(np.nanargmin(d)), int(np.nanargmax(d))
        clauses.append(f"{kind} CKA between {a} and {b} is lowest at layer {lo} ({_f(d[lo])}) and highest at "
                       f"layer {hi} ({_f(d[hi])})")
    n = max(len(v) for v in diag.values())
    table = pd.DataFrame({"layer": range(n), **{k: np.pad(v, (0, n - len(v)), constant_values=np.nan)
                                                 for k, v in diag.items()}})
    s.tables.append(("Per-layer CKA (same layer in both models; 0 = embeddings)", table))
    return clauses


def _head_change(run_dir: Path, s: Section) -> str:
    df = views.table(run_dir, "head_change")
    if df is None:
        s.missing.append("head_change")
        return ""
    metrics = list(df["metric"].unique())
    metric = next((m for m in ("js", "js_divergence") if m in metrics), metrics[0])
    clauses = []
    for (a, b), g in df[df["metric"] == metric].dropna(subset=["value"]).groupby(["model_a", "model_b"]):
        grid = views.head_change_grid(run_dir, a, b, metric)
        s.figs.append(figures.head_grid_figure(grid, title=f"Head change {a} -> {b} ({metric})", colorscale="Reds"))
        top = g.loc[g["value"].idxmax()]
        per_layer = g.groupby("layer")["value"].mean()
        clauses.append(f"from {a} to {b} the attention of layer {int(top['layer'])} head {int(top['head'])} changed most "
                       f"({metric} {_f(top['value'])}; layer means {_f(per_layer.min())} to {_f(per_layer.max())})")
    return "; ".join(clauses)


def emergence_section(run_dir: Path) -> Section:
    """Scores against tokens seen over one pretraining run's log-spaced checkpoints."""
    s = Section("How structure emerges during pretraining")
    df = views.table(run_dir, "emergence")
    if df is None:
        s.missing.append("emergence")
        return s
    s.figs.append(figures.emergence_figure(df))
    for model in sorted(df.loc[df["task_or_score"].str.startswith("pairs:"), "model"].unique()):
        s.figs.append(figures.probe_behaviour_figure(df, model))   # does behaviour lag the probes?
    last = df[df["step"] == df.groupby("model")["step"].transform("max")]
    s.tables.append(("Scores at the last checkpoint analysed", last))
    first, final = df["tokens"].min(), df["tokens"].max()
    s.findings = [f"{df['step'].nunique()} checkpoints from {_f(first, 0)} to {_f(final, 0)} tokens; "
                  f"the table gives each score at the last one, the figure how it got there"]
    return s


# ------------------------------------------------------------------------------ causal probes
# Hewitt and Manning 2019's best BERT-large layers on the Penn Treebank (docs/probing.md, structural probes).
PAPER_STRUCTURAL = {"uuas": 0.8, "root_acc": 0.9}
PASSPORT_ROWS = 12   # heads per model in the report's passport table (the app shows them all)


def structural_section(run_dir: Path) -> Section:
    """Structural probes (Hewitt and Manning 2019): per model, the layer where the tree is most
    recoverable, UUAS for the distance probe and root accuracy for the depth probe (with the Spearman
    correlations beside them), against the paper's BERT-large figures."""
    s = Section("Structural probes", n_key=1)
    df = views.structural_summary(run_dir)
    if df is None and views.table(run_dir, "probing") is None:
        s.missing.append("structural")
        return s
    if df is None:   # the probing section already stands for `workbench probe`: say what to add, not the command
        s.findings, s.n_key = [f"the probing table has no structural-probe rows (add the tasks "
                               f"{' and '.join(views.STRUCTURAL_METRICS)} to the probe run)"], 0
        return s
    s.figs.append(figures.structural_figure(df, views.STRUCTURAL_METRICS))
    s.findings = [_structural_clause(model, g) for model, g in df.groupby("model")]
    s.findings.append("Hewitt and Manning's probes on BERT-large reach about " + " and ".join(
        f"{m} {_f(v, 1)}" for m, v in PAPER_STRUCTURAL.items()) + " at its best layers (Penn Treebank)")
    wide = df.assign(layer=[f"L{l}" for l in df["layer"]]).pivot_table(
        index=["model", "task", "metric"], columns="layer", values="value", sort=False)
    wide = wide[sorted(wide.columns, key=lambda c: int(c[1:]))].rename_axis(columns=None).reset_index()
    floors = views.structural_floors(run_dir)
    if floors is not None:
        for metric in [m for pair in views.STRUCTURAL_METRICS.values() for m in pair][::2]:   # UUAS, root acc
            if (floors["metric"] == metric).any():
                s.figs.append(figures.structural_floors_figure(floors, metric))
        clauses = _structural_floor_clauses(floors)   # each score beside its floors first
        s.findings, s.n_key = clauses + s.findings, max(1, min(3, len(clauses)))
        s.tables.append(("Best layer beside the four floors (random_tree: a uniform spanning tree; chain: the "
                         "adjacent words; position: the probe on word positions alone; random_init: the same "
                         "architecture untrained, its best layer; 95% intervals; above: the model's interval lies "
                         "above the floor's)", _floors_wide(floors)))
    else:
        s.findings.insert(len(s.findings) - 1, "the probing table has no structural floors (tables written before "
                                               "them): the scores below stand without a floor")
    s.tables.append(("Structural probes per layer (mean over seeds)", wide))
    return s


def _floors_wide(floors: pd.DataFrame) -> pd.DataFrame:
    """model, task, metric, then per source "value [low, high]" and the floors the model is above."""
    rows = []
    for (model, task, metric), g in floors.groupby(["model", "task", "metric"], sort=False):
        row = {"model": model, "task": task, "metric": metric}
        for r in g.itertuples():
            name = "model (layer)" if r.source == "model" else r.source
            layer = f" L{r.layer}" if r.source in ("model", "random_init") else ""
            row[name] = _ci(r.value, r.ci_low, r.ci_high) + layer
        row["above"] = ", ".join(g.loc[g["above"] == 1, "source"]) or "none"
        rows.append(row)
    out = pd.DataFrame(rows)
    order = ["model", "task", "metric", "model (layer)", *views.STRUCTURAL_FLOORS, "above"]
    return out[[c for c in order if c in out.columns]]


def _structural_floor_clauses(floors: pd.DataFrame) -> list[str]:
    """Per model and headline metric: the best layer's score, the floors its interval is above, and the
    highest floor with its margin."""
    out = []
    headline = {pair[0] for pair in views.STRUCTURAL_METRICS.values()}
    for model, g in floors[floors["metric"].isin(headline)].groupby("model"):
        parts = []
        for (task, metric), h in g.groupby(["task", "metric"]):
            top = h[h["source"] == "model"].iloc[0]
            fl = h[h["source"] != "model"]
            if not len(fl):
                continue
            high = fl.loc[fl["value"].idxmax()]
            above = list(fl.loc[fl["above"] == 1, "source"])
            verdict = ("above all {} floors".format(len(fl)) if len(above) == len(fl) else
                       f"above {', '.join(above)} only" if above else "above none of its floors")
            parts.append(f"{metric} {_ci(top['value'], top['ci_low'], top['ci_high'])} at layer {int(top['layer'])} is "
                         f"{verdict} (highest floor {high['source']} {_ci(high['value'], high['ci_low'], high['ci_high'])},"
                         f" margin {_f(top['value'] - high['value'])})")
        if parts:
            out.append(f"{model}'s " + "; ".join(parts))
    return out


def _structural_clause(model: str, g: pd.DataFrame) -> str:
    """'in enc, structural_distance peaks at layer 3 (uuas 0.611, dspr 0.741), structural_depth at ...'."""
    parts = []
    for task, (main, rho) in views.STRUCTURAL_METRICS.items():
        t = g[g["task"] == task]
        head = t[t["metric"] == main]
        if not len(head):
            continue
        best = head.loc[head["value"].idxmax()]
        spread = f" [{_f(best['min'])}, {_f(best['max'])}]" if best["n_seeds"] > 1 else ""
        other = t[(t["metric"] == rho) & (t["layer"] == best["layer"])]["value"]
        also = f", {rho} {_f(other.iloc[0])}" if len(other) else ""
        parts.append(f"{task}{' peaks' if not parts else ''} at layer {int(best['layer'])} "
                     f"({main} {_f(best['value'])}{spread}{also})")
    return f"in {model}, " + ", ".join(parts)


def amnesic_section(run_dir: Path) -> Section:
    """Amnesic probing (Elazar et al. 2021): per model and property, the layer where erasing the
    property costs the LM most beyond random directions that move the vectors as far (the matched
    control), and what a probe still finds in the erased vectors."""
    s = Section("Amnesic probing", n_key=1)
    df = views.amnesic_summary(run_dir)
    if df is None:
        s.missing.append("amnesic")
        return s
    s.figs.append(figures.amnesic_figure(df))
    s.findings = [_amnesic_clause(model, task, eraser, g)
                  for (model, task, eraser), g in df.groupby(["model", "task", "eraser"])]
    s.tables.append(("Amnesic probing (gap = lm_loss_delta minus that of the matched control: random directions "
                     "moved as far, mean over draws; displacement = mean ||x - x'||)", df))
    return s


def _amnesic_clause(model: str, task: str, eraser: str, g: pd.DataFrame) -> str:
    # the matched control (random directions moved as far); a table written before it has only the
    # same-rank one, which moves the vectors less: the clause then says so
    ctl, what = (("matched", "random directions moved as far") if "probe_acc_matched" in g else
                 ("same_rank", "as many random directions (same rank, not moved as far: this run has no matched "
                  "control)"))
    def moved(top: pd.Series) -> str:  # tables written before the displacement rows have none
        if f"displacement_{ctl}" not in top or "displacement" not in top:
            return ""
        return f"; displacement {_f(top['displacement'])} and {_f(top[f'displacement_{ctl}'])}"

    if g["lm_loss_delta"].isna().all():  # no LM rows (an untrained LM head): the downstream probe instead
        drop = g[f"last_layer_acc_{ctl}"] - g["last_layer_acc"]
        top = g.loc[drop.idxmax()]
        return (f"erasing {task} from {model} ({eraser}; no LM loss: its LM head is untrained) costs the intact "
                f"model's last-layer {task} probe most at layer {int(top['layer'])}: it reads "
                f"{_f(top['last_layer_acc'])} against {_f(top[f'last_layer_acc_{ctl}'])} after {what}"
                f"{moved(top)}; a probe on the erased vectors scores {_f(top['probe_acc'])} (intact {_f(top['probe_acc_intact'])})")
    gap = g["lm_loss_delta"] - g[f"lm_loss_delta_{ctl}"]
    top = g.loc[gap.idxmax()]
    return (f"erasing {task} from {model} ({eraser}) raises the LM loss most beyond {what} "
            f"at layer {int(top['layer'])}: by {_f(top['lm_loss_delta'])} against {_f(top[f'lm_loss_delta_{ctl}'])} "
            f"(gap {_f(gap[top.name])}; positive at {int((gap > 0).sum())} of {len(g)} layers{moved(top)}); "
            f"there a probe on the erased vectors "
            f"scores {_f(top['probe_acc'])}, against {_f(top['probe_acc_intact'])} intact and "
            f"{_f(top[f'probe_acc_{ctl}'])} after the {ctl.replace('_', '-')} random erasure")


def gating_section(run_dir: Path) -> Section:
    """Head gating: per model, the role or family whose heads cost the LM most beyond as many random
    heads, each property's largest probe-accuracy drop, and the single head that matters most."""
    s = Section("Head gating", n_key=1)
    summary, passport = views.gating_summary(run_dir), views.head_passport(run_dir)
    s.missing += [n for n, t in (("gating", views.table(run_dir, "gating")), ("head_passport", passport)) if t is None]
    models = sorted(set(summary["model"] if summary is not None else [])
                    | set(passport["model"] if passport is not None else []))
    clauses = []
    for model in models:
        parts = []
        mine = summary[summary["model"] == model] if summary is not None else None
        if mine is not None and len(mine):
            s.figs.append(figures.gating_figure(summary, model))
            parts += _gating_clauses(model, mine)
        grid = views.passport_grid(passport, model) if passport is not None else None
        if grid is not None:
            s.figs.append(figures.passport_figure(grid))
            parts.append(_passport_clause(model, passport[passport["model"] == model]))
        clauses += parts
    if summary is None and views.table(run_dir, "gating") is not None:
        clauses.append("no role or family was gated (there was no heads_classes table when `workbench gate` ran)")
    s.findings = [c for c in clauses if c]
    if summary is not None:
        s.tables.append(("Roles and families gated, beside random heads of the same number (max_acc_drop: the "
                         "largest fall of a probe's accuracy over the layers above the gated heads)", summary))
    if passport is not None:
        top = passport.sort_values("lm_loss_delta", ascending=False).groupby("model").head(PASSPORT_ROWS)
        s.tables.append((f"Head passport: the {PASSPORT_ROWS} heads per model whose gating costs the LM most", top))
    return s


def _gating_clauses(model: str, g: pd.DataFrame) -> list[str]:
    lm = g[g["metric"] == "lm_loss_delta"]
    out = []
    if len(lm):
        top = lm.loc[lm["gap"].fillna(lm["value"]).idxmax()]
        rand = (f", against {_f(top['random_mean'])} [{_f(top['random_min'])}, {_f(top['random_max'])}] for "
                f"{int(top['n_random'])} random sets of as many heads" if top["n_random"] > 0 else
                " (no random sets of that size to compare with)")
        verb = "raises" if top["value"] > 0 else "changes"
        n = int(top["n_gated"])
        what = f"the {n} heads of {top['unit']} {top['name']}" if n > 1 else f"the one head of {top['unit']} {top['name']}"
        out.append(f"gating {what} {verb} {model}'s LM loss "
                   f"by {_f(top['value'])}{rand}")
    drops = g[g["metric"] == "max_acc_drop"]
    for task, d in drops.groupby("task"):
        top = d.loc[d["value"].idxmax()]
        if top["value"] <= 0:
            out.append(f"no role or family of {model} lowers the {task} probe's accuracy when gated")
            continue
        out.append(f"the {task} probe of {model} loses at most {_f(top['value'])} accuracy (layer {int(top['layer'])}) "
                   f"when {top['unit']} {top['name']} is gated, against {_f(top['random_mean'])} for random heads")
    return out


def _passport_clause(model: str, p: pd.DataFrame) -> str:
    top = p.loc[p["lm_loss_delta"].idxmax()]
    role = f", role {top['role']}" if "role" in p and isinstance(top["role"], str) else ""
    return (f"of {model}'s {len(p)} heads, gating layer {int(top['layer'])} head {int(top['head'])} alone costs the "
            f"LM most ({_f(top['lm_loss_delta'])}{role})")


# --------------------------------------------------------------------------------- objectives
MAX_CKA_FIGURES = 6   # pairs of systems drawn in the report (the app's picker shows every pair)
STATISTIC_NAMES = {"best_layer_score": "best-layer score", "e_delta": "E_delta", "prunable_share": "prunable share",
                   "finetuning_gain": "finetuning gain", "pairs_accuracy": "minimal-pair accuracy",
                   "flow_lens_kl_tuned_mean": "the tuned lens' mean KL to the final distribution",
                   "interventions_attn_share": "attention's share of the agreement NIE",
                   "interventions_top_layer_share": "last layer's share of the agreement NIE"}


def _statistic_name(statistic: str) -> str:
    if statistic.startswith("heads_"):
        return f"share of {statistic[len('heads_'):]} heads"
    return STATISTIC_NAMES.get(statistic, statistic)


def _ci(v, lo, hi, d: int = 3) -> str:
    """'0.154 [0.082, 0.226]' (the value alone when the interval is not finite)."""
    finite = np.isfinite(float(lo)) and np.isfinite(float(hi))
    return f"{_f(v, d)} [{_f(lo, d)}, {_f(hi, d)}]" if finite else _f(v, d)


def _cis(df: pd.DataFrame, value: str = "value", low: str = "ci_low", high: str = "ci_high", d: int = 3) -> list[str]:
    """`_ci` of each row of df's `value`, `low` and `high` columns."""
    return [_ci(v, lo, hi, d) for v, lo, hi in zip(df[value], df[low], df[high])]


def objectives_section(run_dir: Path) -> Section:
    """The zoo (workbench/analyses/zoo.py): systems that differ only in their pretraining objective, each
    with pretraining seeds. Per task, the best-layer score of every system with its multi-bootstrap
    interval (Sellam et al. 2022); each comparison as its `claim` says (an interval that excludes 0),
    with the seed pairs that disagree; head roles, the flow suite's curves and statistics per system, CKA
    against the seed-to-seed yardstick, the budget."""
    s = Section("Objectives")
    summary = views.zoo_summary_table(run_dir)
    if summary is None:
        s.missing += ["zoo_stats"] + (["zoo_training"] if views.zoo_training_table(run_dir) is None else [])
        return s
    comps, roles = views.zoo_comparisons_table(run_dir), views.zoo_role_composition(run_dir)
    clauses = [_objectives_task_clause(task, t) for task, t in summary.groupby("task", sort=False)]
    # a system against its floors: in the task clauses (probing) and the pairs table, not among the claims
    clauses += _objectives_claims(comps[~comps["system_b"].str.startswith("floor:")]) if comps is not None else []
    cka_clause, cka_table = _objectives_cka(run_dir, s)
    clauses.append(cka_clause)
    for task in views.zoo_tasks(run_dir):
        s.figs.append(zoo_figures.zoo_layer_figure(views.zoo_layer_scores(run_dir, task), task,
                                                   metric=views.zoo_metric_name(task)))
    if roles is not None:
        s.figs.append(zoo_figures.zoo_roles_figure(roles))
    flow = views.table(run_dir, "zoo_stats")
    flow = None if flow is None else flow[flow["task"] == "flow"]
    if flow is not None and (flow["layer"] >= 0).any():
        s.figs.append(figures.zoo_flow_figure(flow))
    s.findings = [c for c in clauses if c]
    s.n_key = min(2, len(s.findings))
    table = summary.assign(
        best=_cis(summary, "best", "best_low", "best_high"),
        e_delta=_cis(summary, "e_delta", "e_delta_low", "e_delta_high", 2))
    bounds = ["best_low", "best_high", "e_delta_low", "e_delta_high"]
    if "random_init" in table:
        table = table.assign(random_init=_cis(summary, "random_init", "random_init_low", "random_init_high"),
                             vs_random_init=_cis(summary, "vs_random_init", "vs_random_init_low",
                                                 "vs_random_init_high"))
        bounds += ["random_init_low", "random_init_high", "vs_random_init_low", "vs_random_init_high"]
    if "mdl_layer" in table:
        table["mdl_layer"] = [str(int(x)) if np.isfinite(x) else "" for x in table["mdl_layer"]]
    caption = ("Per task and system: best-layer score (best: micro F1; UUAS and root accuracy for the structural "
               "probes; the layer chosen on held-out items; multi-bootstrap 95% interval over pretraining seeds x "
               "test items) and E_delta (center of gravity of the cumulative probes, in layers)")
    if "random_init" in table:
        caption += ("; random_init: the same probe's best-layer score on the untrained architecture (its layer chosen "
                    "the same way), vs_random_init: best minus it on the same items, above_random_init: the "
                    "comparison's claim after Holm in the floor family")
    if "e_s" in table:
        caption += ("; E_s (expected layer of the scalar mix) compares layers within a system only: it misleads "
                    "across models whose layer norms differ (Fayyaz et al. 2021)")
    s.tables.append((caption, table.drop(columns=bounds)))
    if comps is not None:
        shown = comps.assign(delta=_cis(comps, "delta"))
        s.tables.append(("Comparisons (delta = A - B with its interval; finding: the claim where both systems have "
                         "3 seeds or more, the interval excludes 0 and Holm's adjusted p_holm <= 0.05 in its family "
                         "(primary: each task's declared statistic between two systems; floor: a system against its "
                         "floors, system_b floor:<name>; secondary: the rest), unadjusted: the interval's "
                         "claim alone; seeds: the smaller system's seeds, 'few' below 5; contrast: what the two "
                         "systems differ in; compute: 6 N D FLOPs per checkpoint; disagree: seed pairs ordering the "
                         "two systems the other way)",
                         shown[["statistic", "task", "system_a", "system_b", "delta", "finding", "unadjusted",
                                "p_holm", "family", "seeds", "contrast", "compute", "disagree", "interval"]]))
    pairs = views.zoo_pairs_table(run_dir)
    if pairs is not None:
        s.tables.append(("Minimal pairs per phenomenon and system (accuracy by the system's own scorer; 95% "
                         "multi-bootstrap interval over pretraining seeds x items; chance, frequency, bigram, random_init: "
                         "each floor's accuracy on the same items and seeds, the random-init model by the system's own "
                         "scorer; each system against each floor: the comparisons above, system_b floor:<name>)",
                         pairs.assign(value=_cis(pairs))
                         .drop(columns=["ci_low", "ci_high", "item_ci_low", "item_ci_high"])))
    if flow is not None and (flow["layer"] < 0).any():
        f = flow[flow["layer"] < 0]
        s.tables.append(("The flow suite per system (docs/flow.md; seeds-only 95% interval; floors: *_random_init, "
                         "*_random; the tuned lens' flow_lens_kl_tuned_mean is its declared primary statistic)",
                         f.assign(value=_cis(f))
                         [["statistic", "system", "value", "n_seeds"]]))
    mediated = views.zoo_interventions_table(run_dir)
    if mediated is not None:
        s.tables.append(("Where agreement is mediated (docs/interventions.md): attention's share and the last layer's "
                         "share of the swap-number NIE of the sub-layer outputs at the reading position, per system "
                         "(seeds-only 95% interval) beside the random-init model's; the comparisons above, "
                         "system_b floor:random_init against the floor",
                         mediated.assign(
                             value=_cis(mediated), floor=_cis(mediated, "floor", "floor_low", "floor_high"))
                         .drop(columns=["ci_low", "ci_high", "floor_low", "floor_high"])))
    fvf = views.zoo_fvf_table(run_dir)
    if fvf is not None:
        s.tables.append(("Finetuning gain (finetuned minus frozen scalar mix), seeds-only interval", fvf))
    if roles is not None:
        s.tables.append(("Share of heads per primary role (mean over seeds, seeds-only interval)", roles))
    training = views.zoo_training_table(run_dir)
    if cka_table is not None:
        s.tables.append(("Linear CKA of the embeddings (first) and of the last layers (last) between two systems, "
                         "seed-averaged, beside the same between each system's own seeds (_a, _b)", cka_table))
    if training is None:
        s.missing.append("zoo_training")
    else:
        s.tables.append(("What each checkpoint got from the same budget (flops_6nd = 6 N D, Kaplan et al. 2020)",
                         training.assign(flops_6nd=[f"{x:.3g}" for x in training["flops_6nd"]])))
    imported = views.table(run_dir, "zoo_checkpoints")
    if imported is not None:
        s.tables.append(("Imported checkpoints: the folder each was read from, the sha256 of its config.json and of "
                         "its weight files, and the seed and step its folder pattern claims (compare the hashes with "
                         "the suite's published ones)",
                         imported[["system", "seed", "step", "tokens", "source", "config_sha256", "weights_sha256",
                                   "claimed_seed", "claimed_step"]]))
    return s


def _objectives_task_clause(task: str, t: pd.DataFrame) -> str:
    """'on pos, the best-layer micro F1 is bert 0.154 [0.082, 0.226], elmo ... (95% multi-bootstrap
    intervals over 3 pretraining seeds x 146 test items); minus the untrained architecture's on the same
    items bert 0.110 [0.080, 0.140] (above), elmo ... (1 of 2 systems above it after Holm); E_delta elmo
    0.50 [-1.00, 1.96], ...' (the floor part where the run has the untrained architecture's items)."""
    scores = ", ".join(f"{r.system} {_ci(r.best, r.best_low, r.best_high)}" for r in t.itertuples())
    seeds, items = int(t["n_seeds"].max()), int(t["n_items"].max())
    unit = "test sentences" if task in views.ZOO_METRIC_NAMES else "test items"
    text = (f"on {task}, the best-layer {views.zoo_metric_name(task)} is {scores} (95% multi-bootstrap intervals "
            f"over {seeds} pretraining seeds x {items} {unit})")
    if "vs_random_init" in t and t["vs_random_init"].notna().any():
        f = t.dropna(subset=["vs_random_init"])
        text += ("; minus the untrained architecture's on the same items " + ", ".join(
            f"{r.system} {_ci(r.vs_random_init, r.vs_random_init_low, r.vs_random_init_high)}"
            + ("" if r.above_random_init == "no claim" else f" ({r.above_random_init})") for r in f.itertuples())
            + f" ({_floor_count(f['above_random_init'])})")
    e = t.dropna(subset=["e_delta"])
    if len(e):
        text += "; E_delta " + ", ".join(f"{r.system} {_ci(r.e_delta, r.e_delta_low, r.e_delta_high, 2)}"
                                         for r in e.itertuples())
        if len(e) < len(t):
            text += (f" ({', '.join(sorted(set(t['system']) - set(e['system'])))}: undefined, the cumulative probes "
                     "of a seed gain nothing beyond layer 0)")
    return text


def _floor_count(claims: pd.Series) -> str:
    """'2 of 7 systems above it after Holm' (+ ', 1 below')."""
    above, below = int((claims == "above").sum()), int((claims == "below").sum())
    return f"{above} of {len(claims)} systems above it after Holm" + (f", {below} below" if below else "")


def _verb(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _objectives_claims(comps: pd.DataFrame) -> list[str]:
    """One clause per claimed comparison, the winner first with the winner-minus-loser interval (and the
    seed pairs that disagree); the comparisons without a claim in one clause; all of them plainly when
    none is claimed."""
    out = []
    for r in comps[comps["claim"] != "no claim"].itertuples():
        sign = 1 if r.claim == "A > B" else -1
        win, lose = (r.system_a, r.system_b) if sign > 0 else (r.system_b, r.system_a)
        lo, hi = sorted((sign * r.ci_low, sign * r.ci_high))
        where = f"on {r.task}, " if r.task else ""
        notes = [x for x in (r.disagree, f"{r.n_seeds} seeds, few" if r.seeds.endswith("few") else "",
                             r.contrast, r.compute if r.budget_differs else "") if x]
        out.append(f"{where}{win} > {lose} in {_statistic_name(r.statistic)}: {win} minus {lose} "
                   f"{_ci(sign * r.delta, lo, hi)} ({r.interval} interval, Holm p {r.p_holm:.3g}, {r.family})"
                   + (f" ({'; '.join(notes)})" if notes else ""))
    none = comps[comps["claim"] == "no claim"]
    if not len(none):
        return out
    few = int((none["n_seeds"] < MIN_SEEDS).sum())
    covers = int(((none["n_seeds"] >= MIN_SEEDS) & (none["claim_unadjusted"] == "no claim")).sum())
    holm_only = len(none) - few - covers
    reasons = ((few, f"{_verb(few, 'has', 'have')} fewer than {MIN_SEEDS} seeds a system"),
               (covers, f"{_verb(covers, 'has', 'have')} an interval that includes 0"),
               (holm_only, f"{_verb(holm_only, 'does', 'do')} not survive Holm's correction"))
    why = "; ".join(f"{n} {text}" for n, text in reasons if n)
    if len(none) == len(comps):
        out.insert(0, f"no comparison between systems is claimed: of the {len(comps)} differences, {why}")
    else:
        flipped = int((none["flips"] > 0).sum())
        out.append(f"{len(none)} of {len(comps)} comparisons make no claim ({why})"
                   + (f"; in {flipped} of them some seed pairs order the systems the other way" if flipped else ""))
    return out


def _objectives_cka(run_dir: Path, s: Section) -> tuple[str, pd.DataFrame | None]:
    """CKA figures (seed-averaged pair beside each system's seeds), a clause on the last layers, the table."""
    table = views.zoo_cka_table(run_dir)
    if table is None:
        s.missing.append("zoo_cka")
        return "", None
    own = {x: views.zoo_cka_matrix(run_dir, x, x) for x in set(table["system_a"]) | set(table["system_b"])}
    for r in table.head(MAX_CKA_FIGURES).itertuples():
        s.figs.append(zoo_figures.zoo_cka_figure(views.zoo_cka_matrix(run_dir, r.system_a, r.system_b), r.system_a,
                                                 r.system_b, own[r.system_a], own[r.system_b]))
    parts = []
    for r in table.itertuples():
        yard = [f"{_f(v)} between {x}'s seeds" for v, x in ((r.last_a, r.system_a), (r.last_b, r.system_b))
                if np.isfinite(v)]
        against = f" (against {' and '.join(yard)})" if yard else ""
        parts.append(f"{r.system_a} and {r.system_b} {_f(r.last)}{against}")
    return "the last layers' linear CKA is " + "; ".join(parts), table


# ----------------------------------------------------------------------------------- behaviour
def pairs_section(run_dir: Path) -> Section:
    """Minimal pairs (docs/behaviour.md; Marvin & Linzen 2018, Warstadt et al. 2020): per model and
    scorer, which phenomena it gets right beyond all four floors on the same items (chance, the more
    frequent form, a bigram model, the same architecture untrained), the figure of every accuracy beside
    its floors and the accuracy against the number of attractors."""
    s = Section("Minimal pairs (behaviour)", n_key=1)
    summary = views.pairs_summary(run_dir)
    if summary is None:
        s.missing.append("minimal_pairs")
        return s
    acc, attr = views.pairs_accuracy(run_dir), views.pairs_attractors(run_dir)
    for model in sorted(summary["model"].unique()):
        s.figs.append(figures.pairs_figure(acc, model))
        if attr is not None and (attr["model"] == model).any():
            s.figs.append(figures.attractors_figure(attr, model))
    s.findings = [_pairs_clause(model, scorer, g)
                  for (model, scorer), g in summary.groupby(["model", "scorer"], sort=True)]
    s.n_key = min(2, len(s.findings))
    shown = summary.assign(accuracy=_cis(summary))
    s.tables.append(("Accuracy per phenomenon (conditions pooled; 95% bootstrap interval over items) beside its "
                     "floors on the same items (chance: the upper end of a fair coin's 95% range; frequency: the "
                     "more frequent form; bigram: a Witten-Bell bigram of the pretraining corpus; random_init: "
                     "the same architecture untrained, same scorer); above: the floors the interval lies above",
                     shown[["model", "scorer", "suite", "phenomenon", "variant", "n_items", "accuracy", "chance",
                            "frequency", "bigram", "random_init", "above"]]))
    return s


def _pairs_clause(model: str, scorer: str, g: pd.DataFrame) -> str:
    """'decoder (clm) is above all four floors on 1 of 13 phenomena (ud reflexive nonce 0.727 [...]);
    at or below the bigram floor on 10'."""
    name = lambda r: f"{r.suite} {r.phenomenon}" + (f" ({r.variant})" if r.variant != "template" else "")  # noqa: E731
    wins = g[g["above_all"]]
    text = f"{model} ({scorer}) is above all four floors on {len(wins)} of {len(g)} phenomena"
    if len(wins):
        text += " (" + ", ".join(f"{name(r)} {_ci(r.value, r.ci_low, r.ci_high)}" for r in wins.itertuples()) + ")"
    bigram = g[np.isfinite(g["bigram"])]
    not_bigram = int((bigram["ci_low"] <= bigram["bigram"]).sum())
    if len(bigram):
        text += f"; its interval does not clear the bigram floor on {not_bigram} of {len(bigram)}"
    return text


# ----------------------------------------------------------------------------------- flow
def flow_section(run_dir: Path) -> Section:
    """How information moves (docs/flow.md): per model, Voita et al.'s (2019) input-token MI from the
    first to the last layer beside the random-init model and the shuffled-token control, the tuned and
    logit lens beside the random-init model's, and the attribution methods whose Spearman with
    leave-one-out clears the random attribution's interval; the figures of `workbench.figures.flow`."""
    s = Section("Information flow (token identity, lens, attribution)", n_key=1)
    mi, lens, attr = (views.table(run_dir, t) for t in ("flow_mi", "flow_lens", "flow_attribution"))
    if mi is None:
        s.missing.append("flow_mi")
        return s
    for model in sorted(mi["model"].unique()):
        s.figs.append(figures.flow_mi_figure(mi, model))
        if lens is not None and (lens["model"] == model).any():
            s.figs.append(figures.flow_lens_figure(lens, model))
        if attr is not None and (attr["model"] == model).any():
            s.figs.append(figures.flow_attribution_figure(attr, model))
        s.findings.append(_flow_mi_clause(model, mi[mi["model"] == model]))
        if attr is not None and (attr["model"] == model).any():
            s.findings.append(_flow_attr_clause(model, attr[attr["model"] == model]))
    s.n_key = min(2, len(s.findings))
    bits = mi[(mi["metric"] == "mi_bits")]
    ends = bits[bits.groupby("model")["layer"].transform(lambda l: l.isin([l.min(), l.max()]))]
    s.tables.append(("MI with the token, bits, at the first and last layer (95% bootstrap interval over sentences); "
                     "floors: the random-init model and the shuffled-token control",
                     ends.assign(mi=_cis(ends))
                     [["model", "estimator", "label", "variant", "control", "layer", "mi"]]))
    if attr is not None:
        s.tables.append(("Faithfulness of each attribution method (95% bootstrap interval over sentences); "
                         "floor: random scores",
                         attr.assign(score=_cis(attr))
                         [["model", "target", "method", "metric", "n_items", "score"]]))
    return s


def _flow_mi_clause(model: str, g: pd.DataFrame) -> str:
    """'decoder: input-token MI (kmeans) 4.96 at layer 0 -> 4.36 [4.28, 4.43] at layer 4; random init
    4.77 [...]; shuffled-token control 1.03'."""
    g = g[(g["metric"] == "mi_bits") & (g["label"] == "input")]
    est = "kmeans" if (g["estimator"] == "kmeans").any() else g["estimator"].iloc[0]
    g = g[g["estimator"] == est]
    row = lambda variant, control, layer: g[(g["variant"] == variant) & (g["control"] == control)  # noqa: E731
                                            & (g["layer"] == layer)].iloc[0]
    first, last = int(g["layer"].min()), int(g["layer"].max())
    a, b = row("trained", "none", first), row("trained", "none", last)
    r, c = row("random_init", "none", last), row("trained", "shuffled", last)
    return (f"{model}: input-token MI ({est}) {_f(a.value, 2)} bits at layer {first} -> "
            f"{_ci(b.value, b.ci_low, b.ci_high, 2)} at layer {last}; random init {_ci(r.value, r.ci_low, r.ci_high, 2)}, "
            f"shuffled-token control {_f(c.value, 2)}")


def _flow_attr_clause(model: str, g: pd.DataFrame) -> str:
    """'decoder: attribution methods above the random floor in Spearman with leave-one-out: integrated
    gradients 0.75 [0.69, 0.83] (random 0.02 [-0.03, 0.08])'."""
    g = g[g["metric"] == "spearman_loo"].set_index("method")
    rnd = g.loc["random"]
    above = g[(g.index != "random") & (g["ci_low"] > rnd.ci_high)].sort_values("value", ascending=False)
    names = ", ".join(f"{m.replace('_', ' ')} {_ci(r.value, r.ci_low, r.ci_high, 2)}" for m, r in above.iterrows())
    return (f"{model}: attribution methods whose Spearman with leave-one-out clears the random floor "
            f"({_ci(rnd.value, rnd.ci_low, rnd.ci_high, 2)}): {names or 'none'}")


# ----------------------------------------------------------------------------------- interventions
def interventions_section(run_dir: Path) -> Section:
    """Causal mediation of subject-verb agreement (docs/interventions.md; Finlayson et al. 2021): per
    model, the total effect of swapping the subject's number beside its two floors (the random-init
    model, the same-number control) with intervals over items; the sites whose natural indirect effect
    clears both floors' intervals; and, when none does, that reading said plainly; per token position
    (heads and sub-layer outputs patched at the subject or the reading position alone) the largest
    indirect effect beside its floors; the figures of `workbench.figures.interventions`."""
    s = Section("Interventions (causal mediation of agreement)", n_key=1)
    t = views.table(run_dir, "interventions")
    if t is None:
        s.missing.append("interventions")
        return s
    for model in sorted(t["model"].unique()):
        g = t[t["model"] == model]
        s.figs.append(figures.interventions_layers_figure(t, model))
        if (g["head"] >= 0).any():
            s.figs.append(figures.interventions_heads_figure(t, model))
        if (g["position"] != "all").any():
            s.figs.append(figures.interventions_positions_figure(t, model))
        s.findings.append(_interventions_te_clause(model, g))
        s.findings.append(_interventions_sites_clause(model, g))
        if (clause := _interventions_positions_clause(model, g)) is not None:
            s.findings.append(clause)
    s.n_key = min(2, len(s.findings))
    te = t[(t["site"] == "input") & t["metric"].isin(["te_log", "accuracy_clean"])]
    s.tables.append(("Total effect of the intervention (nats of log p(agreeing verb) - log p(other form)) and the share of items preferring "
                     "the agreeing verb (95% bootstrap interval over items); floors: the random-init model and the "
                     "same-number control",
                     te.assign(score=_cis(te))
                     [["model", "variant", "intervention", "metric", "n_items", "score"]]))
    return s


def _te_row(g: pd.DataFrame, variant: str, intervention: str, metric: str = "te_log") -> pd.Series | None:
    r = g[(g["site"] == "input") & (g["variant"] == variant) & (g["intervention"] == intervention)
          & (g["metric"] == metric)]
    return r.iloc[0] if len(r) else None


def _te_clears(g: pd.DataFrame) -> tuple[pd.Series, dict[str, pd.Series], bool]:
    """The trained swap-number TE row, its floors' TE rows by name, and whether its interval lies wholly
    above every floor's."""
    te = _te_row(g, "trained", "swap_number")
    floors = {w: _te_row(g, v, i) for w, (v, i) in
              (("random init", ("random_init", "swap_number")), ("same-number control", ("trained", "same_number")))}
    floors = {w: r for w, r in floors.items() if r is not None}
    return te, floors, bool(floors) and all(te.ci_low > r.ci_high for r in floors.values())


def _interventions_te_clause(model: str, g: pd.DataFrame) -> str:
    """'decoder: swapping the subject's number moves the log-probability difference by 0.055 [0.018, 0.093] nats
    (218 items, agreeing form preferred in 0.49 [0.42, 0.55]); random init 0.050 [...], same-number
    control 0.024 [...]: it clears no floor'."""
    te, floors, clears = _te_clears(g)
    acc = _te_row(g, "trained", "swap_number", "accuracy_clean")
    text = (f"{model}: swapping the subject's number moves the log-probability difference of the verb forms by "
            f"{_ci(te.value, te.ci_low, te.ci_high)} nats ({int(te.n_items)} items, agreeing form preferred in "
            f"{_ci(acc.value, acc.ci_low, acc.ci_high, 2)})")
    if floors:
        above = [te.ci_low > r.ci_high for r in floors.values()]
        text += "; " + ", ".join(f"{w} {_ci(r.value, r.ci_low, r.ci_high)}" for w, r in floors.items())
        text += ": it clears " + ("both floors" if clears and len(floors) == 2 else "its floor" if clears
                                  else "no floor" if not any(above) else "one floor, not the other")
    return text


def _whole_intervention(g: pd.DataFrame) -> pd.Series:
    """Rows of sites whose NIE is the TE by construction: the residual stream at every position, and the
    last block's output at the reading position (the whole readout)."""
    resid = g["site_kind"] == "resid_post"
    last = g["layer"] == g.loc[resid, "layer"].max() if resid.any() else False
    return resid & ((g["position"] == "all") | ((g["position"] == "reading") & last))


def _interventions_sites_clause(model: str, g: pd.DataFrame) -> str:
    """The sites (those that are the whole intervention by construction left out) whose swap-number NIE
    (log scale) has its interval above both floors' at the same site, largest first, read as carrying
    the effect only when the TE itself clears its floors; or the honest reading when none does."""
    d = g[(g["metric"] == "nie_log") & ~_whole_intervention(g)]
    key = ["site"]
    trained = d[(d["variant"] == "trained") & (d["intervention"] == "swap_number")].set_index(key)
    floor_hi = pd.concat([d[(d["variant"] == "random_init") & (d["intervention"] == "swap_number")],
                          d[(d["variant"] == "trained") & (d["intervention"] == "same_number")]]
                         ).groupby(key)["ci_high"].max()
    if not len(floor_hi):
        return f"{model}: no floor was run, so no site's indirect effect can be read against one"
    above = trained[trained["ci_low"] > floor_hi.reindex(trained.index).fillna(np.inf)]
    above = above.sort_values("value", ascending=False)
    if not len(above):
        best = trained.sort_values("value", ascending=False).iloc[0]
        return (f"{model}: no site's indirect effect clears its floors' intervals (of {len(trained)} sites; the "
                f"largest, {best.name} {_ci(best.value, best.ci_low, best.ci_high)} nats, does not): nothing here "
                "locates an agreement mechanism")
    names = ", ".join(f"{site} {_ci(r.value, r.ci_low, r.ci_high)}" for site, r in above.head(5).iterrows())
    names += " ..." if len(above) > 5 else ""
    if not _te_clears(g)[2]:
        return (f"{model}: {len(above)} of {len(trained)} sites have an indirect effect above their floors' intervals "
                f"(nats: {names}), but the total effect does not clear its floors, and {len(trained)} sites were "
                "tested without a correction for multiple comparisons: not read as an agreement mechanism")
    return (f"{model}: {len(above)} of {len(trained)} sites carry an indirect effect above their floors' intervals "
            f"(nats): {names}")


def _interventions_positions_clause(model: str, g: pd.DataFrame) -> str | None:
    """Per token position of the grid, the head or sub-layer output (the residual stream left out: it is
    the whole input at that position) whose swap-number NIE (log scale), patched there alone, is largest,
    with its interval and whether it lies above both floors' upper ends at the same site; None without
    a position grid. Read under the same rule as the sites clause: one test per site, no correction."""
    d = g[(g["metric"] == "nie_log") & (g["position"] != "all") & (g["site_kind"] != "resid_post")
          & (g["site"] != "input")]
    trained = d[(d["variant"] == "trained") & (d["intervention"] == "swap_number")]
    if not len(trained):
        return None
    floor_hi = pd.concat([d[(d["variant"] == "random_init") & (d["intervention"] == "swap_number")],
                          d[(d["variant"] == "trained") & (d["intervention"] == "same_number")]]
                         ).groupby("site")["ci_high"].max()
    parts = []
    for position, p in trained.groupby("position", sort=True):
        best = p.sort_values("value", ascending=False).iloc[0]
        floor = floor_hi.get(best.site, np.nan)
        verdict = ("no floor was run" if np.isnan(floor) else "above both floors" if best.ci_low > floor
                   else f"not above its floors (upper end {floor:.3f})")
        parts.append(f"at the {position} position {best.site} {_ci(best.value, best.ci_low, best.ci_high)} "
                     f"nats of {len(p)} sites, {verdict}")
    return f"{model}, heads and sub-layer outputs patched at one position alone: " + "; ".join(parts)



# section key -> its builder; each analysis record names its own keys (`Analysis.sections`,
# workbench/analyses/registry.py), so a new analysis adds its section there, not here
SECTION_BUILDERS: dict[str, Callable[[Path], Section]] = {
    "run": run_section, "models": models_section, "probing": probing_section, "objectives": objectives_section,
    "structural": structural_section, "heads": heads_section, "pruning": pruning_section,
    "gating": gating_section, "amnesic": amnesic_section, "compare": compare_section,
    "emergence": emergence_section, "pairs": pairs_section, "flow": flow_section,
    "interventions": interventions_section,
}
RUN_SECTIONS = ("run", "models")   # the run's own sections, before every analysis'


DEFAULT = "default:"   # the key of a record's default section: "default:<record name>"
DEFAULT_ROWS = 20      # rows of each table the default section shows


def default_section(run_dir: Path, name: str) -> Section | None:
    """The section of an analysis record that names no sections of its own: its figures (drawn by the
    builder its record names, from its tables as the run wrote them) and the first rows of each of its
    tables; None where the run wrote none of its tables (the section is left out, not a notice). It
    states no finding: sentences computed from the numbers need a section builder of the analysis' own."""
    record = analysis(name)
    tables = {t: df for t in record.tables if (df := results.load_table(run_dir, t)) is not None}
    if not tables:
        return None
    builder = figure_builders().get(record.name)
    figs = [] if builder is None else list(builder(tables).values())
    return Section(record.name.replace("_", " ").capitalize(), figs=figs, n_key=0,
                   tables=[(f"{t}: the first {min(DEFAULT_ROWS, len(df))} of {len(df):,} rows "
                            f"(tables/{t}.parquet)", df.head(DEFAULT_ROWS)) for t, df in tables.items()])


def section_keys() -> tuple[str, ...]:
    """The report's sections in reading order: the run's own, then each record of `ANALYSES` (the
    order `workbench run` runs them) with its `sections`, or its default section ("default:<name>",
    `default_section`) when it names none. A key without a builder, a key named twice and a builder no
    record names are ValueErrors naming them (a section is never dropped in silence)."""
    keys = RUN_SECTIONS + tuple(k for a in ANALYSES.values() for k in (a.sections or (DEFAULT + a.name,)))
    unknown = [k for k in keys if k not in SECTION_BUILDERS and not k.startswith(DEFAULT)]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    unnamed = [k for k in SECTION_BUILDERS if k not in keys]
    if unknown or twice or unnamed:
        raise ValueError(f"report sections: unknown {unknown}, named twice {twice}, named by no analysis record "
                         f"{unnamed} (workbench/analyses/registry.py, Analysis.sections)")
    return keys


def build_sections(run_dir: str | Path) -> list[Section]:
    """Every section of the report of `run_dir`, in reading order (`section_keys`; a default section
    whose analysis wrote no table is left out); every section but the run's opens with the competence
    line (`views.competence_text`: how far each model got) when the run has one."""
    run_dir = Path(run_dir)
    built = [default_section(run_dir, k[len(DEFAULT):]) if k.startswith(DEFAULT) else SECTION_BUILDERS[k](run_dir)
             for k in section_keys()]
    sections = [s for s in built if s is not None]
    lead = views.competence_text(views.competence(run_dir), [m.name for m in results.list_models(run_dir)])
    for s in sections:
        if s.title != "Run":
            s.lead = _as_sentence(lead) if lead else ""
    return sections


# --------------------------------------------------------------------------------- rendering
CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #ddd}h2{margin-top:2em;border-bottom:1px solid #eee}
ul.findings,ul.key{background:#f6f8fa;padding:.6em .8em .6em 2em;border-left:4px solid #1f77b4}
ul.findings li,ul.key li{margin:.25em 0}nav ol{columns:2}div.tbl{overflow-x:auto;max-width:100%}
p.missing{color:#8a4b00;background:#fff6e5;padding:.4em .8em}p.lead{color:#555;font-size:.9em;font-style:italic}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f0f0f0}pre{background:#f6f8fa;padding:.5em;overflow:auto;font-size:.8em}"""


def missing_notices(s: Section) -> list[str]:
    """'No pruning, pruned_speed tables yet: run `workbench prune MODEL`.': one line per command."""
    by_command: dict[str, list[str]] = {}
    for name in s.missing:
        by_command.setdefault(views.missing_command(name), []).append("checkpoints" if name == "models" else name)
    return [f"No {', '.join(names)}{' table' * (names != ['checkpoints'])}{'s' * (len(names) > 1)} yet: "
            f"run `{command}`." for command, names in by_command.items()]


def _as_sentence(clause: str) -> str:
    return _sentence([clause])


def key_findings(sections: list[Section]) -> list[tuple[Section, str]]:
    """(section, sentence) for the top of the report: the first findings of each section but the
    run's own (its config and timings are not a finding)."""
    return [(s, _as_sentence(c)) for s in sections if s.title != "Run" for c in s.findings[:s.n_key]]


def _section_html(s: Section) -> str:
    out = [f'<h2 id="{s.anchor}">{html.escape(s.title)}</h2>']
    if s.lead:
        out.append(f'<p class="lead">{html.escape(s.lead)}</p>')
    if s.findings:
        out.append('<ul class="findings">' + "".join(f"<li>{html.escape(_as_sentence(c))}</li>" for c in s.findings)
                   + "</ul>")
    out += [f'<p class="missing">{html.escape(n)}</p>' for n in missing_notices(s)]
    out += [f.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False}) for f in s.figs]
    for caption, df in s.tables:
        out.append(f'<h3>{html.escape(caption)}</h3><div class="tbl">'
                   + _compact(df).to_html(index=False, border=0, na_rep="") + "</div>")
    for summary, text in s.details:
        out.append(f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>")
    return "\n".join(out)


def _head_html(sections: list[Section]) -> str:
    """Key findings (each linked to its section) and the table of contents."""
    keys = key_findings(sections)
    out = []
    if keys:
        out.append('<h2 id="key-findings">Key findings</h2><ul class="key">' + "".join(
            f'<li>{html.escape(text)} <a href="#{s.anchor}">({html.escape(s.title)})</a></li>' for s, text in keys)
            + "</ul>")
    out.append('<nav><h2>Contents</h2><ol>' + "".join(
        f'<li><a href="#{s.anchor}">{html.escape(s.title)}</a></li>' for s in sections) + "</ol></nav>")
    return "\n".join(out)


def render_html(title: str, sections: list[Section]) -> str:
    """A self-contained page: plotly.js once in <head> (no CDN), key findings, contents, sections."""

    js = get_plotlyjs().replace("</script", "<\\/script")   # never close the tag early
    body = "\n".join(_section_html(s) for s in sections)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            f"<style>{CSS}</style>\n<script type=\"text/javascript\">{js}</script>\n</head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n{_head_html(sections)}\n{body}\n</body></html>\n")


def render_markdown(title: str, sections: list[Section], html_name: str = "report.html") -> str:
    """The same findings and compact tables as Markdown, linking to the HTML page for figures."""
    out = [f"# {title}", "", f"Figures: [{html_name}]({html_name}) (self-contained, opens offline).", ""]
    keys = key_findings(sections)
    if keys:
        out += ["## Key findings", ""] + [f"- {text} ({s.title})" for s, text in keys] + [""]
    for s in sections:
        out += [f"## {s.title}", ""] + ([f"*{s.lead}*", ""] if s.lead else [])
        out += [f"- {_as_sentence(c)}" for c in s.findings] + ([""] if s.findings else [])
        out += [f"> {n}" for n in missing_notices(s)] + ([""] if s.missing else [])
        for caption, df in s.tables:
            out += [f"**{caption}**", "", markdown_table(_compact(df)), ""]
    return "\n".join(out)


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write run_dir/report/report.html and run_dir/report/summary.md (atomically); return both paths."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    sections = build_sections(run_dir)
    title = f"Report: {results.run_info(run_dir).get('config', {}).get('name', run_dir.name)}"
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    html_path = atomic_write_text(out / "report.html", render_html(title, sections))
    md_path = atomic_write_text(out / "summary.md", render_markdown(title, sections, html_path.name))
    return html_path, md_path
