"""Results fixtures for the app and view tests: one schema-exact run (12 layers x 12 heads, tiny real
checkpoints and attention store) built once per session, and a partial results root. Imported by
tests/apps/conftest.py and by the view tests."""

from __future__ import annotations

import pytest

from tests.apps.fixtures import make_results_fixture
from workbench.core.results import write_table


@pytest.fixture(scope="session")
def results_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    make_results_fixture(root, n_layers=12, n_heads=12, checkpoints=True)
    return root


@pytest.fixture(scope="session")
def run_dir(results_root):
    return str(results_root / "demo")


@pytest.fixture
def partial_root(tmp_path):
    """A run with only a training table: every analysis page must name its CLI command."""
    import pandas as pd

    write_table(tmp_path / "bare", "training", pd.DataFrame(
        {"model": ["m"], "step": [0], "tokens": [0], "split": ["train"], "metric": ["loss"], "value": [9.0]}))
    return tmp_path
