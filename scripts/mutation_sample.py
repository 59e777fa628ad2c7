"""Sampled mutation testing: how many one-line mutants of a module do its fast tests kill?

    python scripts/mutation_sample.py --modules probes/edge.py --n 20 --fork --out runs/mutation
    python scripts/mutation_sample.py --modules probes/edge.py --survivors --fork --out runs/mutation
    python scripts/mutation_sample.py --n 40             # every module of MODULES, 40 mutants each
    python scripts/mutation_sample.py --merge research/mutation/mutation.csv runs/mutation/mutation.parquet --out M

For each module, every mutation site is listed (an AST walk, `sites`: a comparison operator
flipped, an arithmetic or boolean operator swapped, a numeric constant changed by one, a string
constant changed (not docstrings, not the text of error messages, not parameter defaults), a `return x`
made `return None`), within the module's FOCUS (the definitions its property tests are about: the
analysis and the importers' mapping tables, not the file reading and glue around them);
`--n` of them are drawn with `--seed`; each is written over the module in place, the module's fast
tests (MODULES) run with `pytest -x -q`, and the file is put back (also on Ctrl-C: `finally`). A
mutant is *killed* when the tests fail, *survived* when they pass, and *timeout* when they run past
`--timeout` seconds (counted as killed, as mutmut does); a survivor listed in EQUIVALENT (it changes
no behaviour, with the reason) is *equivalent* and left out of the score. The report (`--out`/
mutation.parquet, one row per module x mutant, and mutation.md, the score per module with a Wilson
interval) lists every survivor with its line, so a test can be written for it; a run for some modules
keeps the other modules' rows, and `--survivors` reruns only the survivors (after writing tests).
`--merge` runs nothing: it joins reports (a later one wins on a site both drew) and puts each row on its
module as the module is now, by the mutated line's text, column and mutation (a module that moved or split
is followed through MOVED; a row whose line was edited is dropped, saying so; a survivor's verdict is read
again from EQUIVALENT), so one report holds every sample and names the current files.

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
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module -> the fast tests that cover it (every fast test module that imports it; seconds, not minutes)
MODULES: dict[str, list[str]] = {
    "probes/heads.py": ["tests/probes/test_heads.py", "tests/probes/test_heads_contracts.py",
                        "tests/probes/test_head_similarity.py"],
    "probes/multibootstrap.py": ["tests/probes/test_multibootstrap.py"],
    "probes/amnesic.py": ["tests/probes/test_amnesic.py"],
    "probes/structural.py": ["tests/probes/test_structural.py", "tests/probes/test_arcs.py"],
    "probes/edge.py": ["tests/probes/test_edge.py"],
    "probes/layers.py": ["tests/probes/test_layers.py", "tests/probes/test_controls.py"],
    # the importers' mapping tables
    "plmodels/hf/bert.py": ["tests/plmodels/test_hf_import.py", "tests/plmodels/test_hf_export.py"],
    "plmodels/hf/common.py": ["tests/plmodels/test_hf_import.py", "tests/plmodels/test_hf_gpt2.py"],
    "plmodels/hf/encoders.py": ["tests/plmodels/test_hf_encoders.py", "tests/plmodels/test_hf_albert.py",
                                "tests/plmodels/test_hf_electra_export.py", "tests/plmodels/test_hf_import_families.py"],
    "plmodels/hf/gpt2.py": ["tests/plmodels/test_hf_gpt2.py", "tests/plmodels/test_gpt2_parity.py"],
    "plmodels/hf/gpt_neox.py": ["tests/plmodels/test_hf_gpt_neox.py"],
    "plmodels/hf/seq2seq.py": ["tests/plmodels/test_seq2seq_parity.py", "tests/plmodels/test_hf_import_families.py"],
    "plmodels/hf/xlnet.py": ["tests/plmodels/test_xlnet.py", "tests/plmodels/test_hf_import_families.py"],
}

# module -> the top-level definitions (functions, classes, constants, by name) whose lines are mutated: the
# analysis and the mapping tables the tests are about, not the file reading, error reporting and glue around
# them (a module not listed: every line). `sites` in the report counts the focus's sites only.
FOCUS: dict[str, tuple[str, ...]] = {
    "probes/layers.py": ("ProbeData", "expected_layer", "differential_scores", "center_of_gravity", "_fit_eval",
                         "_metric_rows", "_seed_aggregates", "per_layer_scores", "cross_fit_best",
                         "scalar_mix_probe", "cumulative_scores"),
    "probes/amnesic.py": ("_onehot", "Eraser", "LeaceEraser", "RandomEraser", "_orth", "INLPEraser", "displacement",
                          "MatchedRandomEraser", "ShuffledLabelEraser"),
    "probes/structural.py": ("tree_depths", "tree_distances", "_sentence_rows", "_read_sentences", "fit_probes",
                             "_fit_group", "_pred_block", "_loss",
                             "_distance_loss", "_StructuralProbe", "_train_group", "DistanceProbe", "DepthProbe",
                             "mst_edges", "_ratio_of_sums", "_mean", "_length_average", "_padded", "uuas_items",
                             "root_accuracy_items", "_spearman_rows", "dspr_items", "nspr_items", "uniform_tree",
                             "random_tree_predictions", "chain_predictions", "position_features", "item_counts"),
    "plmodels/hf/bert.py": ("IGNORED", "RENAMES", "QKV", "OPTIONAL_PREFIXES", "config_from_hf", "map_hf_state"),
    "plmodels/hf/common.py": ("HF_ACTIVATIONS",),
    "plmodels/hf/encoders.py": ("ROBERTA", "DISTILBERT", "ELECTRA", "ALBERT_LAYER", "ALBERT", "ALBERT_PROJECTION",
                                "_activation", "roberta_config", "electra_config", "albert_config",
                                "distilbert_config", "_templates", "map_family_state", "hf_names", "_vocab_projection",
                                "_albert_identity_projection"),
    "plmodels/hf/gpt2.py": ("config_from_gpt2", "_map", "gpt2_name", "map_gpt2_state"),
    "plmodels/hf/gpt_neox.py": ("PREFIX", "NEOX_RENAMES", "LM_HEADS", "BUFFERS", "NEOX_REQUIRED", "_rope",
                                "config_from_neox", "neox_qkv_to_ours", "_map", "neox_name", "map_neox_state",
                                "_check_inv_freq", "_lm_head"),
    "plmodels/hf/seq2seq.py": ("t5_config", "_t5_rescale", "bart_config", "ATTN", "BART_RENAMES", "PROJ", "GROUPS",
                               "_compile", "_rename", "_fuse", "_tied_copy", "from_hf_t5_state_dict",
                               "from_hf_bart_state_dict"),
    "plmodels/hf/xlnet.py": ("ACTIVATIONS", "xlnet_config", "RENAMES", "_TABLE", "_reshape",
                             "from_hf_xlnet_state_dict"),
}

# Equivalent mutants: (module, the mutated line's source text, the node's column counted from the line's first
# character, mutation) -> why no test can kill it. They are run and reported but left out of the score. Keyed by source text and column, not line
# number, so an edit elsewhere in the module keeps the entry.
EQUIVALENT: dict[tuple[str, str, int, str], str] = {
    ("probes/heads.py", "return np.zeros((0, *self.shape_)), np.zeros((0, 1, 1))", 0, "return x -> return None"):
        "HeadStats._parts with no per-sentence parts kept: only then are all the point scores NaN (no word "
        "counted), so floor_check never calls it; a defensive branch",
    ("probes/multibootstrap.py", "return np.where(d > 0, 2 * tp / np.where(d > 0, d, 1.0), 1.0)", 45, "0 -> 1"):
        "the inner where only keeps the division finite: with d > 1 instead of d > 0 it divides by 1.0 where "
        "d is 1, the same number",
    ("probes/amnesic.py", "if not lo < mid < hi:       # rounding at a tiny bracket", 7, "Lt -> LtE"):
        "MatchedRandomEraser._search: differs only when the secant lands exactly on lo. Then move(lo) is read "
        "again from its cache instead of bisecting, lo stays, and the Illinois halving moves the next secant "
        "off lo; the search still returns a gamma whose move is the target to rtol (its contract), so only "
        "the path inside the tolerance changes",
    ("probes/amnesic.py", "cross = xc.T @ (z - z.mean(0)) / len(X)  # (D, K)", 16, "Sub -> Add"):
        "xc is centred (its columns sum to 0), so xc.T @ (z + c) = xc.T @ z = xc.T @ (z - c) for any row c",
    ("probes/amnesic.py", "keep = evals > self.tol * max(float(evals.max()), 1e-300)", 7, "Gt -> GtE"):
        "differs only for an eigenvalue exactly equal to tol x the largest (a zero eigenvalue is below "
        "the positive threshold either way)",
    ("probes/amnesic.py", "w = (evecs * np.where(keep, 1.0 / root, 0.0)) @ evecs.T  # S^{-1/2} (pseudo-inverse on the kept part)",
     40, "0.0 -> 1.0"):
        "a dropped direction has no variance, so no covariance with the labels: u (left singular vectors "
        "of W C) has no component along it and u.T @ W never reads W's value there",
    ("probes/amnesic.py", "u = u[:, s > self.tol * max(float(s.max()), 1e-300)] if s.size else u[:, :0]", 9,
     "Gt -> GtE"):
        "differs only for a singular value exactly equal to tol x the largest",
    ("probes/amnesic.py", "q, _ = np.linalg.qr(np.random.default_rng(self.seed).standard_normal((self.d_in_, "
     "max(self.rank, 1))))", 97, "1 -> 2"):
        "at rank 1 the draw gets a second column that QR then drops: the kept direction is another draw from "
        "the same uniform law (the seed's stream is read in another order), which only a test pinning the "
        "stream could tell; at rank 0 nothing is kept either way",
    ("probes/amnesic.py", "lo, hi = hi, min(2 * hi, self.max_gamma)", 17, "2 -> 3"):
        "tripling instead of doubling only widens the bracket: move increases with gamma, so _search meets "
        "the same gamma (to rtol) in any bracket that holds it, and the range's end is min(., max_gamma) "
        "either way",
    ("probes/amnesic.py", "return vt[s > tol * max(float(s.max()), 1e-300)]", 10, "Gt -> GtE"):
        "differs only for a singular value exactly equal to tol x the largest",
    ("probes/amnesic.py", "log_ev = np.log(np.maximum(evals, self.tol * max(float(evals.max()), 1e-300)))", 34,
     "Mult -> Div"):
        "the floor only keeps log finite for the zero eigenvalues of a rank-deficient covariance; no "
        "eigenvalue of full-rank data is near either floor, and on rank-deficient data another floor "
        "gives another control that meets the same target (the contract the tests check)",
    ("probes/amnesic.py", "if self.rank and move(0.0) < self.target:  # tilt towards the high-variance directions",
     17, "Lt -> LtE"):
        "at move(0) == target the mutant brackets [0, 1], and _search returns its low end 0 (f_lo = 0): "
        "gamma 0, as the original's no-search",
    ("probes/amnesic.py", "elif self.rank and move(0.0) > self.target:  # or away from them", 24, "0.0 -> 1.0"):
        "this branch is reached with move(0) >= target; move increases with gamma, so move(1) > target "
        "too except when both equal it, and then _search returns the bracket's high end 0: the same gamma",
    ("probes/layers.py", "return (picks[0] if picks[0] == picks[1] else -1), chosen", 14, "0 -> 1"):
        "the layer returned is picks[0] only when picks[0] == picks[1]: returning picks[1] there is the same",
    ("plmodels/hf/gpt2.py", 'if ours == "lm_head.weight":', 11, "'lm_head.weight' -> 'lm_head.weightX'"):
        "gpt2_name's shortcut for the LM head: no GPT2_RENAMES target is lm_head.weight, so without it the loop "
        "below matches nothing and returns `ours` itself, the same name",
    ("probes/structural.py", 'by_length = ids[np.argsort(lens, kind="stable")]', 38, "'stable' -> 'stableX'"):
        "numpy reads the first letter of `kind` only ('s': stable), so the sort is the same",
}

# Modules that moved or split since a report was made: old path -> the modules its lines are in now. `--merge`
# looks an old row's line up in these (the first that has it), so a report made before a move still counts.
MOVED: dict[str, tuple[str, ...]] = {
    "plmodels/hf_import.py": ("plmodels/hf/bert.py", "plmodels/hf/common.py"),   # BERT; the shared readers
    "plmodels/hf_encoders.py": ("plmodels/hf/encoders.py",),
    "plmodels/hf_gpt2.py": ("plmodels/hf/gpt2.py",),
    "plmodels/hf_gpt_neox.py": ("plmodels/hf/gpt_neox.py",),
    "plmodels/hf_seq2seq.py": ("plmodels/hf/seq2seq.py",),
    "plmodels/hf_xlnet.py": ("plmodels/hf/xlnet.py",),
}

CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
            ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
BOOL_SWAP = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    """One mutation site: the `index`-th node (in ast.walk order) of kind `op`, at `line` and column `col`."""

    index: int
    line: int
    col: int
    op: str          # "compare", "binop", "boolop", "constant", "return", "string"
    what: str        # before -> after, for the report


def _sites(tree: ast.AST) -> list[Mutant]:
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in CMP_SWAP:
            out.append(Mutant(i, node.lineno, node.col_offset, "compare",
                              f"{type(node.ops[0]).__name__} -> {CMP_SWAP[type(node.ops[0])].__name__}"))
        elif isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAP:
            out.append(Mutant(i, node.lineno, node.col_offset, "binop", f"{type(node.op).__name__} -> {BIN_SWAP[type(node.op)].__name__}"))
        elif isinstance(node, ast.BoolOp) and type(node.op) in BOOL_SWAP:
            out.append(Mutant(i, node.lineno, node.col_offset, "boolop", f"{type(node.op).__name__} -> {BOOL_SWAP[type(node.op)].__name__}"))
        elif (isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool)
              and hasattr(node, "lineno")):
            out.append(Mutant(i, node.lineno, node.col_offset, "constant", f"{node.value!r} -> {node.value + 1!r}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and hasattr(node, "lineno") \
                and 0 < len(node.value) < 40 and "\n" not in node.value:
            out.append(Mutant(i, node.lineno, node.col_offset, "string", f"{node.value!r} -> {node.value + 'X'!r}"))
        elif isinstance(node, ast.Return) and node.value is not None:
            out.append(Mutant(i, node.lineno, node.col_offset, "return", "return x -> return None"))
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


def _focus_lines(tree: ast.Module, names: tuple[str, ...]) -> set[int]:
    """The line numbers of the top-level definitions and assignments named in `names`."""
    unknown = set(names)
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined = {node.name}
        elif isinstance(node, ast.Assign):
            defined = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined = {node.target.id}
        else:
            continue
        if defined & set(names):
            unknown -= defined
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            lines |= set(range(start, node.end_lineno + 1))
    if unknown:
        raise ValueError(f"FOCUS: no top-level definition named {sorted(unknown)}")
    return lines


def _default_ids(tree: ast.AST) -> set[int]:
    """id() of the nodes inside the default values of function parameters: a default is a choice each
    caller may override (the tests pass theirs), not a computation a test of the function's property
    can tell apart (1000 bootstrap resamples or 1001, 20 INLP iterations or 21)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *(k for k in node.args.kw_defaults if k is not None)]:
                ids |= {id(c) for c in ast.walk(d)}
    return ids


def sites(source: str, focus: tuple[str, ...] | None = None) -> list[Mutant]:
    """The mutation sites of a module, less docstrings, error-message text and parameter defaults; with
    `focus`, only those inside the top-level definitions it names."""
    tree = ast.parse(source)
    skip = _docstring_ids(tree) | _message_ids(tree) | _default_ids(tree)
    nodes = list(ast.walk(tree))
    keep = _focus_lines(tree, focus) if focus is not None else None
    return [m for m in _sites(tree) if id(nodes[m.index]) not in skip and (keep is None or m.line in keep)]


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


# Third-party libraries the tests import, loaded once by the parent so that each forked test run skips
# their import (about a third of a small test run's CPU: 2.5 of 7.8 s for test_layers + test_controls). The parent imports nothing of the
# project: a child imports the module under test fresh, mutated or not.
PRELOAD = ("numpy", "scipy", "sklearn.linear_model", "pandas", "pyarrow", "torch", "safetensors.torch",
           "tokenizers", "pytest")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _forked_pytest(tests: list[str], timeout: float) -> int | None:
    """pytest's exit status for `tests` in a forked child of this process (None: killed at `timeout`)."""
    import signal

    pid = os.fork()
    if pid == 0:   # the child: quiet, in the repository, then pytest in process
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.chdir(ROOT)
            sys.path.insert(0, str(ROOT))
            sys.dont_write_bytecode = True   # a cached .pyc of one mutant must never stand in for another
            import pytest

            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
        except BaseException:   # noqa: BLE001 - any failure of the child is a failed run
            code = 99
        os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def run_tests(tests: list[str], timeout: float, fork: bool = False) -> tuple[str, float]:
    """("killed" | "survived" | "timeout", seconds) of `pytest -x -q tests`: in a fresh interpreter, or
    (`fork`) in a forked child of this one, its third-party imports already done (`PRELOAD`)."""
    t0 = time.monotonic()
    if fork:
        code = _forked_pytest(tests, timeout)
        if code is None:
            return "timeout", time.monotonic() - t0
        return ("survived" if code == 0 else "killed"), time.monotonic() - t0
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=ROOT, capture_output=True, timeout=timeout,
                           env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0
    return ("survived" if p.returncode == 0 else "killed"), time.monotonic() - t0


def _row(module: str, m: Mutant, source_line: str, result: str, secs: float, n_sites: int, seed: int) -> dict:
    """The report row of one mutant; `source_line` is the mutated line as in the file."""
    text = source_line.strip()
    col = m.col - (len(source_line) - len(source_line.lstrip()))   # from the line's first character
    reason = EQUIVALENT.get((module, text, col, m.what), "")
    return {"module": module, "index": m.index, "line": m.line, "col": col, "op": m.op, "mutation": m.what,
            "source": text, "result": "equivalent" if reason and result == "survived" else result,
            "reason": reason, "seconds": round(secs, 1), "sites": n_sites, "seed": seed}


def _site_keys(module: str, source: str) -> dict[tuple[str, int, str], list[tuple[Mutant, str]]]:
    """(line's source text, column from its first character, mutation) -> [(site, its line)] of a module's
    focus sites: the key EQUIVALENT uses, which survives edits elsewhere in the file and moves."""
    lines = source.splitlines()
    keys: dict[tuple[str, int, str], list[tuple[Mutant, str]]] = {}
    for m in sites(source, FOCUS.get(module)):
        line = lines[m.line - 1]
        keys.setdefault((line.strip(), m.col - (len(line) - len(line.lstrip())), m.what), []).append((m, line))
    return keys


def rebase(rows: list[dict], sources: dict[str, str] | None = None) -> tuple[list[dict], list[dict]]:
    """Rows of earlier reports put on the modules as they are now: each row's site looked up by its line's
    source text, column and mutation among the current focus sites of its module (of the modules MOVED names
    for a module that moved), its module, index, line and sites updated, and a survivor's verdict read
    again from EQUIVALENT. A key found at several lines (`return self` twice) goes to the one nearest the
    row's line shifted as the module's lines with one match moved (their median shift). Where several rows
    land on one site, the later row wins (a later sample or a rerun). -> (rebased rows, rows whose site is
    gone: its line edited, or no longer in FOCUS). `sources`: module -> its text (default: read under ROOT)."""
    import statistics

    cache: dict[str, dict] = {}

    def keys_of(module: str) -> dict:
        if module not in cache:
            text = sources[module] if sources is not None else (ROOT / module).read_text(encoding="utf-8")
            cache[module] = _site_keys(module, text)
        return cache[module]

    found: list[tuple[dict, str, list[Mutant]] | None] = []
    shifts: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        key = (str(r["source"]), int(r["col"]), str(r["mutation"]))
        for module in MOVED.get(r["module"], (r["module"],)):
            if key in keys_of(module):
                hits = [m for m, _ in keys_of(module)[key]]
                found.append((r, module, hits))
                if len(hits) == 1:
                    shifts.setdefault((r["module"], module), []).append(hits[0].line - int(r["line"]))
                break
        else:
            found.append(None)
    out: dict[tuple[str, int], dict] = {}
    gone = []
    for r, hit in zip(rows, found):
        if hit is None:
            gone.append(r)
            continue
        _, module, hits = hit
        shift = statistics.median(shifts.get((r["module"], module), [0]))
        m = min(hits, key=lambda h: abs(h.line - int(r["line"]) - shift))
        key = (str(r["source"]), int(r["col"]), str(r["mutation"]))
        result, reason = r["result"], ""
        if result in ("survived", "equivalent"):
            reason = EQUIVALENT.get((module, *key), "")
            result = "equivalent" if reason else "survived"
        out[(module, m.index)] = {**r, "module": module, "index": m.index, "line": m.line, "result": result,
                                  "reason": reason, "sites": sum(map(len, keys_of(module).values()))}
    return list(out.values()), gone


def sample_module(module: str, n: int, seed: int, timeout: float, only: set[int] | None = None,
                  fork: bool = False) -> list[dict]:
    """Run `n` mutants of `module` drawn with `seed` (or, with `only`, the mutants of those site indices)."""
    path = ROOT / module
    original = path.read_text(encoding="utf-8")
    source_lines = original.splitlines()
    found = sites(original, FOCUS.get(module))
    if only is None:
        rng = random.Random(f"{seed}:{module}")
        chosen = sorted(rng.sample(found, min(n, len(found))), key=lambda m: m.line)
    else:
        chosen = [m for m in found if m.index in only]
    status, base_s = run_tests(MODULES[module], timeout, fork)
    if status != "survived":
        raise SystemExit(f"{module}: its tests fail (or time out) unmutated: {MODULES[module]}")
    rows = []
    try:
        for k, m in enumerate(chosen, 1):
            path.write_text(mutate(original, m), encoding="utf-8")
            result, secs = run_tests(MODULES[module], max(timeout, 3 * base_s), fork)
            rows.append(_row(module, m, source_lines[m.line - 1], result, secs, len(found), seed))
            print(f"[{module} {k}/{len(chosen)}] line {m.line} {m.op} {m.what}: {rows[-1]['result']} ({secs:.0f} s)",
                  flush=True)
    finally:
        path.write_text(original, encoding="utf-8")
    return rows


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson 95% interval of k successes out of n."""
    import math

    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def report(rows: list[dict]) -> str:
    """Markdown: per module, mutants, equivalent, killed (timeouts included), score = killed / (mutants -
    equivalent) with a Wilson 95% interval; then the survivors and the equivalent mutants by line."""
    lines = ["| module | sites | mutants | equivalent | killed | score | 95% interval |",
             "|---|---|---|---|---|---|---|"]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["module"], []).append(r)
    total_k = total_n = 0
    for module, rs in by.items():
        eq = sum(r["result"] == "equivalent" for r in rs)
        k = sum(r["result"] in ("killed", "timeout") for r in rs)
        n = len(rs) - eq
        total_k, total_n = total_k + k, total_n + n
        lo, hi = _wilson(k, n)
        lines.append(f"| {module} | {rs[0]['sites']} | {len(rs)} | {eq} | {k} | {k / n:.2f} | [{lo:.2f}, {hi:.2f}] |")
    lo, hi = _wilson(total_k, total_n)
    lines.append(f"| all | | {len(rows)} | {len(rows) - total_n} | {total_k} | {total_k / total_n:.2f} | "
                 f"[{lo:.2f}, {hi:.2f}] |")
    lines += ["", "Survivors (a test should fail on each):", ""]
    lines += [f"- {r['module']}:{r['line']} {r['op']} {r['mutation']}: `{r['source']}`"
              for r in rows if r["result"] == "survived"] or ["- none"]
    lines += ["", "Equivalent mutants (left out of the score):", ""]
    lines += [f"- {r['module']}:{r['line']} {r['op']} {r['mutation']}: `{r['source']}`: {r['reason']}"
              for r in rows if r["result"] == "equivalent"] or ["- none"]
    return "\n".join(lines) + "\n"


COLUMNS = ("module", "index", "line", "col", "op", "mutation", "source", "result", "reason", "seconds", "sites", "seed")


def _merge(p: argparse.ArgumentParser, reports: list[Path], out: Path) -> int:
    """`--merge`: the rows of `reports`, in order, rebased onto the modules as they are now, into `out`."""
    import pandas as pd

    for f in reports:
        if not f.is_file():
            p.error(f"--merge: {f} does not exist")
    frames = [pd.read_csv(f, keep_default_na=False) if f.suffix == ".csv" else pd.read_parquet(f) for f in reports]
    for f, df in zip(reports, frames):
        absent = [c for c in COLUMNS if c not in df.columns]
        if absent:
            p.error(f"--merge: {f} has no column {absent} (not a report of this script)")
    rows, gone = rebase([r for df in frames for r in df.to_dict("records")])
    for r in gone:
        print(f"dropped (its site is gone): {r['module']}:{r['line']} {r['mutation']}: `{r['source']}`", file=sys.stderr)
    order = {m: i for i, m in enumerate(MODULES)}
    rows = sorted(rows, key=lambda r: (order.get(r["module"], len(order)), r["line"]))
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.to_parquet(out / "mutation.parquet", index=False)
    table.to_csv(out / "mutation.csv", index=False)
    (out / "mutation.md").write_text(report(rows), encoding="utf-8")
    print(report(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", nargs="*", default=list(MODULES), help="modules to sample (default: all of MODULES)")
    p.add_argument("--n", type=int, default=20, help="mutants per module (default 20)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a test run counts as a timeout")
    p.add_argument("--out", type=Path, default=Path("runs/mutation"), help="folder for the report")
    p.add_argument("--survivors", action="store_true",
                   help="rerun only the survivors (and equivalents) of --out's report for --modules, keeping "
                        "its killed rows: the check after writing tests for them")
    p.add_argument("--fork", action="store_true",
                   help="run each mutant's tests in a forked child of this process, numpy/torch/pandas imported "
                        "once (POSIX; about a third less CPU per run on the small probes test modules)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="REPORT",
                   help="run nothing: join these reports (mutation.parquet or .csv, later ones winning on a site "
                        "both drew) into --out, each row put on its module as it is now (`rebase`: moved modules, "
                        "edited lines, EQUIVALENT read again); also writes --out/mutation.csv")
    a = p.parse_args(argv)
    unknown = [m for m in a.modules if m not in MODULES]
    if unknown:
        p.error(f"--modules: no tests known for {unknown}; known: {', '.join(MODULES)}")
    import pandas as pd

    if a.merge:
        return _merge(p, a.merge, a.out)

    table = a.out / "mutation.parquet"
    old = pd.read_parquet(table) if table.is_file() else pd.DataFrame(columns=["module"])
    if a.survivors and not table.is_file():
        p.error(f"--survivors: {table} does not exist (run without --survivors first)")
    if a.fork:
        _preload()
    rows = []
    for m in a.modules:
        if a.survivors:
            prev = old[old["module"] == m]
            # rows of sites no longer sampled (the site list changed: FOCUS, or a rule of `sites`) are dropped
            current = {s.index for s in sites((ROOT / m).read_text(encoding="utf-8"), FOCUS.get(m))}
            prev = prev[prev["index"].astype(int).isin(current)]
            again = prev["result"].isin(["survived", "equivalent"])
            rows += prev[~again].to_dict("records")
            rows += sample_module(m, a.n, int(prev["seed"].iloc[0]) if len(prev) else a.seed, a.timeout,
                                  only=set(prev.loc[again, "index"].astype(int)), fork=a.fork)
        else:
            rows += sample_module(m, a.n, a.seed, a.timeout, fork=a.fork)
    # a module run again replaces its old rows; the other modules' rows are kept
    kept = old[~old["module"].isin(a.modules)].to_dict("records")
    order = {m: i for i, m in enumerate(MODULES)}
    rows = sorted(kept + rows, key=lambda r: (order.get(r["module"], len(order)), r["line"]))
    a.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(table, index=False)
    (a.out / "mutation.md").write_text(report(rows), encoding="utf-8")
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
