"""The decoder's adaptive softmax output (Grave et al. 2017): exact distribution, frequency ranks,
the training loss against the evaluation logits, checkpoints, config checks."""

import pytest
import torch
import torch.nn.functional as F

from plmodels import load, save
from plmodels.decoder import DecoderConfig
from plmodels.tokenizer import Tokenizer
from plmodels.training.data import Batch
from plmodels.training.loss import adaptive_cross_entropy, lm_loss

from .host_reads import HostReads
from .tiny import TINY, batch, tiny_decoder

ADAPTIVE = dict(output="adaptive", tie_embeddings=False, adaptive_cutoffs=(10, 30), position="rope")


def ranked_model():
    model = tiny_decoder(**ADAPTIVE)
    counts = torch.randint(0, 1000, (TINY["vocab_size"],), generator=torch.Generator().manual_seed(2))
    model.set_vocab_order(counts)
    return model, counts


def test_log_probs_match_the_two_level_formula_by_hand():
    """log p(w) = log softmax(head)[cluster(w)] + log softmax(tail_c(h))[w's place in c], w ranked by count."""
    model, counts = ranked_model()
    h = torch.randn(5, TINY["d_model"], generator=torch.Generator().manual_seed(3))
    got = model.lm_logits(h)
    order = torch.sort(-counts.double(), stable=True).indices  # rank -> id
    head = F.log_softmax(h @ model.adaptive.head.weight.T, -1)  # 10 shortlist ranks + 2 clusters
    want = torch.empty(5, TINY["vocab_size"])
    want[:, order[:10]] = head[:, :10]
    for c, (lo, hi) in enumerate([(10, 30), (30, TINY["vocab_size"])]):
        proj, out = model.adaptive.tail[c]
        tail = F.log_softmax(h @ proj.weight.T @ out.weight.T, -1)
        want[:, order[lo:hi]] = head[:, 10 + c: 11 + c] + tail
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert got.logsumexp(-1).abs().max() < 1e-5  # a distribution, whatever the weights
    assert model.adaptive.tail[0][0].weight.shape == (TINY["d_model"] // 4, TINY["d_model"])  # D / div
    assert model.adaptive.tail[1][0].weight.shape == (TINY["d_model"] // 16, TINY["d_model"])  # D / div^2


def test_vocab_order_puts_the_most_frequent_ids_in_the_shortlist():
    model, counts = ranked_model()
    rank = model.vocab_rank
    assert sorted(rank.tolist()) == list(range(TINY["vocab_size"]))
    assert rank[int(counts.argmax())] == 0
    shortlist = {i for i in range(TINY["vocab_size"]) if rank[i] < 10}
    assert min(counts[list(shortlist)]) >= max(c for i, c in enumerate(counts) if i not in shortlist)
    with pytest.raises(ValueError, match=r"counts has shape \(3,\)"):
        model.set_vocab_order(torch.ones(3))


def test_training_loss_equals_cross_entropy_of_the_evaluation_logits():
    model, _ = ranked_model()
    ids, _ = batch(pad_from=None)
    labels = ids.roll(-1, 1)
    labels[:, -1] = -100
    loss, n = lm_loss(model, Batch(ids, labels), autocast=False)
    logits = model(ids).logits
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert n == ids.numel() - ids.shape[0]
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=0)
    loss.backward()  # the gradient reaches the body and every output matrix
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.adaptive.parameters())


def test_bf16_autocast_and_an_empty_batch():
    """Under CPU bf16 autocast (what `bf16: "auto"` turns on where the CPU has it) the output runs in
    fp32, so the loss is the fp32 loss up to the bf16 body; a batch with no target gives 0, not NaN."""
    model, _ = ranked_model()
    ids, _ = batch(pad_from=None)
    labels = ids.roll(-1, 1)
    labels[:, -1] = -100
    fp32 = lm_loss(model, Batch(ids, labels), autocast=False)[0]
    bf16 = lm_loss(model, Batch(ids, labels), autocast=True)[0]
    assert bf16.dtype == torch.float32 and abs(bf16.item() - fp32.item()) < 0.05
    bf16.backward()
    assert model.adaptive.head.weight.grad.isfinite().all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(ids).logits.float().logsumexp(-1).abs().max() < 1e-4
    empty = lm_loss(model, Batch(ids, torch.full_like(labels, -100)), autocast=False)
    assert float(empty[0]) == 0.0 and empty[1] == 0


def test_round_trip_keeps_the_ranks(tmp_path):
    model, _ = ranked_model()
    tok = Tokenizer.train_wordpiece(["the cat sat on the mat", "a dog ran in the park"] * 5, vocab_size=61)
    loaded, _ = load(save(model, tok, tmp_path / "ckpt"))
    assert loaded.config == model.config and loaded.config.adaptive_cutoffs == (10, 30)
    assert torch.equal(loaded.vocab_rank, model.vocab_rank)
    ids, _ = batch(pad_from=None)
    assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("bad,match", [
    (dict(tie_embeddings=True), "set tie_embeddings=false"),
    (dict(adaptive_cutoffs=(30, 10)), "increasing ints"),
    (dict(adaptive_cutoffs=(10, 61)), r"vocab_size=61"),
    (dict(adaptive_div=0.5), "adaptive_div"),
    (dict(output="hierarchical"), "output must be"),
])
def test_bad_adaptive_configs_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig(**{**TINY, **ADAPTIVE, **bad})


def test_softmax_decoder_has_no_rank_buffer_and_adaptive_has_no_weight_matrix():
    assert "vocab_rank" not in tiny_decoder().state_dict()
    with pytest.raises(ValueError, match="no \\(V, D\\) weight"):
        tiny_decoder(**ADAPTIVE).lm_weight()


def test_the_static_shape_loss_is_the_modules_loss_and_reads_nothing_back():
    # adaptive_cross_entropy (the accelerator's training loss) evaluates every cluster for every row:
    # its summed loss and gradients equal torch's module on the rows with a target (which picks out
    # each cluster's rows by a mask), targets in the shortlist and both tails, -100 rows ignored,
    # and no aten call reads a value back or selects by a mask, backward included
    model, _ = ranked_model()
    g = torch.Generator().manual_seed(4)
    h = torch.randn(40, TINY["d_model"], generator=g, requires_grad=True)
    ranks = torch.randint(0, TINY["vocab_size"], (40,), generator=g)
    ranks[:3] = torch.tensor([0, 10, 30])  # the first rank of each cluster
    ranks[-5:] = -100
    clusters = ((0, 10), (10, 30), (30, TINY["vocab_size"]))
    assert all(int(((ranks >= lo) & (ranks < hi)).sum()) >= 3 for lo, hi in clusters)
    params = [h, *model.adaptive.parameters()]
    keep = ranks != -100
    want = model.adaptive(h[keep], ranks[keep]).loss * int(keep.sum())
    want_grads = torch.autograd.grad(want, params)
    calls = []
    with HostReads(calls):
        got = adaptive_cross_entropy(model.adaptive, h, ranks)
        got_grads = torch.autograd.grad(got, params)
    assert calls == []
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the null: the module's own loss on the same rows is seen selecting
    with HostReads(calls):
        model.adaptive(h[:-5], ranks[:-5])
    assert "aten::nonzero" in calls
