"""Tests for probes/pruning.py: curves, real pruning vs masking, tables, metrics by hand."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from plmodels.decoder import Decoder, DecoderConfig
from probes.importance import ablation_importance, importance_frame, michel_importance
from probes.pruning import (
    METRICS,
    PRUNING_COLUMNS,
    classification_accuracy,
    heads_to_prune_for_loss,
    kendall_table,
    measure_speed_and_size,
    mlm_loss,
    prune_model,
    pruning_curve,
    random_pruning_curves,
    roles_vs_importance,
)
from tests.probes.planted import (
    N_HEADS,
    N_LAYERS,
    planted_encoder,
)




def test_curve_ends_are_the_unmasked_and_all_masked_metrics(planted):
    model, batches = planted
    metric = METRICS["mlm_loss"]
    scores = np.random.default_rng(0).random((N_LAYERS, N_HEADS))
    curve = pruning_curve(model, batches, metric, scores, method="rand_scores", model_name="tiny")
    assert list(curve.columns) == PRUNING_COLUMNS
    assert curve["fraction"].tolist() == pytest.approx([i / 10 for i in range(11)])
    assert curve["value"].iloc[0] == pytest.approx(metric(model, batches))
    assert curve["value"].iloc[-1] == pytest.approx(metric(model, batches, np.zeros((N_LAYERS, N_HEADS))))
    # 25 % of 8 heads rounds to 2: exactly the two lowest-scored heads are masked
    two = np.ones(N_LAYERS * N_HEADS)
    two[np.argsort(scores.ravel())[:2]] = 0
    quarter = pruning_curve(model, batches, metric, scores, fractions=[0.25])
    assert quarter["value"].iloc[0] == pytest.approx(metric(model, batches, two.reshape(N_LAYERS, N_HEADS)))


def test_importance_order_beats_random_order_at_half(planted):
    model, batches = planted
    metric = METRICS["mlm_accuracy"]
    scores = ablation_importance(model, batches, metric)
    ordered = pruning_curve(model, batches, metric, scores, method="ablation")
    random = random_pruning_curves(model, batches, metric, seeds=range(6))
    at_half = random[random["fraction"] == 0.5]["value"].mean()
    assert ordered.loc[ordered["fraction"] == 0.5, "value"].item() > at_half
    # the planted head is kept until the very end: the curve only collapses at 100 %
    assert ordered.loc[ordered["fraction"] == 0.8, "value"].item() > ordered["value"].iloc[-1] + 0.2


def test_iterative_rescoring_calls_scorer_on_the_current_mask(planted):
    model, batches = planted
    seen = []

    def scorer(mask):
        seen.append(int((mask == 0).sum()))
        return michel_importance(model, batches, mlm_loss, head_mask=mask, granularity="batch")

    curve = pruning_curve(model, batches, METRICS["mlm_loss"], scorer=scorer, fractions=[0, 0.5, 1.0],
                          method="michel_iterative")
    assert seen == [0, 4]  # re-scored before each step, on the mask pruned so far
    assert curve["value"].iloc[0] == pytest.approx(METRICS["mlm_loss"](model, batches))
    with pytest.raises(ValueError, match="exactly one"):
        pruning_curve(model, batches, METRICS["mlm_loss"])


def test_heads_to_prune_for_loss_on_a_hand_made_curve():
    fractions = [0.0, 0.1, 0.2, 0.3, 0.4]
    loss = [2.0, 2.01, 2.05, 2.3, 2.02]  # +0.5 %, +2.5 %, +15 %, then back (not counted)
    curve = pd.DataFrame({"model": "m", "method": "michel", "fraction": fractions,
                          "metric": "mlm_loss", "value": loss, "seed": 0})
    one = heads_to_prune_for_loss(curve, tolerance=0.01, n_heads=20)
    five = heads_to_prune_for_loss(curve, tolerance=0.05, n_heads=20)
    assert one["max_fraction"].item() == 0.1 and one["n_prunable"].item() == 2
    assert five["max_fraction"].item() == 0.2 and five["n_prunable"].item() == 4
    acc = curve.assign(metric="mlm_accuracy", value=[0.9, 0.9, 0.89, 0.5, 0.9])
    assert heads_to_prune_for_loss(acc, tolerance=0.02)["max_fraction"].item() == 0.2


def test_prune_model_equals_masking_and_is_smaller(planted):
    model, batches = planted
    batch = batches[0]
    mask = np.ones((N_LAYERS, N_HEADS))
    mask[0, [0, 1, 2, 3]] = 0  # a whole layer: its attention outputs only the output bias
    mask[1, 3] = 0
    pruned = prune_model(model, mask)
    assert pruned.n_heads_per_layer == [0, 3] and model.n_heads_per_layer == [4, 4]
    with torch.no_grad():
        masked_out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                           head_mask=torch.as_tensor(mask, dtype=torch.float32)).last_hidden_state
        pruned_out = pruned(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(pruned_out, masked_out, rtol=1e-5, atol=1e-5)
    sizes = measure_speed_and_size(model, pruned, batches, repeats=2)
    assert sizes["params_pruned"] < sizes["params_full"]
    assert sizes["params_full"] - sizes["params_pruned"] == 5 * (3 * 8 * 32 + 3 * 8 + 8 * 32)
    assert sizes["bytes_pruned"] < sizes["bytes_full"]
    assert sizes["speed_ratio"] > 0
    assert prune_model(model, {1: [3]}).n_heads_per_layer == [4, 3]


def test_all_gates_zero_layer_outputs_only_the_residual():
    model = planted_encoder(bias=False)
    ids = torch.randint(5, 40, (2, 6))
    mask = torch.ones(N_LAYERS, N_HEADS)
    mask[1] = 0
    _, cache = model.run_with_cache(ids, names=["blocks.1.attn_out"], head_mask=mask)
    assert torch.count_nonzero(cache["blocks.1.attn_out"]) == 0


def test_bad_indices_and_shapes_are_errors(planted):
    model, _ = planted
    with pytest.raises(ValueError, match="out of range"):
        prune_model(model, {0: [N_HEADS]})
    with pytest.raises(ValueError, match="out of range"):
        prune_model(model, {N_LAYERS: [0]})
    with pytest.raises(ValueError, match=r"expected \(L, H\) = \(2, 4\)"):
        prune_model(model, np.ones((N_LAYERS, N_HEADS + 1)))
    with pytest.raises(ValueError, match=r"expected \(L, H\)"):
        METRICS["mlm_loss"](model, [], np.ones(3))


def test_kendall_table_identical_and_reversed_rankings():
    scores = np.arange(8.0).reshape(2, 4)
    table = kendall_table(pd.concat([importance_frame(scores, "m", "a"), importance_frame(scores * 3 + 1, "m", "b"),
                                     importance_frame(-scores, "m", "c")]))
    tau = {(r.method_a, r.method_b): r.tau for r in table.itertuples()}
    assert tau[("a", "b")] == pytest.approx(1.0)
    assert tau[("a", "c")] == pytest.approx(-1.0)


def test_roles_vs_importance_by_hand():
    importance = importance_frame(np.array([[1.0, 2.0], [3.0, 4.0]]), "m", "michel")
    roles = pd.DataFrame({"model": "m", "layer": [1, 1], "head": [0, 1], "role": "positional"})
    out = roles_vs_importance(importance, roles)
    row = out.iloc[0]
    assert row["role"] == "positional" and row["n_role"] == 2 and row["n_other"] == 2
    assert row["mean_rank_role"] == pytest.approx((0.75 + 1.0) / 2)  # ranks 3/4 and 4/4
    assert row["mean_rank_other"] == pytest.approx((0.25 + 0.5) / 2)
    assert row["diff"] == pytest.approx(0.5)


def test_causal_perplexity_and_classification_accuracy_by_hand():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                  max_positions=8, dropout=0.0)).eval()
    ids = torch.randint(0, 30, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    nll = [F.cross_entropy(logits[b, : n - 1], ids[b, 1:n], reduction="sum") for b, n in [(0, 6), (1, 4)]]
    expected = math.exp(float(sum(nll)) / (5 + 3))
    assert METRICS["perplexity"](model, [batch]) == pytest.approx(expected, rel=1e-5)

    def classify(m, b, head_mask):  # logits of two classes from the first hidden state
        return m(b["input_ids"], head_mask=head_mask).last_hidden_state[:, 0, :2]

    first = classify(model, batch, None).argmax(-1)
    labelled = {**batch, "labels": torch.stack([first[0], 1 - first[1]])}
    assert classification_accuracy(classify)(model, [labelled]) == pytest.approx(0.5)
