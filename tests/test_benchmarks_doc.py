"""docs/benchmarks.md is exactly what benchmarks/make_docs.py makes of benchmarks/results/*.json, and
every result file that carries `meta` (benchmarks/meta.py) carries all of it.

So a hand edit of the tables, a result file re-measured without regenerating the page, or a page
figure with no file behind it fails here. Nothing is timed.
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
DOC = ROOT / "docs" / "benchmarks.md"


def _module(name: str) -> ModuleType:
    """A script of benchmarks/ (not a package) loaded by path."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


make_docs = _module("make_docs")
meta = _module("meta")
RESULT_FILES = sorted((BENCH / "results").glob("*.json"))


def test_doc_is_what_the_result_files_give():
    doc = DOC.read_text()
    assert make_docs.render(doc) == doc, "docs/benchmarks.md is stale or hand-edited: run python benchmarks/make_docs.py"


def test_every_result_file_has_a_row():
    doc = DOC.read_text()
    for path in RESULT_FILES:
        assert f"| `{path.name}` |" in doc, f"{path.name} is missing from the provenance table"


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_meta_has_every_required_field(path: Path):
    m = json.loads(path.read_text()).get("meta")
    if m is None:
        pytest.skip(f"{path.name} predates meta (the page says so)")
    assert [k for k in meta.REQUIRED if k not in m] == []
    assert [k for k in meta.CPU_REQUIRED if k not in m["cpu"]] == []
    assert set(m["cpu"]["flags"]) == set(meta.CPU_FLAGS)
    assert all(isinstance(v, bool) for v in m["cpu"]["flags"].values())
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?|unknown", m["commit"]), m["commit"]
    assert m["commit"].endswith("+dirty") == bool(m["dirty"])
    start, end = (dt.datetime.strptime(m[k], "%Y-%m-%dT%H:%M:%SZ") for k in ("date", "finished"))
    assert start <= end
    assert isinstance(m["threads"], int) and m["threads"] >= 1
    assert len(m["load_before"]) == 3 and len(m["load_after"]) == 3
    assert "bench_" in m["command"]  # the script that wrote it


def test_at_least_one_result_file_carries_meta():
    assert any("meta" in json.loads(p.read_text()) for p in RESULT_FILES)


@pytest.fixture
def results_copy(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(BENCH / "results", out)
    return out


def _edit(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def test_figures_and_verdicts_follow_the_files(results_copy: Path):
    _edit(results_copy / "extract.json", lambda d: d.update(read_speedup=12345.0))
    _edit(results_copy / "heads.json", lambda d: d.update(total_s=99.0))  # over its 60 s target
    text = make_docs.tables(results_copy)
    assert "**12,345x**" in text
    heads_row = next(line for line in text.splitlines() if "all head scores" in line)
    assert "**99.0 s**" in heads_row and heads_row.endswith("| **no** |")


def test_rows_name_their_provenance(results_copy: Path):
    cpu = meta.cpu_info("model name\t: Test CPU\ncpu family\t: 25\nmodel\t\t: 17\nflags\t\t: avx2 avx512f avx512_bf16\n")
    stamped = {"commit": "0123456789ab", "dirty": [], "date": "2030-01-02T03:04:05Z", "finished": "2030-01-02T03:05:00Z",
               "cpu": cpu, "torch": "2.13.0+cpu", "torch_cpu_capability": "AVX512", "python": "3.11.7", "threads": 2,
               "load_before": [0.5, 0.5, 0.5], "load_after": [1.0, 0.5, 0.5], "command": "python benchmarks/bench_cka.py"}
    _edit(results_copy / "cka.json", lambda d: d.update(meta=stamped))
    _edit(results_copy / "heads.json", lambda d: d.pop("meta", None))
    rows = {line.split(" | ")[0]: line for line in make_docs.tables(results_copy).splitlines()}
    cka_row = next(line for key, line in rows.items() if "CKA" in key and "analysis suite" not in key)
    assert "`cka.json` (2030-01-02, 0123456789ab, Test CPU (family 25, model 17): AVX-512, AVX512-BF16)" in cka_row
    heads_row = next(line for key, line in rows.items() if "head scores" in key)
    assert f"`heads.json` ({make_docs.NO_META})" in heads_row
    assert "| `cka.json` | 2030-01-02 03:04:05 | 0123456789ab |" in rows["| `cka.json`"]


def test_render_keeps_the_prose_and_replaces_the_tables():
    doc = DOC.read_text()
    head, rest = doc.split(make_docs.BEGIN)
    inside, tail = rest.split(make_docs.END)
    edited = f"{head}A new sentence.\n{make_docs.BEGIN}{inside.replace('yes', 'YES BY HAND')}{make_docs.END}{tail}"
    out = make_docs.render(edited)
    assert "A new sentence." in out and "YES BY HAND" not in out
    with pytest.raises(ValueError):
        make_docs.render(doc.replace(make_docs.END, ""))


def test_cpu_info_reads_the_first_processor_and_records_absent_flags():
    cpuinfo = ("processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 26\nmodel\t\t: 2\nflags\t\t: fma avx2 avx512f\n\n"
               "processor\t: 1\nmodel name\t: Other\nflags\t\t: amx_bf16\n")
    info = meta.cpu_info(cpuinfo)
    assert (info["model_name"], info["family"], info["model"]) == ("AMD EPYC", "26", "2")
    assert info["flags"]["avx512f"] and info["flags"]["avx2"]
    assert not info["flags"]["avx512_bf16"] and not info["flags"]["amx_bf16"]
