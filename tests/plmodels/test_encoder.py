"""Encoder behaviour: fast vs eager parity, head mask, pruning, hidden states, config checks.

Tests marked with MODELS run on both the encoder and the decoder (shared machinery)."""

import pytest
import torch
from torch.testing import assert_close

from plmodels import DecoderConfig, EncoderConfig

from .tiny import TINY, batch, tiny_decoder, tiny_encoder

BUILDERS = {"encoder": tiny_encoder, "decoder": tiny_decoder}
MODELS = pytest.mark.parametrize("kind", sorted(BUILDERS))
POSITIONS = pytest.mark.parametrize("position", ["learned", "rope", "alibi"])


def real(out, mask):
    """Hidden vectors of real tokens only (padded positions are unconstrained)."""
    return out.last_hidden_state[mask.bool()]


@MODELS
@POSITIONS
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_sdpa_matches_eager_with_padding(kind, position, norm):
    model = BUILDERS[kind](position=position, norm=norm)
    ids, mask = batch()
    fast = model(ids, attention_mask=mask, attn_impl="sdpa")
    slow = model(ids, attention_mask=mask, attn_impl="eager")
    assert_close(real(fast, mask), real(slow, mask), atol=1e-5, rtol=1e-5)
    # padding must not leak into real tokens: the padded row equals the same row run unpadded
    n = int(mask[-1].sum())
    alone = model(ids[-1:, :n], attn_impl="sdpa").last_hidden_state
    assert_close(fast.last_hidden_state[-1, :n], alone[0], atol=1e-5, rtol=1e-5)


@MODELS
@POSITIONS
def test_only_the_alibi_encoder_cannot_tell_left_from_right(kind, position):
    """ALiBi's bias -m|i - j| is symmetric (Press et al. 2022), so an encoder with no other position
    signal maps the reversed sequence to the reversed outputs: it has no notion of order beyond
    distance. RoPE and learned positions break the symmetry, and so does a decoder's causal mask.
    (research/notebook.md section 1d: why an ALiBi encoder grows no +-1 heads.)"""
    model = BUILDERS[kind](position=position, norm="pre")
    ids, _ = batch(B=2, pad_from=None)
    out = model(ids).last_hidden_state
    out_rev = model(ids.flip(1)).last_hidden_state.flip(1)
    equivariant = torch.allclose(out, out_rev, atol=1e-5, rtol=1e-5)
    assert equivariant == (kind == "encoder" and position == "alibi")


def test_gated_mlp_no_bias_parity_and_no_biases():
    model = tiny_encoder(mlp="gated", bias=False, activation="relu", norm="pre")
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert model.blocks[0].mlp.fc_in.weight.shape == (2 * TINY["d_ff"], TINY["d_model"])
    ids, mask = batch()
    assert_close(real(model(ids, attention_mask=mask), mask), real(model(ids, attention_mask=mask, attn_impl="eager"), mask))


@MODELS
def test_head_mask_of_ones_equals_no_mask(kind):
    model = BUILDERS[kind]()
    ids, mask = batch()
    plain = model(ids, attention_mask=mask, output_hidden_states=True)
    ones = model(ids, attention_mask=mask, head_mask=torch.ones(2, 4), output_hidden_states=True)
    for a, b in zip(plain.hidden_states, ones.hidden_states):
        assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)


@MODELS
@pytest.mark.parametrize("position", ["learned", "alibi"])
def test_zero_gating_heads_equals_pruning_them(kind, position):
    model = BUILDERS[kind](position=position)
    ids, mask = batch()
    hm = torch.ones(2, 4)
    hm[0, 1] = hm[1, 0] = hm[1, 3] = 0.0
    gated = model(ids, attention_mask=mask, head_mask=hm).last_hidden_state
    n_before = sum(p.numel() for p in model.parameters())
    model.prune_heads({0: [1], 1: [0, 3]})
    assert model.n_heads_per_layer == [3, 2]
    assert model.config.pruned_heads == {0: [1], 1: [0, 3]}
    assert sum(p.numel() for p in model.parameters()) == n_before - 3 * (3 * 8 * 32 + 3 * 8 + 32 * 8)  # 3 heads x (QKV rows, QKV bias, out columns)
    pruned = model(ids, attention_mask=mask).last_hidden_state
    assert_close(pruned[mask.bool()], gated[mask.bool()], atol=1e-5, rtol=1e-5)
    # the head mask keeps original head ids after pruning: gating pruned ids changes nothing
    assert_close(model(ids, attention_mask=mask, head_mask=hm).last_hidden_state[mask.bool()], pruned[mask.bool()], atol=1e-5, rtol=1e-5)


@MODELS
def test_pruning_every_head_of_a_layer_leaves_only_the_output_bias(kind):
    model = BUILDERS[kind]()
    ids, mask = batch()
    with torch.no_grad():
        model.blocks[0].attn.out.bias.normal_()
    hm = torch.ones(2, 4)
    hm[0] = 0.0
    gated = model(ids, attention_mask=mask, head_mask=hm).last_hidden_state
    model.prune_heads({0: [0, 1, 2, 3]})
    assert model.n_heads_per_layer == [0, 4]
    out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert out.attentions[0].shape == (3, 0, 9, 9)
    assert_close(out.last_hidden_state[mask.bool()], gated[mask.bool()], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        model.blocks[0].attn.out.bias.zero_()
    cache = model.run_with_cache(ids, names=["blocks.0.attn_out"], attention_mask=mask)[1]
    assert cache["blocks.0.attn_out"].abs().max() == 0  # the sub-layer adds nothing


@MODELS
def test_gradient_reaches_head_mask(kind):
    model = BUILDERS[kind]()
    ids, mask = batch()
    hm = torch.ones(2, 4, requires_grad=True)
    model(ids, attention_mask=mask, head_mask=hm).last_hidden_state.pow(2).sum().backward()
    assert hm.grad is not None and hm.grad.shape == (2, 4) and (hm.grad.abs() > 0).all()


@MODELS
def test_hidden_states_and_attentions(kind):
    model = BUILDERS[kind]()
    ids, mask = batch()
    out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and all(h.shape == (3, 9, 32) for h in out.hidden_states)
    assert len(out.attentions) == 2 and all(a.shape == (3, 4, 9, 9) for a in out.attentions)
    for a in out.attentions:
        assert_close(a.sum(-1), torch.ones(3, 4, 9))
        assert a[-1, :, :, 6:].abs().max() == 0  # padded keys
    final = model.final_norm
    expected = out.hidden_states[-1] if final is None else final(out.hidden_states[-1])
    assert_close(out.last_hidden_state, expected)


def test_encoder_post_ln_defaults_and_hidden_state_zero_is_normalised(encoder):
    cfg = EncoderConfig()
    assert (cfg.norm, cfg.position, cfg.activation, cfg.layer_norm_eps, cfg.dropout, cfg.tie_embeddings) == (
        "post", "learned", "gelu", 1e-12, 0.1, True)
    ids, _ = batch(pad_from=None)
    h0 = encoder(ids, output_hidden_states=True).hidden_states[0]
    assert_close(h0.mean(-1), torch.zeros(3, 9), atol=1e-5, rtol=0)  # after the embedding LayerNorm
    assert encoder.final_norm is None


def test_mlm_logits_tied_and_on_selected_positions(encoder):
    ids, mask = batch()
    h = encoder(ids, attention_mask=mask).last_hidden_state
    logits = encoder.mlm_logits(h[mask.bool()])
    assert logits.shape == (int(mask.sum()), TINY["vocab_size"])
    assert_close(encoder.mlm_logits(h)[mask.bool()], logits)
    m = encoder.mlm
    by_hand = m.norm(torch.nn.functional.gelu(m.dense(h))) @ encoder.embeddings.word.weight.T + m.bias
    assert_close(encoder.mlm_logits(h), by_hand)
    assert "mlm.decoder.weight" not in encoder.state_dict()
    untied = tiny_encoder(tie_embeddings=False, use_nsp=True)
    assert untied.mlm.decoder.weight.shape == (TINY["vocab_size"], TINY["d_model"])
    assert untied.nsp_logits(untied(ids).pooler_output).shape == (3, 2)
    with pytest.raises(ValueError, match="use_nsp"):
        encoder.nsp_logits(torch.zeros(1, 32))


def test_pooler_is_tanh_dense_of_cls(encoder):
    ids, _ = batch()
    out = encoder(ids)
    assert_close(out.pooler_output, torch.tanh(encoder.pooler(out.last_hidden_state[:, 0])))


def test_token_type_ids_change_the_output(encoder):
    ids, _ = batch(pad_from=None)
    a = encoder(ids).last_hidden_state
    b = encoder(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    c = encoder(ids, token_type_ids=torch.ones_like(ids)).last_hidden_state
    assert_close(a, b)
    assert (a - c).abs().max() > 1e-3
    with pytest.raises(ValueError, match="type_vocab_size"):
        tiny_encoder(type_vocab_size=0)(ids, token_type_ids=torch.zeros_like(ids))


def test_init_std_is_0_02():
    model = tiny_encoder(d_model=64, n_heads=4, d_ff=256, vocab_size=500)
    assert abs(model.embeddings.word.weight.std().item() - 0.02) < 2e-3
    assert abs(model.blocks[0].mlp.fc_in.weight.std().item() - 0.02) < 2e-3
    assert model.blocks[0].attn.qkv.bias.abs().max() == 0


@pytest.mark.parametrize(
    "field, value",
    [("n_heads", 5), ("n_layers", 0), ("activation", "swish"), ("position", "sinusoidal"), ("norm", "mid"),
     ("mlp", "moe"), ("dropout", 1.5), ("d_model", 0)],
)
@pytest.mark.parametrize("cls", [EncoderConfig, DecoderConfig])
def test_config_errors_name_the_field(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{**TINY, field: value})


def test_config_round_trip_and_unknown_keys():
    cfg = EncoderConfig(**TINY, pruned_heads={1: [0, 2]})
    import json

    assert EncoderConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="colour"):
        EncoderConfig.from_dict({**cfg.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="pruned_heads"):
        EncoderConfig(**TINY, pruned_heads={0: [7]})


def test_constructor_applies_config_pruning():
    model = tiny_encoder(pruned_heads={1: [0, 2]})
    assert model.n_heads_per_layer == [4, 2] and model.blocks[1].attn.head_ids == [1, 3]


@MODELS
def test_too_long_sequence_says_to_truncate(kind):
    model = BUILDERS[kind]()
    with pytest.raises(ValueError, match="truncate"):
        model(torch.zeros(1, 17, dtype=torch.long))


@MODELS
def test_bad_head_mask_shape_and_sdpa_refusals(kind):
    model = BUILDERS[kind]()
    ids, _ = batch()
    with pytest.raises(ValueError, match="head_mask"):
        model(ids, head_mask=torch.ones(4))
    with pytest.raises(ValueError, match="sdpa"):
        model(ids, head_mask=torch.ones(2, 4), attn_impl="sdpa")
    with pytest.raises(ValueError, match="sdpa"):
        model(ids, output_attentions=True, attn_impl="sdpa")


@MODELS
def test_dropout_is_active_in_train_mode_only(kind):
    model = BUILDERS[kind]()
    ids, _ = batch(pad_from=None)
    assert_close(model(ids).last_hidden_state, model(ids).last_hidden_state)
    model.train()
    assert (model(ids).last_hidden_state - model(ids).last_hidden_state).abs().max() > 0


@POSITIONS
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_masked_hidden_is_the_forward_at_the_selected_positions(position, norm):
    """The training path runs the last block at the masked positions only; values and gradients must
    be those of the full forward indexed at the same positions (a row with none selected, a row
    with all of them, token types, a pruned head in the last layer)."""
    model = tiny_encoder(position=position, norm=norm, mlp="gated" if norm == "pre" else "plain", dropout=0.0).double()
    model.prune_heads({1: [2]})
    ids, _ = batch(B=4, T=12, pad_from=None)
    types = (torch.arange(12) >= 7).long().expand(4, 12)
    sel = torch.rand(4, 12, generator=torch.Generator().manual_seed(3)) < 0.3
    sel[1], sel[2] = False, True
    weights = torch.randn(int(sel.sum()), TINY["d_model"], dtype=torch.double)
    grads = []
    for fast in (False, True):
        model.zero_grad()
        h = (model.masked_hidden(ids, sel, types) if fast
             else model(ids, token_type_ids=types, attn_impl="sdpa").last_hidden_state[sel])
        assert h.shape == (int(sel.sum()), TINY["d_model"])
        (h * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if not fast:
            full = h.detach()
    assert_close(model.masked_hidden(ids, sel, types), full)
    assert model.masked_hidden(ids, torch.zeros_like(sel)).shape == (0, TINY["d_model"])
    assert grads[0].keys() - {"pooler.weight", "pooler.bias"} == grads[1].keys()
    for name, g in grads[1].items():
        assert_close(g, grads[0][name], msg=name)


def test_masked_hidden_refuses_hooks_and_query_rows_refuse_causal(encoder):
    ids, _ = batch(pad_from=None)
    sel = ids > 30
    with encoder.hooks([("blocks.1.resid_post", lambda t, name: t)]):
        with pytest.raises(ValueError, match="blocks.1.resid_post"):
            encoder.masked_hidden(ids, sel)
    x = torch.zeros(3, 9, TINY["d_model"])
    with pytest.raises(ValueError, match="is_causal"):
        encoder.blocks[0].attn(x, None, is_causal=True, query_index=torch.zeros(3, 2, dtype=torch.long))
