"""`workbench zoo configs/zoo.json`: models that differ only in their pretraining objective, with
pretraining seeds, and every analysis on every checkpoint, as one cached, resumable study.

A zoo config names systems (a shipped pretraining recipe each, e.g. `bert-mini`, `electra-mini`,
`t5-mini`, and arms that change one architecture field, e.g. BERT with learned positions), the
pretraining seeds, one wall-clock budget per checkpoint, the training settings they share and each
task's primary statistic (the family whose claims Holm's correction controls); `expand_zoo` turns it into the run config of an ordinary study (workbench/pipeline.py)
with one model "<system>-s<seed>" per system and seed:

- every trained model reads the tokenizer (and the token cache) of the first trained system's first
  seed (`tokenizer_from`), so all of them see the same tokens; DistilBERT-like systems name a `teacher`
  system and distil its checkpoint of the same seed (`teacher_from`);
- probing runs on every model with per-item results kept (`keep_items`), the head analysis and
  importance / pruning on every model that has heads (not ELMo's LSTMs), the cross-attention heads of
  the encoder-decoders, frozen vs finetuned, emergence, minimal pairs, the flow suite (docs/flow.md) and
  the agreement interventions on the models with an agreement view (docs/interventions.md) where the
  config asks for them, and every model's competence (held-out LM loss beside unigram and bigram losses);
- then the zoo's own steps (workbench/analyses/zoo.py): `zoo:training` (steps, tokens, FLOPs of
  each checkpoint), `zoo:cka` (CKA between every two checkpoints' layers) and `zoo:stats` (every
  cross-system number with a multi-bootstrap interval over seeds x items), and the report.

A system may instead be an imported suite of checkpoints, MultiBERTs' (Sellam et al. 2022) or
Pythia's (Biderman et al. 2023) seeds x steps: {"imported": a folder pattern naming {seed} and {step},
"seeds": [...], "steps": [...], "tokens_per_step": n}. Each of its seeds is one model whose steps are
imported once into a pretraining run folder (`workbench.analyses.zoo.import_suite`, provenance on every
card), analysed at its last step like a trained checkpoint, with the multi-bootstrap over the suite's
own seeds and emergence over its steps; it keeps its own tokenizer. Every folder is checked before the
run starts (`check_suite`).

The run is the pipeline's: each step is cached by its config and upstream keys, a killed zoo resumes
where it stopped (pretraining from its last checkpoint), and the log gives each step's progress with
an estimate of the time left for the whole study.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from plmodels import recipes
from plmodels.config import Config, merge, read_json_object
from plmodels.families import family
from plmodels.hf.registry import HF_KINDS, supported_type
from plmodels.training.config import AUTO_OBJECTIVE, PretrainConfig, read_config_file
from plmodels.training.objectives import OBJECTIVES
from workbench.analyses.interventions import intervention_kinds
from workbench.analyses.probing import RECORDS_OF, STRUCTURAL_TASKS
from workbench.analyses.zoo import PRIMARY_STATISTICS, model_name
from workbench.pipeline import NO_TIME_LIMIT, check_pretrain_spec, run_pipeline

@dataclass(frozen=True)
class ZooConfig(Config):
    """A zoo study (configs/zoo.json, configs/zoo-small.json); unknown keys are errors naming the file."""

    name: str                                   # the run folder's name under results_root
    # system -> {"recipe": name, "overrides": {...}, "teacher": system} (trained here), or an imported suite
    # {"imported": "<folder pattern with {seed} and {step}>", "seeds": [...], "steps": [...], "tokens_per_step": n}
    systems: dict[str, dict]
    seeds: tuple[int, ...] = (0, 1)             # pretraining seeds of every trained system
    budget_minutes: float = 15.0                # wall-clock pretraining budget per checkpoint
    training: dict = field(default_factory=dict)  # pretraining overrides shared by every system
    results_root: str = "runs"
    tasks: tuple[str, ...] = ("pos", "deps", "ner")   # probing tasks (edge and structural) built and probed
    probe: dict = field(default_factory=dict)   # ProbeRunConfig fields (keep_items is set)
    heads: dict | None = field(default_factory=dict)   # HeadRunConfig fields; None: no head analysis
    prune: dict | None = None                   # {"methods": [...], "config": {...}}
    cross_heads: dict | None = field(default_factory=dict)  # analyse_cross_heads arguments (T5, BART); None: none
    frozen_vs_finetuned: dict | None = None     # FvFConfig fields
    emergence: dict | None = None               # emergence config (needs log-spaced checkpoints)
    pairs: dict | None = None                   # PairsRunConfig fields: minimal pairs on every model; None: none
    flow: dict | None = None                    # FlowRunConfig fields: the flow suite on every model; None: none
    # InterventionsConfig fields: agreement mediation on the models with an agreement view; None: none
    interventions: dict | None = None
    cka: dict | None = field(default_factory=dict)   # {"sentences": 500, "max_words": 40}; None: none
    stats: dict = field(default_factory=dict)   # {"n_boot": 1000, "seed": 0}
    # task -> the statistic its comparisons are judged on (PRIMARY_STATISTICS; a task not named:
    # "best_layer_score"); the family whose claims Holm's correction controls (docs/zoo.md)
    primary: dict[str, str] = field(default_factory=dict)
    # where a config's step budgets came from (scripts/zoo_calibrate.py: CPU, rates); not read by the run
    calibration: dict | None = None
    # steps run at once (the run config's `workers`, docs/design.md "Runs"); above 1 only with budgets in
    # updates (budget_minutes = NO_TIME_LIMIT): checkpoints trained at once share the CPU, so a wall-clock
    # budget would buy each fewer updates than the same zoo run one step at a time
    workers: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if not self.systems:
            raise ValueError("ZooConfig.systems: name at least one system")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"ZooConfig.seeds must be distinct and non-empty, got {list(self.seeds)}")
        if self.budget_minutes <= 0:
            raise ValueError(f"ZooConfig.budget_minutes must be > 0, got {self.budget_minutes}")
        if self.workers < 1:
            raise ValueError(f"ZooConfig.workers must be >= 1, got {self.workers}")
        if self.workers > 1 and self.trained and self.budget_minutes < NO_TIME_LIMIT:
            raise ValueError(f"ZooConfig.workers={self.workers} needs budgets in updates (budget_minutes = "
                             f"{NO_TIME_LIMIT:g} and max_steps per system, as configs/zoo-steps.json): with a "
                             f"wall-clock budget of {self.budget_minutes:g} min, checkpoints trained at once would "
                             f"each get fewer updates")
        for system, spec in self.systems.items():
            if "imported" in spec:
                check_imported_spec(system, spec)
                continue
            unknown = set(spec) - {"recipe", "overrides", "teacher"}
            if "recipe" not in spec or unknown:
                raise ValueError(f"ZooConfig.systems.{system}: needs 'recipe' (and optionally 'overrides', 'teacher') "
                                 f"or 'imported' (with 'seeds', 'steps'); unknown keys {sorted(unknown)}")
            teacher = spec.get("teacher")
            if teacher is not None and teacher not in self.systems:
                raise ValueError(f"ZooConfig.systems.{system}.teacher={teacher!r} is not a system of the zoo")
            if teacher is not None and "imported" in self.systems[teacher]:
                raise ValueError(f"ZooConfig.systems.{system}.teacher={teacher!r} is an imported suite; a teacher is "
                                 "a system the zoo trains (its checkpoint of the same seed)")
        self._check_primary()

    def seeds_of(self, system: str) -> tuple[int, ...]:
        """The seeds of a system: an imported suite's own, else the zoo's."""
        spec = self.systems[system]
        return tuple(spec["seeds"]) if "imported" in spec else self.seeds

    @property
    def trained(self) -> list[str]:
        """The systems the zoo pretrains (not imported suites), in config order."""
        return [s for s, spec in self.systems.items() if "imported" not in spec]

    def _check_primary(self) -> None:
        for task, statistic in self.primary.items():
            if task not in self.tasks:
                raise ValueError(f"ZooConfig.primary.{task}: not one of the zoo's tasks {list(self.tasks)}")
            if statistic not in PRIMARY_STATISTICS:
                raise ValueError(f"ZooConfig.primary.{task}={statistic!r}: choose one of {list(PRIMARY_STATISTICS)}")
            if statistic == "e_delta" and task in STRUCTURAL_TASKS:
                raise ValueError(f"ZooConfig.primary.{task}: a structural probe has no cumulative probes, "
                                 "so no e_delta")


IMPORTED_KEYS = ("imported", "seeds", "steps", "tokens_per_step")


def check_imported_spec(system: str, spec: dict) -> None:
    """An imported suite's entry, before any file is read: a folder pattern naming {seed} (and {step}
    exactly when the suite lists steps), distinct integer seeds and steps, a positive tokens_per_step;
    a ValueError naming the system and the field otherwise."""
    where = f"ZooConfig.systems.{system}"
    unknown = sorted(set(spec) - set(IMPORTED_KEYS))
    if unknown:
        raise ValueError(f"{where}: an imported suite takes {list(IMPORTED_KEYS)}; unknown keys {unknown}")
    pattern = spec["imported"]
    if not isinstance(pattern, str) or "{seed}" not in pattern:
        raise ValueError(f"{where}.imported={pattern!r}: the folder pattern must name {{seed}} "
                         "(e.g. \"multiberts/seed_{seed}/step_{step}k\")")
    try:
        pattern.format(seed=0, step=0)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{where}.imported={pattern!r}: only {{seed}} and {{step}} may be named ({e!r})") from None
    for key in ("seeds", "steps"):
        values = spec.get(key)
        if values is None and key == "steps":
            continue
        if (not isinstance(values, list) or not values or len(set(values)) != len(values)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)):
            raise ValueError(f"{where}.{key}: a non-empty list of distinct integers >= 0, got {values!r}")
    if ("{step}" in pattern) != ("steps" in spec):
        raise ValueError(f"{where}: the pattern {pattern!r} " + ("names {step} but the suite lists no 'steps'"
                         if "{step}" in pattern else "does not name {step} but the suite lists 'steps'"))
    tps = spec.get("tokens_per_step", 1)
    if not isinstance(tps, int) or isinstance(tps, bool) or tps < 1:
        raise ValueError(f"{where}.tokens_per_step: a positive integer, got {tps!r}")


def system_recipe(spec: dict, training: dict | None = None) -> dict:
    """A system's pretraining config as a dict: its recipe file, the zoo's shared `training`, then
    the system's own overrides (a distillation recipe is only complete once its teacher exists)."""
    return merge(read_config_file(recipes.find("pretrain", spec["recipe"])),
                 merge(training or {}, spec.get("overrides", {})))


def suite_folders(spec: dict, seed: int) -> list[tuple[int | None, Path]]:
    """(step, folder) of every checkpoint of one seed of an imported suite, by step ([(None, folder)]
    for a suite without steps); relative patterns are read from the working directory."""
    steps = sorted(spec["steps"]) if "steps" in spec else [None]
    return [(step, Path(spec["imported"].format(seed=seed, step=step)).expanduser().absolute()) for step in steps]


def trains_lm_head(recipe: dict, kind: str) -> bool:
    """Whether the model a pretraining config trains has a trained LM head, by its objective's record
    (`Objective.lm_head_trained`, the rule the checkpoint's card states): False for ELECTRA's
    discriminator."""
    objective = recipe.get("objective", "auto")
    name = AUTO_OBJECTIVE.get(kind) if objective == "auto" else objective
    return name not in OBJECTIVES or OBJECTIVES[name].lm_head_trained   # (a bad name: the config check's error)


def system_kind(spec: dict) -> str:
    """The model kind a system trains (encoder, decoder, bilm, tbilm, seq2seq, xlnet), or an imported
    suite's, from its first folder's config.json (`plmodels.hf.registry.HF_KINDS`)."""
    if "imported" in spec:
        step, folder = suite_folders(spec, spec["seeds"][0])[0]
        return HF_KINDS[supported_type(folder)]
    return system_recipe(spec).get("kind", "encoder")


def _imported_entry(spec: dict, seed: int) -> dict:
    """A model entry of the run config for one seed of an imported suite: its last folder as the
    model ("import"), every folder as a checkpoint of the suite ("suite"; workbench/analyses/zoo.py:
    `import_suite`)."""
    folders = suite_folders(spec, seed)
    return {"import": str(folders[-1][1]),
            "suite": {"seed": seed, "checkpoints": [[step, str(folder)] for step, folder in folders],
                      "tokens_per_step": spec.get("tokens_per_step", 1)}}


def expand_zoo(zoo: ZooConfig) -> dict:
    """The run config of the study a zoo config describes (module docstring)."""
    systems = list(zoo.systems)
    # a teacher trains before its students
    systems.sort(key=lambda s: zoo.systems[s].get("teacher") is not None)
    trained = [s for s in systems if s in zoo.trained]
    first = model_name(trained[0], zoo.seeds[0]) if trained else None
    models, with_heads, seq2seq, prunable, agreement = {}, [], [], [], []
    for system in systems:
        spec = zoo.systems[system]
        kind = system_kind(spec)
        has_heads = family(kind).head_mask  # no attention heads (ELMo's LSTM): no head analysis or pruning
        # an encoder-decoder's pruning loss and cross-attention alignments replay the denoising objective
        # its card names (workbench.analyses.cross_heads.denoising_objective): an imported one has none
        replays = "imported" in spec and family(kind).cross_attention
        # pruning scores heads by the LM loss: a system whose objective leaves the analysed model's LM
        # head untrained (ELECTRA's discriminator) is not pruned (workbench.analyses.prune refuses it)
        lm_head = "imported" in spec or trains_lm_head(system_recipe(spec, zoo.training), kind)
        for seed in zoo.seeds_of(system):
            name = model_name(system, seed)
            if "imported" in spec:   # its own tokenizer: the suite's
                models[name] = _imported_entry(spec, seed)
            else:
                overrides = merge(merge(zoo.training, spec.get("overrides", {})),
                                  {"max_minutes": zoo.budget_minutes, "seed": seed, "name": name})
                entry = {"pretrain": spec["recipe"], "overrides": overrides}
                if name != first:
                    entry["tokenizer_from"] = first
                if spec.get("teacher"):
                    entry["teacher_from"] = model_name(spec["teacher"], seed)
                models[name] = entry
            if has_heads:
                with_heads.append(name)
                if not replays and lm_head:
                    prunable.append(name)
            if family(kind).cross_attention and not replays:  # an encoder-decoder: its cross-attention heads too
                seq2seq.append(name)
            if kind in intervention_kinds():  # an agreement view (a decoder's or a masked LM's)
                agreement.append(name)
    names = list(models)
    cfg: dict = {"name": zoo.name, "seed": zoo.seeds[0], "results_root": zoo.results_root, "workers": zoo.workers,
                 "models": models,
                 "tasks": {"tasks": list(dict.fromkeys(RECORDS_OF.get(t, t) for t in zoo.tasks))},
                 "probe": {"models": names, "tasks": list(zoo.tasks), "config": {**zoo.probe, "keep_items": True}},
                 "competence": {},
                 "zoo": {"systems": {s: list(zoo.seeds_of(s)) for s in systems}, "cka": zoo.cka, "stats": zoo.stats,
                         "primary": zoo.primary},
                 "report": {}}
    if zoo.heads is not None and with_heads:
        cfg["heads"] = {"models": with_heads, "config": zoo.heads}
    if zoo.cross_heads is not None and seq2seq:
        cfg["cross_heads"] = {"models": seq2seq, "config": zoo.cross_heads}
    if zoo.prune is not None and prunable:
        cfg["prune"] = {"models": prunable, "methods": list(zoo.prune.get("methods", ["michel", "random"])),
                        "config": zoo.prune.get("config", {})}
    if zoo.frozen_vs_finetuned is not None:
        cfg["frozen_vs_finetuned"] = {"models": names, "config": zoo.frozen_vs_finetuned}
    if zoo.emergence is not None:
        cfg["emergence"] = {"models": names, "config": zoo.emergence}
    if zoo.pairs is not None:
        cfg["pairs"] = {"models": names, "config": zoo.pairs}
    if zoo.flow is not None:
        cfg["flow"] = {"models": names, "config": zoo.flow}
    if zoo.interventions is not None and agreement:
        cfg["interventions"] = {"models": agreement, "config": zoo.interventions}
    return cfg


def step_budget_overrides(zoo: ZooConfig, steps: Mapping[str, int]) -> dict:
    """Overrides that give each system a fixed number of updates instead of the wall-clock budget,
    so that a study can run on other machines (or over sessions on CPUs that differ) and train the
    same models: `max_steps` = steps[system], the schedule counted in steps with its warmup the same
    share of the run as under the wall-clock schedule (warmup_steps / max_steps of the system's
    resolved config: the time clock maps the budget's used share onto max_steps), and no time limit.
    A system missing from `steps` is a ValueError naming it."""
    missing = [s for s in zoo.trained if s not in steps]
    if missing:
        raise ValueError(f"no step count for the systems {missing}")
    out = {}
    for system in zoo.trained:
        spec = zoo.systems[system]
        resolved = system_recipe(spec, zoo.training)
        share = (resolved.get("warmup_steps", PretrainConfig.warmup_steps)
                 / resolved.get("max_steps", PretrainConfig.max_steps))
        n = int(steps[system])
        out[system] = {"overrides": {"max_steps": n, "schedule_clock": "steps",
                                     "warmup_steps": max(1, round(share * n))}}
    return {"systems": out, "budget_minutes": NO_TIME_LIMIT}


def load_zoo(path: str | Path, overrides: dict | None = None) -> ZooConfig:
    return ZooConfig.from_dict(merge(read_json_object(path), overrides), str(path))


def check_systems(zoo: ZooConfig, source: str) -> None:
    """Before anything runs: every trained system's recipe exists and its pretraining config (recipe,
    the zoo's `training`, the system's overrides, the budget) type-checks, its model config included
    (pipeline.check_pretrain_spec); every folder of an imported suite exists and holds a Hugging Face
    checkpoint of a family with an importer (`check_suite`). Errors name the zoo file and the system."""
    for system, spec in zoo.systems.items():
        where = f"{source}: systems.{system}"
        if "imported" in spec:
            check_suite(spec, where)
            continue
        try:
            recipes.find("pretrain", spec["recipe"])
        except FileNotFoundError:
            raise FileNotFoundError(f"{where}.recipe: no pretraining recipe named {spec['recipe']!r}; "
                                    f"known: {', '.join(recipes.names('pretrain'))}") from None
        overrides = merge(merge(zoo.training, spec.get("overrides", {})),
                          {"max_minutes": zoo.budget_minutes, "seed": zoo.seeds[0]})
        check_pretrain_spec(spec["recipe"], overrides, where, teacher_later=spec.get("teacher") is not None)


def check_suite(spec: dict, where: str) -> None:
    """Every (seed, step) folder of an imported suite is a folder with a config.json whose model_type
    has an importer, and every folder is of one kind; the first that is not is a FileNotFoundError or
    ValueError naming `where`, the field, the seed, the step and the path."""
    kinds = set()
    for seed in spec["seeds"]:
        for step, folder in suite_folders(spec, seed):
            at = f"{where}.imported: {folder} (seed {seed}" + (f", step {step})" if step is not None else ")")
            if not folder.is_dir():
                raise FileNotFoundError(f"{at} does not exist")
            try:
                kinds.add(HF_KINDS[supported_type(folder)])
            except (FileNotFoundError, ValueError) as e:
                raise type(e)(f"{at}: {e}") from None
    if len(kinds) > 1:
        raise ValueError(f"{where}.imported: the suite's folders hold models of several kinds {sorted(kinds)}")


def run_zoo(path: str | Path, run_dir: str | Path | None = None, force: bool = False,
            overrides: dict | None = None, runner: Callable[..., None] | None = None,
            rerun: Sequence[str] = ()) -> Path:
    """Run (or resume) the zoo study of the config at `path`; returns the run folder. Every system
    is checked first (`check_systems`). `runner`: the pipeline's (`run_pipeline`), e.g. an engine's
    (workbench/engine.py, `dask_runner`: the steps spread over a Dask cluster); `rerun`: the steps to
    run again whatever the cache says, with their readers (`pipeline.rerun_steps`)."""
    zoo = load_zoo(path, overrides)
    check_systems(zoo, str(path))
    return run_pipeline(expand_zoo(zoo), run_dir=run_dir, force=force, config_path=str(path),
                        runner=runner, rerun=rerun)
