"""The training hot path's speed changes keep the maths: fused linear cross-entropy, fused AdamW,
in-place eager attention, and lm_loss matching the plain logits + F.cross_entropy loss."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from plmodels.checkpoint import build_model
from plmodels.components.attention import attention
from plmodels.families import preset
from plmodels.training import PretrainConfig
from plmodels.training.data import Batch
from plmodels.training.loss import linear_cross_entropy, lm_loss
from plmodels.training.masking import masked_slots
from plmodels.training.runtime import make_optimizer


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


@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_under_bf16_autocast_matches_autocast_reference(bias):
    # the bf16 path: matmuls in bf16 like autocast's F.linear, softmax/loss in fp32 like
    # F.cross_entropy(logits.float()); ignored rows still get no gradient
    torch.manual_seed(3)
    h = torch.randn(45, 16, requires_grad=True)
    w = (torch.randn(30, 16) * 0.5).requires_grad_()
    b = torch.randn(30, requires_grad=True) if bias else None
    y = torch.randint(0, 30, (45,))
    y[::4] = -100
    params = [h, w] + ([b] if bias else [])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, b, y, chunk_rows=16) * 0.5  # chunks of 16, 16, 13
        ref = F.cross_entropy(F.linear(h, w, b).float(), y, reduction="sum") * 0.5
    exact = F.cross_entropy(F.linear(h, w, b), y, reduction="sum") * 0.5  # fp32, for scale
    assert fused.dtype == torch.float32
    assert_close(fused, ref, rtol=1e-3, atol=1e-3)
    assert not torch.allclose(ref, exact, rtol=1e-6, atol=0)  # the reference really ran in bf16
    grads, refs = torch.autograd.grad(fused, params), torch.autograd.grad(ref, params)
    for g, r in zip(grads, refs):
        assert g.dtype == r.dtype == torch.float32
        assert_close(g, r, rtol=2e-2, atol=2e-2 * r.abs().max().item())
    assert grads[0][::4].abs().max() == 0


def test_linear_cross_entropy_bf16_is_exact_when_the_target_probability_underflows():
    torch.manual_seed(2)
    h = (torch.randn(12, 4) * 40).requires_grad_()
    w = torch.randn(7, 4, requires_grad=True)
    y = torch.randint(0, 7, (12,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, None, y, chunk_rows=5)
        ref = F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")
    assert torch.isfinite(fused) and fused.item() > 500
    assert_close(fused, ref, rtol=1e-3, atol=1e-2)


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


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_lm_loss_under_bf16_autocast_matches_unfused_autocast_loss(kind):
    # bf16 training: the bf16 fused CE against logits + F.cross_entropy under the same autocast
    # (the attention path of bf16 training is checked in the next test)
    torch.manual_seed(0)
    fields = {**preset(kind, "tiny"), "vocab_size": 50, "dropout": 0.0}
    model = build_model(kind, fields).train()
    ids = torch.randint(5, 50, (3, 12))
    labels = ids.clone()
    labels[:, ::3] = -100
    params = list(model.parameters())
    loss, _ = lm_loss(model, Batch(ids, labels), autocast=True)
    g = torch.autograd.grad(loss, params, allow_unused=True)
    sel = labels != -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = model(ids, attn_impl="eager").last_hidden_state
        logits = model.mlm_logits(h[sel]) if kind == "encoder" else model(ids, attn_impl="eager").logits[sel]
        ref = F.cross_entropy(logits.float(), labels[sel])
    r = torch.autograd.grad(ref, params, allow_unused=True)
    assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    for a, b in zip(g, r):
        if a is not None and b is not None:
            assert_close(a, b, rtol=0.1, atol=0.05 * b.abs().max().item() + 1e-6)


def test_sdpa_path_in_bf16_on_the_cpu_matches_fp32_attention():
    from plmodels.components.attention import sdpa_attention

    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))
    for causal in (False, True):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = sdpa_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=causal)
        assert out.dtype == torch.bfloat16
        assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.slow
@pytest.mark.parametrize("nsp", [False, True], ids=["mlm", "mlm-nsp"])
def test_masked_lm_loss_through_padded_slots_is_the_selected_positions_loss(nsp):
    # float64 (the unfused CE path): the loss over fixed-size slots, padded past every row's count,
    # and over the batch's own counts, against plain logits at labels != -100 + F.cross_entropy
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "vocab_size": 50, "dropout": 0.0, "use_nsp": nsp}
    model = build_model("encoder", fields).double().train()
    ids = torch.randint(5, 50, (3, 12))
    labels = torch.where(torch.rand(3, 12) < 0.3, ids, -100)
    labels[1] = -100  # a row with no target, one with them all
    labels[2] = ids[2]
    types = torch.zeros_like(ids) if nsp else None
    pair = torch.tensor([0, 1, 1]) if nsp else None
    sel = labels != -100
    out = model(ids, token_type_ids=types, attn_impl="sdpa")
    ref = F.cross_entropy(model.mlm_logits(out.last_hidden_state[sel]), labels[sel])
    if nsp:
        ref = ref + F.cross_entropy(model.nsp_logits(out.pooler_output), pair)
    r = torch.autograd.grad(ref, list(model.parameters()), allow_unused=True)
    for sizes in (None, (12, 30)):  # 30 > 3 * 12 * 0.3 + the full row: padding slots in both bounds
        loss, n = lm_loss(model, Batch(ids, labels, types, pair, slots=masked_slots(labels, sizes)), autocast=False)
        assert n == int(sel.sum())
        assert_close(loss, ref, atol=1e-6, rtol=0)
        g = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        for a, b in zip(g, r):
            if a is not None:
                assert_close(a, b, atol=1e-6, rtol=0)
