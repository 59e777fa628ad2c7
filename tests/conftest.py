"""Fixtures shared by every test package, and the slow tier's marks (tests/tiers.py)."""
import pytest
import torch

from tests.tiers import load_durations, slow_tier


def pytest_collection_modifyitems(config, items):
    """Mark `slow` the tests that tests/durations.json measured slow (alone or by their module) or whose
    module it never measured, so that `pytest -m "not slow"` is the fast tier (tests/tiers.py); a test's
    own @pytest.mark.slow stands as well."""
    slow = slow_tier([item.nodeid for item in items], load_durations())
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models and problems are overhead-bound: torch's thread pool only adds contention. The
    thread count is restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The main job on configs/tiny.json, run once per session into <tmp>/results/tiny: what the
    pipeline really writes, for the pipeline test, the app in a browser and the report."""
    from pathlib import Path

    from workbench.core.paths import data_root
    from workbench.pipeline import run_pipeline

    if not (data_root() / "ud_english_ewt").is_dir():
        pytest.skip("data root missing")
    run = tmp_path_factory.mktemp("results") / "tiny"
    run_pipeline(Path(__file__).resolve().parents[1] / "configs" / "tiny.json", run_dir=run)
    return run


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory):
    """`workbench zoo` on configs/zoo-tiny.json, run once per session into <tmp>/results/zoo-tiny: what
    the zoo really writes, for its test, the report and the app's Objectives page."""
    from pathlib import Path

    from workbench.core.paths import data_root
    from workbench.zoo import run_zoo

    if not (data_root() / "ud_english_ewt").is_dir() or not (data_root() / "tiny_shakespeare").is_dir():
        pytest.skip("data root missing")
    run = tmp_path_factory.mktemp("results") / "zoo-tiny"
    run_zoo(Path(__file__).resolve().parents[1] / "configs" / "zoo-tiny.json", run_dir=run)
    return run
