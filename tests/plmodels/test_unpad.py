"""unpad=True (plmodels.components.attention.Packing): the same outputs at the real tokens as the padded forward."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from plmodels.checkpoint import build_model
from plmodels.families import preset


@pytest.mark.parametrize("kind,position,norm", [("encoder", "learned", "post"), ("encoder", "rope", "pre"),
                                                ("encoder", "alibi", "pre"), ("decoder", "learned", "pre"),
                                                ("decoder", "rope", "pre")])
def test_unpadded_forward_matches_padded_at_real_tokens(kind, position, norm):
    torch.manual_seed(0)
    model = build_model(kind, {**preset(kind, "tiny"), "vocab_size": 50, "position": position, "norm": norm}).eval()
    model.prune_heads({1: [0]})  # a pruned layer too
    lengths = [9, 4, 7]
    ids = torch.randint(5, 50, (3, 9))
    mask = (torch.arange(9)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, unpad=True)
    real = mask.bool()
    for h_ref, h_got in zip(ref.hidden_states + (ref.last_hidden_state,), got.hidden_states + (got.last_hidden_state,)):
        assert_close(h_got[real], h_ref[real], atol=1e-5, rtol=1e-5)
        assert h_got[~real].abs().max() == 0  # padding is zero, not computed
    for a_ref, a_got in zip(ref.attentions, got.attentions):
        assert_close(a_got[real[:, None, :, None].expand_as(a_got)], a_ref[real[:, None, :, None].expand_as(a_ref)],
                     atol=1e-6, rtol=1e-5)


def test_unpad_without_padding_is_the_plain_forward_and_refuses_hooks():
    torch.manual_seed(1)
    model = build_model("encoder", {**preset("encoder", "tiny"), "vocab_size": 50}).eval()
    ids = torch.randint(5, 50, (2, 6))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=mask, unpad=True).last_hidden_state,
                           model(ids, attention_mask=mask).last_hidden_state)
        mask[1, 4:] = 0
        with model.hooks([("blocks.0.resid_post", lambda t, name: None)]):
            with pytest.raises(ValueError, match=r"unpad=True cannot run with hooks on \[.blocks.0.resid_post.\]"):
                model(ids, attention_mask=mask, unpad=True)


def test_packing_pad_is_exact_zeros_at_the_padding_and_round_trips():
    from plmodels.components.attention import Packing

    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    x = torch.randn(3, 4, 5)
    pk = Packing(mask)
    for _ in range(3):  # fresh (uninitialised) buffers each time
        padded = pk.pad(pk.pack(x))
        assert torch.equal(padded[mask.bool()], x[mask.bool()])
        assert torch.equal(padded[~mask.bool()], torch.zeros(int((~mask.bool()).sum()), 5))
