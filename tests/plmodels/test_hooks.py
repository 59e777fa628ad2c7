"""Hook sites: names, editing, removal after exceptions, run_with_cache, eager forcing."""

import pytest
import torch
from torch.testing import assert_close

from .conftest import batch, tiny_decoder, tiny_encoder

SITES = ["resid_pre", "attn.pattern", "attn.head_out", "attn_out", "mlp_out", "resid_post"]


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
