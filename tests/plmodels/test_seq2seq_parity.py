"""Our Seq2Seq (plmodels/seq2seq.py) with weights converted from transformers' T5 and BART
(plmodels/hf/seq2seq.py) computes what transformers computes: logits, every hidden state of both
stacks, and the encoder self-, decoder self- and cross-attention probabilities agree to 1e-4 on a
batch with padding on both sides of the model and given decoder inputs.

Hidden-state convention (as in the GPT-2 importer's tests): ours are the embedding output and each
block's raw output; T5's last entry is after the stack's final_layer_norm, so it is compared with our
final norm of our last entry. transformers is the reference only; plmodels never imports it."""

from __future__ import annotations

import json

import pytest
import torch

from plmodels.hf.seq2seq import bart_config, from_hf_bart_state_dict, from_hf_t5_state_dict, t5_config
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig, relative_position_bucket

from .hf_models import hf_bart, hf_t5
from .hf_models import seq2seq_batch as batch

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-4


def ours_from(hf, config_fn, convert) -> Seq2Seq:
    cfg = config_fn(hf.config.to_dict())
    model = Seq2Seq(cfg).eval()
    model.load_state_dict(convert(hf.state_dict(), cfg), strict=True)
    return model


def _compare(ours, hf_out, enc_mask, dec_mask, *, final_norm_enc=None, final_norm_dec=None):
    """Everything at the real positions (padding rows are arbitrary in both)."""
    e = enc_mask.bool()
    d = dec_mask.bool()
    torch.testing.assert_close(ours.logits[d], hf_out.logits[d], atol=ATOL, rtol=0)
    for name, mine, theirs, real, norm in (
        ("encoder", ours.encoder_hidden_states, hf_out.encoder_hidden_states, e, final_norm_enc),
        ("decoder", ours.decoder_hidden_states, hf_out.decoder_hidden_states, d, final_norm_dec),
    ):
        assert len(mine) == len(theirs) == 3, name
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if i == len(mine) - 1 and norm is not None:
                a = norm(a)
            torch.testing.assert_close(a[real], b[real], atol=ATOL, rtol=0, msg=f"{name} hidden state {i}")
    for name, mine, theirs, rows in (
        ("encoder", ours.encoder_attentions, hf_out.encoder_attentions, e),
        ("decoder", ours.decoder_attentions, hf_out.decoder_attentions, d),
        ("cross", ours.cross_attentions, hf_out.cross_attentions, d),
    ):
        assert len(mine) == len(theirs) == 2, name
        for l, (a, b) in enumerate(zip(mine, theirs)):
            assert a.shape == b.shape, name
            torch.testing.assert_close(a.transpose(1, 2)[rows], b.transpose(1, 2)[rows], atol=ATOL, rtol=0,
                                       msg=f"{name} attention {l}")  # (B, T, H, Tk) at real query rows


def _run(model, ids, mask, dec, dec_mask, **kw):
    return model(ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                 output_hidden_states=True, output_attentions=True, **kw)


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"])
def test_t5_parity(proj):
    hf = hf_t5(feed_forward_proj=proj)
    ours = ours_from(hf, t5_config, from_hf_t5_state_dict)
    ids, mask, dec, dec_mask = batch(pad=0)
    with torch.no_grad():
        theirs = _run(hf, ids, mask, dec, dec_mask)
        mine = _run(ours, ids, mask, dec, dec_mask)
    _compare(mine, theirs, mask, dec_mask, final_norm_enc=ours.encoder.final_norm,
             final_norm_dec=ours.decoder.final_norm)
    torch.testing.assert_close(mine.encoder_last_hidden_state[mask.bool()],
                               theirs.encoder_last_hidden_state[mask.bool()], atol=ATOL, rtol=0)


@pytest.mark.parametrize("untie", [False, True])
def test_t5_without_output_rescale(untie):
    """transformers 5 reads tie_word_embeddings=False as "no d_model^-0.5 rescale" (the head stays
    tied); a transformers-4 config dict says untied: then our own lm_head gets the HF lm_head tensor."""
    hf = hf_t5(tie_word_embeddings=False)
    hf_dict = hf.config.to_dict()
    assert hf_dict["scale_decoder_outputs"] is False
    if untie:
        hf_dict = {k: v for k, v in hf_dict.items() if k != "scale_decoder_outputs"} | {"tie_word_embeddings": False}
    cfg = t5_config(hf_dict)
    assert not cfg.rescale_tied_output and cfg.tie_embeddings != untie
    ours = Seq2Seq(cfg).eval()
    ours.load_state_dict(from_hf_t5_state_dict(hf.state_dict(), cfg), strict=True)
    assert (ours.lm_head is not None) == untie
    ids, mask, dec, dec_mask = batch(pad=0)
    with torch.no_grad():
        theirs = _run(hf, ids, mask, dec, dec_mask)
        mine = _run(ours, ids, mask, dec, dec_mask)
    torch.testing.assert_close(mine.logits[dec_mask.bool()], theirs.logits[dec_mask.bool()], atol=ATOL, rtol=0)


@pytest.mark.parametrize("scale_embedding", [False, True])
def test_bart_parity(scale_embedding):
    hf = hf_bart(scale_embedding=scale_embedding)
    ours = ours_from(hf, bart_config, from_hf_bart_state_dict)
    ids, mask, dec, dec_mask = batch(pad=1)
    with torch.no_grad():
        theirs = _run(hf, ids, mask, dec, dec_mask)
        mine = _run(ours, ids, mask, dec, dec_mask)
    _compare(mine, theirs, mask, dec_mask)


def test_sdpa_path_matches_eager():
    """The fused path (no probabilities asked) gives the eager path's logits, for both families."""
    for hf, cfg_fn, conv, pad in ((hf_t5(), t5_config, from_hf_t5_state_dict, 0),
                                  (hf_bart(), bart_config, from_hf_bart_state_dict, 1)):
        ours = ours_from(hf, cfg_fn, conv)
        ids, mask, dec, dec_mask = batch(pad)
        with torch.no_grad():
            fast = ours(ids, mask, dec, dec_mask, attn_impl="sdpa").logits
            slow = ours(ids, mask, dec, dec_mask, attn_impl="eager").logits
            causal_only = ours(ids, mask, dec, attn_impl="sdpa").logits  # is_causal path for BART
            causal_eager = ours(ids, mask, dec, attn_impl="eager").logits
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)
        torch.testing.assert_close(causal_only, causal_eager, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="sdpa"):
            ours(ids, mask, dec, dec_mask, output_attentions=True, attn_impl="sdpa")


def test_relative_buckets_match_t5():
    rel = torch.arange(-200, 200)[None, :]
    for bidirectional in (True, False):
        ours = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
        theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
        assert torch.equal(ours, theirs)


def test_cross_attention_head_mask():
    """A cross-attention head mask of ones changes nothing; zeroing head h of layer l zeroes its
    probabilities and equals zeroing that head's output at the `head_out` hook site."""
    hf = hf_bart()
    ours = ours_from(hf, bart_config, from_hf_bart_state_dict)
    ids, mask, dec, dec_mask = batch(pad=1)
    ones = torch.ones(2, 4)
    gate = ones.clone()
    gate[1, 2] = 0.0
    with torch.no_grad():
        base = _run(ours, ids, mask, dec, dec_mask)
        same = _run(ours, ids, mask, dec, dec_mask, cross_attn_head_mask=ones)
        gated = _run(ours, ids, mask, dec, dec_mask, cross_attn_head_mask=gate)

        def zero_head(t, name):
            t = t.clone()
            t[:, :, 2] = 0.0
            return t

        with ours.hooks([("decoder.blocks.1.cross_attn.head_out", zero_head)]):
            hooked = _run(ours, ids, mask, dec, dec_mask)
    torch.testing.assert_close(same.logits, base.logits, atol=0, rtol=0)
    assert torch.all(gated.cross_attentions[1][:, 2] == 0)
    torch.testing.assert_close(gated.cross_attentions[0], base.cross_attentions[0])  # other layers untouched
    torch.testing.assert_close(gated.cross_attentions[1][:, [0, 1, 3]], base.cross_attentions[1][:, [0, 1, 3]])
    assert not torch.allclose(gated.logits, base.logits, atol=1e-3)
    torch.testing.assert_close(gated.logits, hooked.logits, atol=1e-5, rtol=0)


def test_hook_sites_and_cache():
    hf = hf_t5()
    ours = ours_from(hf, t5_config, from_hf_t5_state_dict)
    names = ours.hook_names()
    for site in ("encoder.blocks.1.attn.pattern", "decoder.blocks.0.self_attn.head_out",
                 "decoder.blocks.1.cross_attn.pattern", "encoder.blocks.0.resid_post", "decoder.blocks.1.resid_post"):
        assert site in names
    ids, mask, dec, dec_mask = batch(pad=0)
    with torch.no_grad():
        out, cache = ours.run_with_cache(ids, names=["decoder.blocks.1.cross_attn.pattern",
                                                     "encoder.blocks.1.resid_post"],
                                         attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                                         output_attentions=True, output_hidden_states=True)
    assert torch.equal(cache["decoder.blocks.1.cross_attn.pattern"], out.cross_attentions[1])
    assert torch.equal(cache["encoder.blocks.1.resid_post"], out.encoder_hidden_states[2])


def test_converter_refuses_unknown_tensors():
    hf = hf_t5()
    state = dict(hf.state_dict())
    state["encoder.block.0.layer.0.SelfAttention.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="extra"):
        from_hf_t5_state_dict(state, t5_config(hf.config.to_dict()))


def test_config_round_trip_and_checks():
    for cfg in (t5_config(hf_t5().config.to_dict()), bart_config(hf_bart().config.to_dict())):
        assert Seq2SeqConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="bias"):
        Seq2SeqConfig.t5(bias=True)  # RMSNorm has no bias
    with pytest.raises(ValueError, match="n_heads"):
        Seq2SeqConfig.bart(d_model=30, n_heads=4)
