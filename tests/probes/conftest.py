"""Shared fixtures for the probes tests."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models and problems are overhead-bound: torch's thread pool only adds contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def planted(one_thread):
    """A tiny encoder with one planted crucial head, and batches labelled with its own predictions."""
    from tests.probes.test_importance import planted_encoder, self_labelled_batches

    model = planted_encoder()
    return model, self_labelled_batches(model)
