"""Sampled mutation testing: how many one-line mutants of a module do its fast tests kill?

    python scripts/mutation_sample.py --modules probes/edge.py --n 20 --out /tmp/mut
    python scripts/mutation_sample.py --n 40             # every module of MODULES, 40 mutants each

For each module, every mutation site is listed (an AST walk, `sites`: a comparison operator
flipped, an arithmetic or boolean operator swapped, a numeric constant changed by one, a string
constant changed (not docstrings, not the text of error messages), a `return x` made `return None`); `--n` of them are drawn with `--seed`; each is written over the
module in place, the module's tests (TESTS) run with `pytest -x -q`, and the file is put back (also
on Ctrl-C: `finally`). A mutant is *killed* when the tests fail, *survived* when they pass, and
*timeout* when they run past `--timeout` seconds (counted as killed, as mutmut does). The report
(`--out`/mutation.parquet, one row per module x mutant, and mutation.md, the score per module) lists
every survivor with its line, so a test can be written for it.

Why a small AST mutator rather than mutmut or cosmic-ray (STYLE.md names both): mutmut 3 copies the
whole tree into `mutants/` and runs the whole suite under its own trampoline, and cosmic-ray needs a
session database and a config per module; neither samples N mutants per module out of the box, and
both would run the full (slow, hours on two shared cores) suite rather than the few fast test
modules that cover one file. The mutation operators here are the classic ones both use.

Run it from a worktree nobody else is editing: mutants are written into the module's file.
"""
from __future__ import annotations

import argparse
import ast
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module -> the fast tests that cover it
MODULES: dict[str, list[str]] = {
    "probes/heads.py": ["tests/probes/test_heads.py"],
    "probes/multibootstrap.py": ["tests/probes/test_multibootstrap.py"],
    "probes/amnesic.py": ["tests/probes/test_amnesic.py"],
    "probes/structural.py": ["tests/probes/test_structural.py", "tests/probes/test_arcs.py"],
    "probes/edge.py": ["tests/probes/test_edge.py"],
    "probes/layers.py": ["tests/probes/test_layers.py"],
    "plmodels/hf_import.py": ["tests/plmodels/test_hf_import.py"],   # the importers' mapping tables
    "plmodels/hf_encoders.py": ["tests/plmodels/test_hf_encoders.py"],
}

CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
            ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
BOOL_SWAP = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    """One mutation site: the `index`-th node (in ast.walk order) of kind `op`, at `line`."""

    index: int
    line: int
    op: str          # "compare", "binop", "boolop", "constant", "return", "string"
    what: str        # before -> after, for the report


def _sites(tree: ast.AST) -> list[Mutant]:
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in CMP_SWAP:
            out.append(Mutant(i, node.lineno, "compare",
                              f"{type(node.ops[0]).__name__} -> {CMP_SWAP[type(node.ops[0])].__name__}"))
        elif isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAP:
            out.append(Mutant(i, node.lineno, "binop", f"{type(node.op).__name__} -> {BIN_SWAP[type(node.op)].__name__}"))
        elif isinstance(node, ast.BoolOp) and type(node.op) in BOOL_SWAP:
            out.append(Mutant(i, node.lineno, "boolop", f"{type(node.op).__name__} -> {BOOL_SWAP[type(node.op)].__name__}"))
        elif (isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool)
              and hasattr(node, "lineno")):
            out.append(Mutant(i, node.lineno, "constant", f"{node.value!r} -> {node.value + 1!r}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and hasattr(node, "lineno") \
                and 0 < len(node.value) < 40 and "\n" not in node.value:
            out.append(Mutant(i, node.lineno, "string", f"{node.value!r} -> {node.value + 'X'!r}"))
        elif isinstance(node, ast.Return) and node.value is not None:
            out.append(Mutant(i, node.lineno, "return", "return x -> return None"))
    return out


def _docstring_ids(tree: ast.AST) -> set[int]:
    """id() of the Constant nodes that are docstrings (mutating them changes no behaviour)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _message_ids(tree: ast.AST) -> set[int]:
    """id() of the string constants inside a `raise` or an f-string: error-message text, whose
    mutants no behavioural test should have to kill."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            ids |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return ids


def sites(source: str) -> list[Mutant]:
    """The mutation sites of a module, less docstrings and error-message text."""
    tree = ast.parse(source)
    skip = _docstring_ids(tree) | _message_ids(tree)
    nodes = list(ast.walk(tree))
    return [m for m in _sites(tree) if id(nodes[m.index]) not in skip]


def mutate(source: str, mutant: Mutant) -> str:
    """`source` with `mutant` applied (the tree re-walked in the same order, so indices match)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.index]
    if mutant.op == "compare":
        node.ops[0] = CMP_SWAP[type(node.ops[0])]()
    elif mutant.op == "binop":
        node.op = BIN_SWAP[type(node.op)]()
    elif mutant.op == "boolop":
        node.op = BOOL_SWAP[type(node.op)]()
    elif mutant.op == "constant":
        node.value = node.value + 1
    elif mutant.op == "string":
        node.value = node.value + "X"
    elif mutant.op == "return":
        node.value = ast.Constant(None)
    return ast.unparse(tree) + "\n"


def run_tests(tests: list[str], timeout: float) -> tuple[str, float]:
    """("killed" | "survived" | "timeout", seconds) of `pytest -x -q tests`."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=ROOT, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0
    return ("survived" if p.returncode == 0 else "killed"), time.monotonic() - t0


def sample_module(module: str, n: int, seed: int, timeout: float) -> list[dict]:
    path = ROOT / module
    original = path.read_text(encoding="utf-8")
    found = sites(original)
    rng = random.Random(f"{seed}:{module}")
    chosen = sorted(rng.sample(found, min(n, len(found))), key=lambda m: m.line)
    status, base_s = run_tests(MODULES[module], timeout)
    if status != "survived":
        raise SystemExit(f"{module}: its tests fail (or time out) unmutated: {MODULES[module]}")
    rows = []
    try:
        for k, m in enumerate(chosen, 1):
            path.write_text(mutate(original, m), encoding="utf-8")
            result, secs = run_tests(MODULES[module], max(timeout, 3 * base_s))
            rows.append({"module": module, "line": m.line, "op": m.op, "mutation": m.what, "result": result,
                         "seconds": round(secs, 1), "sites": len(found), "seed": seed})
            print(f"[{module} {k}/{len(chosen)}] line {m.line} {m.op} {m.what}: {result} ({secs:.0f} s)", flush=True)
    finally:
        path.write_text(original, encoding="utf-8")
    return rows


def report(rows: list[dict]) -> str:
    """Markdown: per module, mutants, killed (timeouts included), score with a Wilson 95% interval,
    and the survivors by line."""
    import math

    lines = ["| module | sites | mutants | killed | score | 95% interval |", "|---|---|---|---|---|---|"]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["module"], []).append(r)
    for module, rs in by.items():
        n, k = len(rs), sum(r["result"] != "survived" for r in rs)
        z, p = 1.96, k / n
        centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        lines.append(f"| {module} | {rs[0]['sites']} | {n} | {k} | {p:.2f} | [{centre - half:.2f}, {centre + half:.2f}] |")
    lines += ["", "Survivors (a test should fail on each):", ""]
    lines += [f"- {r['module']}:{r['line']} {r['op']} {r['mutation']}" for r in rows if r["result"] == "survived"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", nargs="*", default=list(MODULES), help="modules to sample (default: all of MODULES)")
    p.add_argument("--n", type=int, default=20, help="mutants per module (default 20)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a test run counts as a timeout")
    p.add_argument("--out", type=Path, default=Path("runs/mutation"), help="folder for the report")
    a = p.parse_args(argv)
    unknown = [m for m in a.modules if m not in MODULES]
    if unknown:
        p.error(f"--modules: no tests known for {unknown}; known: {', '.join(MODULES)}")
    rows = [r for m in a.modules for r in sample_module(m, a.n, a.seed, a.timeout)]
    a.out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame(rows).to_parquet(a.out / "mutation.parquet", index=False)
    (a.out / "mutation.md").write_text(report(rows), encoding="utf-8")
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
