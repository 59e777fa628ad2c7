"""The tiny encoder and decoder as fixtures (tests/plmodels/tiny.py holds the helpers)."""

from __future__ import annotations

import pytest

from plmodels import Decoder, Encoder

from .tiny import tiny_decoder, tiny_encoder


@pytest.fixture
def encoder() -> Encoder:
    return tiny_encoder()


@pytest.fixture
def decoder() -> Decoder:
    return tiny_decoder()
