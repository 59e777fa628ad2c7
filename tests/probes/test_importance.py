"""Tests for probes/importance.py: Michel gradients by hand, ablation, confidence, a planted head."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from probes.importance import (
    IMPORTANCE_COLUMNS,
    ablation_importance,
    check_head_mask,
    confidence_importance,
    importance_frame,
    michel_importance,
    n_real_tokens,
)
from probes.l0 import l0_importance
from probes.pruning import METRICS, mlm_loss

from .planted import CRUCIAL, HEAD_DIM, N_HEADS, N_LAYERS, planted_encoder, self_labelled_batches


def _loss(model, batch, head_mask):
    return mlm_loss(model, batch, head_mask)[0]


def test_michel_batch_granularity_matches_finite_differences():
    model = planted_encoder().double()
    batch = self_labelled_batches(model, n_batches=1)[0]
    raw = michel_importance(model, [batch], mlm_loss, granularity="batch", normalize=False)
    eps = 1e-5
    for layer, head in [(0, 1), CRUCIAL]:
        plus, minus = torch.ones(N_LAYERS, N_HEADS, dtype=torch.float64), torch.ones(N_LAYERS, N_HEADS, dtype=torch.float64)
        plus[layer, head] += eps
        minus[layer, head] -= eps
        with torch.no_grad():
            fd = (_loss(model, batch, plus) - _loss(model, batch, minus)) / (2 * eps)
        expected = abs(float(fd)) / n_real_tokens(batch)
        assert raw[layer, head] == pytest.approx(expected, rel=1e-6)


def test_michel_token_granularity_matches_per_token_gates():
    """Hand computation: a separate gate per (example, token) on one head's output, by autograd."""
    model = planted_encoder()
    batch = self_labelled_batches(model, n_batches=1)[0]
    raw = michel_importance(model, [batch], mlm_loss, granularity="token", normalize=False)
    layer, head = 0, 3
    gates = torch.ones(batch["input_ids"].shape, requires_grad=True)  # (B, T)

    def gate_head(t, name):  # t: (B, T, H, Dh)
        mult = torch.ones(t.shape[:3] + (1,))
        mult[:, :, head, 0] = gates
        return t * mult

    with model.hooks(fwd=[(f"blocks.{layer}.attn.head_out", gate_head)]):
        _loss(model, batch, torch.ones(N_LAYERS, N_HEADS)).backward()
    per_token = gates.grad * batch["attention_mask"]
    expected = per_token.abs().sum() / n_real_tokens(batch)
    assert raw[layer, head] == pytest.approx(float(expected), rel=1e-4)
    example = michel_importance(model, [batch], mlm_loss, granularity="example", normalize=False)
    assert example[layer, head] == pytest.approx(float(per_token.sum(1).abs().sum() / n_real_tokens(batch)), rel=1e-4)


def test_head_mask_gradient_equals_gradient_of_output_scalar():
    model = planted_encoder()
    batch = self_labelled_batches(model, n_batches=1)[0]
    mask = torch.ones(N_LAYERS, N_HEADS, requires_grad=True)
    _loss(model, batch, mask).backward()
    layer, head = CRUCIAL
    scale = torch.ones((), requires_grad=True)

    def scale_head(t, name):  # t: (B, T, H, Dh)
        mult = torch.ones(t.shape[:3] + (1,))
        mult[:, :, head, 0] = scale
        return t * mult

    with model.hooks(fwd=[(f"blocks.{layer}.attn.head_out", scale_head)]):
        _loss(model, batch, None).backward()
    torch.testing.assert_close(mask.grad[layer, head], scale.grad, rtol=1e-4, atol=1e-6)


def test_normalisation_gives_unit_l2_norm_per_layer(planted):
    model, batches = planted
    scores = michel_importance(model, batches, mlm_loss)
    np.testing.assert_allclose(np.linalg.norm(scores, axis=1), 1.0, rtol=1e-6)


def test_ablation_of_a_dead_head_is_zero(planted):
    model, batches = planted
    dead = planted_encoder()
    with torch.no_grad():
        dead.blocks[0].attn.out.weight[:, HEAD_DIM: 2 * HEAD_DIM] = 0.0  # head 1 of layer 0
    scores = ablation_importance(dead, batches, METRICS["mlm_loss"])
    assert scores[0, 1] == 0.0
    assert scores[CRUCIAL] > 0.1


def test_every_method_ranks_the_planted_head_first(planted):
    model, batches = planted
    results = {
        "michel_token": michel_importance(model, batches, mlm_loss),
        "michel_example": michel_importance(model, batches, mlm_loss, granularity="example"),
        "michel_batch": michel_importance(model, batches, mlm_loss, granularity="batch"),
        "ablation_loss": ablation_importance(model, batches, METRICS["mlm_loss"]),
        "ablation_acc": ablation_importance(model, batches, METRICS["mlm_accuracy"]),
        "confidence": confidence_importance(model, batches),
        "l0": l0_importance(model, batches, mlm_loss, lam=0.1, steps=60),
    }
    for name, scores in results.items():
        assert scores.shape == (N_LAYERS, N_HEADS), name
        assert np.unravel_index(np.argmax(scores), scores.shape) == CRUCIAL, (name, scores.round(3))


def test_confidence_by_hand_and_ignores_padding(planted):
    model, batches = planted
    batch = batches[0]
    with torch.no_grad():
        attn = model(batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True).attentions
    real = batch["attention_mask"].bool()
    expected = [[float(attn[l][:, h].max(-1).values[real].mean()) for h in range(N_HEADS)] for l in range(N_LAYERS)]
    np.testing.assert_allclose(confidence_importance(model, [batch]), expected, rtol=1e-6)


def test_confidence_leaves_special_tokens_out_by_hand(planted):
    # Voita et al. 2019: the largest weight excluding the end-of-sentence symbol. Treat two token ids
    # as specials: they leave the max as keys and the mean as queries.
    model, batches = planted
    batch = batches[0]
    ids = batch["input_ids"]
    special = (int(ids[0, 0]), int(ids[0, 1]))
    with torch.no_grad():
        attn = model(ids, attention_mask=batch["attention_mask"], output_attentions=True).attentions
    word = batch["attention_mask"].bool() & ~torch.isin(ids, torch.tensor(special))
    expected = [[float(attn[l][:, h].masked_fill(~word[:, None, :], 0).max(-1).values[word].mean())
                 for h in range(N_HEADS)] for l in range(N_LAYERS)]
    got = confidence_importance(model, [batch], special_ids=special)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert not np.allclose(got, confidence_importance(model, [batch]))


def test_importance_frame_schema():
    frame = importance_frame(np.arange(8.0).reshape(2, 4), model="m", method="michel")
    assert list(frame.columns) == IMPORTANCE_COLUMNS
    row = frame[(frame["layer"] == 1) & (frame["head"] == 2)]
    assert float(row.value.iloc[0]) == 6.0 and len(frame) == 8


def test_bad_masks_and_inputs_are_errors(planted):
    model, batches = planted
    with pytest.raises(ValueError, match=r"expected \(L, H\) = \(2, 4\)"):
        check_head_mask(np.ones((4, 2)), model)
    with pytest.raises(ValueError, match="granularity"):
        michel_importance(model, batches, mlm_loss, granularity="word")
    with pytest.raises(ValueError, match="labels"):
        michel_importance(model, [{"input_ids": batches[0]["input_ids"]}], mlm_loss)
