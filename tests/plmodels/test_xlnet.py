"""XLNet (plmodels/xlnet.py), its importer (hf/xlnet.py) and the permutation batch (training/plm.py).

Parity: our model with weights converted from a small random transformers XLNetLMHeadModel gives the
same content hidden states, content attentions, query-stream attentions and logits to 1e-4, without
and with a permutation batch, with padding and segments. Two-stream semantics are checked by
gradients through the `embed` site: the query stream at a target never depends on its own token, and
the content stream of a 1-layer model depends exactly on what perm_mask lets it see plus itself.
transformers is the reference only; plmodels never imports it."""

from __future__ import annotations

import pytest
import torch

from plmodels.hf.xlnet import from_hf_xlnet_state_dict, xlnet_config
from plmodels.training.plm import permutation_batch
from plmodels.xlnet import XLNet, XLNetConfig

from .hf_models import XLNET_VOCAB as V
from .hf_models import hf_xlnet
from .hf_models import xlnet_batch as batch

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-4


def ours_from(hf) -> XLNet:
    model = XLNet(xlnet_config(hf.config.to_dict())).eval()
    model.load_state_dict(from_hf_xlnet_state_dict(hf.state_dict()), strict=True)
    return model


@pytest.mark.parametrize("hf_kw", [{}, {"bi_data": True, "clamp_len": 3}, {"attn_type": "uni"}])
@pytest.mark.parametrize("permuted", [False, True])
def test_parity_with_transformers(hf_kw, permuted):
    hf = hf_xlnet(**hf_kw)
    ours = ours_from(hf)
    ids, mask, tt = batch()
    if hf_kw.get("attn_type") == "uni":  # HF's uni mask adds a (T, T, B) data mask in place: B = 1 only
        ids, mask, tt = ids[1:2], mask[1:2], tt[1:2]
    kw = dict(attention_mask=mask, token_type_ids=tt)
    if permuted:
        pb = permutation_batch(ids, partial_k=3, attention_mask=mask, generator=torch.Generator().manual_seed(2))
        assert len(ids) == 1 or (pb.target_mapping.sum(2) == 0).any()  # padded row: fewer targets, a zero row
        kw.update(perm_mask=pb.perm_mask, target_mapping=pb.target_mapping)
    with torch.no_grad():
        ref = hf(ids, **kw, output_hidden_states=True, output_attentions=True, use_mems=False)
        out, cache = ours.run_with_cache(ids, **kw, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(out.logits, ref.logits, atol=ATOL, rtol=0)
    ref_h = ref.hidden_states[0::2] if permuted else ref.hidden_states  # HF interleaves (h, g) when permuted
    assert len(out.hidden_states) == 3
    for a, b in zip(out.hidden_states, ref_h, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for l, (a, b) in enumerate(zip(out.attentions, ref.attentions, strict=True)):
        torch.testing.assert_close(a, b[0] if permuted else b, atol=ATOL, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.pattern"], a)
        if permuted:  # HF's query-stream probabilities at every position; ours at the targets
            tm = kw["target_mapping"]
            rows = torch.einsum("bpt,bhts->bhps", tm, b[1])
            torch.testing.assert_close(cache[f"blocks.{l}.attn.query_pattern"] * tm.sum(2)[:, None, :, None],
                                       rows, atol=ATOL, rtol=0)
            torch.testing.assert_close(cache[f"blocks.{l}.query_resid_post"],
                                       ref.hidden_states[2 * l + 3], atol=ATOL, rtol=0)
    if permuted:
        assert out.logits.shape == (len(ids), kw["target_mapping"].shape[1], V)


def test_sdpa_matches_eager_and_head_mask_reaches_both_streams():
    model = ours_from(hf_xlnet())
    ids, mask, tt = batch()
    pb = permutation_batch(ids, n_predict=3, attention_mask=mask, generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=mask, token_type_ids=tt, perm_mask=pb.perm_mask, target_mapping=pb.target_mapping)
    with torch.no_grad():
        fast = model(ids, **kw, attn_impl="sdpa")
        eager = model(ids, **kw, attn_impl="eager", head_mask=torch.ones(2, 4))
        hm = torch.ones(2, 4)
        hm[1, 2] = 0.0
        gated = model(ids, **kw, head_mask=hm, output_attentions=True)
    torch.testing.assert_close(fast.logits, eager.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.last_hidden_state, eager.last_hidden_state, atol=1e-5, rtol=0)
    assert (gated.attentions[1][:, 2] == 0).all()
    assert not torch.allclose(gated.query_hidden_state, eager.query_hidden_state, atol=1e-4)
    with pytest.raises(ValueError, match="sdpa"):
        model(ids, **kw, attn_impl="sdpa", head_mask=hm)


def _embedding_grads(model: XLNet, ids: torch.Tensor, pick, **kw) -> torch.Tensor:
    """d pick(output) / d embedding, (B, T, D), with the `embed` site's output made a leaf."""
    leaf = {}

    def make_leaf(x, name):
        leaf["x"] = x.detach().requires_grad_(True)
        return leaf["x"]

    with model.hooks([("embed", make_leaf)]):
        out = model(ids, **kw)
    pick(out).backward()
    return leaf["x"].grad


def test_query_stream_never_sees_its_own_token():
    model = ours_from(hf_xlnet())  # 2 layers: the content of a target only reaches later targets
    ids = batch()[0][:1]  # (1, 10)
    pb = permutation_batch(ids, n_predict=4, generator=torch.Generator().manual_seed(3))
    kw = dict(perm_mask=pb.perm_mask, target_mapping=pb.target_mapping)
    for m, t in enumerate(pb.target_mapping[0].argmax(1).tolist()):
        grad = _embedding_grads(model, ids, lambda o, m=m: o.query_hidden_state[0, m].square().sum(), **kw)
        assert torch.equal(grad[0, t], torch.zeros_like(grad[0, t])), f"query stream at {t} sees its token"
        assert grad[0].abs().sum() > 0  # it does see its context
        content = _embedding_grads(model, ids, lambda o, t=t: o.last_hidden_state[0, t].square().sum(), **kw)
        assert content[0, t].abs().sum() > 0  # the content stream at t does read token t


@pytest.mark.parametrize("n_predict", [8, 3])
def test_content_stream_sees_what_the_order_allows(n_predict):
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=4, d_ff=64, dropout=0.0)).eval()
    ids = torch.randint(0, V, (1, 8))
    order = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])
    pb = permutation_batch(ids, n_predict=n_predict, order=order)
    rank = order.argsort()
    for i in range(8):
        grad = _embedding_grads(model, ids, lambda o, i=i: o.last_hidden_state[0, i].square().sum(),
                                perm_mask=pb.perm_mask, target_mapping=pb.target_mapping)
        seen = grad[0].abs().sum(1) > 0  # (T,)
        if n_predict == 8:  # every token a target: the order itself
            expected = (rank < rank[i]) | (torch.arange(8) == i)
        else:  # partial prediction: the authors' rule, perm_mask plus itself
            expected = (pb.perm_mask[0, i] == 0) | (torch.arange(8) == i)
        assert torch.equal(seen, expected), (i, seen, expected)


def test_permutation_batch_hand_example():
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    pb = permutation_batch(ids, n_predict=2, order=torch.tensor([2, 0, 4, 1, 3]))
    # targets: the last two of the order, positions 1 (rank 3) and 3 (rank 4)
    blocked_all = [0, 1, 0, 1, 0]  # non-targets see every non-target and no target
    expected = torch.tensor([blocked_all, [0, 1, 0, 1, 0], blocked_all, [0, 0, 0, 1, 0], blocked_all]).float()
    torch.testing.assert_close(pb.perm_mask[0], expected)  # target 3 sees target 1, not itself; 1 sees no target
    torch.testing.assert_close(pb.target_mapping[0], torch.eye(5)[[1, 3]])
    assert pb.labels.tolist() == [[11, 13]]


def test_permutation_batch_partial_prediction_and_padding():
    T, K = 14, 7
    ids = torch.arange(2 * T).view(2, T)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 7:] = 0
    a = permutation_batch(ids, partial_k=K, attention_mask=mask, generator=torch.Generator().manual_seed(5))
    b = permutation_batch(ids, partial_k=K, attention_mask=mask, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.perm_mask, b.perm_mask) and torch.equal(a.order, b.order)  # the generator decides
    assert a.target_mapping.shape == (2, T // K, T)
    assert a.target_mapping[0].sum() == 2 and a.target_mapping[1].sum() == 1  # 14 // 7 and 7 // 7
    assert a.labels[1, 1] == -100
    for b_ in range(2):
        rank = a.order[b_].argsort()
        n_real = int(mask[b_].sum())
        target = a.target_mapping[b_].sum(0).bool()
        assert torch.equal(target, rank >= T - target.sum())  # the last of the order
        assert not (target & ~mask[b_].bool()).any()  # padding never a target
        for i in range(T):
            for j in range(T):
                if target[j]:
                    want = rank[j] >= rank[i] if target[i] else True
                else:
                    want = False
                assert bool(a.perm_mask[b_, i, j]) == bool(want), (b_, i, j)
        assert n_real - target.sum() >= 1
