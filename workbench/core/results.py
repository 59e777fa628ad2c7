"""The results store: run folders holding models, tidy Parquet tables and reports.

Layout (docs/design.md, "Runs and the results store"):

    runs/<run>/run.json, models/<name>/, tables/<table>.parquet, attention/<model>/, report/

Everything that reads results (the report, the app) goes through these functions, so the layout
lives in one place.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from plmodels.checkpoint import read_card
from plmodels.training.runtime import read_jsonl
from workbench.core.io import atomic_write_json, atomic_write_text, file_lock, write_parquet_atomic

TABLES = (
    "training", "probing", "probing_summary", "mix_weights", "heads", "heads_classes",
    "relations", "head_similarity", "importance", "pruning", "pruned_speed", "kendall", "cka",
    "frozen_vs_finetuned", "head_change", "probing_change", "emergence",
)


@dataclass(frozen=True)
class ModelInfo:
    """A checkpoint folder inside a run: its name, path, kind and model card."""

    name: str
    path: Path
    kind: str
    card: dict = field(default_factory=dict)


def list_runs(root: str | Path) -> list[str]:
    """Names of the run folders under `root` (those holding a run.json or a tables/ folder), sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and ((p / "run.json").exists() or (p / "tables").is_dir())
    )


def table_path(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / "tables" / f"{name}.parquet"


def load_table(run_dir: str | Path, name: str) -> pd.DataFrame | None:
    """The table `name` of a run, or None when the step that writes it has not run yet."""
    path = table_path(run_dir, name)
    return pd.read_parquet(path) if path.exists() else None


def find_run_table(out_dir: Path | None, name: str, model_name: str) -> pd.DataFrame | None:
    """This model's rows of table `name` in the run an analysis folder sits in: out_dir itself, or one
    or two levels up (runs/<run>/<analysis>/<model>); None when no such table has the model's rows."""
    if out_dir is None:
        return None
    for run in (out_dir, out_dir.parent, out_dir.parent.parent):
        df = load_table(run, name)
        if df is not None and len(df := df[df["model"] == model_name]):
            return df
    return None


def write_table(run_dir: str | Path, name: str, df: pd.DataFrame) -> Path:
    """Write a tidy table atomically into the run's tables/ folder."""
    path = table_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(df.reset_index(drop=True), path)
    return path


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def list_models(run_dir: str | Path) -> list[ModelInfo]:
    """Checkpoints in the run's models/ folder (a folder with a config.json, or its final/ one)."""
    models_dir = Path(run_dir) / "models"
    if not models_dir.is_dir():
        return []
    infos = []
    for p in sorted(models_dir.iterdir()):
        ckpt = p if (p / "config.json").exists() else p / "final"
        if not (ckpt / "config.json").exists():
            continue
        cfg = _read_json(ckpt / "config.json")
        try:
            card = dict(read_card(ckpt).fields)
        except (OSError, ValueError):  # a damaged card: listed without one
            card = {}
        infos.append(ModelInfo(p.name, ckpt, cfg.get("kind", "?"), card))
    return infos


TRAINING_COLUMNS = ["model", "step", "tokens", "split", "metric", "value"]


def training_rows(model_dir: str | Path, name: str | None = None) -> pd.DataFrame:
    """The `training` table rows of one pretraining run folder, from its metrics.jsonl (empty when
    there is none): model (`name`, default the folder's name), step, tokens, split, metric, value.
    A killed run's torn last line is dropped (`plmodels.training.runtime.read_jsonl`)."""
    model_dir = Path(model_dir)
    log = read_jsonl(model_dir / "metrics.jsonl")
    if log.torn_lines:
        warnings.warn(f"{model_dir / 'metrics.jsonl'}: dropped its torn last line ({log.torn_bytes} bytes; "
                      f"a killed run leaves one)", stacklevel=2)
    df = pd.DataFrame(log.rows, columns=[c for c in TRAINING_COLUMNS if c != "model"])
    df.insert(0, "model", name or model_dir.name)
    return df.astype({"step": "int64", "tokens": "int64", "value": "float64"})


def run_info(run_dir: str | Path) -> dict:
    """The run's run.json (resolved config, seed, code version, data checksums, step states)."""
    return _read_json(Path(run_dir) / "run.json")


def upsert_table(run_dir: str | Path, name: str, df: pd.DataFrame, key: str = "model") -> Path:
    """Replace the rows of `df`'s `key` values in table `name` (other models' rows stay), atomically,
    under the table's lock (`file_lock`: steps running at once may write their shares together).

    Analyses run one model at a time; this lets each write its share of a run-wide table.
    """
    with file_lock(table_path(run_dir, name)):
        old = load_table(run_dir, name)
        if old is not None and key in old.columns and key in df.columns:
            old = old[~old[key].isin(df[key].unique())]
            df = pd.concat([old, df], ignore_index=True)
        return write_table(run_dir, name, df)


def write_tables(run_dir: str | Path, tables: dict[str, pd.DataFrame], key: str = "model") -> list[Path]:
    """`upsert_table` for every table of an analysis' result dict."""
    return [upsert_table(run_dir, name, df, key=key) for name, df in tables.items()]


def write_figures(folder: Path, figures: dict) -> list[Path]:
    """Write each Plotly figure as JSON (`plotly.io.from_json` reads it back); None entries are skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    return [atomic_write_text(folder / f"{name}.json", fig.to_json()) for name, fig in figures.items()
            if fig is not None]


def write_analysis_outputs(tables: dict[str, pd.DataFrame], out_dir, run_dir, record: dict,
                           record_name: str) -> None:
    """An analysis' outputs: its tables (upserted into `run_dir`, else `out_dir`), and in `out_dir`
    its record (`record_name`, with a creation time). Figures are drawn from the tables by the
    presentation layer (`workbench.presentation.analysis_figures`)."""
    target = run_dir if run_dir is not None else out_dir
    if target is not None:
        write_tables(target, tables)
    if out_dir is None:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / record_name, {**record, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
