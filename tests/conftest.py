"""Fixtures shared by every test package."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models and problems are overhead-bound: torch's thread pool only adds contention. The
    thread count is restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
