"""L0-regularised head gates: how many heads a model needs (Voita et al. 2019).

Voita, Talbot, Moiseev, Sennrich & Titov (2019), "Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", Sec. 6: every head h gets a scalar gate g_h
multiplying its output; the gates are Hard-Concrete random variables (Louizos, Welling & Kingma
2018, "Learning Sparse Neural Networks through L0 Regularization", Sec. 4) with parameters
log_alpha_h, temperature beta = 1/3 and stretch interval (l, r) = (-0.1, 1.1):

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / beta),
    g = min(1, max(0, s (r - l) + l))                                  (training sample)
    P(g_h != 0) = sigmoid(log_alpha_h - beta log(-l / r))             (Louizos Eq. 12)
    g_h = min(1, max(0, sigmoid(log_alpha_h) (r - l) + l))            (deterministic, evaluation)

and the objective is the model's loss with sampled gates + lambda * sum_h P(g_h != 0) (the expected
number of open heads, Voita Eq. 7). Gates are fed to the model as `head_mask`. Voita start from the
converged model and train the whole model jointly; here `train_model=False` (default, fast: only
the L x H gate parameters learn, the model is frozen) or `train_model=True` (a deep copy of the
model is trained jointly, as in the paper; the input model is never modified). Dropout is off in
both cases (the model runs in eval mode) so that the gates alone carry the noise.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from .importance import Batch, BatchStat, head_grid, to_device

L0_SWEEP_COLUMNS = ["model", "lam", "n_open", "expected_open", "metric", "value", "seed"]


class HardConcreteGates(nn.Module):
    """(L, H) Hard-Concrete gates with learnable log_alpha (Louizos et al. 2018, Sec. 4)."""

    def __init__(
        self,
        shape: tuple[int, int],
        beta: float = 1.0 / 3.0,
        stretch: tuple[float, float] = (-0.1, 1.1),
        init_log_alpha: float = 3.0,
    ) -> None:
        super().__init__()
        low, high = stretch
        if not (low < 0.0 and high > 1.0):
            raise ValueError(f"stretch must satisfy l < 0 < 1 < r, got {stretch}")
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta, self.low, self.high = beta, low, high
        self.log_alpha = nn.Parameter(torch.full(shape, float(init_log_alpha)))

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """A training sample g (L, H) in [0, 1], differentiable w.r.t. log_alpha."""
        eps = 1e-6
        u = torch.rand(self.log_alpha.shape, generator=generator).clamp(eps, 1 - eps)
        u = u.to(self.log_alpha)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / self.beta)
        return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def deterministic(self) -> Tensor:
        """Test-time gates min(1, max(0, sigmoid(log_alpha) (r - l) + l)), (L, H)."""
        s = torch.sigmoid(self.log_alpha)
        return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def open_probability(self) -> Tensor:
        """P(g_h != 0) = sigmoid(log_alpha - beta log(-l / r)), (L, H)."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-self.low / self.high))

    def expected_l0(self) -> Tensor:
        """The L0 penalty: expected number of non-zero gates, a 0-d tensor."""
        return self.open_probability().sum()


class L0HeadGates:
    """Fit Hard-Concrete head gates with an L0 penalty on a frozen (or jointly trained) model.

    fit(model, batches, loss) -> self, where loss(model, batch, head_mask) -> (total, count) is a
    summed batch loss (e.g. `probes.pruning.mlm_loss`); the training loss of a step is
    total / count + lam * expected_l0. Learned state: log_alpha_ (L, H), gates_ (L, H)
    deterministic gates, open_prob_ (L, H), n_open_ (heads with a non-zero deterministic gate),
    model_ (the model the gates belong to: the input model, or its trained copy), history_
    (per-step loss and expected L0).
    """

    def __init__(
        self,
        lam: float = 0.05,
        steps: int = 200,
        lr: float = 0.1,
        beta: float = 1.0 / 3.0,
        stretch: tuple[float, float] = (-0.1, 1.1),
        init_log_alpha: float = 3.0,
        train_model: bool = False,
        model_lr: float = 1e-5,
        seed: int = 0,
    ) -> None:
        self.lam = lam
        self.steps = steps
        self.lr = lr
        self.beta = beta
        self.stretch = stretch
        self.init_log_alpha = init_log_alpha
        self.train_model = train_model
        self.model_lr = model_lr
        self.seed = seed

    def fit(self, model: nn.Module, batches: Sequence[Batch], loss: BatchStat) -> "L0HeadGates":
        if self.lam < 0 or self.steps < 1:
            raise ValueError(f"need lam >= 0 and steps >= 1; got lam={self.lam}, steps={self.steps}")
        if len(batches) == 0:
            raise ValueError("L0HeadGates.fit got no batches")
        shape = head_grid(model)
        torch.manual_seed(self.seed)
        generator = torch.Generator().manual_seed(self.seed)
        gates = HardConcreteGates(shape, self.beta, self.stretch, self.init_log_alpha)
        gates.to(next(model.parameters()))
        target = copy.deepcopy(model) if self.train_model else model
        groups = [{"params": gates.parameters(), "lr": self.lr}]
        if self.train_model:
            groups.append({"params": target.parameters(), "lr": self.model_lr})
        optimizer = torch.optim.Adam(groups)
        frozen = [(p, p.requires_grad) for p in target.parameters()]
        for p, _ in frozen:
            p.requires_grad_(self.train_model)
        was_training = target.training
        target.eval()
        self.history_: list[dict[str, float]] = []
        try:
            for step in range(self.steps):
                batch = to_device(batches[step % len(batches)], target)
                total, count = loss(target, batch, gates.sample(generator))
                penalty = gates.expected_l0()
                objective = total / count + self.lam * penalty
                optimizer.zero_grad(set_to_none=True)
                objective.backward()
                optimizer.step()
                self.history_.append({"step": step, "loss": float((total / count).detach()),
                                      "expected_l0": float(penalty.detach())})
        finally:
            for p, flag in frozen:
                p.requires_grad_(flag)
            target.train(was_training)
        with torch.no_grad():
            self.log_alpha_ = gates.log_alpha.detach().cpu().numpy().copy()
            self.gates_ = gates.deterministic().cpu().numpy()
            self.open_prob_ = gates.open_probability().cpu().numpy()
        self.n_open_ = int((self.gates_ > 0).sum())
        self.model_ = target
        return self

    def score(self, batches: Sequence[Batch], metric: Any) -> float:
        """metric(model_, batches, head_mask=gates_) with the deterministic gates."""
        mask = torch.as_tensor(self.gates_).to(next(self.model_.parameters()))
        return float(metric(self.model_, batches, mask))


def l0_sweep(
    model: nn.Module,
    batches: Sequence[Batch],
    loss: BatchStat,
    metric: Any,
    lams: Sequence[float] = (0.0, 0.01, 0.03, 0.1, 0.3),
    *,
    eval_batches: Sequence[Batch] | None = None,
    model_name: str = "model",
    **gate_kwargs: Any,
) -> pd.DataFrame:
    """One `L0HeadGates` fit per lambda: open heads and the metric (deterministic gates).

    Returns model, lam, n_open, expected_open (sum of P(g != 0)), metric, value, seed. `metric` is a
    `probes.pruning.Metric` (its `name` fills the metric column); it is evaluated on
    `eval_batches` (default: `batches`).
    """
    rows = []
    for lam in lams:
        fitted = L0HeadGates(lam=lam, **gate_kwargs).fit(model, batches, loss)
        value = fitted.score(eval_batches if eval_batches is not None else batches, metric)
        rows.append((model_name, float(lam), fitted.n_open_, float(fitted.open_prob_.sum()),
                     getattr(metric, "name", "metric"), value, fitted.seed))
    return pd.DataFrame(rows, columns=L0_SWEEP_COLUMNS)


def l0_importance(
    model: nn.Module, batches: Sequence[Batch], loss: BatchStat, lam: float = 0.05, **gate_kwargs: Any
) -> np.ndarray:
    """(L, H) learned log_alpha after one L0 fit: heads the penalty closes last score highest."""
    return L0HeadGates(lam=lam, **gate_kwargs).fit(model, batches, loss).log_alpha_
