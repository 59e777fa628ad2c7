"""Screen pretraining variants at a fixed number of steps, several at once, then probe UPOS per layer.

Why: a 60-minute run on a slow CPU reads a known number of tokens (7.3M for the decoder config on the
2-core AVX2 EPYC). The same steps with the lr schedule on the step axis (warmup and decay at the same
shares of the run as the config's clock schedule) can be trained anywhere, in fp32, and give the same
model up to floating-point order. On a GPU, several such runs train side by side in minutes, so a
variant can be screened with a few seeds before an hour of CPU is spent on it. Checked on the decoder
config (research/notebook.md, "Screening the EPYC hour on a GPU"): an H100 reproduced the EPYC hours' POS
gains within 0.05 point and their Gutenberg perplexity within 1%. In bf16 (`"bf16": "on"` in a run's
overrides, to replay an hour of a CPU with native bf16) the GPU and the CPU round differently and
a run parts ways with the hour of the same seed: a bf16 replay gives the spread over seeds, not a
given seed's hour (research/notebook.md, "Twelve seeds of the slower AMX hour").

Each run is `workbench pretrain CONFIG --out OUT/NAME --set ...` with `schedule_clock: "steps"`, no
time budget, fp32 (`bf16: "off"` unless the overrides say "on"), and the variant's overrides, which
must give `max_steps`; `warmup_steps` defaults to the config's warmup share of its own `max_steps`.
Runs sharing a tokenizer (`tokenizer_path`) tokenize the corpus once: the first builds the cache, the
others link it.
Then every run gets UPOS accuracy per layer (`research.ablate.pos_by_layer`, the probe of
`measure_variant`) with first- and last-subword vectors (`--poolings`). Results: OUT/screen.jsonl
(one line per run, appended as each finishes) and OUT/screen.parquet (tidy: run, tokens, pooling,
layer, accuracy).

The probes, not the training, bound a GPU screen: scikit-learn's fit takes ~16 s per layer and
pooling on two CPU threads, ~160 s per run, and eight at once on a 16-core GPU host did not finish
one run in four minutes. `--solver torch` fits the same objective on the GPU
(`probes.logreg.LogisticRegressionLBFGS`; per-layer accuracies within 0.16 point of
scikit-learn's on the EPYC decoder hours, research/notebook.md).

    python -m research.scripts.screen_equal_tokens decoder-mini-cram OUT \
        '{"b32_s0": {"max_steps": 1810, "seed": 0, "tokenizer_path": "runs/x/tokenizer"}, ...}'

`--measure full` measures each run as the CPU hours are measured instead (`measure_variant`: the
POS probe on first-subword vectors, the head analysis's det / case margins and positional shares,
the held-out accuracy), on 1,250 / 500 EWT sentences for the probe and 500 for the heads, and adds
the encoder targets met (`check_targets`). Results: OUT/screen.jsonl and OUT/screen.parquet (one
row per run). It replays hours whose head targets vary between seeds.

`--dry-run` trains 3 steps on 20 texts and probes 40/20 sentences: a check of the plumbing only.

On the lent GPU machines: their image has PyTorch, scikit-learn and pyarrow but no plotly, which
`--measure full` needs (the head analysis writes its figures); carry plotly's wheel. The data
travel in a git-ignored folder named by `WORKBENCH_DATA` (Gutenberg, EWT with train cut to its
first 3,000 sentences, WikiText-2 for the encoder's extra evaluation), the tokenizer as a carried
path. The device returns at most eight files from `$OUT`: copy OUT/screen.jsonl and
OUT/screen.parquet there and pack the runs' logs into one archive, not a file per run.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import torch
from threadpoolctl import threadpool_limits

import plmodels
from plmodels.checkpoint import read_card
from plmodels.training.config import read_config_file
from research.ablate import AblationEval, check_targets, measure_variant, pos_by_layer, training_summary
from workbench.core.io import write_parquet_atomic

WORKBENCH = [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())"]
FIXED = {"bf16": "off", "schedule_clock": "steps", "max_minutes": None, "ckpt_log_spaced": False,
         "ckpt_every": 0, "log_every": 100, "compile": False}
DRY = {"max_train_texts": 20, "eval_sequences": 8, "eval_every": 0}
POOLINGS = ("first", "last")  # word vectors the probe can read: first or last subword


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def run_settings(config: Path, overrides: dict, threads: int, dry: bool) -> dict:
    """The --set of one run: step schedule, fp32, the variant's overrides (max_steps required)."""

    if "max_steps" not in overrides:
        raise ValueError(f"every run needs max_steps, got {sorted(overrides)}")
    base = read_config_file(config)
    share = base.get("warmup_steps", 0) / base["max_steps"]
    out = {**FIXED, "num_threads": threads, "warmup_steps": round(share * overrides["max_steps"]), **overrides}
    return {**out, **DRY, "max_steps": 3, "warmup_steps": 1} if dry else out


def start(config: Path, out: Path, settings: dict, link_cache_from: Path | None) -> subprocess.Popen:
    """Launch one `workbench pretrain`; its output goes to out.log."""
    if link_cache_from is not None:
        (out / "cache").mkdir(parents=True, exist_ok=True)
        for f in (link_cache_from / "cache").iterdir():
            if not (out / "cache" / f.name).exists():
                os.link(f, out / "cache" / f.name)
    with open(out.with_suffix(".log"), "w") as fh:
        return subprocess.Popen(WORKBENCH + ["pretrain", str(config), "--out", str(out), "--set", json.dumps(settings)],
                                stdout=fh, stderr=subprocess.STDOUT)


def probe(run: str, threads: int, dry: bool, poolings: tuple[str, ...] = POOLINGS,
          solver: str = "sklearn") -> dict:
    """UPOS accuracy per layer for each pooling (first / last subword), and the run's last metrics."""


    torch.set_num_threads(threads)
    path = Path(run)
    model, tok = plmodels.load(path / "final")
    n_train, n_test = (40, 20) if dry else (1250, 500)
    ev = AblationEval(pos_train_sentences=n_train, pos_test_sentences=n_test)
    row = {"run": path.name, **training_summary(path)}
    with threadpool_limits(threads):
        for pooling in poolings:
            row[pooling] = pos_by_layer(model, tok, path / f"store-{pooling}", ev, pooling=pooling, solver=solver)
    metrics = read_card(path / "final").metrics
    row.update({k: v for k, v in metrics.items() if k.endswith(("_ppl", "_loss"))})
    return row


def measure(run: str, threads: int, dry: bool, solver: str = "sklearn") -> dict:
    """The row of `measure_variant` for one run (POS probe, heads, held-out metrics), plus
    `targets_met` out of the encoder targets for an encoder."""


    torch.set_num_threads(threads)
    path = Path(run)
    n_train, n_test, n_heads = (40, 20, 20) if dry else (1250, 500, 500)
    ev = AblationEval(pos_train_sentences=n_train, pos_test_sentences=n_test, head_sentences=n_heads)
    with threadpool_limits(threads):
        row = {"run": path.name, **measure_variant(path.name, path / "final", ev, {}, solver=solver)}
    if "model_ppl" not in row:  # an encoder: the five targets
        row["targets_met"] = int(check_targets(row)["passed"].sum())
    return row


def summary_line(row: dict, poolings: tuple[str, ...], full: bool) -> str:
    """The log line of a measured run: POS gains per pooling, or (full) the five target measures."""
    if not full:
        return "POS gain " + " ".join(f"{p} {100 * (max(row[p].values()) - row[p][0]):+.2f}" for p in poolings)
    pct = lambda k: f"{100 * float(row.get(k, float('nan'))):.1f}"  # noqa: E731
    line = (f"acc {pct('eval_acc')} POS gain {100 * row['pos_gain']:+.2f} ±1 tokens {pct('positional_max_tokens')} "
            f"det {100 * row['det_margin']:+.1f} case {100 * row['case_margin']:+.1f}")
    return line + (f" targets {row['targets_met']}/5" if "targets_met" in row else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", help='JSON object: run name -> overrides (with "max_steps")')
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per training run and per probe")
    ap.add_argument("--probes", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="probes run at once")
    ap.add_argument("--poolings", default="first,last", help="word vectors probed: first,last or one of them")
    ap.add_argument("--solver", choices=("sklearn", "torch"), default="sklearn",
                    help="probe fit: scikit-learn's lbfgs on CPU (measure_variant's) or the same objective in torch, "
                         "on CUDA when available")
    ap.add_argument("--measure", choices=("pos", "full"), default="pos",
                    help="pos: the POS probe per layer and pooling; full: measure_variant's row (POS, heads, "
                         "held-out accuracy) and the encoder targets met")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    poolings = tuple(p for p in a.poolings.split(",") if p)
    if not poolings or not set(poolings) <= set(POOLINGS):
        ap.error(f"--poolings: expected first, last or first,last, got {a.poolings!r}")
    runs = json.loads(a.runs)
    a.out.mkdir(parents=True, exist_ok=True)
    settings = {name: run_settings(a.config, over, a.threads, a.dry_run) for name, over in runs.items()}
    # one 1-step run per tokenizer builds its token cache; the runs then link to it
    caches: dict[str, Path] = {}
    for name, s in settings.items():
        tok = s.get("tokenizer_path")
        if tok is not None and tok not in caches:
            caches[tok] = a.out / f"_cache{len(caches)}"
            p = start(a.config, caches[tok], {**s, "max_steps": 1, "warmup_steps": 0, "eval_every": 0}, None)
            if p.wait() != 0:
                raise SystemExit(f"building the token cache failed; see {caches[tok]}.log")
            log("token cache for", tok)
    procs = {name: start(a.config, a.out / name, s, caches.get(s.get("tokenizer_path"))) for name, s in settings.items()}
    rows: list[dict] = []
    full = a.measure == "full"
    if full:  # per-run worker and table writer, chosen once
        work, write = functools.partial(measure, threads=a.threads, dry=a.dry_run, solver=a.solver), write_rows
    else:
        work = functools.partial(probe, threads=a.threads, dry=a.dry_run, poolings=poolings, solver=a.solver)
        write = functools.partial(write_table, poolings=poolings)
    ctx = multiprocessing.get_context("spawn")  # no fork after torch has started threads
    with ProcessPoolExecutor(max_workers=a.probes, mp_context=ctx) as pool:
        futures, probed = {}, set()
        while len(rows) < len(procs):
            for name, p in procs.items():
                if name in futures or p.poll() is None:
                    continue
                if p.returncode != 0:
                    raise SystemExit(f"run {name} failed (rc {p.returncode}); see {a.out / name}.log")
                log("trained", name)
                futures[name] = pool.submit(work, str(a.out / name))
            for name in [n for n, f in futures.items() if f.done() and n not in probed]:
                probed.add(name)
                row = futures[name].result()
                rows.append(row)
                log("measured" if full else "probed", name, summary_line(row, poolings, full))
                with open(a.out / "screen.jsonl", "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row, default=float) + "\n")
            time.sleep(2)
    write(rows, a.out / "screen.parquet")
    return 0


def write_table(rows: list[dict], path: Path, poolings: tuple[str, ...] = POOLINGS) -> None:
    """Tidy table: one row per run, pooling and layer (written to a temp file, then renamed)."""


    tidy = [{"run": r["run"], "tokens": r["tokens"], "pooling": p, "layer": int(layer), "accuracy": acc}
            for r in rows for p in poolings for layer, acc in r[p].items()]
    write_parquet_atomic(pd.DataFrame(tidy), path, index=False)


def write_rows(rows: list[dict], path: Path) -> None:
    """`--measure full`: one row per run with measure_variant's columns (temp file, then rename)."""


    write_parquet_atomic(pd.DataFrame(rows).sort_values("run"), path, index=False)


if __name__ == "__main__":
    raise SystemExit(main())
