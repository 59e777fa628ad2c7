"""Head importance scores: which attention heads matter for a model's objective.

Every score here is a function of a model object (a `plmodels` Encoder or Decoder, see
docs/design.md), a re-iterable sequence of batches and a loss / metric callable; it returns an
(L, H) numpy array where larger means "more important". `importance_frame` turns such an array into
the tidy `importance` table (model, method, layer, head, value).

Methods (the L0-gate score lives in `probes/l0.py`):
- `michel_importance` -- Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?",
  Sec. 4.1: I_h = E_x |dL(x)/d xi_h|, with xi = head_mask gates evaluated at the current mask,
  normalised per layer by the l2 norm over that layer's heads.
- `ablation_importance` -- the change in a metric when one head alone is masked (Michel et al.
  2019, Sec. 3.1, "ablating one head").
- `confidence_importance` -- Voita et al. (2019), "Analyzing Multi-Head Self-Attention", Sec. 4:
  a head's confidence is the mean over (non-pad) query tokens of its maximum attention weight.

Batches are mappings of tensors: "input_ids" (B, T) long, optional "attention_mask" (B, T) with 1 =
real token, optional "token_type_ids" (encoder only) and whatever labels the loss needs.
A *batch statistic* is a callable `stat(model, batch, head_mask) -> (total, count)` returning the
sum of a per-unit quantity over the batch (a 0-d tensor, differentiable for losses) and the number
of units; datasets are aggregated as sum(total) / sum(count). Ready-made ones are in
`probes/pruning.py` (masked-LM loss and accuracy, causal-LM loss, classification).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from plmodels.families import family_of

Batch = Mapping[str, Tensor]
BatchStat = Callable[[nn.Module, Batch, "Tensor | None"], "tuple[Tensor, Tensor | float]"]

IMPORTANCE_COLUMNS = ["model", "method", "layer", "head", "value"]


# --------------------------------------------------------------------------- shared helpers
def head_grid(model: nn.Module) -> tuple[int, int]:
    """(L, H) of an unpruned model (a seq2seq model's rows: every attention's layers, its family's
    `heads_per_layer`); a model with pruned (unequal) layers has no (L, H) grid."""
    per_layer = family_of(model).heads_per_layer(model)
    if len(set(per_layer)) != 1:
        raise ValueError(
            f"head masks need the same number of heads in every layer; this model has "
            f"n_heads_per_layer={per_layer} (it was pruned). Score the unpruned model instead."
        )
    return len(per_layer), per_layer[0]


def check_head_mask(mask: Any, model: nn.Module, name: str = "head_mask") -> Tensor:
    """Return `mask` as a float tensor after checking it has the model's (L, H) shape."""
    n_layers, n_heads = head_grid(model)
    mask_t = torch.as_tensor(np.asarray(mask) if not isinstance(mask, Tensor) else mask)
    if tuple(mask_t.shape) != (n_layers, n_heads):
        raise ValueError(
            f"{name} has shape {tuple(mask_t.shape)}; expected (L, H) = ({n_layers}, {n_heads})"
        )
    return mask_t.to(dtype=_model_dtype(model), device=_model_device(model))


def ones_mask(model: nn.Module) -> Tensor:
    """A (L, H) mask of ones in the model's dtype and device."""
    n_layers, n_heads = head_grid(model)
    return torch.ones(n_layers, n_heads, dtype=_model_dtype(model), device=_model_device(model))


def _model_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def to_device(batch: Batch, model: nn.Module) -> dict[str, Tensor]:
    device = _model_device(model)
    return {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in batch.items()}


def forward(model: nn.Module, batch: Batch, head_mask: Tensor | None = None, **kwargs: Any):
    """Call `model` on a batch, passing only the inputs its family accepts (`Family.forward_batch`,
    plmodels/families.py). A seq2seq model runs teacher-forced (the batch's decoder_input_ids) and its
    (L_enc + 2 L_dec, H) head mask is split over encoder self-, decoder self- and cross-attention."""
    return family_of(model).forward_batch(model, batch, head_mask, **kwargs)


def n_real_tokens(batch: Batch) -> int:
    """Number of non-padding tokens of a batch (all tokens when there is no attention_mask)."""
    mask = batch.get("attention_mask")
    return int(batch["input_ids"].numel() if mask is None else mask.sum().item())


def evaluate_stat(
    model: nn.Module, batches: Sequence[Batch], stat: BatchStat, head_mask: Tensor | None = None
) -> float:
    """sum_b total_b / sum_b count_b over the dataset, without gradients."""
    total, count = 0.0, 0.0
    with torch.no_grad():
        for batch in batches:
            t, c = stat(model, to_device(batch, model), head_mask)
            total += float(t)
            count += float(c)
    if count == 0:
        raise ValueError("the batches hold no units to evaluate (count is 0: no labels?)")
    return total / count


def importance_frame(scores: np.ndarray, model: str, method: str) -> pd.DataFrame:
    """The `importance` table (model, method, layer, head, value) of an (L, H) score array."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (L, H); got shape {scores.shape}")
    layer, head = np.indices(scores.shape)
    return pd.DataFrame(
        {
            "model": model,
            "method": method,
            "layer": layer.ravel(),
            "head": head.ravel(),
            "value": scores.ravel(),
        },
        columns=IMPORTANCE_COLUMNS,
    )


def normalize_by_layer(scores: np.ndarray, exponent: float = 2.0) -> np.ndarray:
    """Divide each layer's scores by their l_p norm (Michel et al. 2019 code, p = 2)."""
    norm = (np.abs(scores) ** exponent).sum(axis=-1, keepdims=True) ** (1.0 / exponent)
    return scores / (norm + 1e-20)


# --------------------------------------------------------------------------- Michel et al. 2019
Granularity = Literal["token", "example", "batch"]


def michel_importance(
    model: nn.Module,
    batches: Sequence[Batch],
    loss: BatchStat,
    head_mask: Any = None,
    granularity: Granularity = "token",
    normalize: bool = True,
) -> np.ndarray:
    """Gradient-based head importance of Michel, Levy & Neubig (2019), shape (L, H).

    With gates xi_h multiplying each head's output (`head_mask`, evaluated at `head_mask`, default
    all ones), the paper defines I_h = E_x |dL(x)/d xi_h|.  Where the absolute value is taken
    decides what "one x" is; `granularity` picks it:

    - "token" (default, what the authors' code computes): per real token t of example b,
      g_{b,t,h} = <head_out_{b,t,h}, dL/d head_out_{b,t,h}> / xi_h, the derivative w.r.t. a gate on
      that head at that token only; I_h = sum_{b,t} |g_{b,t,h}| / (number of real tokens).
    - "example": I_h = sum_b |sum_t g_{b,t,h}| / (number of real tokens).
    - "batch": I_h = sum_batches |dL_batch/d xi_h| / (number of real tokens), i.e. the absolute
      head_mask gradient accumulated per batch (HuggingFace `run_bertology.py`).

    L is the summed loss `loss(...)[0]` of a batch (the authors sum the per-example losses, so a
    batch's size does not rescale its examples).  Then, if `normalize`, each layer is divided by its
    l2 norm over heads (Sec. 4.1; "we normalise the importance scores by layer").  Heads masked to
    0 in `head_mask` get a "token"/"example" score of 0 (they output nothing).
    The "token" and "example" modes read `blocks.{l}.attn.head_out` through the model's hooks (a
    model with `head_out_sites()`, seq2seq or the transformer biLM, names its own sites and real-position
    mask per row).
    """
    n_layers, n_heads = head_grid(model)
    gates = ones_mask(model) if head_mask is None else check_head_mask(head_mask, model).clone()
    gates.requires_grad_(True)
    scores = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    n_tokens = 0
    was_training = model.training
    model.eval()
    # Only the gates need gradients: skipping weight gradients saves about a third of the work.
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        for batch in batches:
            batch = to_device(batch, model)
            gates.grad = None
            if granularity == "batch":
                total, _ = loss(model, batch, gates)
                total.backward()
                scores += gates.grad.detach().abs().double().cpu()
            elif granularity in ("token", "example"):
                scores += _token_gate_grads(model, batch, loss, gates, granularity)
            else:
                raise ValueError(f"granularity must be 'token', 'example' or 'batch'; got {granularity!r}")
            n_tokens += n_real_tokens(batch)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        model.train(was_training)
    if n_tokens == 0:
        raise ValueError("michel_importance got no tokens (empty batches)")
    out = (scores / n_tokens).numpy()
    return normalize_by_layer(out) if normalize else out


def _token_gate_grads(
    model: nn.Module, batch: Batch, loss: BatchStat, gates: Tensor, granularity: str
) -> Tensor:
    """(L, H) sum over examples of |per-token| or |per-example| gate derivatives for one batch."""
    n_layers, _ = gates.shape
    saved: dict[str, Tensor] = {}

    def keep(tensor: Tensor, name: str) -> None:
        tensor.retain_grad()
        saved[name] = tensor

    # (hook site, the batch's mask of its real positions) per row of the gate grid
    sites = (model.head_out_sites() if hasattr(model, "head_out_sites")
             else [(f"blocks.{l}.attn.head_out", "attention_mask") for l in range(n_layers)])
    names = [n for site, _ in sites for n in ((site,) if isinstance(site, str) else site)]
    with model.hooks(fwd=[(name, keep) for name in names]):
        total, _ = loss(model, batch, gates)
    total.backward()
    inv_gate = torch.where(gates != 0, 1.0 / gates, torch.zeros_like(gates)).detach()
    out = torch.zeros(gates.shape, dtype=torch.float64)
    for layer, (names, mask_key) in enumerate(sites):
        parts = []  # a layer may have its heads at several sites (the transformer biLM: one per direction)
        for name in ((names,) if isinstance(names, str) else names):
            head_out = saved[name]  # (B, T, H_site, Dh)
            grad = head_out.grad if head_out.grad is not None else torch.zeros_like(head_out)
            parts.append((head_out.detach() * grad).sum(-1))
        g = torch.cat(parts, dim=2) * inv_gate[layer]  # (B, T, H)
        real = batch.get(mask_key)
        if real is not None:
            g = g * real[..., None].to(g.dtype)
        if granularity == "token":
            out[layer] = g.abs().sum(dim=(0, 1)).double().cpu()
        else:
            out[layer] = g.sum(dim=1).abs().sum(dim=0).double().cpu()
    return out


# --------------------------------------------------------------------------- ablation
def ablation_importance(
    model: nn.Module,
    batches: Sequence[Batch],
    metric: Callable[..., float],
    higher_is_better: bool | None = None,
    head_mask: Any = None,
) -> np.ndarray:
    """Metric change when one head alone is masked (Michel et al. 2019, Sec. 3.1), shape (L, H).

    value_h = m(all heads) - m(head h masked) for a higher-is-better metric m (e.g. accuracy) and
    m(head h masked) - m(all heads) for a lower-is-better one (e.g. loss), so that a head whose
    removal hurts always scores > 0 and an irrelevant head scores 0.  `metric(model, batches,
    head_mask) -> float` (a `probes.pruning.Metric` carries its own direction; pass
    `higher_is_better` for a plain callable).  Costs L*H + 1 passes over `batches` without gradients;
    `head_mask` (default all ones) is the starting point (e.g. after earlier pruning).
    """
    if higher_is_better is None:
        higher_is_better = getattr(metric, "higher_is_better", None)
        if higher_is_better is None:
            raise ValueError("pass higher_is_better for a metric callable without that attribute")
    base_mask = ones_mask(model) if head_mask is None else check_head_mask(head_mask, model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            base = metric(model, batches, base_mask)
            scores = np.zeros(tuple(base_mask.shape))
            for layer, head in np.ndindex(*scores.shape):
                if base_mask[layer, head] == 0:
                    continue  # already gone: removing it again changes nothing
                mask = base_mask.clone()
                mask[layer, head] = 0.0
                scores[layer, head] = metric(model, batches, mask) - base
    finally:
        model.train(was_training)
    return -scores if higher_is_better else scores


# --------------------------------------------------------------------------- Voita confidence
def confidence_importance(model: nn.Module, batches: Sequence[Batch],
                          special_ids: Sequence[int] = ()) -> np.ndarray:
    """Voita et al. (2019) head confidence, shape (L, H).

    conf_h = mean over real query tokens i of max_j a_h(i, j), with a_h the head's post-softmax
    attention (padding keys already carry weight 0). Voita et al. take "the average of its maximum
    attention weight excluding the end of sentence symbol": tokens whose id is in `special_ids`
    ([CLS]/[SEP], BOS) are left out as keys of the max and as queries of the mean, so a head that
    parks its mass on [SEP] is not confident. A confident head puts most of its weight on one
    token. Decoders: the first real token can only attend to itself (and BOS), so its max is 1.
    """
    n_layers, n_heads = head_grid(model)
    sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    n_tokens = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                batch = to_device(batch, model)
                out = forward(model, batch, output_attentions=True)
                ids = batch["input_ids"]
                real = batch.get("attention_mask")
                real = torch.ones_like(ids, dtype=torch.bool) if real is None else real.bool()
                word = real & ~torch.isin(ids, torch.tensor(list(special_ids), dtype=ids.dtype, device=ids.device))
                for layer, attn in enumerate(out.attentions):  # (B, H, T, T)
                    keys = attn.masked_fill(~word[:, None, None, :], 0.0)   # special keys out of the max
                    top = keys.max(dim=-1).values * word[:, None, :].to(attn.dtype)  # (B, H, T), word queries
                    sums[layer] += top.sum(dim=(0, 2)).double().cpu()
                n_tokens += int(word.sum())
    finally:
        model.train(was_training)
    if n_tokens == 0:
        raise ValueError("confidence_importance got no tokens (empty batches)")
    return (sums / n_tokens).numpy()
