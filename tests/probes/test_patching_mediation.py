"""Causal mediation (probes/mediation.py) on patching scores: a planted mechanism recovered exactly, and
the definitions checked by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from plmodels import Decoder, DecoderConfig
from probes.mediation import bootstrap_rows, interchange_hits, item_effects, restored_fraction
from probes.patching import patch_sites, site_grid

PLANTED = (1, 2)  # the one head through which the subject reaches the last position
GAIN = 40.0  # its output is amplified (a hook): the swap then moves the decision by ~0.05 nats, not ~2e-3


def planted_decoder():
    """A tiny decoder whose head mask closes every head but PLANTED: the only path from an earlier
    position to the last one runs through that head (MLPs and LayerNorms are position-wise)."""
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=16)).eval()
    mask = torch.zeros(2, 4)
    mask[PLANTED] = 1.0

    gain = torch.ones(4)
    gain[PLANTED[1]] = GAIN

    def louder(t, name):  # (B, T, H, Dh): the planted head's output x GAIN
        return t * gain.view(1, 1, -1, 1)

    def score(m, batch):  # the logit difference of two "verb forms" at the last position
        with m.hooks([(f"blocks.{PLANTED[0]}.attn.head_out", louder)]):
            logits = m(batch["input_ids"], attention_mask=batch["attention_mask"], head_mask=mask).logits
        return logits[:, -1, 7] - logits[:, -1, 8]
    return model, score


def subject_pairs(n: int = 24, T: int = 6):
    """(clean, corrupt): random sentences whose token 1 (the subject) is swapped for another."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(10, 61, (n, T), generator=g)
    other = ids.clone()
    other[:, 1] = 10 + (ids[:, 1] - 10 + torch.randint(1, 50, (n,), generator=g)) % 51
    batch = lambda x: {"input_ids": x, "attention_mask": torch.ones_like(x)}  # noqa: E731
    return batch(ids), batch(other)


@pytest.mark.parametrize("scale", ["log", "ratio"])
def test_a_head_that_carries_the_decision_has_the_whole_indirect_effect(scale):
    model, score = planted_decoder()
    clean, corrupt = subject_pairs()
    sites = site_grid(model, kinds=("head_out",))
    d_clean, d_corrupt, noised = patch_sites(model, score, clean, corrupt, sites)
    _, _, denoised = patch_sites(model, score, corrupt, clean, sites)
    eff = item_effects(d_clean.numpy(), d_corrupt.numpy(), noised.numpy(), denoised.numpy(), scale=scale)
    te = eff["te"][0]
    assert np.abs(eff["te"] if scale == "log" else np.log1p(te)).mean() > 0.02  # the swap moves the decision
    k = next(i for i, s in enumerate(sites) if (s.layer, s.head) == PLANTED)
    tol = 1e-5 * max(1.0, np.abs(te).max())
    np.testing.assert_allclose(eff["nie"][k], te, atol=tol)  # the whole effect, through the head
    np.testing.assert_allclose(eff["nde"][k], 0.0, atol=tol)  # none around it
    others = [i for i in range(len(sites)) if i != k]
    np.testing.assert_allclose(eff["nie"][others], 0.0, atol=tol)
    np.testing.assert_allclose(eff["nde"][others], np.broadcast_to(te, (len(others), len(te))), atol=tol)
    value, _, _ = restored_fraction(d_clean.numpy(), d_corrupt.numpy(), denoised.numpy(), n_boot=50)
    np.testing.assert_allclose(value, np.where(np.arange(len(sites)) == k, 1.0, 0.0), atol=1e-5)
    # IIA: the planted head's interchange behaves exactly as the corrupted run, every other as the clean one
    hits = interchange_hits(noised.numpy())
    np.testing.assert_array_equal(hits[k], (d_corrupt.numpy() < 0).astype(float))
    np.testing.assert_array_equal(hits[others], np.broadcast_to(d_clean.numpy() < 0, (len(others), len(te))))


def test_effects_by_hand():
    """d = logit(right) - logit(wrong); y = exp(-d); TE = y(u')/y(u) - 1 etc. (Finlayson et al. 2021)."""
    clean, corrupt = np.array([2.0, 1.0]), np.array([-1.0, 0.0])
    noised, denoised = np.array([[0.5, 1.0]]), np.array([[2.0, -0.5]])
    r = item_effects(clean, corrupt, noised, denoised, scale="ratio")
    np.testing.assert_allclose(r["te"], [[np.e ** 3 - 1, np.e - 1]])
    np.testing.assert_allclose(r["nie"], [[np.e ** 1.5 - 1, 0.0]])
    np.testing.assert_allclose(r["nde"], [[0.0, np.e ** 1.5 - 1]])
    log = item_effects(clean, corrupt, noised, denoised, scale="log")
    np.testing.assert_allclose(log["te"], [[3.0, 1.0]])
    value, _, _ = restored_fraction(clean, corrupt, denoised, n_boot=10)
    np.testing.assert_allclose(value, [(3.0 - 0.5) / 4.0])  # mean gain 1.25 over mean gap 2
    with pytest.raises(ValueError, match=r"noised must be \(S, N\) with N = 2"):
        item_effects(clean, corrupt, noised[:, :1], denoised)
    with pytest.raises(ValueError, match="scale 'odds'"):
        item_effects(clean, corrupt, noised, denoised, scale="odds")


def test_bootstrap_rows_covers_the_mean_and_shrinks_with_items():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 1.0, (3, 50)), rng.normal(1.0, 1.0, (3, 2000))
    m, lo, hi = bootstrap_rows(small, n_boot=400)
    np.testing.assert_allclose(m, small.mean(1))
    assert np.all(lo < m) and np.all(m < hi) and np.all((lo < 1.0) & (1.0 < hi))
    _, lo2, hi2 = bootstrap_rows(large, n_boot=400)
    ratio = (hi - lo) / (hi2 - lo2)  # width ~ 1/sqrt(N): sqrt(40) ~ 6.3
    assert np.all((ratio > 4) & (ratio < 9))
