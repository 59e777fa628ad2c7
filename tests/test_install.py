"""A real install: the wheel built from this tree, installed into a fresh virtual environment, runs
`workbench` from a folder outside the repository with every default found (the recipes by name, the
analyses' built-in configs), and ships the LICENSE that pyproject.toml names.

The virtual environment sees the system's site-packages (torch and the other dependencies are
already installed there; the wheel goes in with --no-deps), and the test checks that the
`workbench` it runs is the wheel's copy, not this checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from plmodels.paths import data_root

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache")


def test_license_file_matches_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}
    head = (ROOT / "LICENSE").read_text().split()
    assert head[:4] == ["Apache", "License", "Version", "2.0,"]


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of a venv holding the wheel, a working folder outside the repository)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)   # build from a copy: no build/ folder left in the tree
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)], tmp, env)
    wheel = next((tmp / "dist").glob("plm_workbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "plmodels/recipes/pretrain/encoder-mini-cram.json" in names and "apps/app.py" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("research/", "tests/")) for n in names)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp, env)
    work = tmp / "work"
    work.mkdir()
    return venv / "bin", work


def test_the_wheel_runs_outside_the_repository(installed):
    bin_dir, work = installed
    env = {**os.environ, "WORKBENCH_DATA": str(data_root())}
    env.pop("PYTHONPATH", None)
    where = _run([str(bin_dir / "python"), "-c", "import workbench, plmodels; print(workbench.__file__)"], work, env)
    assert str(bin_dir.parent) in where and str(ROOT) not in where   # the wheel's copy, not the checkout
    assert _run([str(bin_dir / "workbench"), "--version"], work, env).strip().startswith("workbench 0.")


@pytest.mark.slow
def test_subcommands_find_their_defaults_from_the_wheel(installed):
    bin_dir, work = installed
    if not (data_root() / "tiny_shakespeare").is_dir() or not (data_root() / "ud_english_ewt").is_dir():
        pytest.skip(f"no data under {data_root()}")
    env = {**os.environ, "WORKBENCH_DATA": str(data_root())}
    env.pop("PYTHONPATH", None)
    wb = str(bin_dir / "workbench")
    # a recipe by name (package data), typed --set overrides
    _run([wb, "pretrain", "encoder-tiny", "--out", "m", "--set", "max_steps=3", "--set", "eval_every=0",
          "--set", "tokenizer_sample_chars=200000", "--set", "vocab_size=500"], work, env)
    assert (work / "m" / "final" / "model.safetensors").is_file()
    # an analysis with its built-in defaults (no configs/ folder here), a few fields overridden
    _run([wb, "heads", "m/final", "--out", "h", "--set", "max_sentences=8", "--set", "freq_source=ewt:train",
          "--set", "freq_max_chars=20000", "--set", "n_boot=10", "--set", "similarity_max_words=50"], work, env)
    assert {p.name for p in (work / "h" / "tables").glob("*.parquet")} >= {"heads.parquet", "relations.parquet"}
    assert (work / "h" / "figures" / "heads_roles_m.json").is_file()
    # a bad override names the field and fails cleanly
    p = subprocess.run([wb, "heads", "m/final", "--out", "h2", "--set", "n_boot=many"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and 'n_boot: input should be a valid integer, got "many"' in p.stderr
