"""onednn_linear: the inference forward's linear layers on oneDNN give F.linear's values, and the
mode leaves every call that needs autograd, or that it cannot take, to F.linear."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from plmodels.components.cpu_linear import available, onednn_linear
from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig

pytestmark = pytest.mark.skipif(not available(), reason="this PyTorch build has no oneDNN linear op")


def _routed(fn) -> int:
    """How many oneDNN linear calls `fn` made."""
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    return sum(e.count for e in p.key_averages() if e.key == "mkldnn::_linear_pointwise")


@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (1, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_fp32_equals_f_linear(shape, bias):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g), torch.randn(40, 24, generator=g) * 0.2
    b = torch.randn(40, generator=g) if bias else None
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    with torch.inference_mode(), onednn_linear():
        got = F.linear(x, w, b)
        assert _routed(lambda: F.linear(x, w, b)) == 1
    assert got.dtype == torch.float32 and got.shape == exact.shape
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_casts_like_autocast():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(64, 32, generator=g), torch.randn(48, 32, generator=g) * 0.2, torch.randn(48, generator=g)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.linear(x, w, b)
        with onednn_linear():
            got = F.linear(x, w, b)
            assert _routed(lambda: F.linear(x, w, b)) == 1
    assert got.dtype == ref.dtype == torch.bfloat16
    # same bf16 inputs, fp32 accumulation: equal up to the output's bf16 rounding
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_autograd_calls_stay_on_f_linear():
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8, requires_grad=True)
    with onednn_linear():
        y = lin(x)
        assert _routed(lambda: lin(x)) == 0
    assert torch.equal(y, lin(x))
    y.sum().backward()  # the graph is F.linear's
    assert x.grad is not None and lin.weight.grad is not None


def test_other_dtypes_stay_on_f_linear():
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad(), onednn_linear():
        assert torch.equal(F.linear(x, w), x @ w.T)
        assert _routed(lambda: F.linear(x, w)) == 0


@pytest.mark.parametrize("model", ["encoder", "decoder"])
def test_model_forward_equals_default(model):
    torch.manual_seed(0)
    if model == "encoder":
        m = Encoder(EncoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=16))
    else:
        m = Decoder(DecoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=16))
    m.eval()
    ids = torch.randint(1, 50, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    kw = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
    with torch.inference_mode():
        ref = m(ids, **kw)
        with onednn_linear():
            got = m(ids, **kw)
    for a, b in zip(ref.hidden_states + ref.attentions, got.hidden_states + got.attentions):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
