"""One registration point per analysis: `ANALYSES`, a record per analysis of one model.

The record is what `workbench run` (workbench/pipeline.py), the CLI, the app's views and the figure
writer read instead of a branch per analysis (issue 76, part 3; the pattern is the objectives
registry of `plmodels.training.objectives` and HF's `AutoModel` mappings): its name (the step kind
and the run config's section), its config class (a `plmodels.config.Config`), its run function in the
one shape `run(source, config, where) -> {table name: DataFrame}`, the tables it writes, what it
reads (a checkpoint, or a pretraining run's folder of checkpoints), the analyses of the same model
whose tables it reads, the CLI command that writes its tables, its figure builder and its sections of
the run's report (`workbench.presentation.report` reads them in the records' order, after the run's own
two).

The run functions here are the analyses' library entry points called in that one shape; the config
reaches them typed (resolved once by `config_class.resolve`, never the raw dict). Figures are drawn
from the returned tables by the builder the record names, a key of
`workbench.presentation.analysis_figures.BUILDERS` (the presentation layer sits above this one, so the
record names its builder and its report sections by key; `analysis_figures.figure_builders` and
`report.section_keys` refuse a key without a builder and a builder no record names).

Two steps of `workbench run` are not analyses of one model and are not here: `compare` (a pair of
models) and `competence` (every pretrained model of the run, no config of its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import pandas as pd

from plmodels.config import Config
from workbench.analyses.amnesic import AmnesicRunConfig, amnesic_model
from workbench.analyses.cross_heads import CrossHeadsConfig, analyse_cross_heads
from workbench.analyses.emergence import EmergenceConfig, emergence_cli
from workbench.analyses.flow import FlowRunConfig, flow_model
from workbench.analyses.frozen_vs_finetuned import FvFConfig, frozen_vs_finetuned
from workbench.analyses.gating import GateRunConfig, gate_model
from workbench.analyses.heads import HeadRunConfig, analyse_heads
from workbench.analyses.interventions import InterventionsConfig, interventions_model
from workbench.analyses.minimal_pairs import PairsRunConfig, score_pairs_model
from workbench.analyses.probing import ProbeRunConfig, probe_model
from workbench.analyses.prune import PruneRunConfig, prune_model_cli

Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Where:
    """Where an analysis of one model writes and which shared folders of a run it reads."""

    out_dir: Path                     # its tables/ (and figures/, records) go here
    model_name: str | None = None     # the `model` column (None: the checkpoint folder's name)
    store_root: Path | None = None    # activation stores (None: out_dir/store)
    tasks_dir: Path | None = None     # the built probing tasks (None: build them under the data root)
    cache_dir: Path | None = None     # the minimal pairs' suites and scores (None: under out_dir)


@dataclass(frozen=True)
class Analysis:
    """One analysis of one model (module docstring)."""

    name: str                                   # step kind of `workbench run`, its config section, figures key
    config_class: type[Config]                  # the typed run config; `resolve` reads a file, dict or None
    run: Callable[[Path, Config, Where], Tables]   # (checkpoint or run folder, config, where) -> tables
    tables: tuple[str, ...]                     # the tables it may write (optional ones included)
    command: str                                # the CLI line that writes them (the app's "no results yet")
    reads: Literal["checkpoint", "pretraining_run"] = "checkpoint"   # emergence reads checkpoints/step_*
    reads_tasks: bool = False                   # reads the run's built probing tasks (after the tasks step)
    after: tuple[str, ...] = ()                 # analyses of the same model whose tables it reads
    step_fields: tuple[str, ...] = ()           # keys of its `workbench run` section that override config fields
    check: Callable[[Config], object] | None = None   # checks beyond the schema (files a config names)
    sections: tuple[str, ...] = ()              # its report sections, in reading order: keys of
                                                # workbench.presentation.report.SECTION_BUILDERS
    figures: str | None = None                  # its figure builder: a key of
                                                # workbench.presentation.analysis_figures.BUILDERS

    def resolve(self, config: Config | dict | str | Path | None = None, overrides: dict | None = None) -> Config:
        """The typed config: None -> the defaults, a dict over them, a JSON file, or a config itself;
        `overrides` (`--set`, a step's own keys) last. Errors name the file or flag and the field."""
        resolved = self.config_class.resolve(config, overrides)
        if self.check is not None:
            self.check(resolved)
        return resolved


def _probe(source: Path, config: Config, where: Where) -> Tables:
    return probe_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                       tasks_dir=where.tasks_dir, store_root=where.store_root)


def _heads(source: Path, config: Config, where: Where) -> Tables:
    return analyse_heads(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                         store_root=where.store_root)


def _cross_heads(source: Path, config: Config, where: Where) -> Tables:
    return analyse_cross_heads(source, out_dir=where.out_dir, model_name=where.model_name, **config.to_dict())


def _prune(source: Path, config: Config, where: Where) -> Tables:
    return prune_model_cli(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


def _gate(source: Path, config: Config, where: Where) -> Tables:
    return gate_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                      store_root=where.store_root)


def _amnesic(source: Path, config: Config, where: Where) -> Tables:
    return amnesic_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                         store_root=where.store_root)


def _frozen_vs_finetuned(source: Path, config: Config, where: Where) -> Tables:
    return frozen_vs_finetuned(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


def _emergence(source: Path, config: Config, where: Where) -> Tables:
    return emergence_cli(source, where.out_dir, config=config)


def _pairs(source: Path, config: Config, where: Where) -> Tables:
    return score_pairs_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                             cache_dir=where.cache_dir)


def _flow(source: Path, config: Config, where: Where) -> Tables:
    return flow_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


def _interventions(source: Path, config: Config, where: Where) -> Tables:
    return interventions_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


_RECORDS = (
    Analysis("probe", ProbeRunConfig, _probe, ("probing", "probing_summary", "mix_weights", "probe_items"),
             "workbench probe MODEL", reads_tasks=True, step_fields=("tasks",),
             sections=("probing", "objectives", "structural"), figures="probing"),
    Analysis("heads", HeadRunConfig, _heads, ("heads", "heads_classes", "relations", "head_similarity"),
             "workbench heads MODEL", check=HeadRunConfig.thresholds,   # reads its heads_config file
             sections=("heads",), figures="heads"),
    Analysis("cross_heads", CrossHeadsConfig, _cross_heads, ("cross_heads",), "workbench cross-heads MODEL"),
    Analysis("prune", PruneRunConfig, _prune,
             ("importance", "pruning", "prunable", "kendall", "pruned_speed", "roles_importance"),
             "workbench prune MODEL", step_fields=("methods",), sections=("pruning",)),
    Analysis("gate", GateRunConfig, _gate, ("gating", "head_passport"),
             "workbench gate MODEL --out RUN_FOLDER (after workbench heads, for role units)",
             after=("heads", "prune"), sections=("gating",), figures="gating"),
    Analysis("amnesic", AmnesicRunConfig, _amnesic, ("amnesic",), "workbench amnesic MODEL --out RUN_FOLDER",
             sections=("amnesic",), figures="amnesic"),
    Analysis("frozen_vs_finetuned", FvFConfig, _frozen_vs_finetuned, ("frozen_vs_finetuned",),
             "workbench frozen-vs-finetuned MODEL", sections=("compare",)),
    Analysis("emergence", EmergenceConfig, _emergence, ("emergence",),
             "workbench emergence RUN_FOLDER (a pretraining run with log-spaced checkpoints)",
             reads="pretraining_run", reads_tasks=True, sections=("emergence",), figures="emergence"),
    Analysis("pairs", PairsRunConfig, _pairs, ("minimal_pairs", "minimal_pair_items"),
             "workbench pairs MODEL --out RUN_FOLDER", sections=("pairs",)),
    Analysis("flow", FlowRunConfig, _flow, ("flow_mi", "flow_lens", "flow_attribution"),
             "workbench flow MODEL --out RUN_FOLDER", sections=("flow",), figures="flow"),
    Analysis("interventions", InterventionsConfig, _interventions, ("interventions", "interventions_attribution"),
             "workbench patch MODEL --out RUN_FOLDER", sections=("interventions",), figures="interventions"),
)
# name -> record, in the order `workbench run` runs them
ANALYSES: dict[str, Analysis] = {a.name: a for a in _RECORDS}


def analysis(name: str) -> Analysis:
    """The record of analysis `name`; an unknown name is a ValueError listing the known ones."""
    if name not in ANALYSES:
        raise ValueError(f"unknown analysis {name!r}; known: {', '.join(ANALYSES)}")
    return ANALYSES[name]
