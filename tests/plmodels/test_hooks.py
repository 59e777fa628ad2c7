"""Hook sites: names, editing, removal after exceptions, run_with_cache, eager forcing."""

import pytest
import torch
from torch.testing import assert_close

from .tiny import batch, tiny_decoder, tiny_encoder

SITES = ["resid_pre", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.pattern", "attn.head_out", "attn_out",
         "mlp.post", "mlp_out", "resid_post"]


@pytest.mark.parametrize("build", [tiny_encoder, tiny_decoder])
def test_hook_names_are_the_design_table(build):
    model = build()
    expected = ["embed"] + [f"blocks.{l}.{s}" for l in range(2) for s in SITES]
    assert model.hook_names() == expected


@pytest.mark.parametrize("build", [tiny_encoder, tiny_decoder])
def test_run_with_cache_matches_hidden_states_and_attentions(build):
    model = build()
    ids, mask = batch()
    out, cache = model.run_with_cache(ids, attention_mask=mask)
    ref = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert set(cache) == set(model.hook_names())
    assert_close(cache["embed"], ref.hidden_states[0])
    for l in range(2):
        assert_close(cache[f"blocks.{l}.resid_post"], ref.hidden_states[l + 1])
        assert_close(cache[f"blocks.{l}.resid_pre"], ref.hidden_states[l])
        assert_close(cache[f"blocks.{l}.attn.pattern"], ref.attentions[l])
        assert cache[f"blocks.{l}.attn.head_out"].shape == (3, 9, 4, 8)
    # head_out -> output projection gives attn_out (dropout is off in eval)
    attn = model.blocks[1].attn
    assert_close(attn.out(cache["blocks.1.attn.head_out"].reshape(3, 9, 32)), cache["blocks.1.attn_out"])
    # without pattern names the fast path is used and gives the same residual stream
    _, fast = model.run_with_cache(ids, names=["blocks.1.resid_post"], attention_mask=mask, attn_impl="sdpa")
    assert_close(fast["blocks.1.resid_post"][mask.bool()], cache["blocks.1.resid_post"][mask.bool()], atol=1e-5, rtol=1e-5)


def test_editing_resid_post_changes_the_output_and_hooks_see_their_name(encoder):
    ids, _ = batch()
    base = encoder(ids).last_hidden_state
    seen = []

    def zero(t, name):
        seen.append(name)
        return torch.zeros_like(t)

    with encoder.hooks(fwd=[("blocks.1.resid_post", zero)]):
        edited = encoder(ids).last_hidden_state
    assert seen == ["blocks.1.resid_post"]
    assert_close(edited, torch.zeros_like(edited))  # post-LN, last block: output is the edit
    assert (base - edited).abs().max() > 0.1
    assert_close(encoder(ids).last_hidden_state, base)  # hook gone


def test_pattern_hook_edits_attention_and_forces_eager(decoder):
    ids, _ = batch(pad_from=None)
    base = decoder(ids).logits

    def uniform_over_self(p, name):  # attend only to the token itself
        return torch.eye(p.shape[-1]).expand_as(p).clone()

    with decoder.hooks(fwd=[("blocks.0.attn.pattern", uniform_over_self)]):
        edited = decoder(ids).logits  # auto -> eager because a pattern hook is registered
        with pytest.raises(ValueError, match="pattern"):
            decoder(ids, attn_impl="sdpa")
    assert (edited - base).abs().max() > 1e-4
    # with a self-only pattern token t's output no longer depends on earlier tokens
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 61
    with decoder.hooks(fwd=[(f"blocks.{l}.attn.pattern", uniform_over_self) for l in range(2)]):
        a, b = decoder(ids).logits, decoder(changed).logits
    assert_close(a[:, 1:], b[:, 1:])


def test_hooks_are_removed_after_an_exception(encoder):
    ids, _ = batch()
    with pytest.raises(RuntimeError, match="boom"):
        with encoder.hooks(fwd=[("embed", lambda t, n: t * 0), ("blocks.0.attn.pattern", lambda t, n: None)]):
            raise RuntimeError("boom")
    assert all(not p.fns for p in encoder.hook_points().values())
    assert not encoder._pattern_hooks_active()
    encoder(ids, attn_impl="sdpa")  # no pattern hook left behind


def test_unknown_hook_name_lists_valid_ones(encoder):
    with pytest.raises(ValueError, match="blocks.0.resid_post"):
        with encoder.hooks(fwd=[("blocks.9.resid_post", lambda t, n: t)]):
            pass
    assert all(not p.fns for p in encoder.hook_points().values())


def test_cache_detaches_by_default_and_can_keep_the_graph(encoder):
    ids, _ = batch()
    _, cache = encoder.run_with_cache(ids, names=["blocks.0.mlp_out"])
    assert not cache["blocks.0.mlp_out"].requires_grad
    _, cache = encoder.run_with_cache(ids, names=["blocks.0.mlp_out"], detach=False)
    assert cache["blocks.0.mlp_out"].requires_grad


@pytest.mark.parametrize("build", [tiny_encoder, tiny_decoder])
def test_transformer_lens_sites_recompute_the_layer_by_hand(build):
    """hook_q/k/v give the pattern back through softmax(q k^T / sqrt(d) + mask); hook_attn_scores gives
    it through the softmax alone; hook_z through W_O is hook_attn_out; mlp.hook_post through W_out is
    hook_mlp_out (eval mode: no dropout). Names are TransformerLens' (aliases of ours)."""
    model = build().eval()
    ids, mask = batch()
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    for l, block in enumerate(model.blocks):
        q, k, v = (cache[f"blocks.{l}.attn.hook_{x}"] for x in "qkv")           # (B, T, H, Dh)
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]                       # (B, H, T, T)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
        if getattr(model, "kind", "") == "decoder":
            T = ids.shape[1]
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        real = mask.bool()[:, None, :, None]                                   # query rows of real tokens
        assert_close(scores.softmax(-1) * real, pattern * real, atol=1e-5, rtol=1e-5)
        assert_close(cache[f"blocks.{l}.attn.hook_attn_scores"].softmax(-1) * real, pattern * real)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)                        # (B, T, H, Dh)
        assert_close(z * mask[:, :, None, None], cache[f"blocks.{l}.attn.hook_z"] * mask[:, :, None, None],
                     atol=1e-5, rtol=1e-5)
        attn_out = block.attn.out(cache[f"blocks.{l}.attn.hook_z"].flatten(2))
        assert_close(attn_out, cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=1e-5)
        mlp_out = block.mlp.fc_out(cache[f"blocks.{l}.mlp.hook_post"])
        assert_close(mlp_out, cache[f"blocks.{l}.hook_mlp_out"], atol=1e-5, rtol=1e-5)
        assert cache[f"blocks.{l}.hook_resid_pre"] is cache[f"blocks.{l}.resid_pre"]


def test_names_filter_takes_a_predicate_a_list_or_a_name_in_either_naming(encoder):
    ids, mask = batch()
    _, c = encoder.run_with_cache(ids, attention_mask=mask, names_filter=lambda n: n.endswith("hook_pattern"))
    assert sorted(c) == ["blocks.0.attn.pattern", "blocks.1.attn.pattern"]
    _, c = encoder.run_with_cache(ids, attention_mask=mask, names_filter=["blocks.1.hook_resid_post", "embed"])
    assert sorted(c) == ["blocks.1.resid_post", "embed"] and "blocks.1.hook_resid_post" in c
    _, c = encoder.run_with_cache(ids, attention_mask=mask, names_filter="blocks.0.mlp.hook_post")
    assert list(c) == ["blocks.0.mlp.post"]
    with pytest.raises(ValueError, match="unknown hook name"):
        encoder.run_with_cache(ids, attention_mask=mask, names=["blocks.0.hook_nothing"])


def test_an_edit_through_an_alias_is_an_edit_of_our_site(encoder):
    # zeroing every value of head 0 through hook_v equals masking head 0
    ids, mask = batch()
    def zero_head0(v, name):
        v = v.clone()
        v[:, :, 0] = 0.0
        return v
    with encoder.hooks([(f"blocks.{l}.attn.hook_v", zero_head0) for l in range(2)]):
        edited = encoder(ids, attention_mask=mask).last_hidden_state
    head_mask = torch.ones(2, encoder.config.n_heads)
    head_mask[:, 0] = 0.0
    masked = encoder(ids, attention_mask=mask, head_mask=head_mask, attn_impl="eager").last_hidden_state
    assert_close(edited, masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("build", [tiny_encoder, tiny_decoder])
def test_the_scores_site_holds_the_scores_under_no_grad(build):
    """Without autograd the eager kernel may run its softmax in the scores' own memory; a hook that saw
    `attn.scores` (run_with_cache, a patching cache) must still hold q k^T / sqrt(Dh) + mask, not the
    probabilities written over it."""
    model = build().eval()
    ids, mask = batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, attention_mask=mask)
    T = ids.shape[1]
    allowed = mask.bool()[:, None, None, :].expand(-1, 1, T, T)
    if getattr(model, "kind", "") == "decoder":
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(2):
        q, k = cache[f"blocks.{l}.attn.q"], cache[f"blocks.{l}.attn.k"]      # (B, T, H, Dh)
        by_hand = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5   # (B, H, T, T)
        scores = cache[f"blocks.{l}.attn.scores"]
        sel = allowed.expand_as(scores)
        assert_close(scores[sel], by_hand[sel], atol=1e-5, rtol=1e-5)
        assert_close(scores.softmax(-1), cache[f"blocks.{l}.attn.pattern"], atol=1e-6, rtol=1e-5)
