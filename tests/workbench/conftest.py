"""Every workbench test module runs on one thread (tests/conftest.py: one_thread)."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread_here(one_thread):
    yield
