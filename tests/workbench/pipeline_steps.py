"""Stand-in steps for the tests of `workbench.pipeline.run_steps_parallel`: `build(cfg)` makes one step per
entry of cfg["fake"] ({name: {"after": [...], "sleep": s, "fail": message | None, "alone": bool}}). Each step records
its process id in <run_dir>/<name>.pid when it starts, and in <run_dir>/<name>.json when it started and ended, its process id, its torch thread count and its BLAS/OpenMP pools' thread counts, sleeps,
then fails with ValueError(message) or returns {"slept": s}. A module-level function, so that a step's
process (a forkserver child) can find it by reference."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from threadpoolctl import threadpool_info

from workbench.pipeline import Context, Step


def _fn(name: str, spec: dict):
    def fn(ctx: Context) -> dict:
        t0 = time.time()
        (Path(ctx.run_dir) / f"{name}.pid").write_text(str(os.getpid()))
        time.sleep(spec.get("sleep", 0.0))
        blas = {p["num_threads"] for p in threadpool_info()}
        record = {"start": t0, "end": time.time(), "pid": os.getpid(), "threads": torch.get_num_threads(),
                  "blas_threads": sorted(blas)}
        (Path(ctx.run_dir) / f"{name}.json").write_text(json.dumps(record))
        if spec.get("fail"):
            raise ValueError(spec["fail"])
        return {"slept": spec.get("sleep", 0.0)}
    return fn


def build(cfg: dict) -> list[Step]:
    return [Step(name, spec, _fn(name, spec), after=list(spec.get("after", [])), alone=spec.get("alone", False))
            for name, spec in cfg["fake"].items()]


def record(run_dir: Path, name: str) -> dict | None:
    p = Path(run_dir) / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None
