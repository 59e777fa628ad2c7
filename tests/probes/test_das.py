"""Distributed alignment search (probes/das.py): a planted direction recovered, the k = D identity with
whole-site interchange, the rotation kept orthogonal, the pair bookkeeping by hand, bad input refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from plmodels import Decoder, DecoderConfig
from probes.das import DistributedAlignmentSearch, InterchangePairs, haar_rotation, whole_site_hits
from probes.patching import Site, patch_sites

D, T, SITE = 32, 5, Site("blocks.0.resid_post", position=1)


def tiny_decoder(dtype: torch.dtype = torch.float32) -> Decoder:
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=61, d_model=D, n_layers=2, n_heads=4, d_ff=48, max_positions=16, dropout=0.0)
    return Decoder(cfg).to(dtype).eval()


def random_pairs(n: int, seed: int) -> tuple[dict, dict]:
    """Base and source inputs drawn independently (the same length: aligned position by position)."""
    g = torch.Generator().manual_seed(seed)
    batch = lambda x: {"input_ids": x, "attention_mask": torch.ones_like(x)}  # noqa: E731
    return batch(torch.randint(10, 61, (n, T), generator=g)), batch(torch.randint(10, 61, (n, T), generator=g))


GAP = 0.3  # the planted number's distance from 0 along u, in the residual stream's units


def planted_decoder():
    """(model, u, number, score): a tiny decoder whose tokens have a number (+1 even ids, -1 odd) written
    into their embeddings along one known unit direction u (GAP * number * u added), and an agreement
    decision that reads u alone: d = u . h / GAP, h the residual stream after block 0 at position 1 (the
    subject), read by a hook at the site that runs after any intervention there. Everything else in h
    (position, the token's identity, what block 0 adds) varies freely and the decision ignores it."""
    model = tiny_decoder()
    u = torch.nn.functional.normalize(torch.randn(D, generator=torch.Generator().manual_seed(7)), dim=0)
    number = torch.where(torch.arange(model.config.vocab_size) % 2 == 0, 1.0, -1.0)
    with torch.no_grad():
        model.wte.weight += GAP * number[:, None] * u

    def score(m, batch):
        read = {}

        def keep(t, name):
            read["h"] = t[:, 1]

        with m.hooks([(SITE.hook, keep)]):
            m(batch["input_ids"], attention_mask=batch["attention_mask"])
        return read["h"] @ u.to(read["h"].dtype) / GAP
    return model, u, number, score


def counterfactual_labels(model, score, source) -> np.ndarray:
    """1 where the source run's own decision is positive: the label the intervened base run should take."""
    with torch.no_grad():
        return (score(model, source) > 0).double().numpy()


@pytest.fixture(scope="module")
def planted_fit():
    model, u, number, score = planted_decoder()
    base, source = random_pairs(600, seed=1)
    pairs = InterchangePairs.one_row_each(base, source)
    y = (number[source["input_ids"][:, 1]] > 0).double().numpy()  # the source subject's number
    np.testing.assert_array_equal(counterfactual_labels(model, score, source), y)  # the planting holds
    train, test = np.arange(400), np.arange(400, 600)
    das = DistributedAlignmentSearch(model, score, SITE, k=1, epochs=10, lr=0.05, batch_size=50, seed=0)
    das.fit(pairs.take(train), y[train])
    return model, score, u, pairs, y, train, test, das


@pytest.mark.slow
def test_das_finds_the_planted_direction_and_a_random_rotation_does_not(planted_fit):
    model, score, u, pairs, y, train, test, das = planted_fit
    Xt, yt = pairs.take(test), y[test]
    cos = float(das.subspace_[:, 0] @ u)
    assert abs(cos) > 0.95, cos
    assert das.score(Xt, yt) >= 0.99  # held-out IIA: the direction carries the decision
    # the base runs' own answers agree with the counterfactual label on about half the pairs: chance
    chance = float(((score(model, Xt.base) > 0).double().numpy() == yt).mean())
    assert 0.35 < chance < 0.65
    random = DistributedAlignmentSearch(model, score, SITE, k=1, epochs=0, seed=0).fit(pairs.take(train), y[train])
    assert abs(float(random.subspace_[:, 0] @ u)) < 0.5
    assert abs(random.score(Xt, yt) - chance) < 0.1
    # whole-site interchange sets u . h to the source's exactly: its IIA is 1 by construction
    assert whole_site_hits(model, score, SITE, Xt, yt).mean() == 1.0


@pytest.mark.slow
def test_the_rotation_stays_orthogonal_while_it_moves(planted_fit):
    das = planted_fit[-1]
    R = das.rotation_.double()
    torch.testing.assert_close(R.T @ R, torch.eye(D, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(R @ R.T, torch.eye(D, dtype=torch.float64), atol=1e-5, rtol=0)
    assert (R - haar_rotation(D, das.seed).double()).abs().max() > 0.1  # training did turn it


def test_das_at_k_equal_to_d_is_the_whole_site_interchange():
    """h' = h_b + R R^T (h_s - h_b) = h_s: the decisions are patch_sites' whole-site ones (float64), with the
    site at a per-row (named) position and the model's own logit difference as the decision."""
    model = tiny_decoder(torch.float64)

    def score(m, batch):
        logits = m(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return logits[:, -1, 7] - logits[:, -1, 8]

    base, source = random_pairs(40, seed=3)
    where = {"subject": torch.randint(0, T, (40,), generator=torch.Generator().manual_seed(5))}
    site = Site("blocks.0.resid_post", position="subject")
    pairs = InterchangePairs.one_row_each(base, source, where)
    y = counterfactual_labels(model, score, source)
    das = DistributedAlignmentSearch(model, score, site, k=D, epochs=1, batch_size=16).fit(pairs, y)
    _, _, patched = patch_sites(model, score, base, source, [site], positions=where)
    torch.testing.assert_close(das.decision_function(pairs), patched[0], atol=1e-9, rtol=0)
    np.testing.assert_array_equal(das.hits(pairs, y), whole_site_hits(model, score, site, pairs, y))
    # and a smaller k is not: the site's other coordinates stay the base's
    part = DistributedAlignmentSearch(model, score, site, k=D // 2, epochs=0).fit(pairs, y)
    assert (part.decision_function(pairs) - patched[0]).abs().max() > 1e-3


def test_pairs_of_several_rows_add_their_signed_scores_and_take_renumbers():
    rows = {"x": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])}
    pairs = InterchangePairs(rows, rows, item=torch.tensor([0, 0, 1, 2, 2]),
                             weight=torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0]))
    assert pairs.n_pairs == 3
    torch.testing.assert_close(pairs.decisions(rows["x"]), torch.tensor([1 - 2.0, 3.0, 4 - 5.0]))
    sub = pairs.take([2, 0])  # pair 2 first, then pair 0
    torch.testing.assert_close(sub.base["x"], torch.tensor([4.0, 5.0, 1.0, 2.0]))
    torch.testing.assert_close(sub.item, torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(sub.decisions(sub.base["x"]), torch.tensor([-1.0, -1.0]))


def test_bad_input_is_one_line_naming_it():
    model, _, _, score = planted_decoder()
    base, source = random_pairs(8, seed=2)
    pairs = InterchangePairs.one_row_each(base, source)
    y = np.zeros(8)
    with pytest.raises(ValueError, match=r"y must be \(8,\) labels of 0/1"):
        DistributedAlignmentSearch(model, score, SITE).fit(pairs, y[:5])
    with pytest.raises(ValueError, match=r"y must be \(8,\) labels of 0/1"):
        DistributedAlignmentSearch(model, score, SITE).fit(pairs, y + 0.5)
    with pytest.raises(ValueError, match="k must be <= the site's dimension 32"):
        DistributedAlignmentSearch(model, score, SITE, k=33).fit(pairs, y)
    with pytest.raises(ValueError, match="not one vector per row"):
        DistributedAlignmentSearch(model, score, Site(SITE.hook)).fit(pairs, y)
    with pytest.raises(ValueError, match="unknown site"):
        DistributedAlignmentSearch(model, score, Site("blocks.9.resid_post", position=1)).fit(pairs, y)
    with pytest.raises(ValueError, match="k must be >= 1"):
        DistributedAlignmentSearch(model, score, SITE, k=0).fit(pairs, y)
    with pytest.raises(ValueError, match="call fit before"):
        DistributedAlignmentSearch(model, score, SITE).score(pairs, y)
    with pytest.raises(ValueError, match=r"one row per entry of item \(7 rows\); .*base\[input_ids\]': 8"):
        InterchangePairs(base, source, item=torch.arange(7))
