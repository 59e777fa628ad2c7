"""Decoder behaviour: causality, logits, GPT-2 defaults (shared machinery is tested in test_encoder)."""

import pytest
import torch
from torch.testing import assert_close

from plmodels import DecoderConfig

from .conftest import TINY, batch, tiny_decoder


def test_gpt2_defaults(decoder):
    cfg = DecoderConfig()
    assert (cfg.norm, cfg.position, cfg.activation, cfg.layer_norm_eps, cfg.dropout, cfg.tie_embeddings) == (
        "pre", "learned", "gelu_tanh", 1e-5, 0.1, True)
    assert decoder.final_norm is not None


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_attention_is_causal_and_future_tokens_do_not_matter(position):
    model = tiny_decoder(position=position)
    ids, _ = batch(pad_from=None)
    out = model(ids, output_attentions=True)
    for a in out.attentions:
        assert torch.triu(a, diagonal=1).abs().max() == 0
        assert_close(a.sum(-1), torch.ones(3, 4, 9))
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % TINY["vocab_size"]
    for impl in ("sdpa", "eager"):
        a = model(ids, attn_impl=impl).logits
        b = model(changed, attn_impl=impl).logits
        assert_close(a[:, :5], b[:, :5])
        assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-4


def test_left_padding_is_finite_and_matches_unpadded():
    model = tiny_decoder()
    ids, _ = batch(pad_from=None)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: rows 0..2 of sample 0 see no real key
    for impl in ("sdpa", "eager"):
        out = model(ids, attention_mask=mask, attn_impl=impl).last_hidden_state
        assert torch.isfinite(out).all()


def test_logits_are_tied_and_optional(decoder):
    ids, _ = batch()
    out = decoder(ids)
    assert out.logits.shape == (3, 9, TINY["vocab_size"])
    assert_close(out.logits, out.last_hidden_state @ decoder.wte.weight.T)
    assert decoder(ids, return_logits=False).logits is None
    assert "lm_head.weight" not in decoder.state_dict()
    untied = tiny_decoder(tie_embeddings=False)
    assert "lm_head.weight" in untied.state_dict()


def test_next_token_loss_decreases_with_training():
    torch.manual_seed(0)
    model = tiny_decoder(dropout=0.0).train()
    ids = torch.arange(8).repeat(4, 2)[:, :12] + 5  # a repeating pattern a model can learn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, TINY["vocab_size"]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
