"""Tests for MLM / NSP / causal-LM targets and the learning-rate schedules."""
import math

import pytest
import torch

from plmodels.training.masking import (IGNORE_INDEX, MaskingConfig, cap_predictions, causal_lm_labels,
                                       mask_tokens, masked_slots, nsp_pairs, slot_sizes, step_generator,
                                       word_starts)
from plmodels.training.schedule import lr_at, schedule_step

V, MASK, SPECIALS = 1000, 4, {0, 1, 2, 3, 4}


def _batch(B=256, T=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = 2          # [CLS]
    ids[:, -1] = 3         # [SEP]
    ids[:, -10:-1] = 0     # padding
    return ids


def test_bert_recipe_statistics():
    ids = _batch()
    out, labels = mask_tokens(ids, mask_id=MASK, vocab_size=V, special_ids=SPECIALS,
                              generator=step_generator(0, 0))
    sel = labels != IGNORE_INDEX
    eligible = ~torch.isin(ids, torch.tensor(sorted(SPECIALS)))
    n = sel.sum().item()
    assert abs(n / eligible.sum().item() - 0.15) < 0.005
    assert not (sel & ~eligible).any(), "a special token was selected"
    assert torch.equal(labels[sel], ids[sel])
    assert torch.equal(out[~sel], ids[~sel]), "unselected tokens must be unchanged"
    masked = (out[sel] == MASK).float().mean().item()
    same = (out[sel] == ids[sel]).float().mean().item()
    rand = 1 - masked - same
    assert abs(masked - 0.8) < 0.015 and abs(same - 0.1) < 0.012 and abs(rand - 0.1) < 0.012
    # random replacements are never special tokens
    replaced = out[sel][(out[sel] != MASK) & (out[sel] != ids[sel])]
    assert not torch.isin(replaced, torch.tensor(sorted(SPECIALS))).any()


def test_dynamic_masks_differ_by_step_and_reproduce():
    ids = _batch(B=16)
    kw = dict(mask_id=MASK, vocab_size=V, special_ids=SPECIALS)
    a1, l1 = mask_tokens(ids, generator=step_generator(7, 10), **kw)
    a2, l2 = mask_tokens(ids, generator=step_generator(7, 10), **kw)
    b, lb = mask_tokens(ids, generator=step_generator(7, 11), **kw)
    c, lc = mask_tokens(ids, generator=step_generator(8, 10), **kw)
    assert torch.equal(a1, a2) and torch.equal(l1, l2)
    assert not torch.equal(l1, lb) and not torch.equal(l1, lc)


def test_whole_word_masking_takes_whole_words():
    vocab = {f"w{i}": i for i in range(5, 500)} | {f"##c{i}": i for i in range(500, V)}
    cont = torch.tensor(sorted(i for t, i in vocab.items() if t.startswith("##")))
    ids = _batch(B=64, seed=3)
    starts = word_starts(ids, cont)
    out, labels = mask_tokens(ids, mask_id=MASK, vocab_size=V, special_ids=SPECIALS,
                              generator=step_generator(0, 1), cfg=MaskingConfig(whole_word=True),
                              starts=starts)
    sel = labels != IGNORE_INDEX
    assert sel.any()
    # a continuation piece is selected iff the token before it (same word) is selected
    cont_pos = ~starts[:, 1:] & ~torch.isin(ids[:, 1:], torch.tensor(sorted(SPECIALS)))
    prev_special = torch.isin(ids[:, :-1], torch.tensor(sorted(SPECIALS)))
    check = cont_pos & ~prev_special
    assert torch.equal(sel[:, 1:][check], sel[:, :-1][check])


def test_nsp_pairs_layout():
    content = torch.arange(5, 5 + 8 * 20).view(8, 20)
    ids, types, lab = nsp_pairs(content, cls_id=2, sep_id=3, generator=step_generator(1, 2))
    assert ids.shape == (8, 23) and set(lab.tolist()) <= {0, 1}
    for i in range(8):
        seps = (ids[i] == 3).nonzero().flatten().tolist()
        assert ids[i, 0] == 2 and len(seps) == 2 and seps[1] == 22
        c = seps[0] - 1
        assert torch.equal(ids[i, 1:1 + c], content[i, :c])
        assert (types[i, :seps[0] + 1] == 0).all() and (types[i, seps[0] + 1:] == 1).all()
        b = ids[i, seps[0] + 1:22]
        if lab[i] == 0:
            assert torch.equal(b, content[i, c:])
        else:
            assert not torch.equal(b, content[i, c:])
    assert 0 < lab.sum() < 8  # both classes occur (fixed generator)


def test_causal_labels_are_shifted_inputs():
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    am = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    lab = causal_lm_labels(ids, am)
    assert lab.tolist() == [[6, 7, 8, -100], [10, -100, -100, -100]]


def test_masking_rate_decay_by_hand_and_in_the_batches():
    from types import SimpleNamespace

    from plmodels.training import PretrainConfig
    from plmodels.training.corpus import PackedDataset
    from plmodels.training.data import Batches
    from plmodels.training.distributed import Dist

    cfg = MaskingConfig(rate=0.4, rate_final=0.15)
    assert [cfg.rate_at(p) for p in (0.0, 0.5, 1.0, 2.0)] == pytest.approx([0.4, 0.275, 0.15, 0.15])
    assert MaskingConfig(rate=0.3).rate_at(0.9) == 0.3  # no decay: constant
    with pytest.raises(ValueError, match="rate_final"):
        MaskingConfig(rate=0.3, rate_final=0.0)
    # the trainer's batches follow the progress it passes (the lr schedule's position)
    tok = SimpleNamespace(kind="wordpiece", cls_id=2, sep_id=3, mask_id=MASK, vocab_size=V, special_ids=SPECIALS,
                          hf=None)
    ids = torch.randint(5, V, (200_000,), generator=torch.Generator().manual_seed(0)).numpy()
    ds = PackedDataset(ids, seq_len=128, seed=0, mode="mlm", cls_id=2, sep_id=3)
    pc = PretrainConfig(kind="encoder", train_source="x", batch_size=256, masking={"rate": 0.4, "rate_final": 0.15})
    batches = Batches(ds, pc, Dist(), tok)
    share = lambda p: (batches.get(0, 0, torch.device("cpu"), p).labels != IGNORE_INDEX).float().mean().item()  # noqa: E731
    assert share(0.0) == pytest.approx(0.4 * 126 / 128, abs=0.01)  # [CLS] and [SEP] are never selected
    assert share(1.0) == pytest.approx(0.15 * 126 / 128, abs=0.01)


def test_masking_config_checks():
    with pytest.raises(ValueError, match="rate"):
        MaskingConfig(rate=1.5)
    with pytest.raises(ValueError, match="bogus"):
        MaskingConfig.from_dict({"rate": 0.1, "bogus": 1})


def test_schedules_by_hand():
    kw = dict(peak=1.0, warmup=10, total=110)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw, schedule="linear") == pytest.approx(0.5)
    assert lr_at(110, **kw, schedule="linear") == pytest.approx(0.0)
    assert lr_at(60, **kw, schedule="cosine") == pytest.approx(0.5)
    assert lr_at(35, **kw, schedule="cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(80, **kw, schedule="constant") == 1.0
    assert lr_at(110, **kw, schedule="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_at(500, **kw) == pytest.approx(0.0)   # past the end it stays at the floor
    # wsd, 10 warmup + 100 steps, decay over the last 20: flat to step 90, half way at 100, floor at 110
    assert lr_at(60, **kw, schedule="wsd") == 1.0
    assert lr_at(90, **kw, schedule="wsd") == pytest.approx(1.0)
    assert lr_at(100, **kw, schedule="wsd") == pytest.approx(0.5)
    assert lr_at(110, **kw, schedule="wsd") == pytest.approx(0.0)
    assert lr_at(60, **kw, schedule="wsd", decay_frac=1.0) == pytest.approx(lr_at(60, **kw, schedule="linear"))
    with pytest.raises(ValueError, match="decay_frac"):
        lr_at(0, **kw, schedule="wsd", decay_frac=0.0)
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_at(0, **kw, schedule="nope")


def test_schedule_step_on_the_clock_by_hand():
    assert schedule_step(10, 999.0, None, 100) == 10  # step clock: the step itself
    assert schedule_step(10, 30.0, 60.0, 100) == 50  # half the budget used: half the schedule
    assert schedule_step(70, 30.0, 60.0, 100) == 70  # ahead of the clock: the step
    assert schedule_step(10, 90.0, 60.0, 100) == 100  # past the budget: the end (lr at its floor)
    # 3/4 of the budget used at step 0: linear decay read at step 75, (1 - (75 - 10) / 90)
    assert lr_at(schedule_step(0, 45.0, 60.0, 100), peak=1.0, warmup=10, total=100) == pytest.approx(25 / 90)
    with pytest.raises(ValueError):
        schedule_step(1, 1.0, 0.0, 10)


# --- fixed-size slots (issue 81: static shapes) -------------------------------------------------

def _labels(B=4, T=10, seed=0, rate=0.3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    sel = torch.rand(B, T, generator=g) < rate
    return ids, torch.where(sel, ids, torch.full_like(ids, IGNORE_INDEX))


@pytest.mark.parametrize("sizes", [None, (9, 30)])
def test_masked_slots_gather_the_labels_in_their_order_and_pad_with_unlabelled_positions(sizes):
    ids, labels = _labels()
    labels[1] = IGNORE_INDEX  # a row without a target
    s = masked_slots(labels, sizes)
    sel = labels != IGNORE_INDEX
    n = int(sel.sum())
    q, m = sizes or (int(sel.sum(1).max()), n)
    assert s.index.shape == (4, q) and s.rows.shape == s.positions.shape == s.targets.shape == (m,)
    assert float(s.count) == n
    assert torch.equal(s.targets[:n], labels[sel])  # labels[labels != -100]'s order
    assert (s.targets[n:] == IGNORE_INDEX).all() and (labels.flatten()[s.positions[n:]] == IGNORE_INDEX).all()
    assert torch.equal(labels.flatten()[s.positions], s.targets)
    slot_pos = (s.index + torch.arange(4)[:, None] * 10).flatten()  # the slot -> position map is one map
    assert torch.equal(slot_pos[s.rows], s.positions)
    assert len(set(s.positions.tolist())) == m  # no position twice (ELECTRA scatters its samples there)


def test_masked_slots_refuse_a_batch_over_their_sizes():
    _, labels = _labels()
    most = int((labels != IGNORE_INDEX).sum(1).max())
    with pytest.raises(ValueError, match="over the sizes"):
        masked_slots(labels, (most - 1, 40))


def test_cap_predictions_drops_the_last_selections_past_each_bound_and_restores_their_tokens():
    original = torch.arange(10, 30).view(2, 10)
    labels = torch.full_like(original, IGNORE_INDEX)
    labels[0, [1, 3, 5, 7]] = original[0, [1, 3, 5, 7]]
    labels[1, [2, 4]] = original[1, [2, 4]]
    ids = torch.where(labels != IGNORE_INDEX, MASK, original)
    got_ids, got = cap_predictions(ids, labels, original, (3, 4))  # row 0: keeps 1, 3, 5; batch: 4 in all
    assert (got != IGNORE_INDEX).nonzero().tolist() == [[0, 1], [0, 3], [0, 5], [1, 2]]
    assert got_ids[0, 7] == original[0, 7] and got_ids[1, 4] == original[1, 4] and got_ids[0, 5] == MASK
    same_ids, same = cap_predictions(ids, labels, original, (4, 6))  # within the bounds: as it was
    assert same is labels and same_ids is ids


def test_slot_sizes_by_hand_and_never_reached_by_bert_masking():
    # T = 128 at 15%: 19.2 + 6 sqrt(128 .15 .85) = 43.4 -> 48 a row; 32 rows: 614.4 + 6 * 22.85 = 751.5 -> 752
    assert slot_sizes(32, 128, 0.15) == (48, 752)
    assert slot_sizes(2, 8, 0.9) == (8, 16)  # never past the tokens there are
    q, m = slot_sizes(256, 128, 0.15)
    for step in range(20):
        _, labels = mask_tokens(_batch(), mask_id=MASK, vocab_size=V, special_ids=SPECIALS,
                                generator=step_generator(0, step))
        counts = (labels != IGNORE_INDEX).sum(1)
        assert counts.max() <= q and counts.sum() <= m
