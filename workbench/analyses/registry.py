"""One registration point per analysis: `ANALYSES`, a record per analysis of one model.

The record is what `workbench run` (workbench/pipeline.py: its steps and the schema of its run config,
`run_config_class`), the CLI (workbench/cli.py: one subcommand per record), the app's views, the
figure writer and the report read instead of a branch per analysis (issue 76, part 3; the pattern is
the objectives registry of `plmodels.training.objectives` and HF's `AutoModel` mappings): its name
(the step kind and the run config's section), its config class (a `plmodels.config.Config`), its run
function in the one shape `run(source, config, where) -> {table name: DataFrame}`, the tables it
writes, what it reads (a checkpoint, or a pretraining run's folder of checkpoints), the analyses of
the same model whose tables it reads, its CLI subcommand and help line, its figure builder and its
sections of the run's report (`workbench.presentation.report` reads them in the records' order,
after the run's own two; a record without sections gets the report's default section).

The records are light: a config class may be named as "module:Class" and is imported when first
asked for (`Analysis.config_class`), the run functions here import their analysis module inside, and
this module imports neither torch nor pandas, so the CLI builds its parser from the records in
milliseconds (as HF's lazy `AutoModel`
mappings name their classes by string). The config reaches a run function typed (resolved once by
`Analysis.resolve`, never the raw dict). Figures are drawn from the returned tables by the builder
the record names, a key of `workbench.presentation.analysis_figures.BUILDERS` (the presentation layer
sits above this one, so the record names its builder and its report sections by key;
`analysis_figures.figure_builders` and `report.section_keys` refuse a key without a builder and a
builder no record names).

Two steps of `workbench run` are not analyses of one model and are not here: `compare` (a pair of
models) and `competence` (every pretrained model of the run, no config of its own).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

if TYPE_CHECKING:   # the annotations only: importing this module loads neither torch nor pandas
    import pandas as pd

    from plmodels.config import Config

    Tables = dict[str, pd.DataFrame]


def load_ref(ref: str) -> object:
    """The object "package.module:Name" (or "module:Class.attribute") names, imported now; a name that
    does not resolve is a ValueError naming it."""
    module, _, attrs = ref.partition(":")
    if not module or not attrs:
        raise ValueError(f"{ref!r}: expected 'module:name'")
    obj: object = importlib.import_module(module)
    for attr in attrs.split("."):
        if not hasattr(obj, attr):
            raise ValueError(f"{ref!r}: {module} has no {attrs}")
        obj = getattr(obj, attr)
    return obj


@dataclass(frozen=True)
class Where:
    """Where an analysis of one model writes and which shared folders of a run it reads."""

    out_dir: Path                     # its tables/ (and figures/, records) go here
    model_name: str | None = None     # the `model` column (None: the checkpoint folder's name)
    store_root: Path | None = None    # activation stores (None: out_dir/store)
    tasks_dir: Path | None = None     # the built probing tasks (None: build them under the data root)
    cache_dir: Path | None = None     # the minimal pairs' suites and scores (None: under out_dir)
    lens_dir: Path | None = None      # flow: the tuned lens' translators (None: beside the checkpoint)


@dataclass(frozen=True)
class Analysis:
    """One analysis of one model (module docstring)."""

    name: str                                   # step kind of `workbench run`, its config section, figures key
    config: type[Config] | str                  # the typed run config, or "module:Class" naming it
    run: Callable[[Path, Config, Where], Tables]   # (checkpoint or run folder, config, where) -> tables
    tables: tuple[str, ...]                     # the tables it may write (optional ones included)
    command: str                                # the CLI line that writes them: "workbench <subcommand> ..."
                                                # (the subcommand and the app's "no results yet")
    help: str = ""                              # the subcommand's help line (and the run config section's)
    reads: Literal["checkpoint", "pretraining_run"] = "checkpoint"   # emergence reads checkpoints/step_*
    reads_tasks: bool = False                   # reads the run's built probing tasks (after the tasks step)
    after: tuple[str, ...] = ()                 # analyses of the same model whose tables it reads
    step_fields: tuple[str, ...] = ()           # keys of its `workbench run` section that override config fields
    check: Callable[[Config], object] | str | None = None   # checks beyond the schema (files a config
                                                # names), or "module:function" naming them
    sections: tuple[str, ...] = ()              # its report sections, in reading order: keys of
                                                # workbench.presentation.report.SECTION_BUILDERS
                                                # (none: the report's default section)
    figures: str | None = None                  # its figure builder: a key of
                                                # workbench.presentation.analysis_figures.BUILDERS

    @property
    def config_class(self) -> type[Config]:
        """The config class (imported on first use when the record names it by string)."""
        return load_ref(self.config) if isinstance(self.config, str) else self.config   # type: ignore[return-value]

    @property
    def subcommand(self) -> str:
        """The CLI subcommand that runs it: the second word of `command`."""
        return self.command.split()[1]

    def resolve(self, config: Config | dict | str | Path | None = None, overrides: dict | None = None) -> Config:
        """The typed config: None -> the defaults, a dict over them, a JSON file, or a config itself;
        `overrides` (`--set`, a step's own keys) last. Errors name the file or flag and the field."""
        resolved = self.config_class.resolve(config, overrides)
        check = load_ref(self.check) if isinstance(self.check, str) else self.check
        if check is not None:
            check(resolved)
        return resolved


# The run functions: each imports its analysis module when called (module docstring).
def _probe(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.probing import probe_model
    return probe_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                       tasks_dir=where.tasks_dir, store_root=where.store_root)


def _heads(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.heads import analyse_heads
    return analyse_heads(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                         store_root=where.store_root)


def _cross_heads(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.cross_heads import analyse_cross_heads
    return analyse_cross_heads(source, out_dir=where.out_dir, model_name=where.model_name, **config.to_dict())


def _prune(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.prune import prune_model_cli
    return prune_model_cli(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


def _gate(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.gating import gate_model
    return gate_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                      store_root=where.store_root)


def _amnesic(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.amnesic import amnesic_model
    return amnesic_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                         store_root=where.store_root)


def _frozen_vs_finetuned(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.frozen_vs_finetuned import frozen_vs_finetuned
    return frozen_vs_finetuned(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


def _emergence(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.emergence import emergence_cli
    return emergence_cli(source, where.out_dir, config=config)


def _pairs(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.minimal_pairs import score_pairs_model
    return score_pairs_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                             cache_dir=where.cache_dir)


def _flow(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.flow import flow_model
    return flow_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name,
                      lens_dir=where.lens_dir)


def _interventions(source: Path, config: Config, where: Where) -> Tables:
    from workbench.analyses.interventions import interventions_model
    return interventions_model(source, out_dir=where.out_dir, config=config, model_name=where.model_name)


_A = "workbench.analyses."
_RECORDS = (
    Analysis("probe", _A + "probing:ProbeRunConfig", _probe,
             ("probing", "probing_summary", "mix_weights", "probe_items"), "workbench probe MODEL",
             "edge probing per layer, scalar mix, cumulative, controls",
             reads_tasks=True, step_fields=("tasks",), sections=("probing", "objectives", "structural"),
             figures="probing"),
    Analysis("heads", _A + "heads:HeadRunConfig", _heads, ("heads", "heads_classes", "relations", "head_similarity"),
             "workbench heads MODEL", "attention-head roles (positional, syntactic, rare-token, ...) beside "
             "their floors",
             check=_A + "heads:HeadRunConfig.thresholds",   # reads its heads_config file
             sections=("heads",), figures="heads"),
    Analysis("cross_heads", _A + "cross_heads:CrossHeadsConfig", _cross_heads, ("cross_heads",),
             "workbench cross-heads MODEL", "cross-attention heads of a T5/BART checkpoint: where each target "
             "position looks in the source, under the model's own noising and teacher forcing"),
    Analysis("prune", _A + "prune:PruneRunConfig", _prune,
             ("importance", "pruning", "prunable", "kendall", "pruned_speed", "roles_importance"),
             "workbench prune MODEL", "head importance, pruning curves and real pruning",
             step_fields=("methods",), sections=("pruning",)),
    Analysis("gate", _A + "gating:GateRunConfig", _gate, ("gating", "head_passport"),
             "workbench gate MODEL --out RUN_FOLDER (after workbench heads, for role units)",
             "head-gated probing: gate each head, role and role family off and measure the LM loss and the "
             "probes' accuracy, against random heads; the per-head passport",
             after=("heads", "prune"), sections=("gating",), figures="gating"),
    Analysis("amnesic", _A + "amnesic:AmnesicRunConfig", _amnesic, ("amnesic",),
             "workbench amnesic MODEL --out RUN_FOLDER",
             "amnesic probing: erase a property per layer (LEACE, INLP) and measure what the model loses, "
             "against random erasures of the same size",
             sections=("amnesic",), figures="amnesic"),
    Analysis("frozen_vs_finetuned", _A + "frozen_vs_finetuned:FvFConfig", _frozen_vs_finetuned,
             ("frozen_vs_finetuned",), "workbench frozen-vs-finetuned MODEL",
             "frozen features with a trained head vs full finetuning", sections=("compare",)),
    Analysis("emergence", _A + "emergence:EmergenceConfig", _emergence, ("emergence",),
             "workbench emergence RUN_FOLDER (a pretraining run with log-spaced checkpoints)",
             "probes and head scores over a pretraining run's log-spaced checkpoints",
             reads="pretraining_run", reads_tasks=True, sections=("emergence",), figures="emergence"),
    Analysis("pairs", _A + "minimal_pairs:PairsRunConfig", _pairs, ("minimal_pairs", "minimal_pair_items"),
             "workbench pairs MODEL --out RUN_FOLDER",
             "targeted syntactic evaluation: which sentence of each minimal pair (agreement, reflexives, NPIs; "
             "from UD and templates) the model prefers, beside its floors", sections=("pairs",)),
    Analysis("flow", _A + "flow:FlowRunConfig", _flow, ("flow_mi", "flow_lens", "flow_attribution"),
             "workbench flow MODEL --out RUN_FOLDER",
             "information flow: token identity per layer (Voita et al.), logit and tuned lens, attribution "
             "methods and their faithfulness, each beside its floor (docs/flow.md)",
             sections=("flow",), figures="flow"),
    Analysis("interventions", _A + "interventions:InterventionsConfig", _interventions,
             ("interventions", "interventions_attribution"), "workbench patch MODEL --out RUN_FOLDER",
             "causal mediation of subject-verb agreement: activation patching of every layer and head, "
             "attribution patching beside it, with floors (docs/interventions.md)",
             sections=("interventions",), figures="interventions"),
)
# name -> record, in the order `workbench run` runs them
ANALYSES: dict[str, Analysis] = {a.name: a for a in _RECORDS}


def analysis(name: str) -> Analysis:
    """The record of analysis `name`; an unknown name is a ValueError listing the known ones."""
    if name not in ANALYSES:
        raise ValueError(f"unknown analysis {name!r}; known: {', '.join(ANALYSES)}")
    return ANALYSES[name]
