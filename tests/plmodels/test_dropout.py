"""plmodels.components.dropout: the drop rate, the scale, the gradient, reproducibility and eval identity."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from plmodels.components.dropout import Dropout, dropout, dropout_mask


def test_mask_drops_at_the_rate_and_keeps_the_expectation():
    torch.manual_seed(0)
    m = dropout_mask((1_000_000,), 0.1)
    p = 3277 / 32768  # p rounded to 15 bits
    assert m.unique().tolist() == [0.0, pytest.approx(1 / (1 - p))]
    dropped = (m == 0).float().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / 1e6) ** 0.5  # within 5 standard errors
    assert abs(m.mean().item() - 1.0) < 0.002


def test_both_halves_of_each_draw_are_used_independently():
    torch.manual_seed(1)
    m = dropout_mask((400_000,), 0.5) == 0
    even, odd = m[0::2].float(), m[1::2].float()  # the two 15-bit halves of the same int32 draw
    assert abs(even.mean().item() - 0.5) < 0.005 and abs(odd.mean().item() - 0.5) < 0.005
    assert abs(((even - 0.5) * (odd - 0.5)).mean().item()) < 0.002  # uncorrelated


def test_gradient_uses_the_forward_mask_and_seed_reproduces_it():
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25)
    (g,) = torch.autograd.grad(y.sum(), x)
    kept = y != 0
    assert torch.equal(g != 0, kept)
    torch.testing.assert_close(g[kept], torch.full_like(g[kept], 1 / (1 - 8192 / 32768)))
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.25), y)


def test_module_is_identity_in_eval_and_refuses_bad_rates():
    layer = Dropout(0.3).eval()
    x = torch.randn(5, 7)
    assert layer(x) is x
    assert dropout(x, 0.0) is x
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 0.99999)


@pytest.mark.slow
def test_a_compiled_forward_with_dropout_is_one_graph_off_the_cpu():
    # off the CPU (the meta device stands in for an accelerator: dynamo traces it the same way)
    # torch.compile traces dropout (F.dropout) in a training-mode encoder: one graph, no break; the
    # null, the same model on the CPU, breaks at every dropout site (the 15-bit mask's random_)
    from plmodels.checkpoint import build_model
    from plmodels.families import preset

    torch.manual_seed(0)
    model = build_model("encoder", {**preset("encoder", "tiny"), "vocab_size": 50, "dropout": 0.1}).train()
    ids = torch.randint(5, 50, (2, 12))
    sites = sum(isinstance(m, Dropout) for m in model.modules())
    torch._dynamo.reset()
    cpu = torch._dynamo.explain(model)(ids, attn_impl="sdpa")
    torch._dynamo.reset()
    meta = torch._dynamo.explain(model.to("meta"))(ids.to("meta"), attn_impl="sdpa")
    torch._dynamo.reset()
    assert (meta.graph_count, meta.graph_break_count) == (1, 0)
    assert cpu.graph_break_count >= sites > 0


class _Ops(TorchDispatchMode):
    def __init__(self, names: list[str]):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_the_cpu_draws_the_15_bit_mask_and_other_devices_torchs():
    # the CPU's mask is one int32 random_ split in two; elsewhere F.dropout draws torch's own
    # (native_dropout, or bernoulli_ where it is decomposed, as on the meta device)
    torchs = {"aten::native_dropout", "aten::bernoulli_", "aten::bernoulli"}
    for device in ("cpu", "meta"):
        names: list[str] = []
        with _Ops(names):
            y = dropout(torch.ones(4, 8, device=device), 0.1)
        assert y.shape == (4, 8)
        if device == "cpu":
            assert "aten::random_" in names and not torchs & set(names), names
        else:
            assert "aten::random_" not in names and torchs & set(names), names
