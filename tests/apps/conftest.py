"""The app tests' results fixtures (defined in tests/apps/results_fixtures.py)."""

from tests.apps.results_fixtures import partial_root, results_root, run_dir  # noqa: F401  (fixtures)
