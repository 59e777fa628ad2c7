"""Shared fixtures for the probes tests."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread_here(one_thread):
    """Every probes test module runs on one thread (tests/conftest.py: one_thread)."""
    yield


@pytest.fixture(scope="module")
def planted(one_thread):
    """A tiny encoder with one planted crucial head, and batches labelled with its own predictions."""
    from tests.probes.planted import planted_encoder, self_labelled_batches

    model = planted_encoder()
    return model, self_labelled_batches(model)
