"""workbench/engine.py: a study's steps on Dask distributed (a LocalCluster of two worker processes here),
the device-aware number of steps at once, and `workbench study`'s results folder. The Dask tests skip
without Dask (`pip install "plm-workbench[cluster]"`); stand-in steps: tests/workbench/pipeline_steps.py."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pandas as pd
import pytest

from tests.workbench import pipeline_steps
from tests.workbench.pipeline_steps import record
from workbench.core.paths import data_root
from workbench.core.results import load_table
from workbench.engine import (GPU_STEP_GIB, HOST_CORES_PER_GPU_STEP, RESULTS_LIMIT, DeviceInfo, _default_scheduler,
                              check_budgets, export_every, export_results, folder_bytes, run_study, run_steps_dask,
                              steps_at_once, waves)
from workbench.pipeline import build_steps, run_pipeline

REPO = Path(__file__).resolve().parents[2]
needs_dask = pytest.mark.skipif(find_spec("distributed") is None,
                                reason='Dask distributed is not installed (pip install "plm-workbench[cluster]")')
needs_data = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir() or
                                not (data_root() / "tiny_shakespeare").is_dir(), reason="data root missing")

TRAINING = {"max_steps": 6, "eval_every": 3, "eval_sequences": 4, "batch_size": 4, "tokenizer_sample_chars": 50000,
            "vocab_size": 500, "ckpt_every": 0, "ckpt_log_spaced": False}


# ------------------------------------------------------------------------------ steps at once
def test_a_gpu_runs_as_many_steps_as_its_memory_holds_or_its_cores_feed():
    """An H200 (139 GiB, 16 host cores): the cores bound it, 16 // 2 = 8; a 16 GiB GPU on 64 cores: its
    memory, floor(16 x 0.9 / 4) = 3; a GPU smaller than one step still runs one."""
    assert steps_at_once(DeviceInfo("cuda", "H200", 139.8, 16)) == 16 // HOST_CORES_PER_GPU_STEP == 8
    assert steps_at_once(DeviceInfo("cuda", "T4", 16.0, 64)) == int(16.0 * 0.9 // GPU_STEP_GIB) == 3
    assert steps_at_once(DeviceInfo("cuda", "small", GPU_STEP_GIB / 2, 64)) == 1
    assert steps_at_once(DeviceInfo("cuda", "one core", 80.0, 1)) == 1


def test_a_cpu_runs_one_step_at_a_time_whatever_its_size():
    """Training steps beside each other on a CPU take longer than one after another (steps_at_once)."""
    assert steps_at_once(DeviceInfo("cpu", "EPYC", 512.0, 128)) == 1


def test_a_wall_clock_budget_is_refused_beside_other_steps_but_not_alone():
    cfg = {"name": "x", "seed": 0, "models": {"m": {"pretrain": "encoder-tiny", "overrides": {"max_minutes": 2.0}}}}
    steps = build_steps(cfg)
    check_budgets(steps, 1)
    with pytest.raises(ValueError, match=r"pretrain:m: a wall-clock budget \(max_minutes=2\) on an engine of 2"):
        check_budgets(steps, 2)
    cfg["models"]["m"]["overrides"] = {"max_minutes": 1440.0, "max_steps": 10}   # a budget in updates
    check_budgets(build_steps(cfg), 2)


def test_a_study_takes_a_local_cluster_on_a_gpu_only_with_budgets_in_updates(capfd):
    """No --scheduler: on a GPU of 8 steps at once, a local Dask cluster (when Dask is installed) for a
    study budgeted in updates; the pipeline's own runner for a wall-clock budget (the log says why),
    and on a CPU."""
    gpu, cpu = DeviceInfo("cuda", "H200", 139.8, 16), DeviceInfo("cpu", "EPYC", 64.0, 2)
    cfg = {"name": "x", "seed": 0,
           "models": {"m": {"pretrain": "encoder-tiny", "overrides": {"max_minutes": 1440.0, "max_steps": 10}}}}
    assert _default_scheduler(gpu, build_steps(cfg)) == ("local" if find_spec("distributed") else None)
    assert _default_scheduler(cpu, build_steps(cfg)) is None
    cfg["models"]["m"]["overrides"]["max_minutes"] = 15.0
    assert _default_scheduler(gpu, build_steps(cfg)) is None
    assert "one step at a time on H200, not 8: pretrain:m: a wall-clock budget" in capfd.readouterr().err


# ------------------------------------------------------------------------------ the results folder
def test_the_results_folder_keeps_tables_report_and_records_and_no_checkpoint(tmp_path):
    run = tmp_path / "run"
    for rel, size in (("run.json", 10), ("tables/probing.parquet", 100), ("tables/.probing.parquet.lock", 0),
                      ("report/report.html", 1000), ("models/m/final/model.safetensors", 5000),
                      ("store/m/acts.npy", 5000), ("probe/m/figure.html", 50)):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(b"x" * size)
    assert export_results(run, tmp_path / "res") == 1110
    kept = sorted(str(p.relative_to(tmp_path / "res")) for p in (tmp_path / "res").rglob("*") if p.is_file())
    assert kept == ["report/report.html", "run.json", "tables/probing.parquet"]
    (run / "tables" / "probing.parquet").write_bytes(b"y" * 2000)      # a second export replaces the first
    (run / "report" / "report.html").unlink()
    assert export_results(run, tmp_path / "res") == 2010
    with pytest.raises(ValueError, match=r"res: 0.0 MiB, over the 0 MiB .* largest: tables/probing.parquet"):
        export_results(run, tmp_path / "res", limit=1000)


def _killed_export(run: Path, res: Path) -> None:
    """In a forked child: `export_results`, killed (SIGKILL) while tables/ is copied, after its first file."""
    copytree = shutil.copytree

    def dying_copytree(src, dst, **kw):
        copied = []

        def copy(s, d):
            if copied:
                os.kill(os.getpid(), signal.SIGKILL)
            copied.append(shutil.copy2(s, d))
        return copytree(src, dst, **{**kw, "copy_function": copy})
    shutil.copytree = dying_copytree
    export_results(run, res)


def test_an_export_killed_mid_copy_leaves_nothing_the_next_one_counts_or_trips_over(tmp_path):
    run, res = tmp_path / "run", tmp_path / "res"
    for rel, size in (("run.json", 10), ("tables/a.parquet", 100), ("tables/b.parquet", 200),
                      ("tables/c.parquet", 400), ("report/report.html", 1000)):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(os.urandom(size))
    export_results(run, res)
    (run / "tables" / "d.parquet").write_bytes(os.urandom(800))       # a new table, then a kill mid-copy
    child = multiprocessing.get_context("fork").Process(target=_killed_export, args=(run, res))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    stale = [p for p in res.iterdir() if p.name.startswith(".tables.tmp-")]
    assert len(stale) == 1 and len(list(stale[0].iterdir())) == 1     # half a copy, beside the old one whole
    assert sorted(p.name for p in (res / "tables").iterdir()) == ["a.parquet", "b.parquet", "c.parquet"]
    assert folder_bytes(res) == 1710 + (stale[0] / next(stale[0].iterdir()).name).stat().st_size
    assert export_results(run, res) == 2510                            # the rerun: the copies only
    assert sorted(p.name for p in res.iterdir()) == ["report", "run.json", "tables"]
    for rel in ("run.json", "tables/a.parquet", "tables/b.parquet", "tables/c.parquet", "tables/d.parquet",
                "report/report.html"):
        assert (res / rel).read_bytes() == (run / rel).read_bytes(), rel


def test_a_study_checks_its_flags_and_config_before_a_cluster_starts(tmp_path, monkeypatch):
    """A bad flag or config is one error naming it, and no cluster is started for it."""
    import workbench.engine as engine

    monkeypatch.setattr(engine, "dask_runner", lambda *a: pytest.fail("a cluster was started"))
    config = tmp_path / "zoo.json"
    config.write_text(json.dumps({"name": "z", "systems": {"bert": {"recipe": "bert-tiny"}}, "sedes": [0]}))
    with pytest.raises(ValueError, match="--workers 2 is for --scheduler local"):
        run_study(config, tmp_path / "res", scheduler="tcp://host:8786", workers=2)
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        run_study(config, tmp_path / "res", workers=0)
    with pytest.raises(ValueError, match=r"zoo.json.*sedes"):
        run_study(config, tmp_path / "res", scheduler="local")
    assert not (tmp_path / "res").exists()


def test_a_gpu_study_trains_beside_the_other_steps_and_a_cpu_study_alone(tmp_path, monkeypatch):
    """The steps marked alone (training) run by themselves on a CPU's Dask engine, and beside the others
    on a GPU's, where they train on the device (`dask_runner`'s `alone`)."""
    import workbench.engine as engine

    class Started(Exception):
        pass

    def runner(*args):
        asked.append(args)
        raise Started
    asked: list = []
    monkeypatch.setattr(engine, "dask_runner", runner)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"name": "x", "seed": 0, "models": {"m": {"import": "x"}}}))
    for kind in ("cuda", "cpu"):
        monkeypatch.setattr(engine, "device_info", lambda kind=kind: DeviceInfo(kind, "x", 80.0, 16))
        with pytest.raises(Started):
            run_study(config, tmp_path / "res", scheduler="local")
    assert asked == [("local", None, False), ("local", None, True)]


def test_the_dask_engine_without_dask_is_one_error_naming_the_flag(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)    # an import of it fails, as when not installed
    from workbench.engine import dask_runner

    with pytest.raises(ValueError, match=r'--scheduler local: the Dask engine needs .*plm-workbench\[cluster\]'):
        dask_runner("local", 2)


def test_a_running_study_copies_its_tables_as_they_come(tmp_path):
    """While a study runs, its finished tables reach the results folder without waiting for the end."""
    import threading

    run, res = tmp_path / "run", tmp_path / "res"
    stop = threading.Event()
    copier = threading.Thread(target=export_every, args=(run, res, 0.05, stop))
    copier.start()
    try:
        (run / "tables").mkdir(parents=True)
        (run / "tables" / "probing.parquet").write_bytes(b"x" * 10)
        deadline = time.time() + 10
        while not (res / "tables" / "probing.parquet").exists():
            assert time.time() < deadline, "the table was not copied"
            time.sleep(0.05)
    finally:
        stop.set()
        copier.join()
    assert (res / "tables" / "probing.parquet").read_bytes() == b"x" * 10


@pytest.mark.slow
@needs_data
def test_a_study_keeps_a_small_results_folder_and_resumes(tmp_path):
    """`workbench study` on a one-system zoo: the results folder holds the tables, report and records,
    no checkpoint, well under 64 MiB; study.json has the sitting's device, commit and step timings. A
    step a killed sitting left "running" is the only one the next sitting runs."""
    config = tmp_path / "zoo.json"
    config.write_text(json.dumps({
        "name": "zoo-one", "seeds": [0], "budget_minutes": 1440, "training": {**TRAINING, "schedule_clock": "steps"},
        "systems": {"bert": {"recipe": "bert-tiny"}}, "tasks": ["pos"],
        "probe": {"modes": ["single"], "seeds": [0], "max_train_targets": 100, "max_eval_targets": 50,
                  "max_epochs": 1, "hidden": 16, "proj_dim": 16, "n_boot": 10},
        "heads": None, "cross_heads": None, "cka": None, "stats": {"n_boot": 20}}))
    res, run = tmp_path / "results", tmp_path / "run"
    run_study(config, res, run_dir=run)
    files = [p.relative_to(res) for p in res.rglob("*") if p.is_file()]
    assert {f.parts[0] for f in files} == {"run.json", "study.json", "tables", "report"}
    assert not [f for f in files if f.suffix in (".safetensors", ".pt", ".bin", ".npy")]
    assert (run / "models" / "bert-s0" / "final" / "model.safetensors").exists()   # the checkpoint stays behind
    assert folder_bytes(res) < RESULTS_LIMIT
    pd.testing.assert_frame_equal(load_table(res, "probing"), load_table(run, "probing"))
    sitting = json.loads((res / "study.json").read_text())["sittings"][0]
    assert sitting["device"]["kind"] == "cpu" and sitting["code_version"] and sitting["finished"] > sitting["started"]
    assert set(sitting["steps"]) == set(json.loads((run / "run.json").read_text())["steps"])
    # a kill during probing leaves its step "running": the next sitting runs that step alone
    info = json.loads((run / "run.json").read_text())
    info["steps"]["probe:bert-s0"]["status"] = "running"
    (run / "run.json").write_text(json.dumps(info))
    run_study(config, res, run_dir=run)
    second = json.loads((res / "study.json").read_text())["sittings"][1]
    assert list(second["steps"]) == ["probe:bert-s0"]


# ------------------------------------------------------------------------------ Dask
@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _fake(run_dir: Path, fake: dict, client, info: dict | None = None, alone: bool = True) -> dict:
    cfg = {"seed": 0, "fake": fake}
    steps = pipeline_steps.build(cfg)
    info = info if info is not None else {"steps": {}}
    todo = [s for s in steps if info["steps"].get(s.name, {}).get("status") != "done"]
    run_steps_dask(steps, todo, {s.name: f"key-{s.name}" for s in steps}, info, run_dir, cfg, False, client,
                   build=pipeline_steps.build, alone=alone)
    return info


def test_the_steps_are_cut_into_waves_at_each_step_that_runs_alone():
    fake = {"a": {}, "b": {}, "t": {"alone": True}, "u": {"alone": True}, "c": {}, "d": {"after": ["c"]}}
    steps = pipeline_steps.build({"fake": fake})
    assert [[s.name for s in w] for w in waves(steps)] == [["a", "b"], ["t"], ["u"], ["c", "d"]]
    assert [[s.name for s in w] for w in waves(steps, alone=False)] == [["a", "b", "t", "u", "c", "d"]]
    assert waves([]) == []


@pytest.mark.slow
@needs_dask
def test_a_step_marked_alone_runs_by_itself_with_every_core_on_dask(tmp_path, client):
    """a and b run at once; t (alone) starts after both end, with every core of the machine, and c and d
    start after it ends, at once, each with a worker's share again. Unmarked (`alone=False`, a GPU's
    study), t runs beside a and b."""
    fake = {"a": {"sleep": 1.0}, "b": {"sleep": 1.0}, "t": {"alone": True, "sleep": 1.0},
            "c": {"sleep": 1.0}, "d": {"sleep": 1.0}}
    _fake(tmp_path, fake, client)
    a, b, t, c, d = (record(tmp_path, n) for n in "abtcd")
    cores, share = len(os.sched_getaffinity(0)), max(1, len(os.sched_getaffinity(0)) // 2)
    assert a["start"] < b["end"] and b["start"] < a["end"] and c["start"] < d["end"] and d["start"] < c["end"]
    assert t["start"] >= max(a["end"], b["end"]) and min(c["start"], d["start"]) >= t["end"]
    assert t["threads"] == cores and a["threads"] == b["threads"] == c["threads"] == d["threads"] == share
    _fake(tmp_path / "gpu", {"a": {"sleep": 1.0}, "t": {"alone": True, "sleep": 1.0}}, client, alone=False)
    a, t = record(tmp_path / "gpu", "a"), record(tmp_path / "gpu", "t")
    assert a["start"] < t["end"] and t["start"] < a["end"] and t["threads"] == share


@pytest.mark.slow
@needs_dask
def test_dask_runs_steps_at_once_each_after_what_it_reads_and_keeps_what_a_failure_does_not_touch(tmp_path, client):
    """a and b read nothing and run at once on the two workers; c reads b and starts after it. Then:
    f fails, g (reading f) never runs, h (free) runs and is kept, and f's error is raised."""
    info = _fake(tmp_path, {"a": {"sleep": 1.0}, "b": {"sleep": 1.0}, "c": {"after": ["b"], "sleep": 0.1}}, client)
    a, b, c = (record(tmp_path, n) for n in "abc")
    assert a["start"] < b["end"] and b["start"] < a["end"]
    assert c["start"] >= b["end"]
    assert a["pid"] != b["pid"] and a["threads"] == b["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert {n: s["status"] for n, s in info["steps"].items()} == dict.fromkeys("abc", "done")
    assert json.loads((tmp_path / "run.json").read_text())["steps"] == info["steps"]
    with pytest.raises(ValueError, match="bad f") as err:
        _fake(tmp_path / "x", {"f": {"fail": "bad f"}, "g": {"after": ["f"]}, "h": {"sleep": 0.5}}, client)
    assert any("in step f" in n for n in err.value.__notes__)
    steps = json.loads((tmp_path / "x" / "run.json").read_text())["steps"]
    assert {n: s["status"] for n, s in steps.items()} == {"f": "running", "g": "running", "h": "done"}
    assert record(tmp_path / "x", "g") is None and record(tmp_path / "x", "h") is not None


@pytest.mark.slow
@needs_dask
@needs_data
def test_a_two_step_study_on_two_dask_workers_writes_the_plain_runs_tables(tmp_path, client):
    """One tiny pretraining and one analysis of it (competence), run plainly and through Dask: the same
    training and competence tables, value for value. Both read one tokenizer: its trainer is not
    deterministic across processes (two plain runs in two processes train different vocabularies).
    Every step at one thread in both runs (this module's torch threads; a worker's share of 2 cores):
    the pretraining step is not run alone here, where it would get every core and its losses would
    differ in the fifth digit (another thread count, another reduction order; docs/design.md, "Runs")."""
    first = run_pipeline(_study(None), run_dir=tmp_path / "first")   # trains the tokenizer both runs read
    cfg = _study(str(first / "models" / "enc" / "tokenizer"))
    plain = run_pipeline(cfg, run_dir=tmp_path / "plain")
    dask = run_pipeline(cfg, run_dir=tmp_path / "dask",
                        runner=lambda *a: run_steps_dask(*a, client=client, alone=False))
    for table in ("training", "competence"):
        pd.testing.assert_frame_equal(load_table(plain, table), load_table(dask, table))
    steps = json.loads((dask / "run.json").read_text())["steps"]
    assert {n: s["status"] for n, s in steps.items()} == dict.fromkeys(
        ["tasks", "pretrain:enc", "competence:enc", "report"], "done")


def _study(tokenizer: str | None) -> dict:
    overrides = {**TRAINING, **({"tokenizer_path": tokenizer} if tokenizer else {})}
    return {"name": "two", "seed": 0, "tasks": {"tasks": ["pos"]}, "competence": {"eval_sequences": 4},
            "models": {"enc": {"pretrain": "encoder-tiny", "overrides": overrides}}}


KILLED = """import json, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from distributed import Client, LocalCluster
from tests.workbench.test_engine import _fake
if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as c, Client(c) as client:
        _fake(Path({run!r}), {fake!r}, client)
"""


@pytest.mark.slow
@needs_dask
def test_a_killed_dask_run_resumes_where_it_stopped(tmp_path, client):
    """SIGKILL of the run's process while b runs (a done): its worker ends with it, b stays "running" in
    run.json, and the next run runs b (and c after it), not a."""
    fake = {"a": {"sleep": 0.1}, "b": {"after": ["a"], "sleep": 60.0}, "c": {"after": ["b"]}}
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(repo=str(REPO), run=str(tmp_path), fake=fake))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (tmp_path / "b.pid").exists() or not (tmp_path / "b.pid").read_text():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    b_pid = int((tmp_path / "b.pid").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while Path(f"/proc/{b_pid}").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{b_pid}").exists() or "Z" in Path(f"/proc/{b_pid}/stat").read_text().split(") ")[1][:1]
    info = json.loads((tmp_path / "run.json").read_text())
    assert {n: s["status"] for n, s in info["steps"].items()} == {"a": "done", "b": "running", "c": "running"}
    a_end = record(tmp_path, "a")["end"]
    fake["b"]["sleep"] = 0.1
    info = _fake(tmp_path, fake, client, info=info)
    assert {n: s["status"] for n, s in info["steps"].items()} == dict.fromkeys("abc", "done")
    assert record(tmp_path, "a")["end"] == a_end                         # not run again
    assert record(tmp_path, "c")["start"] >= record(tmp_path, "b")["end"]
