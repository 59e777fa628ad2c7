"""The two test tiers (tests/tiers.py): the rule that puts a test in the slow tier, by hand, and the
measured fast tier fitting its budget."""
import json
from pathlib import Path

from tests.tiers import DURATIONS, FAST_BUDGET_S, marked_slow, parse_durations, slow_ids, slow_tier


def test_durations_sum_setup_call_and_teardown_per_test():
    lines = ["============ slowest durations ============",
             "2.50s call     tests/a.py::test_x[1]",
             "0.40s setup    tests/a.py::test_x[1]",
             "0.10s teardown tests/a.py::test_x[1]",
             "0.01s call     tests/b.py::test_y",
             "(12 durations < 0.005s hidden)"]
    assert parse_durations(lines) == {"tests/a.py::test_x[1]": 3.0, "tests/b.py::test_y": 0.01}


def test_a_test_is_slow_alone_or_by_its_module():
    seconds = {"tests/a.py::test_long": 2.5, "tests/a.py::test_short": 0.1,
               **{f"tests/b.py::test_{i}": 1.0 for i in range(13)},   # 13 s together: a slow module
               **{f"tests/c.py::test_{i}": 1.0 for i in range(12)}}   # 12 s: at the limit, fast
    slow = slow_ids(seconds, test_limit=2.0, module_limit=12.0)
    assert slow == {"tests/a.py::test_long"} | {f"tests/b.py::test_{i}" for i in range(13)}


def test_a_module_never_measured_is_slow_until_it_is():
    seconds = {"tests/a.py::test_x": 0.1, "tests/a.py::test_y": 3.0}
    ids = ["tests/a.py::test_x", "tests/a.py::test_y", "tests/a.py::test_new", "tests/new.py::test_z"]
    assert slow_tier(ids, seconds) == {"tests/a.py::test_y", "tests/new.py::test_z"}
    assert slow_tier(ids, {}) == set()      # no measurements: no tiers, every test is fast


def test_the_measured_fast_tier_fits_its_budget():
    seconds = json.loads(DURATIONS.read_text())["seconds"]
    slow = slow_ids(seconds)
    marked = marked_slow(Path(__file__).resolve().parents[1])
    fast = sum(s for test, s in seconds.items() if test not in slow and test.split("[")[0] not in marked)
    assert fast <= FAST_BUDGET_S, f"the fast tier measured {fast:.0f} s, over its {FAST_BUDGET_S:.0f} s budget"
    assert len(seconds) - len(slow) >= 0.6 * len(seconds), "most tests stay in the fast tier"


def test_marked_slow_reads_the_decorators_of_the_sources(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n"
        "@pytest.mark.parametrize('n', [1])\n@pytest.mark.slow\ndef test_b(n):\n    pass\n\n"
        "@pytest.mark.skipif(True, reason='x')\ndef test_c():\n    pass\n\ndef test_d():\n    pass\n")
    assert marked_slow(tmp_path, ("tests",)) == {"tests/test_x.py::test_a", "tests/test_x.py::test_b"}
