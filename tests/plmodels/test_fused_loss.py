"""The training hot path's speed changes keep the maths: fused linear cross-entropy, fused AdamW,
in-place eager attention, and lm_loss matching the plain logits + F.cross_entropy loss."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from plmodels.attention import attention
from plmodels.checkpoint import build_model
from plmodels.presets import preset
from plmodels.train import Batch, PretrainConfig, linear_cross_entropy, lm_loss, make_optimizer


@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_matches_reference_loss_and_grads(bias):
    torch.manual_seed(0)
    h = torch.randn(37, 8, requires_grad=True)
    w = torch.randn(23, 8, requires_grad=True)
    b = torch.randn(23, requires_grad=True) if bias else None
    y = torch.randint(0, 23, (37,))
    y[::5] = -100  # ignored rows contribute neither loss nor gradient
    params = [h, w] + ([b] if bias else [])
    fused = linear_cross_entropy(h, w, b, y, chunk_rows=10) * 0.3  # chunks of 10, 10, 10, 7
    ref = F.cross_entropy(F.linear(h, w, b), y, reduction="sum") * 0.3
    assert_close(fused, ref)
    for g, r in zip(torch.autograd.grad(fused, params), torch.autograd.grad(ref, params)):
        assert_close(g, r, atol=1e-5, rtol=1e-5)
    assert torch.autograd.grad(linear_cross_entropy(h, w, b, y, 10), h)[0][::5].abs().max() == 0


def test_linear_cross_entropy_is_exact_when_the_target_probability_underflows():
    # logits 200 apart: p_y = exp(-200) is 0 in fp32, so -log p_y would be inf; those rows are
    # recomputed as lse - z_y, the others keep -log p_y
    torch.manual_seed(2)
    h = (torch.randn(12, 4) * 40).requires_grad_()
    w = torch.randn(7, 4, requires_grad=True)
    y = torch.randint(0, 7, (12,))
    fused = linear_cross_entropy(h, w, None, y, chunk_rows=5)
    ref = F.cross_entropy(h @ w.T, y, reduction="sum")
    assert torch.isfinite(fused) and fused.item() > 500  # some rows did underflow
    assert_close(fused, ref)
    for g, r in zip(torch.autograd.grad(fused, (h, w)), torch.autograd.grad(ref, (h, w))):
        assert_close(g, r)


def test_linear_cross_entropy_without_grad_is_plain_cross_entropy():
    torch.manual_seed(1)
    h, w, y = torch.randn(6, 4), torch.randn(9, 4), torch.randint(0, 9, (6,))
    with torch.no_grad():
        assert_close(linear_cross_entropy(h, w, None, y), F.cross_entropy(h @ w.T, y, reduction="sum"))


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_lm_loss_equals_unfused_loss_and_gradients(kind):
    torch.manual_seed(0)
    fields = {**preset(kind, "tiny"), "vocab_size": 50, "dropout": 0.0}
    model = build_model(kind, fields).train()
    ids = torch.randint(5, 50, (3, 12))
    labels = ids.clone()
    labels[:, ::3] = -100
    loss, n = lm_loss(model, Batch(ids, labels), autocast=False)
    g = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    sel = labels != -100
    out = model(ids, attn_impl="sdpa")
    logits = model.mlm_logits(out.last_hidden_state[sel]) if kind == "encoder" else out.logits[sel]
    ref = F.cross_entropy(logits, labels[sel])
    r = torch.autograd.grad(ref, list(model.parameters()), allow_unused=True)
    assert n == int(sel.sum())
    assert_close(loss, ref)
    for a, b in zip(g, r):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_make_optimizer_is_fused_adamw_with_decay_groups():
    model = build_model("encoder", {**preset("encoder", "tiny"), "vocab_size": 30})
    cfg = PretrainConfig(kind="encoder", train_source="x.txt", weight_decay=0.05)
    opt = make_optimizer(model, cfg)
    assert [g["fused"] for g in opt.param_groups] == [True, True]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert all(p.dim() == 1 for p in opt.param_groups[1]["params"])


def test_eager_attention_in_place_softmax_matches_reference_without_grad():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 5)
    mask[0, ..., -2:] = torch.finfo(torch.float32).min
    ref = ((q @ k.transpose(-2, -1)) / 2.0 + mask).softmax(-1)
    with torch.inference_mode():
        out, probs = attention(q, k, v, mask)
    assert_close(probs, ref)
    assert_close(out, ref @ v)
    assert probs[0, :, :, -2:].abs().max() == 0
