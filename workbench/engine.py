"""A study's steps on an existing engine, Dask distributed (Rocklin 2015, "Dask: parallel computation
with blocked algorithms and task scheduling"), and the one-command study of a GPU machine (issue 81).

`run_steps_dask` is a runner for `workbench.pipeline.run_pipeline` (its `runner` argument): each step
the run has to do becomes one Dask task whose arguments are the futures of the steps it reads
(`Step.after`), so the Dask scheduler starts it on a free worker once they are done; a step marked
`Step.alone` (training and the imports before it) runs by itself, as with the local runner, except on
a GPU, where training runs on the device and the steps train side by side. Nothing else
changes: the step is the same function on the same run folder, the cache is the same run.json (each
step's key and state, written by this process as results come back), so a study run on a cluster
resumes on one machine and the other way round. The run folder must be one folder for every worker
(a shared file system on a cluster; `LocalCluster` on one machine). The home-made local runner
(`run_steps_parallel`) stays the default; Dask is an optional dependency (`pip install
"plm-workbench[cluster]"`), imported only when a runner is made (`dask_runner`).

`steps_at_once` is how many steps one device runs at once, from its memory and host cores (a pure
function); `device_info` reads them off this machine. `run_study` is `workbench study`: a zoo (or run)
config trained and analysed in a work folder, its tables, report and run records copied into a
results folder of at most `RESULTS_LIMIT` bytes (no checkpoints, no activation stores), with a
`study.json` record of each sitting's device, commit and step timings; the same command resumes.
"""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from plmodels.config import read_json_object
from plmodels.files import copy_atomic
from workbench.core.io import atomic_write_json
from workbench.pipeline import (NO_TIME_LIMIT, Context, Step, build_steps, code_version, load_run_config, mark_done,
                                run_log, run_pipeline, set_step_threads)
from workbench.zoo import check_systems, expand_zoo, load_zoo, run_zoo

# ----------------------------------------------------------------------------- steps per device
# Host cores one step of a GPU study keeps busy: its Python loop (which launches the kernels) and the
# worker that builds its batches ahead (plmodels/training/data.py), so that neither waits on the other.
HOST_CORES_PER_GPU_STEP = 2
# GPU memory one zoo step is given (GiB). Not measured (no device lent to this session): a mini model's
# weights and AdamW state are tens of MiB and its activations at the zoo's batches under 1 GiB, while
# each process holds its own CUDA context (about 0.5 GiB) and the caching allocator's reserve; 4 GiB
# leaves twice that for the analyses' extraction batches. Measure it on a GPU before trusting it.
GPU_STEP_GIB = 4.0
# Share of a device's memory kept free (other processes, fragmentation).
MEMORY_RESERVE = 0.1


@dataclass(frozen=True)
class DeviceInfo:
    """The device a study's steps run on: its kind ("cuda" or "cpu"), name, memory (GiB: the GPU's, or
    the host's for a CPU) and the host cores this process may use."""

    kind: str
    name: str
    memory_gib: float
    cores: int


def steps_at_once(device: DeviceInfo) -> int:
    """How many steps run at once on one device (at least 1). On a GPU: as many as its memory holds at
    `GPU_STEP_GIB` each (less `MEMORY_RESERVE`), and at most one per `HOST_CORES_PER_GPU_STEP` host
    cores. On a CPU: 1, since training steps share the cores and take longer than one after another
    (2-core EPYC: a pretraining step at 1 thread beside another took 323 s, alone at 2 threads 118 s;
    `run_steps_parallel`), so the CPU gains nothing from running them at once."""
    if device.kind != "cuda":
        return 1
    by_memory = math.floor(device.memory_gib * (1 - MEMORY_RESERVE) / GPU_STEP_GIB)
    by_cores = device.cores // HOST_CORES_PER_GPU_STEP
    return max(1, min(by_memory, by_cores))


def device_info() -> DeviceInfo:
    """This machine's device: its first CUDA GPU when torch sees one, else the CPU."""
    import torch

    cores = _host_cores()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return DeviceInfo("cuda", props.name, props.total_memory / 2**30, cores)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return DeviceInfo("cpu", _cpu_name(), pages / 2**30, cores)


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# ------------------------------------------------------------------------------------- the engine
Runner = Callable[[list[Step], list[Step], dict[str, str], dict, Path, dict, bool], None]


def _host_cores() -> int:
    return len(os.sched_getaffinity(0))


def _share_threads(client: Any) -> dict[str, int]:
    """Each worker's threads: its host's cores shared evenly by the workers on that host."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    by_host: dict[str, list[str]] = {}
    for address, w in workers.items():
        by_host.setdefault(w["host"], []).append(address)
    threads = {}
    for addresses in by_host.values():
        cores = client.run(_host_cores, workers=addresses[:1])
        share = max(1, next(iter(cores.values())) // len(addresses))
        threads.update(client.run(set_step_threads, share, workers=addresses))
    return threads


def _run_step(build: Callable[[dict], list[Step]], cfg: dict, run_dir: str, name: str, force: bool, alone: bool,
              *upstream: Any) -> tuple[dict, float]:
    """On a worker: step `name` of `build(cfg)` (`upstream`: the results of the steps it reads, passed
    only so that Dask starts it after them); returns its outputs and seconds. A step run `alone` gets
    every core of its host (`set_step_threads`), and the worker its share back after it."""
    import torch

    step = next(s for s in build(cfg) if s.name == name)
    share = torch.get_num_threads()
    if alone:
        set_step_threads(_host_cores())
    try:
        t0 = time.perf_counter()
        return step.fn(Context(Path(run_dir), cfg, step.params, force=force)), time.perf_counter() - t0
    finally:
        if alone:
            set_step_threads(share)


def waves(todo: list[Step], alone: bool = True) -> list[list[Step]]:
    """`todo` in build order, cut at its `Step.alone` steps: each run of the other steps is one wave,
    submitted at once, and each alone step a wave by itself (`run_steps_dask` waits for a wave before
    the next). With `alone` False, one wave of every step."""
    out: list[list[Step]] = []
    for step in todo:
        if not out or (alone and (step.alone or out[-1][-1].alone)):
            out.append([step])
        else:
            out[-1].append(step)
    return out


def check_budgets(steps: list[Step], slots: int) -> None:
    """Pretraining steps trained beside others need budgets in updates: with a wall-clock budget
    (`max_minutes` below NO_TIME_LIMIT) checkpoints trained at once would each get fewer updates than
    alone (the rule of `ZooConfig.workers`). A ValueError naming the first such step otherwise."""
    if slots <= 1:
        return
    for step in steps:
        minutes = ((step.params or {}).get("overrides") or {}).get("max_minutes") if step.name.startswith(
            "pretrain:") else None
        if minutes is not None and float(minutes) < NO_TIME_LIMIT:
            raise ValueError(f"{step.name}: a wall-clock budget (max_minutes={minutes:g}) on an engine of {slots} "
                             f"workers; give it a budget in updates (max_steps, max_minutes={NO_TIME_LIMIT:g}, as "
                             "configs/zoo-steps.json), or run one worker")


def run_steps_dask(steps: list[Step], todo: list[Step], keys: dict[str, str], info: dict, run_dir: Path,
                   cfg: dict, force: bool, client: Any, build: Callable[[dict], list[Step]] = build_steps,
                   alone: bool = True) -> None:
    """Run the steps of `todo` on the Dask cluster of `client`: one task each, after the tasks of the
    steps it reads, each worker with its host's cores shared among the workers there (`_share_threads`).
    A step marked `alone` (pretraining, finetuning, imports: `Step.alone`) runs with no other step beside
    it and with every core of its host, as in `run_steps_parallel`: in build order it waits for every
    step submitted before it, and the steps after it are submitted once it is done (`waves`). With
    `alone` False the mark is not applied: `run_study` on a GPU, where training runs on the device and
    `steps_at_once` has already sized the workers to its memory and host cores, so a zoo's checkpoints
    train side by side.
    Every step of `todo` is marked "running" in run.json before the first is submitted and "done" with
    its outputs and seconds as its result comes back, so a killed run re-runs exactly what had not come
    back. When a step fails, the steps that do not read it run on and are kept (a cluster's work is not
    thrown away), those that read it do not run, and its exception is raised here once the others are
    done. A worker finds its step by name in `build(cfg)` (a module-level function: pickled by
    reference)."""
    from distributed import as_completed

    check_budgets(todo, sum(w["nthreads"] for w in client.scheduler_info(n_workers=-1)["workers"].values()))
    threads = _share_threads(client)
    run_log(f"{len(todo)} steps on Dask ({client.scheduler.address}): {len(threads)} workers, "
            f"{sorted(set(threads.values()))} torch thread(s) each"
            + ("" if alone else "; steps marked alone run beside the others"))
    started = time.time()
    for step in todo:
        info["steps"][step.name] = {"status": "running", "key": keys[step.name], "started": started}
    atomic_write_json(run_dir / "run.json", info)
    futures: dict[str, Any] = {}
    failure: tuple[str, BaseException] | None = None
    for wave in waves(todo, alone):
        for step in wave:
            upstream = [futures[a] for a in step.after if a in futures]
            futures[step.name] = client.submit(_run_step, build, cfg, str(run_dir), step.name, force,
                                               alone and step.alone, *upstream,
                                               key=f"{step.name}-{uuid.uuid4().hex}", pure=False)
        by_future = {futures[s.name].key: s for s in wave}
        for future in as_completed([futures[s.name] for s in wave]):
            step = by_future[future.key]
            if future.status == "finished":
                outputs, seconds = future.result()
                mark_done(step, steps.index(step) + 1, len(steps), keys, info, run_dir, outputs, seconds)
            elif failure is None and _own_failure(step, futures):
                failure = (step.name, future.exception())
                run_log(f"{step.name} failed: the steps that do not read it run on")
    if failure is not None:
        name, error = failure
        error.add_note(f"in step {name}, on a Dask worker")
        raise error


def _own_failure(step: Step, futures: dict[str, Any]) -> bool:
    """Whether a failed step failed itself, not because a step it reads did (Dask fails those too)."""
    return all(futures[a].status == "finished" for a in step.after if a in futures)


def dask_runner(scheduler: str, workers: int | None = None, alone: bool = True) -> tuple[Runner, Callable[[], None]]:
    """A runner for `run_pipeline` on Dask, and the function that closes it: `scheduler` is a
    scheduler's address ("tcp://host:8786"), or "local" for a LocalCluster of `workers` processes on
    this machine (default: `steps_at_once(device_info())`), one thread each; `alone`: whether steps
    marked alone run by themselves (`run_steps_dask`). Without Dask installed, a ValueError naming
    --scheduler and how to install it (a missing extra is bad input, not a bug)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ValueError(f'--scheduler {scheduler}: the Dask engine needs Dask distributed: pip install '
                         '"plm-workbench[cluster]" (or pip install "dask[distributed]")') from None
    if scheduler == "local":
        n = workers or steps_at_once(device_info())
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        cluster, client = None, Client(scheduler)

    def runner(steps, todo, keys, info, run_dir, cfg, force):
        run_steps_dask(steps, todo, keys, info, run_dir, cfg, force, client, alone=alone)

    def close() -> None:
        client.close()
        if cluster is not None:
            cluster.close()
    return runner, close


# -------------------------------------------------------------------------------- the GPU study
RESULTS_LIMIT = 64 * 2**20   # bytes: a results folder small enough to copy off a lent machine (issue 81)
# What a results folder keeps of a run folder: its records and tables, the report (figures inside).
KEPT = ("run.json", "tables", "report")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def export_results(run_dir: Path, results: Path, limit: int = RESULTS_LIMIT) -> int:
    """Copy the run folder's run.json, tables/ and report/ into `results`, each swapped in whole over
    its earlier copy (`plmodels.files.copy_atomic`: a copy killed midway leaves only a temporary, which
    the next export deletes before the size is counted); returns the folder's size in bytes. A results
    folder over `limit` is a ValueError naming its largest files (nothing else of the run is copied: no
    checkpoint, no activation store)."""
    results.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (run_dir / name).exists():   # without the tables' lock files (.name.lock)
            copy_atomic(run_dir / name, results / name, ignore=shutil.ignore_patterns(".*"))
    size = folder_bytes(results)
    if size > limit:
        biggest = sorted((p for p in results.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)[:3]
        raise ValueError(f"{results}: {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB of a results folder; "
                         "largest: " + ", ".join(f"{p.relative_to(results)} ({p.stat().st_size / 2**20:.1f} MiB)"
                                                 for p in biggest))
    return size


def _default_scheduler(device: DeviceInfo, steps: list[Step]) -> str | None:
    """The engine of a study given no --scheduler: "local" where the device runs more than one step at
    once, Dask is installed and every pretraining step has a budget in updates (`check_budgets`), else
    None (the pipeline's own runner); the log says why when the device could do more."""
    n = steps_at_once(device)
    if n == 1:
        return None
    try:
        check_budgets(steps, n)
        import distributed  # noqa: F401 - only whether it is installed
    except ValueError as e:
        run_log(f"one step at a time on {device.name}, not {n}: {e}")
        return None
    except ImportError:
        run_log(f"one step at a time on {device.name}, not {n}: Dask is not installed "
                '(pip install "plm-workbench[cluster]")')
        return None
    return "local"


# Seconds between the copies of a running study's run.json and tables into its results folder, so that
# a machine taken back mid-study leaves the results of the steps it finished (the report comes last).
EXPORT_EVERY_S = 60.0


def export_every(run_dir: Path, results: Path, seconds: float, stop: threading.Event) -> None:
    """Copy `run_dir`'s results into `results` every `seconds` until `stop` is set (run in a thread by
    `run_study`); a failed copy is logged and tried again at the next one, and no size limit is
    checked until the study's last copy."""
    while not stop.wait(seconds):
        try:
            export_results(run_dir, results, limit=math.inf)
        except OSError as e:
            run_log(f"copying the results so far into {results} failed ({e}); trying again in {seconds:g} s")


def run_study(config: str | Path, results: str | Path, run_dir: str | Path | None = None,
              scheduler: str | None = None, workers: int | None = None, overrides: dict | None = None) -> Path:
    """`workbench study`: train and analyse the study of `config` (a zoo config, or a run config with
    "models") in its run folder (`run_dir`, default runs/<name>: checkpoints and stores stay there, so
    the same command resumes), then copy its tables, report and run.json into `results`
    (`export_results`; run.json and the tables also every `EXPORT_EVERY_S` while it runs, so a killed
    sitting leaves what it finished) and add this sitting to `results`/study.json: the device, the commit, the
    engine, its start and end, and the seconds of every step it ran. The steps run on `scheduler` (a
    Dask address, or "local": a LocalCluster of `workers` processes, default `steps_at_once`; `workers`
    alone means "local"; on a GPU the steps marked `Step.alone` run beside the others, `run_steps_dask`),
    or without one by the pipeline's own runner with its config's `workers`; on a
    GPU without a scheduler "local" is taken when Dask is installed, `steps_at_once` is above 1 and the
    pretraining budgets are in updates (`_default_scheduler`).
    The config is read and checked before a cluster starts. Returns `results`."""
    config, results = Path(config), Path(results)
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if workers is not None and scheduler not in (None, "local"):
        raise ValueError(f"--workers {workers} is for --scheduler local; the cluster at {scheduler} has its own")
    scheduler = "local" if workers is not None else scheduler
    raw = read_json_object(config)     # the config is read and type-checked before a cluster starts
    if "systems" in raw:
        check_systems(zoo := load_zoo(config, overrides), str(config))
        name, cfg = zoo.name, expand_zoo(zoo)
    else:
        cfg = load_run_config(config, overrides)
        name = cfg["name"]
    device = device_info()
    if scheduler is None:
        scheduler = _default_scheduler(device, build_steps(cfg))
    # on a GPU the steps marked alone (training) run side by side too: they train on the device
    runner, close = dask_runner(scheduler, workers, device.kind != "cuda") if scheduler else (None, lambda: None)
    results.mkdir(parents=True, exist_ok=True)
    record_path = results / "study.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"name": name, "sittings": []}
    # recorded at its start: a killed sitting stays in the record, without "finished"
    sitting = {"device": asdict(device), "code_version": code_version(), "engine": scheduler or "local runner",
               "workers": workers or (steps_at_once(device) if scheduler == "local" else None),
               "started": time.time(), "finished": None}
    record["sittings"].append(sitting)
    atomic_write_json(record_path, record)
    folder = Path(run_dir) if run_dir else Path(cfg.get("results_root", "runs")) / cfg["name"]  # run_pipeline's
    stop = threading.Event()
    copier = threading.Thread(target=export_every, args=(folder, results, EXPORT_EVERY_S, stop), daemon=True)
    copier.start()
    try:
        if "systems" in raw:
            folder = run_zoo(config, run_dir=run_dir, overrides=overrides, runner=runner)
        else:
            folder = run_pipeline(config, run_dir=run_dir, overrides=overrides, runner=runner)
    finally:
        stop.set()
        copier.join()
        close()
    steps = json.loads((folder / "run.json").read_text())["steps"]
    sitting.update(finished=time.time(), run_dir=str(folder.resolve()),
                   steps={n: s["seconds"] for n, s in steps.items()
                          if s.get("status") == "done" and s.get("finished", 0) >= sitting["started"]})
    sitting["seconds"] = round(sitting["finished"] - sitting["started"], 1)
    atomic_write_json(record_path, record)
    size = export_results(folder, results)
    run_log(f"results: {results.resolve()} ({size / 2**20:.1f} MiB)")
    return results
