"""`workbench run` with workers > 1 (`workbench.pipeline.run_steps_parallel`): steps run at once, each in a
process of its own, as soon as what they read is done; a failure raises the step's own error after the
steps beside it finish; a killed run takes its steps along; a table two steps write at once keeps both
shares (`upsert_table` under `file_lock`). Stand-in steps: tests/workbench/pipeline_steps.py."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.workbench import pipeline_steps
from tests.workbench.pipeline_steps import record
from workbench.core.results import load_table, upsert_table
from workbench.pipeline import run_steps_parallel, worker_threads

REPO = Path(__file__).resolve().parents[2]


def _run(run_dir: Path, fake: dict, workers: int = 2, info: dict | None = None) -> dict:
    cfg = {"seed": 0, "fake": fake}
    steps = pipeline_steps.build(cfg)
    info = info if info is not None else {"steps": {}}
    todo = [s for s in steps if info["steps"].get(s.name, {}).get("status") != "done"]
    run_steps_parallel(steps, todo, {s.name: f"key-{s.name}" for s in steps}, info, run_dir, cfg, False, workers,
                       build=pipeline_steps.build)
    return info


@pytest.mark.slow
def test_steps_run_at_once_each_after_what_it_reads(tmp_path):
    """a and b read nothing and run together; c reads b, so it starts only once b is done, though a
    finished long before and a worker was free. Each step runs in its own process with the run's
    torch threads, and its outputs land in run.json."""
    info = _run(tmp_path, {"a": {"sleep": 0.3}, "b": {"sleep": 2.0}, "c": {"after": ["b"], "sleep": 0.1}})
    a, b, c = (record(tmp_path, n) for n in "abc")
    assert a["start"] < b["end"] and b["start"] < a["end"]            # at once
    assert c["start"] >= b["end"]                                     # after what it reads
    assert len({a["pid"], b["pid"], c["pid"], os.getpid()}) == 4      # a process each
    assert {r["threads"] for r in (a, b, c)} == {worker_threads(2)}
    assert {t for r in (a, b, c) for t in r["blas_threads"]} == {worker_threads(2)}
    assert {n: s["status"] for n, s in info["steps"].items()} == {"a": "done", "b": "done", "c": "done"}
    assert info["steps"]["b"]["outputs"] == {"slept": 2.0} and info["steps"]["b"]["key"] == "key-b"
    on_disk = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert on_disk == info["steps"]


@pytest.mark.slow
def test_a_step_that_runs_alone_runs_beside_nothing_with_every_thread(tmp_path):
    """Training steps (`Step.alone`) wait for the running steps and hold the machine: b, ready from the
    start, waits for a; c, ready when a starts, waits for b; each of a, b, c overlaps no other step,
    and b gets worker_threads(1) threads where the others get worker_threads(2)."""
    _run(tmp_path, {"a": {"sleep": 0.6}, "b": {"sleep": 0.6, "alone": True}, "c": {"sleep": 0.6},
                    "d": {"after": ["b"], "sleep": 0.6}})
    r = {n: record(tmp_path, n) for n in "abcd"}
    assert r["b"]["start"] >= r["a"]["end"] and r["c"]["start"] >= r["b"]["end"]
    assert r["c"]["start"] < r["d"]["end"] and r["d"]["start"] < r["c"]["end"]      # c and d at once
    assert r["b"]["threads"] == worker_threads(1) and r["a"]["threads"] == r["c"]["threads"] == worker_threads(2)


@pytest.mark.slow
def test_a_failed_step_raises_its_error_after_the_running_ones_finish(tmp_path):
    """a fails while b runs: b finishes (done, its work kept), nothing new starts (c reads a; d is
    free but waits), a's ValueError reaches the caller with its traceback as a note, and a stays
    "running" so that the next run re-runs it, with c and d, and not b."""
    fake = {"a": {"sleep": 0.2, "fail": "bad thing in a"}, "b": {"sleep": 1.5},
            "c": {"after": ["a"]}, "d": {}}
    with pytest.raises(ValueError, match="bad thing in a") as err:
        _run(tmp_path, fake)
    assert any("in step a" in n and "Traceback" in n for n in getattr(err.value, "__notes__", []))
    info = json.loads((tmp_path / "run.json").read_text())
    assert {n: s["status"] for n, s in info["steps"].items()} == {"a": "running", "b": "done"}
    assert record(tmp_path, "c") is None and record(tmp_path, "d") is None
    b_end = record(tmp_path, "b")["end"]
    fake["a"].pop("fail")
    info = _run(tmp_path, fake, info=info)
    assert {n: s["status"] for n, s in info["steps"].items()} == dict.fromkeys("abcd", "done")
    assert record(tmp_path, "b")["end"] == b_end                         # not run again
    assert record(tmp_path, "c")["start"] >= record(tmp_path, "a")["end"]


@pytest.mark.slow
def test_a_killed_run_takes_its_steps_along(tmp_path):
    """SIGKILL of the run's process: the step it had started ends within a couple of seconds instead
    of writing on into a folder the next run takes over."""
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
              "from pathlib import Path\n"
              "from tests.workbench.test_pipeline_parallel import _run\n"
              f"_run(Path({str(tmp_path)!r}), {{'long': {{'sleep': 30.0}}}})\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    pid_file = tmp_path / "long.pid"
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    step_pid = int(pid_file.read_text())
    assert _alive(step_pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 5
    while _alive(step_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(step_pid)
    assert record(tmp_path, "long") is None        # it never finished its sleep and wrote


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _upsert_many(run_dir: str, prefix: str, n: int) -> None:
    for i in range(n):
        upsert_table(run_dir, "probing", pd.DataFrame({"model": [f"{prefix}{i}"] * 3, "value": [1.0, 2.0, 3.0]}))


@pytest.mark.slow
def test_two_steps_upserting_one_table_at_once_keep_both_shares(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_upsert_many, args=(str(tmp_path), p, 25)) for p in ("x", "y")]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    table = load_table(tmp_path, "probing")
    assert sorted(table["model"].unique()) == sorted([f"x{i}" for i in range(25)] + [f"y{i}" for i in range(25)])
    assert len(table) == 150
