"""Fix a zoo's budget in updates: measure each system's update rate on this CPU and write the config
with the number of updates its wall-clock budget buys here.

A zoo gives every checkpoint the same wall-clock minutes on one CPU. A study longer than a session
(configs/zoo.json: about 20 hours) runs over sessions, and the CPU can differ between them: the
same 15 minutes would then train different models in different sessions. This trains the first seed
of each system for `--seconds` with the zoo's own settings and tokenizer, reads its rate over the
second half of that run (after warm-up and any compilation) from its metrics.jsonl, and writes the
config with each system's updates fixed to rate x budget (`workbench.zoo.step_budget_overrides`:
the schedule counted in steps with the same warmup share, no time limit) and the measurement under
`calibration`. The rate leaves out the periodic evaluations, so on this CPU the fixed updates take
a little longer than the budget.

    python scripts/zoo_calibrate.py configs/zoo.json [--seconds 120] [--out configs/zoo-steps.json]
    workbench zoo configs/zoo-steps.json --run-dir runs/zoo
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # meta: the CPU and commit a measurement ran on
from meta import begin  # noqa: E402

from plmodels.config import merge, read_json_object  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.pipeline import run_pipeline  # noqa: E402
from workbench.zoo import expand_zoo, load_zoo, step_budget_overrides  # noqa: E402

ANALYSES = ("probe", "heads", "cross_heads", "prune", "frozen_vs_finetuned", "emergence", "zoo", "report")


def update_rate(metrics: Path, seconds: float) -> float:
    """Updates per second over the second half of a training run, from its metrics.jsonl train rows."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("split") == "train" and r["time"] >= seconds / 2]
    if len(rows) < 2 or rows[-1]["time"] <= rows[0]["time"]:
        raise ValueError(f"{metrics}: too few training rows after {seconds / 2:.0f} s to read a rate "
                         "(give --seconds more time)")
    return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time"] - rows[0]["time"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--seconds", type=float, default=120.0, help="training time per system for the measurement")
    ap.add_argument("--run-dir", type=Path, default=None, help="default: <results_root>/<name>-calibration")
    ap.add_argument("--out", type=Path, default=None, help="default: the config's folder, <stem>-steps.json")
    a = ap.parse_args()
    meta = begin()
    zoo = load_zoo(a.config)
    short = load_zoo(a.config, {"seeds": [zoo.seeds[0]], "budget_minutes": a.seconds / 60,
                                "training": {"eval_every": 0, "ckpt_log_spaced": False}})
    cfg = {k: v for k, v in expand_zoo(short).items() if k not in ANALYSES}
    cfg["tasks"] = {"tasks": ["pos"]}
    run_dir = a.run_dir or Path(zoo.results_root) / f"{zoo.name}-calibration"
    run_pipeline(cfg, run_dir=run_dir)
    rates = {system: update_rate(run_dir / "models" / f"{system}-s{zoo.seeds[0]}" / "metrics.jsonl", a.seconds)
             for system in zoo.systems}
    steps = {system: int(round(rate * zoo.budget_minutes * 60)) for system, rate in rates.items()}
    over = step_budget_overrides(zoo, steps)
    over["calibration"] = {"budget_minutes": zoo.budget_minutes, "seconds_measured": a.seconds,
                           "updates_per_second": {s: round(r, 4) for s, r in rates.items()}, "steps": steps,
                           "source": str(a.config), "command": meta["command"], "commit": meta["commit"],
                           "date": meta["date"], "cpu": meta["cpu"], "torch": meta["torch"]}
    out = a.out or a.config.with_name(f"{a.config.stem}-steps.json")
    atomic_write_json(out, merge(read_json_object(a.config), over))
    load_zoo(out)  # the written config is a valid zoo
    for system in zoo.systems:
        print(f"{system:18s} {rates[system]:7.3f} updates/s -> {steps[system]:6d} updates in "
              f"{zoo.budget_minutes:g} min")
    print(f"wrote {out}; run the study with: workbench zoo {out} --run-dir {Path(zoo.results_root) / zoo.name}")


if __name__ == "__main__":
    main()
