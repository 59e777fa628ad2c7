"""Benchmark the Streamlit app: seconds from a page switch to its Plotly figures in the browser.

Builds the results fixture with a 12-layer x 12-head model (tests/apps/fixtures.py), serves the app
with `streamlit run` on 127.0.0.1 (headless, no usage stats), and drives headless Chromium over the
DevTools protocol (tests/apps/browser.py): load the first page, then click through every page in the
sidebar `--rounds` times. Round 0 is cold (imports, caches filling, spaCy and the model loading);
later rounds are warm page switches, the number the app is held to (target: < 2 s per page).

Prints a table and writes benchmarks/results/app.json.
Run: python benchmarks/bench_app.py [--rounds 3] [--layers 12 --heads 12]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from meta import begin, write_result

from tests.apps.browser import streamlit_server, visit_all
from tests.apps.fixtures import make_results_fixture

TARGET_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "app.json")
    a = ap.parse_args()
    meta = begin()
    with tempfile.TemporaryDirectory() as tmp:
        make_results_fixture(tmp, n_layers=a.layers, n_heads=a.heads, checkpoints=True)
        with streamlit_server(Path(tmp)) as url:
            visits = visit_all(url, rounds=a.rounds, timeout=180)
    pages = list(dict.fromkeys(v["path"] for v in visits))
    rows = []
    for p in pages:
        cold = [v["seconds"] for v in visits if v["path"] == p and v["round"] == 0]
        warm = [v["seconds"] for v in visits if v["path"] == p and v["round"] > 0]
        rows.append({"page": p, "cold_s": round(cold[0], 3), "warm_median_s": round(statistics.median(warm), 3) if warm else None,
                     "warm_max_s": round(max(warm), 3) if warm else None,
                     "plots": max(v["plots"] for v in visits if v["path"] == p),
                     "exceptions": sum(v["exceptions"] for v in visits if v["path"] == p)})
    print(f"{'page':<12}{'cold s':>8}{'warm med s':>12}{'warm max s':>12}{'plots':>7}")
    for r in rows:
        print(f"{r['page']:<12}{r['cold_s']:>8.2f}{r['warm_median_s'] or 0:>12.2f}{r['warm_max_s'] or 0:>12.2f}{r['plots']:>7}")
    worst = max((r["warm_max_s"] or 0) for r in rows)
    print(f"worst warm page switch: {worst:.2f} s (target < {TARGET_S} s): {'OK' if worst < TARGET_S else 'SLOW'}")
    write_result(a.out, {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "layers": a.layers, "heads": a.heads,
        "rounds": a.rounds, "target_s": TARGET_S, "worst_warm_s": worst, "pages": rows}, meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
