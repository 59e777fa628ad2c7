"""Parity of our GPT-2-style decoder preset with Hugging Face transformers' GPT2LMHeadModel.

The same random weights go into both models; every hidden state, every attention map and the LM
logits must agree to 1e-4, with and without padding, as the encoder presets agree with BertModel
(test_hf_import.py). transformers is used here only as a reference implementation; plmodels never
imports it.

Two conventions differ and are mapped, not loosened:
- hidden states: both give L + 1 tensors, the embedding output then one per block, but GPT-2's last
  entry is after `ln_f` while ours is the raw residual stream after the last block (the final
  LayerNorm is applied to `last_hidden_state` only). So ours[L] is compared through `final_norm`.
- weights: GPT-2's `Conv1D` stores (in, out), the transpose of `nn.Linear`'s (out, in); its `c_attn`
  columns are [q | k | v], each H blocks of Dh, exactly the rows of our fused `qkv` once transposed.

`map_gpt2_state` and `config_from_gpt2` are the GPT-2 importer's own (plmodels.hf.gpt2, issue 62):
they take a plain state dict / config dict and do not import transformers.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from plmodels import Decoder, DecoderConfig
from plmodels.hf.gpt2 import config_from_gpt2, map_gpt2_state
from plmodels.families import preset

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

# Our decoder preset's style (GPT-2) with small sizes; d_ff != 4 D so a swapped MLP matrix shows.
SIZES = {"vocab_size": 50, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 48, "max_positions": 16}


@pytest.fixture(scope="module")
def pair() -> tuple[Decoder, transformers.GPT2LMHeadModel]:
    """(our Decoder, GPT2LMHeadModel) in eval mode with the same random, non-trivial weights."""
    ours_cfg = DecoderConfig(**{**preset("decoder", "tiny"), **SIZES})
    style = (ours_cfg.norm, ours_cfg.position, ours_cfg.activation, ours_cfg.tie_embeddings)
    assert style == ("pre", "learned", "gelu_tanh", True)
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(
        vocab_size=SIZES["vocab_size"], n_embd=SIZES["d_model"], n_layer=SIZES["n_layers"], n_head=SIZES["n_heads"],
        n_inner=SIZES["d_ff"], n_positions=SIZES["max_positions"], activation_function="gelu_new",
        layer_norm_epsilon=ours_cfg.layer_norm_eps, resid_pdrop=ours_cfg.dropout, embd_pdrop=ours_cfg.dropout,
        attn_pdrop=ours_cfg.dropout, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        # weights N(0, 0.2), not GPT-2's 0.02: at 0.02 the pre-activations are so small that erf-GELU
        # for tanh-GELU (or eps 1e-12 for 1e-5) moves the logits by < 1e-4 and would pass
        initializer_range=0.2, attn_implementation="eager",
    )
    ref = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases so a mapping slip shows
        for name, p in ref.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    assert config_from_gpt2(hf_cfg.to_dict()) == ours_cfg
    state, unknown, ignored = map_gpt2_state(ref.state_dict())
    assert unknown == [] and ignored == ["lm_head.weight"]
    ours = Decoder(ours_cfg)
    ours.load_state_dict(state, strict=True)
    return ours.eval(), ref


def padded_batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (3, 9) and a mask whose last row has 3 padding positions at the end (right) or start (left)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, SIZES["vocab_size"], (3, 9), generator=g)
    mask = torch.ones_like(ids)
    if side == "right":
        mask[-1, 6:] = 0
    elif side == "left":
        mask[-1, :3] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize(
    "side, unpad", [("none", False), ("right", False), ("left", False), ("right", True), ("left", True)]
)
def test_decoder_matches_gpt2_hidden_states_attentions_and_logits(pair, side, unpad):
    ours, ref = pair
    ids, mask = padded_batch(side)
    attention_mask = None if side == "none" else mask
    with torch.no_grad():
        r = ref(ids, attention_mask=attention_mask, output_hidden_states=True, output_attentions=True)
        o = ours(ids, attention_mask=attention_mask, output_hidden_states=True, output_attentions=True,
                 attn_impl="eager", unpad=unpad)
    real = mask.bool()  # (B, T) real query positions; both sides number positions 0..T-1 whatever the padding
    L = ours.config.n_layers
    assert len(o.hidden_states) == len(r.hidden_states) == L + 1
    assert len(o.attentions) == len(r.attentions) == L
    for l in range(L):  # embedding output, then the output of blocks 0 .. L-2
        assert_close(o.hidden_states[l][real], r.hidden_states[l][real], atol=1e-4, rtol=1e-4)
    # GPT-2's last entry is ln_f(last block); ours is the block output, normalised in last_hidden_state
    assert_close(ours.final_norm(o.hidden_states[L])[real], r.hidden_states[L][real], atol=1e-4, rtol=1e-4)
    assert_close(o.last_hidden_state[real], r.hidden_states[L][real], atol=1e-4, rtol=1e-4)
    for a, b in zip(o.attentions, r.attentions, strict=True):  # (B, H, T, T): rows of real queries
        assert a.shape == b.shape
        assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=1e-4, rtol=1e-4)
    assert_close(o.logits[real], r.logits[real], atol=1e-4, rtol=1e-4)


def test_parity_has_the_power_to_see_a_wrong_activation_or_epsilon(pair):
    """Negative control: the same weights with erf-GELU, or BERT's eps, miss GPT-2 by more than 1e-4."""
    ours, ref = pair
    ids, mask = padded_batch("right")
    real = mask.bool()
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits[real]
        for change in ({"activation": "gelu"}, {"layer_norm_eps": 1e-12}):
            wrong = Decoder(DecoderConfig(**{**ours.config.to_dict(), **change}))
            wrong.load_state_dict(ours.state_dict(), strict=True)
            got = wrong.eval()(ids, attention_mask=mask).logits[real]
            assert (got - want).abs().max() > 1e-4, change


def test_mapping_transposes_conv1d_and_keeps_an_untied_head(pair):
    _, ref = pair
    hf = ref.state_dict()
    untied = {**hf, "lm_head.weight": hf["lm_head.weight"] + 1.0}
    state, unknown, ignored = map_gpt2_state(
        {**untied, "transformer.h.0.attn.bias": torch.ones(1, 1, 16, 16), "score.weight": torch.zeros(2, 32)}
    )
    assert torch.equal(state["blocks.0.attn.qkv.weight"], hf["transformer.h.0.attn.c_attn.weight"].t())
    assert torch.equal(state["blocks.1.mlp.fc_in.weight"][:, 0], hf["transformer.h.1.mlp.c_fc.weight"][0])
    assert torch.equal(state["lm_head.weight"], untied["lm_head.weight"])
    assert unknown == ["score.weight"] and ignored == ["transformer.h.0.attn.bias"]
