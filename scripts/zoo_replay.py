"""Replay a zoo on a GPU machine with many more pretraining seeds, the same configs.

A zoo on this CPU gives every checkpoint the same wall-clock budget; a GPU would run many more steps
in those minutes and train other models. So the replay fixes each system's number of updates to what
the CPU zoo reached (the median over its seeds, from `zoo_training`), with the schedule counted in
steps, and trains the seeds it is given; everything else (recipes, shared training settings,
analyses) is the config's. The tokenizer of the CPU run is reused when its run folder is given, so
the replay's models read the same tokens.

    python scripts/zoo_replay.py configs/zoo.json --cpu-run runs/zoo --seeds 0-24 [--run-dir runs/zoo-gpu] [--dry-run]

Analyses run where the workbench runs them (pretraining picks the GPU by itself). The replay's
tables hold more seeds per system; its multi-bootstrap intervals are the procedure-level ones the
CPU zoo can only approximate with its few seeds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.core.results import load_table
from workbench.zoo import ZooConfig, expand_zoo, load_zoo, run_zoo, step_budget_overrides


def seeds_arg(text: str) -> list[int]:
    """'0-24' or '0,1,5' -> the seeds."""
    if "-" in text:
        a, b = text.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",") if s]


def replay_overrides(cpu_run: Path, zoo: ZooConfig) -> dict:
    """`workbench.zoo.step_budget_overrides` with each system's median steps in the CPU zoo's
    zoo_training table (max_steps, the schedule in steps with the CPU run's warmup share, no time
    limit); a system the CPU run lacks is an error naming it."""
    training = load_table(cpu_run, "zoo_training")
    if training is None:
        raise FileNotFoundError(f"{cpu_run}/tables/zoo_training.parquet is missing: run the CPU zoo first")
    steps = training.groupby("system")["steps"].median()
    missing = [s for s in zoo.systems if s not in steps.index]
    if missing:
        raise ValueError(f"{cpu_run}: the CPU zoo has no checkpoints of {missing}")
    return step_budget_overrides(zoo, {s: int(steps[s]) for s in zoo.systems})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--cpu-run", type=Path, required=True, help="the finished CPU zoo's run folder")
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-24"))
    ap.add_argument("--run-dir", type=Path, default=None, help="default: <results_root>/<name>-gpu")
    ap.add_argument("--dry-run", action="store_true", help="print the models and their step counts only")
    a = ap.parse_args()
    zoo = load_zoo(a.config)
    over = replay_overrides(a.cpu_run, zoo)
    over.update({"seeds": a.seeds, "name": f"{zoo.name}-gpu"})
    first = next(iter(expand_zoo(zoo)["models"]))  # the model whose tokenizer every other one reads
    tokenizer = a.cpu_run / "models" / first / "tokenizer"
    if tokenizer.is_dir():  # the same tokens as the CPU zoo
        system = first.rsplit("-s", 1)[0]
        over["systems"][system]["overrides"]["tokenizer_path"] = str(tokenizer.resolve())
    cfg = expand_zoo(load_zoo(a.config, over))
    if a.dry_run:
        print(json.dumps({m: spec["overrides"]["max_steps"] for m, spec in cfg["models"].items()}, indent=1))
        return
    run_dir = a.run_dir or Path(zoo.results_root) / f"{zoo.name}-gpu"
    run_zoo(a.config, run_dir=run_dir, overrides=over)


if __name__ == "__main__":
    main()
