"""The training loss: masked LM (encoder) or causal LM (decoder) on a `Batch`, through a fused
linear cross-entropy that never materialises the full (N, V) logits in training.

`lm_loss(model, batch, autocast)` is what a training step differentiates; `linear_cross_entropy`
is its vocabulary projection + cross-entropy (`LinearCrossEntropy`: Liger-Kernel, Wijmans et al.
2024 "Cut Your Losses"), exact against `F.cross_entropy(F.linear(...))` (tests/plmodels/test_fused_loss.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from plmodels.families import family_of

from .data import Batch
from .masking import IGNORE_INDEX, masked_slots


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i CE(h_i W^T + b, y_i) over rows with y_i != -100, computed in row chunks (fused linear
    cross-entropy, as in Liger-Kernel / Wijmans et al. 2024 "Cut Your Losses").

    For each chunk of rows the logits z = h W^T + b (c, V) are formed, the loss is lse(z) - z_y, and
    the gradient dL/dz = softmax(z) - onehot(y) is written over z in place (softmax, with the loss
    lse(z) - z_y = max(z) - log p_max - z_y read off it, exact where p_y underflows); then
    dL/dh = dz W and dL/dW += dz^T h, dL/db += sum dz over the rows with a target. Nothing is read
    back to the host (no sync on CUDA). So the full (N, V) logits, their fp32 log-softmax copy and the
    separate backward pass over them are never materialised; backward only scales the stored
    gradients by the incoming scalar. Same FLOPs as linear + F.cross_entropy (3 matmuls).

    `compute_dtype` bfloat16 is the bf16-autocast version: the three matmuls run in bf16 (as
    autocast runs F.linear and its backward), the softmax and the loss in fp32 on an fp32 copy of
    the bf16 logits (as `F.cross_entropy(logits.float())` does), dz is rounded to bf16 for the two
    backward matmuls, and dL/dW accumulates over chunks in fp32.
    hidden (N, D), weight (V, D), bias (V,) or None, targets (N,) long -> scalar (sum, not mean).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_rows: int, compute_dtype=torch.float32):
        n = hidden.shape[0]
        low = compute_dtype != torch.float32
        h_all, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        grad_h = torch.empty_like(h_all)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and ctx.needs_input_grad[2] else None
        total = hidden.new_zeros((), dtype=torch.float32)
        # one logits buffer for all chunks: a fresh (c, V) tensor per chunk (64 MB for the mini
        # decoder) is a fresh mmap whose pages fault in on first touch
        rows = min(chunk_rows, n)
        buf = h_all.new_empty(rows, weight.shape[0])  # logits in the compute dtype
        buf32 = buf.new_empty(rows, weight.shape[0], dtype=torch.float32) if low else buf
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk_rows):
                h, y = h_all[s: s + chunk_rows], targets[s: s + chunk_rows]
                z = buf[: h.shape[0]]  # (c, V), contiguous
                torch.mm(h, w.t(), out=z) if b is None else torch.addmm(b, h, w.t(), out=z)
                z32 = buf32[: h.shape[0]].copy_(z) if low else z
                valid = y != IGNORE_INDEX
                y0 = y.clamp_min(0)[:, None]  # (c, 1); ignored rows are zeroed below
                z_y = z.gather(1, y0)[:, 0].float()  # the target's logit, before the softmax overwrites it
                top, at = z.max(-1)  # (c,) the largest logit and its id
                torch._softmax(z32, -1, False, out=z32)  # probabilities, in place (one fused kernel)
                # -log p_y = lse(z) - z_y with lse(z) = max - log p_max: p_max >= 1/V never underflows
                # (p_y can), and no row is picked out on the host
                nll = (top.float() - z_y) - z32.gather(1, at[:, None])[:, 0].log()
                total += (nll * valid).sum()
                z32.scatter_add_(1, y0, torch.full_like(y0, -1, dtype=z32.dtype))  # - onehot(y)
                # ignored rows contribute nothing: their rows of dz are left as they are and masked
                # in the (c, D) products instead (no (c, V) pass, no count read back)
                keep = valid[:, None].to(h.dtype)  # (c, 1)
                dz = z.copy_(z32) if low else z32  # dL/dz in the compute dtype
                torch.mm(dz, w, out=grad_h[s: s + chunk_rows])
                grad_h[s: s + chunk_rows] *= keep
                if grad_w is not None:
                    grad_w.add_(dz.t() @ (h * keep)) if low else grad_w.addmm_(dz.t(), h * keep)
                if grad_b is not None:
                    grad_b += torch.mv(z32.t(), keep[:, 0].float())
        ctx.save_for_backward(grad_h.to(hidden.dtype), grad_w, grad_b)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scale = lambda g: None if g is None else g * grad_out.to(g.dtype)  # noqa: E731
        return scale(grad_h), scale(grad_w), scale(grad_b), None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Summed cross-entropy of the logits hidden @ weight.T + bias against targets (-100 ignored).

    With grad enabled it takes the fused chunked path (`LinearCrossEntropy`): in fp32 when autocast
    is off and the inputs are fp32, in bf16 under CPU bf16 autocast. Otherwise it is exactly
    `F.cross_entropy(F.linear(...).float(), ...)` (in float64 for float64 inputs).
    hidden (N, D), weight (V, D), bias (V,) or None, targets (N,) -> scalar fp32 (float64).
    """
    if torch.is_grad_enabled():
        device = hidden.device.type
        if not torch.is_autocast_enabled(device) and hidden.dtype == weight.dtype == torch.float32:
            return LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows)
        if (device == "cpu" and torch.is_autocast_enabled(device)
                and torch.get_autocast_dtype(device) == torch.bfloat16):
            return LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows, torch.bfloat16)
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, reduction="sum")


def masked_lm_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder's mean masked-LM cross-entropy over the labelled positions (+ NSP), and their count
    (a 0-d device tensor).

    Hidden states at the predicted positions only, gathered through the batch's `MaskedSlots` (M, D)
    (their padding slots are labelled -100 and weigh nothing), go through the MLM transform and the
    (tied) vocabulary projection: with 15% masking this skips 85% of the projection, the largest
    matmul of a small model; without NSP the last block itself runs at the Q slots of each row
    only (`Encoder.hidden_at`). Every shape is set by the slots' sizes, and nothing is read back to
    the host: a batch built without slots gets its own here (`masked_slots`, which reads the counts).
    """
    device_type = batch.input_ids.device.type
    slots = batch.slots if batch.slots is not None else masked_slots(batch.labels)
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        if batch.nsp_labels is None:  # the last block at the slots only (exact)
            rows = model.hidden_at(batch.input_ids, slots.index, batch.token_type_ids)  # (B, Q, D)
        else:  # NSP also needs [CLS]'s last hidden state: the whole forward
            out = model(batch.input_ids, token_type_ids=batch.token_type_ids, attn_impl="sdpa")
            rows = gather_rows(out.last_hidden_state, slots.index)  # (B, Q, D)
        hidden = rows.flatten(0, 1).index_select(0, slots.rows)  # (M, D)
        loss = linear_cross_entropy(model.mlm_transform(hidden), *model.mlm_projection(), slots.targets)
        loss = loss / slots.count.clamp_min(1.0)
        if batch.nsp_labels is not None:
            nsp = model.nsp_logits(out.pooler_output)
            loss = loss + F.cross_entropy(nsp.float(), batch.nsp_labels)
    return loss, slots.count


def gather_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden (B, T, D) at index (B, Q) long -> (B, Q, D)."""
    return hidden.gather(1, index[..., None].expand(*index.shape, hidden.shape[-1]))


def causal_lm_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder's mean next-token cross-entropy at every position against the shifted labels, and
    the count (a 0-d device tensor: the mean divides by it on the device, no read back). A decoder
    with the adaptive output: on the CPU its own loss (`Decoder.adaptive_loss`), which evaluates a
    tail cluster only for the targets in it, picked out by a mask (a host read, which costs the CPU
    nothing); on an accelerator `adaptive_cross_entropy`, every cluster for every row, static shapes,
    nothing read back."""
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        out = model(batch.input_ids, attn_impl="sdpa", return_logits=False)
        n = (batch.labels != IGNORE_INDEX).sum()
        h = out.last_hidden_state.flatten(0, 1)  # (B T, D)
        labels = batch.labels.flatten()
        if model.config.output != "adaptive":
            loss = linear_cross_entropy(h, model.lm_weight(), None, labels)
        elif device_type == "cpu":
            sel = labels != IGNORE_INDEX
            loss = model.adaptive_loss(h[sel], labels[sel])
        else:
            ranks = torch.where(labels != IGNORE_INDEX, model.vocab_rank[labels.clamp_min(0)], IGNORE_INDEX)
            loss = adaptive_cross_entropy(model.adaptive, h, ranks)
    return loss / n.clamp_min(1), n


def adaptive_cross_entropy(adaptive: torch.nn.AdaptiveLogSoftmaxWithLoss, hidden: torch.Tensor,
                           targets: torch.Tensor) -> torch.Tensor:
    """Summed -log p(target) under an adaptive softmax (Grave et al. 2017, torch's
    `AdaptiveLogSoftmaxWithLoss`), targets -100 ignored; hidden (N, D), targets (N,) in the module's
    class order (frequency ranks) -> scalar fp32. Every tail cluster is evaluated for every row and
    each row reads the cluster its target is in: the module's loss, without its selection of each
    cluster's rows (a nonzero and a count per cluster, each a wait for the device on CUDA), so the
    shapes are the batch's and nothing is read back. Computed in fp32 with autocast off, as
    `Decoder.adaptive_loss`. The tails cost (N, d_i) x (d_i, size_i) each for all N rows instead of
    the rows in cluster i only."""
    with torch.autocast(hidden.device.type, enabled=False):
        h = hidden.float()
        valid = targets != IGNORE_INDEX
        t = targets.clamp_min(0)
        short = adaptive.shortlist_size
        head = torch.log_softmax(adaptive.head(h), -1)  # (N, shortlist + clusters)
        column, within = t.clamp_max(short - 1), h.new_zeros(t.shape)  # the head's column, log p in the cluster
        for i, tail in enumerate(adaptive.tail):
            lo, hi = adaptive.cutoffs[i], adaptive.cutoffs[i + 1]
            inside = (t >= lo) & (t < hi)
            logp = torch.log_softmax(tail(h), -1).gather(1, (t - lo).clamp(0, hi - lo - 1)[:, None])[:, 0]  # (N,)
            within = torch.where(inside, logp, within)
            column = torch.where(inside, short + i, column)
        nll = -(head.gather(1, column[:, None])[:, 0] + within)  # (N,)
        return torch.where(valid, nll, 0.0).sum()


# the training loss of each LM batch form (plmodels.families.Family.lm_inputs) that `lm_loss` serves
TRAINING_LOSSES = {"masked": masked_lm_loss, "causal": causal_lm_loss}


def lm_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over labelled positions, and their count: `masked_lm_loss` for a masked LM
    (encoder), `causal_lm_loss` for a causal one (decoder), by the model's family record. Both use
    `linear_cross_entropy`, which never materialises the full logits when training in fp32."""
    return TRAINING_LOSSES[family_of(model).lm_inputs](model, batch, autocast)
