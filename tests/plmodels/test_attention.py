"""The attention kernel alone: eager vs SDPA, masks, head mask, ALiBi slopes, RoPE, pruning."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from plmodels.components.attention import MultiHeadAttention, additive_mask, attention, keep_mask, resolve_attn_impl, sdpa_attention
from plmodels.components.positions import alibi_slopes, apply_rope, rope_cos_sin


def qkv(B=2, H=3, T=5, Dh=4):
    torch.manual_seed(0)
    return torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)


def test_eager_matches_hand_computation_and_sdpa():
    q, k, v = qkv()
    out, probs = attention(q, k, v)
    by_hand = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), dim=-1)
    assert_close(probs, by_hand)
    assert_close(out, by_hand @ v)
    assert_close(sdpa_attention(q, k, v), out)


def test_padding_and_causal_masks_match_sdpa_and_block_keys():
    q, k, v = qkv()
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    for causal in (False, True):
        keep, _ = keep_mask(am, 5, am.device, causal=causal, explicit=True)
        mask = additive_mask(keep, None, q.dtype)
        out, probs = attention(q, k, v, mask)
        assert_close(sdpa_attention(q, k, v, mask), out)
        assert probs[1, :, :, 3:].abs().max() == 0  # padded keys get no weight
        if causal:
            assert torch.triu(probs, diagonal=1).abs().max() == 0
    keep, is_causal = keep_mask(None, 5, am.device, causal=True, explicit=False)
    assert keep is None and is_causal
    assert_close(sdpa_attention(q, k, v, is_causal=True), attention(q, k, v, additive_mask(torch.ones(5, 5).tril().bool(), None, q.dtype))[0])


def test_fully_blocked_row_gives_no_nan():
    q, k, v = qkv()
    keep = torch.zeros(1, 1, 5, 5, dtype=torch.bool)
    out, probs = attention(q, k, v, additive_mask(keep, None, q.dtype))
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()


def test_head_mask_scales_probabilities_and_outputs_per_head():
    q, k, v = qkv()
    hm = torch.tensor([1.0, 0.0, 0.5])
    out, probs = attention(q, k, v, head_mask=hm)
    out1, probs1 = attention(q, k, v)
    assert_close(probs, probs1 * hm.view(1, 3, 1, 1))
    assert_close(out, out1 * hm.view(1, 3, 1, 1))


def test_alibi_slopes_follow_press_et_al():
    assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # non power of two (6): slopes of 4, then every other slope of 8
    s4, s8 = [2.0 ** (-2 * (i + 1)) for i in range(4)], [2.0 ** -(i + 1) for i in range(8)]
    assert_close(alibi_slopes(6), torch.tensor(s4 + s8[0::2][:2]))


def test_rope_preserves_norm_and_depends_only_on_relative_position():
    torch.manual_seed(0)
    cos, sin = rope_cos_sin(12, 8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def rot(x, pos):
        return apply_rope(x.expand(1, 1, 12, 8), cos, sin)[0, 0, pos]
    assert_close(rot(q, 3).norm(), q.norm())
    assert_close(rot(q, 7) @ rot(k, 4), rot(q, 5) @ rot(k, 2), atol=1e-5, rtol=1e-5)


def test_rope_is_the_complex_rotation_of_channel_pairs():
    """Su et al. 2021, rotate-half layout: channels (i, i + Dh/2) form z = x_i + j x_{i+Dh/2}, which is
    multiplied by exp(j pos theta_i), theta_i = 10000^(-2i/Dh)."""
    torch.manual_seed(0)
    T, Dh = 7, 8
    x = torch.randn(2, 3, T, Dh)
    cos, sin = rope_cos_sin(T, Dh)
    theta = 10000.0 ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
    z = torch.complex(x[..., : Dh // 2].double(), x[..., Dh // 2:].double())
    z = z * torch.polar(torch.ones(T, Dh // 2, dtype=torch.float64), torch.outer(torch.arange(T).double(), theta))
    assert_close(apply_rope(x, cos, sin), torch.cat((z.real, z.imag), -1).float(), atol=1e-6, rtol=1e-6)


def test_resolve_attn_impl_never_falls_back_silently():
    assert resolve_attn_impl("auto", output_attentions=False, head_mask=None, pattern_hooks=False) is False
    assert resolve_attn_impl("auto", output_attentions=True, head_mask=None, pattern_hooks=False) is True
    assert resolve_attn_impl("auto", output_attentions=False, head_mask=None, pattern_hooks=True) is True
    for kw in ({"output_attentions": True}, {"head_mask": torch.ones(2)}, {"pattern_hooks": True}):
        args = {"output_attentions": False, "head_mask": None, "pattern_hooks": False, **kw}
        with pytest.raises(ValueError, match="sdpa"):
            resolve_attn_impl("sdpa", **args)
    with pytest.raises(ValueError, match="attn_impl"):
        resolve_attn_impl("flash", output_attentions=False, head_mask=None, pattern_hooks=False)


def test_module_sdpa_path_refuses_head_mask():
    attn = MultiHeadAttention(16, 4, bias=True, dropout=0.0, position="learned").eval()
    with pytest.raises(ValueError, match="head mask"):
        attn(torch.randn(1, 3, 16), head_mask=torch.ones(4), eager=False)


def test_pruning_a_head_equals_zero_gating_it():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, bias=True, dropout=0.0, position="alibi").eval()
    x = torch.randn(2, 5, 16)
    gated, _ = attn(x, head_mask=torch.tensor([1.0, 0.0, 1.0, 0.0]), eager=True)
    n_before = sum(p.numel() for p in attn.parameters())
    attn.prune([1, 3])
    assert attn.head_ids == [0, 2] and attn.qkv.weight.shape == (24, 16) and attn.out.weight.shape == (16, 8)
    assert sum(p.numel() for p in attn.parameters()) < n_before
    assert_close(attn(x, eager=True)[0], gated)
    assert_close(attn(x, eager=False)[0], gated)
    with pytest.raises(ValueError, match="not present"):
        attn.prune([1])


def test_partial_rope_rotates_the_first_channels_as_a_head_of_that_size():
    """GPT-NeoX's rotary_pct: tables for R < Dh channels rotate channels [0, R) exactly as a head of
    size R is rotated (pairs (i, i + R/2), theta_i = base^(-2i/R)); channels [R, Dh) pass unchanged."""
    torch.manual_seed(0)
    T, Dh, R = 7, 8, 4
    x = torch.randn(2, 3, T, Dh)
    cos, sin = rope_cos_sin(T, R, base=500.0)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[..., R:], x[..., R:])
    assert torch.equal(out[..., :R], apply_rope(x[..., :R].contiguous(), cos, sin))
    assert (out[..., :R] - x[..., :R]).abs().max() > 0.1  # positions 1.. do turn
    # base 500 against the default 10000: the second pair turns at another rate
    assert (apply_rope(x, *rope_cos_sin(T, R)) - out)[..., 1, :R].abs().max() > 1e-3
