"""Re-probe the first look's 15-minute checkpoints with standardised edge-probe inputs, beside the raw
probe's numbers (docs/objectives.md, "With standardised inputs").

The first look (objectives_first_look.py) probed raw vectors, as Tenney et al.'s probe does; a pre-LN
residual stream that grows with depth (T5) then read as lost information. This probes every final in
OUT/train again with `standardize=True`, same tasks, caps and seed (single and cumulative modes; the
stores are reused), and writes OUT/tables/first_look_standardized.parquet with both readings per
system, task and layer.

    PYTHONPATH=. python -m research.scripts.standardized_first_look runs/objectives [--systems bert,t5]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from research.scripts.objectives_first_look import PROBE, log
from workbench.analyses.probing import probe_model
from workbench.core.results import load_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--systems", default=None, help="comma-separated (default: every final in OUT/train)")
    args = ap.parse_args()
    finals = {p.parent.name: p for p in sorted((args.out / "train").glob("*/final")) if (p / "config.json").is_file()}
    if args.systems:
        finals = {k: v for k, v in finals.items() if k in args.systems.split(",")}
    raw = load_table(args.out, "first_look_probing")
    cfg = {**PROBE, "modes": ["single", "cumulative"], "standardize": True}
    rows = []
    for name, final in finals.items():
        log(f"probing {name} with standardised inputs")
        t = probe_model(final, out_dir=args.out / "standardized" / name, config=cfg, model_name=name,
                        store_root=args.out / "store", progress=False)["probing"]
        for reading, df in (("standardized", t), ("raw", raw[raw["model"] == name])):
            d = df[(df["seed"] == 0) & (df["mode"].isin(["single", "best"])) & (df["metric"] == "accuracy")]
            rows.append(d.assign(reading=reading)[["model", "task", "mode", "layer", "value", "ci_low", "ci_high",
                                                    "reading"]])
    out = pd.concat(rows, ignore_index=True)
    path = args.out / "tables" / "first_look_standardized.parquet"
    out.to_parquet(path, index=False)
    wide = out[out["mode"] == "single"].pivot_table(index=["model", "task", "layer"], columns="reading",
                                                    values="value")
    print(wide.round(3).to_string())
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
