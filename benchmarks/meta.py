"""Where a benchmark figure came from: the `meta` object every result file in benchmarks/results carries.

A ratio measured on one CPU says little about another (bf16 autocast beats fp32 where the CPU has
native bf16 and loses badly where it is emulated), and a figure taken at load 12 is not one taken at
load 1. So every
benchmark opens with `begin()` and writes its result through `write_result(path, result, meta)`,
which adds what the run cannot know at the start (threads, load after, end time) and writes the
file atomically (temp file, then rename). `docs/benchmarks.md` is generated from these files by
`benchmarks/make_docs.py`, which names each file's date, commit and CPU beside its figures.

Fields of `meta` (REQUIRED lists them; tests/test_benchmarks_doc.py checks every result file):
commit (short hash, "+dirty" when tracked files other than the result files and docs/benchmarks.md
differ from it), dirty (those files, at most 20), date and finished (UTC, ISO 8601), cpu (model
name, family/model numbers, logical CPUs, and which of the SIMD flags that decide our kernels it
has), torch, torch_cpu_capability (the kernel level torch dispatches to), python, threads (torch's
intra-op threads when the result was written), load_before / load_after (os.getloadavg()), command
(the exact command line).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
from workbench.core.io import atomic_write_json

# The flags that change which kernels run: AVX2/FMA (fp32 baseline), AVX-512, native bf16
# (AVX512-BF16, AMX) and int8 dot products. Listed whether present or not, so absence is recorded.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
REQUIRED = ("commit", "dirty", "date", "finished", "cpu", "torch", "torch_cpu_capability", "python", "threads",
            "load_before", "load_after", "command")
CPU_REQUIRED = ("model_name", "family", "model", "logical_cpus", "flags")
# Outputs, not code: result files and the page generated from them do not make a measurement "dirty".
NOT_CODE = ("benchmarks/results/", "docs/benchmarks.md")


def _utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def git_commit() -> tuple[str, list[str]]:
    """(short hash with "+dirty" when tracked code differs from it, the differing paths)."""
    head = _git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown", []
    status = _git("status", "--porcelain", "--untracked-files=no") or ""
    dirty = sorted(line[3:] for line in status.splitlines() if not line[3:].startswith(NOT_CODE))
    return head.strip() + ("+dirty" if dirty else ""), dirty


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """Model name, family/model numbers and the CPU_FLAGS present, from /proc/cpuinfo (first CPU)."""
    if cpuinfo is None:
        p = Path("/proc/cpuinfo")
        cpuinfo = p.read_text() if p.is_file() else ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model_name": fields.get("model name", platform.processor() or platform.machine()),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "logical_cpus": os.cpu_count(), "flags": {f: f in flags for f in CPU_FLAGS}}


def begin() -> dict[str, Any]:
    """The meta known at the start of a run; call it before anything is timed."""
    commit, dirty = git_commit()
    return {"commit": commit, "dirty": dirty[:20], "date": _utc_now(), "finished": None, "cpu": cpu_info(),
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(), "threads": None,
            "load_before": list(os.getloadavg()), "load_after": None,
            "command": " ".join([Path(sys.executable).name, *sys.argv])}


def write_result(path: str | os.PathLike, result: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write `result` plus a completed `meta` object to `path` atomically; returns the path."""
    meta = {**meta, "finished": _utc_now(), "threads": torch.get_num_threads(), "load_after": list(os.getloadavg())}
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise ValueError(f"meta lacks {missing}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, {**{k: v for k, v in result.items() if k != "meta"}, "meta": meta})
