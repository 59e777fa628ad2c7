"""Decoder behaviour: causality, logits, GPT-2 defaults (shared machinery is tested in test_encoder)."""

import pytest
import torch
from torch.testing import assert_close

from plmodels import DecoderConfig
from plmodels.components.attention import keep_mask
from plmodels.components.positions import rope_cos_sin

from .tiny import TINY, batch, tiny_decoder


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


def test_left_padding_rows_that_see_no_real_key_are_finite():
    model = tiny_decoder()
    ids, _ = batch(pad_from=None)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: rows 0..2 of sample 0 see no real key
    for impl in ("sdpa", "eager"):
        out = model(ids, attention_mask=mask, attn_impl=impl).last_hidden_state
        assert torch.isfinite(out).all()


def _assert_real_positions_match_alone(model, ids, mask):
    """Each row b of the padded batch, at its real positions, equals row b run alone without padding:
    hidden states of every layer, logits and (eager path) attention probabilities, which also put
    exactly zero weight on padding keys."""
    tight = {"rtol": 1e-5, "atol": 1e-6}
    for impl in ("sdpa", "eager"):
        for unpad in (False, True):
            eager = impl == "eager"
            out = model(ids, attention_mask=mask, attn_impl=impl, unpad=unpad, output_hidden_states=True,
                        output_attentions=eager)
            for b in range(ids.shape[0]):
                real = mask[b].bool()
                alone = model(ids[b:b + 1, real], attn_impl=impl, output_hidden_states=True,
                              output_attentions=eager)
                assert_close(out.logits[b, real], alone.logits[0], **tight)
                assert_close(out.last_hidden_state[b, real], alone.last_hidden_state[0], **tight)
                assert len(out.hidden_states) == len(alone.hidden_states) == TINY["n_layers"] + 1
                for h, h_alone in zip(out.hidden_states, alone.hidden_states):
                    assert_close(h[b, real], h_alone[0], **tight)
                for a, a_alone in zip(out.attentions or (), alone.attentions or ()):
                    assert_close(a[b][:, real][:, :, real], a_alone[0], **tight)  # (H, n, n)
                    assert (a[b][:, real][:, :, ~real] == 0).all()
            assert eager == (out.attentions is not None)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_right_padded_batch_matches_each_sequence_alone(position):
    model = tiny_decoder(position=position)
    ids, mask = batch()  # the last row is padded from position 6 on
    mask[1, 4:] = 0  # a second padded row, of another length
    _assert_real_positions_match_alone(model, ids, mask)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_left_padded_batch_matches_each_sequence_alone_with_relative_positions(position):
    # RoPE scores and ALiBi biases depend on i - j only, so shifting a sequence right by its padding
    # changes nothing. Learned positions are absolute (row t of wpe for column t) and the decoder takes
    # no position ids, so a left-padded row is read at shifted positions there: not tested for equality.
    model = tiny_decoder(position=position)
    ids, _ = batch(pad_from=None)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    _assert_real_positions_match_alone(model, ids, mask)


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


# ---------------------------------------------------------------- GPT-NeoX's options (Pythia)
NEOX = dict(position="rope", parallel_residual=True, rotary_dims=2, rope_base=500.0)


def test_new_options_leave_the_default_config_json_and_parameters_unchanged():
    """Checkpoints of the existing kind keep their config.json (and checkpoint_hash) byte for byte:
    the options are left out at their defaults; they add no parameter."""
    keys = set(DecoderConfig(**TINY).to_dict())
    assert not keys & {"parallel_residual", "rotary_dims", "rope_base"}
    with_options = DecoderConfig(**TINY, **NEOX)
    assert {"parallel_residual", "rotary_dims", "rope_base"} <= set(with_options.to_dict())
    assert DecoderConfig.from_dict(with_options.to_dict()) == with_options
    plain, neox = tiny_decoder(position="rope").state_dict(), tiny_decoder(**NEOX).state_dict()
    assert {k: v.shape for k, v in plain.items()} == {k: v.shape for k, v in neox.items()}
    assert all(torch.equal(plain[k], neox[k]) for k in plain)  # same init draws too


def test_parallel_residual_block_adds_both_sublayers_of_the_same_input():
    """GPT-NeoX / GPT-J: x + Attn(LN1(x)) + MLP(LN2(x)); GPT-2's MLP reads x + Attn(LN1(x)) instead."""
    for parallel in (True, False):
        model = tiny_decoder(**{**NEOX, "parallel_residual": parallel})
        block = model.blocks[0]
        x = torch.randn(2, 5, TINY["d_model"])
        keep, _ = keep_mask(None, 5, x.device, causal=True, explicit=True)
        rope = rope_cos_sin(5, 2, base=500.0)
        with torch.no_grad():
            got, _ = block(x, keep, rope=rope, eager=True)
            a = block.attn(block.norm1(x), keep, rope=rope, eager=True)[0]
            mlp_in = x if parallel else x + a
            assert_close(got, x + a + block.mlp(block.norm2(mlp_in)), atol=1e-6, rtol=1e-6)


def test_rotary_dims_rotates_only_the_first_channels_of_q_and_k():
    model = tiny_decoder(**NEOX)
    ids, _ = batch(pad_from=None)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, ["blocks.0.resid_pre", "blocks.0.attn.q"], attn_impl="eager")
        block = model.blocks[0]
        H, Dh = TINY["n_heads"], TINY["d_model"] // TINY["n_heads"]
        raw_q = block.attn.qkv(block.norm1(cache["blocks.0.resid_pre"])).view(*ids.shape, 3, H, Dh)[:, :, 0]
    q = cache["blocks.0.attn.q"]  # (B, T, H, Dh), after RoPE
    assert_close(q[..., 2:], raw_q[..., 2:], atol=1e-6, rtol=0)  # channels 2.. carry no position
    assert_close(q[:, 0], raw_q[:, 0], atol=1e-6, rtol=0)  # position 0 is not turned
    assert (q[:, 1:, :, :2] - raw_q[:, 1:, :, :2]).abs().max() > 1e-3


@pytest.mark.parametrize("fields, field", [
    ({"rotary_dims": 2}, "rotary_dims"),  # needs position rope
    ({"position": "rope", "rotary_dims": 3}, "rotary_dims"),  # odd
    ({"position": "rope", "rotary_dims": 10}, "rotary_dims"),  # beyond the head size 8
    ({"parallel_residual": True, "norm": "post"}, "parallel_residual"),
    ({"position": "rope", "rope_base": 1.0}, "rope_base"),
])
def test_option_checks_name_their_field(fields, field):
    with pytest.raises(ValueError, match=f"DecoderConfig.{field}"):
        DecoderConfig(**TINY, **fields)
