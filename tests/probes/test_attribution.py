"""probes.attribution: rollout and flow on hand-made attention graphs (flow = networkx's max-flow),
integrated gradients' completeness, leave-one-out, deletion and insertion on functions with known answers, and
value zeroing's causal structure."""
import networkx as nx
import numpy as np
import pytest
import torch

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from probes.attribution import (EmbedTarget, aopc, attention_flow, deletion_curve, faithfulness, flow_capacities,
                                input_x_gradient, insertion_aopc, insertion_curve, integrated_gradients,
                                leave_one_out, rank_correlation, rollout, value_zeroing)


def test_rollout_by_hand():
    # layer 1: token 1 reads token 0 only; layer 2: token 0 reads token 1 only
    a1 = np.array([[1.0, 0.0], [1.0, 0.0]])
    a2 = np.array([[0.0, 1.0], [0.0, 1.0]])
    # with the residual: A~1 = [[1, 0], [.5, .5]], A~2 = [[.5, .5], [0, 1]]; R = A~2 A~1
    want = np.array([[0.75, 0.25], [0.5, 0.5]])
    np.testing.assert_allclose(rollout(np.stack([a1, a2])), want)
    np.testing.assert_allclose(rollout(np.stack([a1, a2]), residual=0.0), a2 @ a1)


def random_attention(L: int, T: int, seed: int, causal: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.random((L, T, T)) ** 3
    if causal:
        a = a * np.tril(np.ones((T, T)))
    return a / a.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed,causal", [(0, False), (1, True), (2, False)])
def test_attention_flow_is_networkx_max_flow(seed, causal):
    attn = random_attention(3, 5, seed, causal)
    cap = flow_capacities(attn)
    g = nx.DiGraph()
    for u, v in zip(*np.nonzero(cap)):
        g.add_edge(int(u), int(v), capacity=float(cap[u, v]))
    L, T = attn.shape[0], attn.shape[1]
    for target in (0, T // 2, T - 1):
        got = attention_flow(attn, target)
        want = [nx.maximum_flow_value(g, j, L * T + target) if g.has_node(j) else 0.0 for j in range(T)]
        np.testing.assert_allclose(got, want, atol=L * 1e-6 * T)


def test_flow_by_hand_on_a_bottleneck():
    # one layer, T = 2, token 1 attends 0.2 / 0.8: with the residual, A~ = [[1, 0], [.1, .9]]
    attn = np.array([[[1.0, 0.0], [0.2, 0.8]]])
    np.testing.assert_allclose(attention_flow(attn, 1), [0.1, 0.9], atol=1e-6)


def test_integrated_gradients_known_answer_and_completeness():
    w = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 0.0]], dtype=torch.float64)
    f = lambda e: (w * e**2).sum((-1, -2))  # IG with a zero baseline: w x^2 per entry, exactly
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [3.0, 1.0]], dtype=torch.float64)
    attr, err = integrated_gradients(f, x, torch.zeros_like(x))
    np.testing.assert_allclose(attr, (w * x**2).sum(-1).numpy(), rtol=1e-10)
    assert err < 1e-10


def tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(DecoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                 max_positions=16, dropout=0.0)).eval()


def next_token_target(model: Decoder, ids: torch.Tensor) -> EmbedTarget:
    """F = log p(last token | the rest), read at the position before it."""
    def score(batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch).logits[:, -2].double()
        return torch.log_softmax(logits, -1)[:, ids[-1]]
    return EmbedTarget(model, score, ids, pad_id=0)


def test_integrated_gradients_completeness_on_a_model_at_the_default_steps():
    model = tiny_decoder()
    ids = torch.tensor([3, 17, 8, 22, 41, 9, 30])
    target = next_token_target(model, ids)
    attr, err = integrated_gradients(target, target.x, target.baseline)
    assert err < 0.01
    assert abs(attr[-1]) < 1e-9  # the last token is after the read position: a causal model gives it 0
    ixg = input_x_gradient(target, target.x)
    assert abs(ixg[-1]) < 1e-9 and np.abs(ixg[:-1]).sum() > 0


def test_leave_one_out_and_deletion_on_a_linear_function():
    w = torch.tensor([3.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    f = lambda e: (e.sum(-1) * w).sum(-1)
    x = torch.ones(4, 2, dtype=torch.float64)
    base = torch.zeros_like(x)
    pos = np.arange(4)
    loo = leave_one_out(f, x, base, pos)
    np.testing.assert_allclose(loo, 2 * w.numpy())  # each token's own term: w_j * sum(x_j)
    curve = deletion_curve(f, x, base, pos, loo, k=3)
    np.testing.assert_allclose(curve, [9.0, 3.0, -1.0, -2.0])  # delete 3 (6), then 2 (4), then 0.5 (1)
    assert aopc(curve) == pytest.approx(np.mean([6.0, 10.0, 11.0]))
    worst = deletion_curve(f, x, base, pos, -loo, k=3)
    assert aopc(worst) < aopc(curve)
    assert rank_correlation(loo, loo) == pytest.approx(1.0)
    assert rank_correlation(-loo, loo) == pytest.approx(-1.0)


def test_insertion_on_a_linear_function():
    """Every token deleted (F = 0), then put back best first: 6 (w=3), +4 (w=2), +1 (w=0.5); the mean
    rise is the insertion AOPC, and the worst order's is lower."""
    w = torch.tensor([3.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    f = lambda e: (e.sum(-1) * w).sum(-1)
    x = torch.ones(4, 2, dtype=torch.float64)
    base = torch.zeros_like(x)
    pos = np.arange(4)
    curve = insertion_curve(f, x, base, pos, w.numpy(), k=3)
    np.testing.assert_allclose(curve, [0.0, 6.0, 10.0, 11.0])
    assert insertion_aopc(curve) == pytest.approx(np.mean([6.0, 10.0, 11.0]))
    assert insertion_aopc(insertion_curve(f, x, base, pos, -w.numpy(), k=3)) < insertion_aopc(curve)
    # positions outside the attributed set are never deleted: token 1 (w = -1) stays in every row
    kept = insertion_curve(f, x, base, np.array([0, 2, 3]), np.array([3.0, 0.5, 2.0]), k=2)
    np.testing.assert_allclose(kept, [-2.0, 4.0, 8.0])


def test_value_zeroing_is_causal_in_a_decoder_and_rows_sum_to_one():
    model = tiny_decoder()
    ids = torch.tensor([3, 17, 8, 22, 41])
    run = lambda batch: model(batch, output_hidden_states=True).hidden_states
    with torch.no_grad():
        mix = value_zeroing(model, run, ids)
    assert mix.shape == (2, 5, 5)
    np.testing.assert_allclose(mix.sum(-1), 1.0, atol=1e-9)
    assert np.abs(np.triu(mix, k=1)).max() < 1e-6  # a later token's values never reach an earlier one
    np.testing.assert_allclose(mix[:, 0, 0], 1.0)  # token 0 reads only itself


def test_faithfulness_in_one_pass_equals_the_calls_one_by_one():
    model = tiny_decoder()
    ids = torch.tensor([3, 17, 8, 22, 41, 9, 30, 12])
    target = next_token_target(model, ids)
    pos = np.arange(7)
    rng = np.random.default_rng(0)
    scores = {"a": rng.random(7), "b": -np.arange(7.0), "c": rng.random(7)}
    loo, curves, inserted = faithfulness(target, target.x, target.baseline, pos, scores, k=4, batch=5)
    np.testing.assert_allclose(loo, leave_one_out(target, target.x, target.baseline, pos), atol=1e-6)
    assert list(curves) == list(scores) == list(inserted)
    for name, sc in scores.items():
        np.testing.assert_allclose(curves[name], deletion_curve(target, target.x, target.baseline, pos, sc, 4), atol=1e-6)
        np.testing.assert_allclose(inserted[name], insertion_curve(target, target.x, target.baseline, pos, sc, 4),
                                   atol=1e-6)
    assert not np.allclose(curves["a"], curves["b"])  # each scoring reads its own deletion order
    assert not np.allclose(inserted["a"], inserted["b"])  # and its own insertion order


def value_zeroing_per_layer(model, run, ids: torch.Tensor) -> np.ndarray:
    """The definition: per layer, a full forward of T + 1 rows, read in its hidden states."""
    T, L = ids.shape[0], model.config.n_layers
    rows = torch.arange(T)

    def zero_own(v, name):
        v = v.clone()
        v[rows, rows] = 0.0
        return v

    out = np.zeros((L, T, T))
    for l in range(L):
        with model.hooks([(f"blocks.{l}.attn.v", zero_own)]):
            h = run(ids[None].expand(T + 1, -1))[l + 1].double()
        m = (1.0 - torch.nn.functional.cosine_similarity(h[:T], h[T:].expand(T, -1, -1), dim=-1)).T.clamp_min(0).numpy()
        out[l] = m / m.sum(-1, keepdims=True)
    return out


@pytest.mark.parametrize("make", [Decoder, Encoder], ids=["decoder", "encoder"])
def test_value_zeroing_stopped_at_each_layer_equals_the_full_forward_definition(make):
    torch.manual_seed(0)
    config = {Decoder: DecoderConfig, Encoder: EncoderConfig}[make]
    model = make(config(vocab_size=50, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_positions=16,
                        dropout=0.0)).eval()
    ids = torch.tensor([3, 17, 8, 22, 41, 9])
    run = lambda batch: model(batch, output_hidden_states=True).hidden_states
    with torch.no_grad():
        got, want = value_zeroing(model, run, ids), value_zeroing_per_layer(model, run, ids)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(got[0] - got[2]).max() > 1e-3  # each layer's rows read that layer's intervention
