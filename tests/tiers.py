"""The two test tiers, decided by measured time: `pytest -m "not slow"` is the fast tier a developer
runs between edits (under two minutes on the 2-core machine), plain `pytest` the full suite CI runs.

A test is `slow` when it carries `@pytest.mark.slow` itself, when tests/durations.json says that it,
or the test module it is in, took longer than the limits below, or when its module was never measured (a module's setup is paid by
whichever of its tests runs first, so a module whose tests together are slow goes to the slow tier
whole). tests/conftest.py applies the marks at collection.

tests/durations.json holds the seconds per test id (setup + call + teardown) of a full run, and how
it was measured. Refresh it after adding slow tests, from `--durations=0` output of the suite in parts:

    nice -n 10 python3 -m pytest -q -p no:cacheprovider --durations=0 --durations-min=0 tests/probes > probes.log
    ...   (tests/plmodels, tests/workbench, tests/apps, research/tests, tests/test_*.py)
    python3 -m tests.tiers "what was run, where" probes.log plmodels.log ... > tests/durations.json

A new test in a measured module is fast unless it is marked; a module the file does not know at all is
slow until the file is refreshed, so the fast tier keeps its budget.
"""
from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
TEST_LIMIT_S = 1.5      # one test (setup, call and teardown) longer than this is slow
MODULE_LIMIT_S = 10.0   # a module whose tests together take longer than this is slow whole
FAST_BUDGET_S = 90.0    # the fast tier's measured seconds (tests/test_tiers.py); collection adds ~20 s
_LINE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)$")


def parse_durations(lines) -> dict[str, float]:
    """Seconds per test id (setup + call + teardown) from pytest `--durations=0` report lines."""
    out: dict[str, float] = defaultdict(float)
    for line in lines:
        m = _LINE.match(line.strip())
        if m:
            out[m.group(3)] += float(m.group(1))
    return dict(out)


def slow_ids(seconds: dict[str, float], test_limit: float = TEST_LIMIT_S,
             module_limit: float = MODULE_LIMIT_S) -> set[str]:
    """The test ids of the slow tier: over `test_limit` alone, or in a module over `module_limit`."""
    per_module: dict[str, float] = defaultdict(float)
    for test, s in seconds.items():
        per_module[test.split("::")[0]] += s
    return {test for test, s in seconds.items()
            if s > test_limit or per_module[test.split("::")[0]] > module_limit}


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The measured seconds per test id of tests/durations.json ({} when the file is absent)."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["seconds"]


def slow_tier(test_ids, seconds: dict[str, float]) -> set[str]:
    """Of `test_ids`, those in the slow tier: measured slow (`slow_ids`), or in a module that was not
    measured at all (a new module stays out of the fast tier until tests/durations.json is refreshed,
    so the fast tier keeps its budget). With no measurements, none."""
    if not seconds:
        return set()
    slow = slow_ids(seconds)
    measured = {test.split("::")[0] for test in seconds}
    return {t for t in test_ids if t in slow or t.split("::")[0] not in measured}


def marked_slow(root: Path, folders: tuple[str, ...] = ("tests", "research/tests")) -> set[str]:
    """The ids "path::name" (parameters left off) of the test functions that carry `@pytest.mark.slow`
    themselves, read from the sources under `root` (a test measured fast that is marked slow runs in the
    slow tier all the same, so the fast tier's measured budget leaves it out)."""
    import ast
    out = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("test_*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        ast.unparse(d).startswith("pytest.mark.slow") for d in node.decorator_list):
                    out.add(f"{path.relative_to(root).as_posix()}::{node.name}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python3 -m tests.tiers 'what was measured, where' LOG ...", file=sys.stderr)
        return 2
    seconds: dict[str, float] = {}
    for log in argv[1:]:
        seconds.update(parse_durations(Path(log).read_text(encoding="utf-8").splitlines()))
    record = {"measured": argv[0], "test_limit_s": TEST_LIMIT_S, "module_limit_s": MODULE_LIMIT_S,
              "seconds": {k: round(v, 2) for k, v in sorted(seconds.items())}}
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
