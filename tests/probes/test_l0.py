"""Tests for probes/l0.py: Hard-Concrete formulas by hand, the lambda sweep, the joint-training copy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probes.l0 import HardConcreteGates, L0HeadGates, l0_sweep
from probes.pruning import METRICS, mlm_loss
from tests.probes.planted import CRUCIAL, planted_encoder, self_labelled_batches




def test_expected_l0_and_deterministic_gates_by_hand():
    gates = HardConcreteGates((1, 3))
    with torch.no_grad():
        gates.log_alpha.copy_(torch.tensor([[-2.0, 0.0, 1.5]]))
    beta, low, high = 1 / 3, -0.1, 1.1
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    open_prob = [sig(a - beta * math.log(-low / high)) for a in (-2.0, 0.0, 1.5)]
    assert gates.open_probability().squeeze(0).tolist() == pytest.approx(open_prob, rel=1e-6)
    assert float(gates.expected_l0().detach()) == pytest.approx(sum(open_prob), rel=1e-6)
    det = [min(1.0, max(0.0, sig(a) * (high - low) + low)) for a in (-2.0, 0.0, 1.5)]
    assert gates.deterministic().squeeze(0).tolist() == pytest.approx(det, rel=1e-6)
    # Monte Carlo: the fraction of non-zero training samples matches P(g != 0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        samples = torch.stack([gates.sample(g) for _ in range(4000)])
    assert ((samples > 0).float().mean(0).squeeze(0).tolist()) == pytest.approx(open_prob, abs=0.03)
    assert float(samples.min()) >= 0.0 and float(samples.max()) <= 1.0
    assert float((samples == 1.0).float().mean()) > 0  # the stretch puts mass exactly at 1


def test_larger_lambda_closes_more_gates(planted):
    model, batches = planted
    sweep = l0_sweep(model, batches, mlm_loss, METRICS["mlm_accuracy"], lams=(0.0, 0.1, 5.0),
                     steps=60, model_name="tiny")
    n_open = sweep["n_open"].tolist()
    assert n_open[0] == 8 and n_open[-1] == 0
    assert n_open == sorted(n_open, reverse=True) and n_open[1] < n_open[0]
    assert sweep["value"].iloc[0] == pytest.approx(1.0)  # all gates open: the self-labels are the argmax
    assert set(sweep["metric"]) == {"mlm_accuracy"}


def test_fit_state_and_the_crucial_head_stays_open(planted):
    model, batches = planted
    fitted = L0HeadGates(lam=0.1, steps=60).fit(model, batches, mlm_loss)
    assert fitted.gates_.shape == (2, 4) and len(fitted.history_) == 60
    assert fitted.gates_[CRUCIAL] > 0.9
    assert fitted.n_open_ == int((fitted.gates_ > 0).sum()) < 8
    assert fitted.history_[-1]["expected_l0"] < fitted.history_[0]["expected_l0"]
    assert all(p.requires_grad for p in model.parameters())  # frozen only during the fit


def test_joint_training_trains_a_copy(planted):
    model, batches = planted
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fitted = L0HeadGates(lam=0.1, steps=5, train_model=True, model_lr=1e-2).fit(model, batches, mlm_loss)
    assert fitted.model_ is not model
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])
    changed = [k for k, v in fitted.model_.state_dict().items() if not torch.equal(v, before[k])]
    assert changed


def test_bad_arguments():
    with pytest.raises(ValueError, match="stretch"):
        HardConcreteGates((2, 2), stretch=(0.1, 1.1))
    model = planted_encoder()
    with pytest.raises(ValueError, match="lam"):
        L0HeadGates(lam=-1.0).fit(model, self_labelled_batches(model, 1), mlm_loss)
    assert np.isfinite(HardConcreteGates((2, 2)).deterministic().detach().numpy()).all()
