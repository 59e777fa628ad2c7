"""scripts/mutation_sample.py on a module small enough to list its mutants by hand."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_sample.py"
spec = importlib.util.spec_from_file_location("mutation_sample", SCRIPT)
ms = importlib.util.module_from_spec(spec)
sys.modules["mutation_sample"] = ms   # its dataclasses look their module up there
spec.loader.exec_module(ms)

SOURCE = '''def f(x):
    """Docstrings are never mutated."""
    if x < 1:
        raise ValueError(f"x must be >= 1, got {x}")
    return x + 2
'''


def test_sites_are_the_operators_numbers_and_returns_but_no_docstring_or_message():
    found = sorted((m.line, m.op, m.what) for m in ms.sites(SOURCE))
    assert found == [(3, "compare", "Lt -> LtE"), (3, "constant", "1 -> 2"), (5, "binop", "Add -> Sub"),
                     (5, "constant", "2 -> 3"), (5, "return", "return x -> return None")]


def test_a_mutant_changes_its_one_node_and_nothing_else():
    (lt,) = [m for m in ms.sites(SOURCE) if m.op == "compare"]
    mutant = ms.mutate(SOURCE, lt)
    assert "if x <= 1:" in mutant and "return x + 2" in mutant
    scope: dict = {}
    exec(mutant, scope)
    assert scope["f"](3) == 5


def test_the_score_leaves_equivalent_mutants_out():
    row = dict(module="m.py", op="constant", mutation="0 -> 1", source="y = 0", sites=9, seed=0, reason="")
    rows = [{**row, "line": 1, "result": "killed"}, {**row, "line": 2, "result": "timeout"},
            {**row, "line": 3, "result": "survived"}, {**row, "line": 4, "result": "equivalent", "reason": "why"}]
    md = ms.report(rows)
    # 2 of 3 killed (a timeout counts as killed), the equivalent one not counted: Wilson [0.21, 0.94]
    assert "| m.py | 9 | 4 | 1 | 2 | 0.67 | [0.21, 0.94] |" in md
    assert "- m.py:3 constant 0 -> 1: `y = 0`" in md and "- m.py:4 constant 0 -> 1: `y = 0`: why" in md


FOCUSED = '''TABLE = {"a": "b"}


def g(x, n=3):
    return x * n


def h(x):
    return x - 1
'''


def test_focus_keeps_the_named_definitions_and_no_parameter_default_is_a_site():
    found = sorted((m.line, m.op, m.what) for m in ms.sites(FOCUSED, ("TABLE", "g")))
    # TABLE's two strings and g's body; not g's default n=3, nothing of h
    assert found == [(1, "string", "'a' -> 'aX'"), (1, "string", "'b' -> 'bX'"),
                     (5, "binop", "Mult -> Div"), (5, "return", "return x -> return None")]
    assert {m.line for m in ms.sites(FOCUSED)} == {1, 5, 9}
    with pytest.raises(ValueError, match="'nope'"):
        ms.sites(FOCUSED, ("g", "nope"))


def test_every_focus_names_definitions_of_its_module():
    for module, names in ms.FOCUS.items():
        assert module in ms.MODULES
        assert ms.sites((ms.ROOT / module).read_text(encoding="utf-8"), names)


def test_every_equivalent_mutant_is_a_site_of_its_module_as_it_is():
    # an entry whose line was edited away would silently stop applying
    for module, text, col, what in ms.EQUIVALENT:
        source = (ms.ROOT / module).read_text(encoding="utf-8")
        lines = source.splitlines()
        keys = set()
        for m in ms.sites(source, ms.FOCUS.get(module)):
            line = lines[m.line - 1]
            keys.add((line.strip(), m.col - (len(line) - len(line.lstrip())), m.what))
        assert (text, col, what) in keys, (module, text)


def test_rebase_puts_old_rows_on_the_moved_module_by_line_text_and_drops_edited_lines(monkeypatch):
    # old.py became new.py, three lines lower, its last line edited (x + 2 -> x + 3)
    moved = "import math\n\n\n" + SOURCE.replace("x + 2", "x + 3")
    monkeypatch.setattr(ms, "MOVED", {"old.py": ("other.py", "new.py")})
    monkeypatch.setattr(ms, "EQUIVALENT", {("new.py", "if x < 1:", 3, "Lt -> LtE"): "why"})
    row = dict(module="old.py", index=0, op="", seconds=1.0, sites=5, seed=0, reason="")
    lt = {**row, "line": 3, "source": "if x < 1:", "col": 3, "mutation": "Lt -> LtE"}
    rows = [{**lt, "result": "killed"},
            {**row, "line": 3, "source": "if x < 1:", "col": 7, "mutation": "1 -> 2", "result": "killed"},
            {**row, "line": 5, "source": "return x + 2", "col": 7, "mutation": "Add -> Sub", "result": "killed"},
            {**lt, "result": "survived", "seed": 1}]   # the same site again, later: it wins, and is equivalent now
    got, gone = ms.rebase(rows, {"other.py": "y = 1\n", "new.py": moved})
    now = {(m.line, m.what): m.index for m in ms.sites(moved)}
    assert sorted((r["module"], r["line"], r["index"], r["mutation"], r["result"], r["reason"], r["sites"])
                  for r in got) == sorted([("new.py", 6, now[(6, "1 -> 2")], "1 -> 2", "killed", "", 5),
                                           ("new.py", 6, now[(6, "Lt -> LtE")], "Lt -> LtE", "equivalent", "why", 5)])
    assert [r["source"] for r in gone] == ["return x + 2"]


TWICE = '''def a(x):
    return x


def b(x):
    y = x * 2
    return x
'''


def test_rebase_sends_a_line_found_twice_to_the_one_shifted_as_the_module_moved():
    # five lines lower now (the one-match row says by how much): each `return x` keeps its own verdict
    row = dict(module="m.py", index=0, col=0, op="return", mutation="return x -> return None", source="return x",
               reason="", seconds=1.0, sites=4, seed=0)
    rows = [{**row, "line": 2, "result": "killed"}, {**row, "line": 7, "result": "survived"},
            {**row, "line": 6, "op": "binop", "source": "y = x * 2", "col": 4, "mutation": "Mult -> Div",
             "result": "killed"}]
    got, gone = ms.rebase(rows, {"m.py": "\n" * 5 + TWICE})
    assert gone == [] and sorted((r["line"], r["result"]) for r in got) == [(7, "killed"), (11, "killed"),
                                                                            (12, "survived")]
