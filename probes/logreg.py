"""Multinomial logistic regression fitted with L-BFGS in torch: the objective of scikit-learn's
`LogisticRegression(solver="lbfgs")`, on any torch device.

Why it exists: the POS probe of `research.ablate.pos_by_layer` fits one scikit-learn model per layer
and pooling; on 27k words x 256 features each fit takes ~16 s on two CPU threads, so probing a dozen
screened checkpoints costs more than training them on a GPU. This estimator minimises the same
function (Pedregosa et al. 2011, scikit-learn >= 1.2, multinomial loss with an L2 penalty):

    L(W, b) = (1/n) sum_i -log softmax(x_i W + b)[y_i]  +  ||W||^2 / (2 C n)

(the intercept is not penalised), with torch's L-BFGS (Liu & Nocedal 1989; history 10 as in SciPy's
default, strong-Wolfe line search) from W = 0, b = 0. The line searches differ from SciPy's, so after a
capped number of iterations the two stop at slightly different points; where both converge they agree
(tests/probes/test_logreg.py). On the POS probe of a trained decoder, at scikit-learn's default of
300 iterations, per-layer accuracies agreed within 0.12 point (research/notebook.md, "Screening the EPYC
hour on a GPU, round 2").

Shaped like a scikit-learn classifier: `fit(X, y)`, `predict`, `predict_proba`, `score`, and the
fitted `classes_`, `coef_` (n_classes x n_features), `intercept_`, `n_iter_`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


class LogisticRegressionLBFGS:
    """Multinomial logistic regression with an L2 penalty of strength 1/C, fitted by L-BFGS.

    Parameters: `C` (inverse penalty strength, as in scikit-learn), `max_iter` (L-BFGS iterations),
    `tol` (stop when the largest absolute gradient entry of L falls below it: scikit-learn passes
    its `tol` to SciPy as `gtol`, on the same mean loss), `device` ("cpu", "cuda", or None for cuda when
    available), `dtype` (torch.float32 or torch.float64)."""

    def __init__(self, C: float = 1.0, max_iter: int = 300, tol: float = 1e-4, device: str | None = "cpu",
                 dtype: torch.dtype = torch.float32):
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.device = device
        self.dtype = dtype

    # ------------------------------------------------------------------ helpers
    def _device(self) -> torch.device:
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def _as_X(self, X, where: str) -> torch.Tensor:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"{where}: X must be 2-D (n_samples, n_features), got shape {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError(f"{where}: X has {int((~np.isfinite(X)).sum())} non-finite values")
        return torch.as_tensor(X, dtype=self.dtype, device=self._device())

    # ------------------------------------------------------------------ estimator API
    def fit(self, X, y) -> "LogisticRegressionLBFGS":
        if not self.C > 0:
            raise ValueError(f"LogisticRegressionLBFGS: C must be > 0, got {self.C}")
        if self.max_iter < 1:
            raise ValueError(f"LogisticRegressionLBFGS: max_iter must be >= 1, got {self.max_iter}")
        Xt = self._as_X(X, "fit")
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != Xt.shape[0]:
            raise ValueError(f"fit: y must be 1-D with one label per row of X ({Xt.shape[0]}), got shape {y.shape}")
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"fit: needs at least 2 classes, got {list(self.classes_)}")
        n, d, k = Xt.shape[0], Xt.shape[1], len(self.classes_)
        yt = torch.as_tensor(codes, device=Xt.device)
        W = torch.zeros(d, k, dtype=self.dtype, device=Xt.device, requires_grad=True)
        b = torch.zeros(k, dtype=self.dtype, device=Xt.device, requires_grad=True)
        # history 10 and up to 15,000 loss evaluations: SciPy's L-BFGS-B defaults (m, maxfun)
        opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=self.max_iter, max_eval=15000, history_size=10,
                                line_search_fn="strong_wolfe", tolerance_grad=self.tol, tolerance_change=0.0)
        penalty = 1.0 / (2.0 * self.C * n)

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(Xt @ W + b, yt) + penalty * (W * W).sum()
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        self.n_iter_ = int(opt.state[W].get("n_iter", 0))  # LBFGS keeps its state under the first parameter
        self.coef_ = W.detach().T.cpu().numpy()
        self.intercept_ = b.detach().cpu().numpy()
        return self

    def decision_function(self, X) -> np.ndarray:
        if not hasattr(self, "coef_"):
            raise RuntimeError("LogisticRegressionLBFGS is not fitted: call fit(X, y) first")
        Xt = self._as_X(X, "decision_function")
        if Xt.shape[1] != self.coef_.shape[1]:
            raise ValueError(f"decision_function: X has {Xt.shape[1]} features, the model was fitted on "
                             f"{self.coef_.shape[1]}")
        W = torch.as_tensor(self.coef_, dtype=self.dtype, device=Xt.device)
        b = torch.as_tensor(self.intercept_, dtype=self.dtype, device=Xt.device)
        return (Xt @ W.T + b).cpu().numpy()

    def predict_proba(self, X) -> np.ndarray:
        z = self.decision_function(X)
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def predict(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        return self.classes_[scores.argmax(1)]

    def score(self, X, y) -> float:
        """Accuracy on (X, y)."""
        y = np.asarray(y)
        if len(y) != len(X):
            raise ValueError(f"score: {len(X)} rows of X but {len(y)} labels")
        return float((self.predict(X) == y).mean())
