"""DistilBERT pieces (plmodels/training/distil.py): student init, KD / cosine losses, the config,
the teacher checks and the triple loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig
from plmodels.checkpoint import read_card, save
from plmodels.config import ConfigError
from plmodels.training.distil import (
    DistilConfig,
    check_teacher,
    distil_loss,
    hidden_cosine_loss,
    kd_loss,
    load_teacher,
    student_from_teacher,
)
from plmodels.training.masking import masked_slots

from .tiny import TINY, batch


def teacher_encoder(n_layers: int = 6, seed: int = 0, **overrides) -> Encoder:
    """A tiny teacher whose every tensor (LayerNorm gains and biases, segment rows) is perturbed by a
    seeded RNG, so no copy can pass by being trivially zero or one."""
    torch.manual_seed(seed)
    model = Encoder(EncoderConfig(**{**TINY, "n_layers": n_layers, "dropout": 0.0, **overrides}))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def masked_batch(B: int = 3, T: int = 9):
    """ids, attention mask (last row padded from 6), labels at a fixed set of real positions."""
    ids, mask = batch(B, T)
    labels = torch.full_like(ids, -100)
    for b, t in [(0, 1), (0, 4), (1, 2), (1, 7), (2, 0), (2, 5)]:
        labels[b, t] = ids[b, t]
        ids[b, t] = 3  # a stand-in [MASK] id
    return ids, mask, labels


# --- student_from_teacher -----------------------------------------------------------------------


def test_student_blocks_are_teacher_blocks_0_2_4():
    teacher = teacher_encoder(6, use_nsp=True)
    student = student_from_teacher(teacher)
    assert student.config.n_layers == 3
    assert student.config.type_vocab_size == 0 and student.config.use_nsp is False
    assert student.embeddings.segment is None and student.nsp is None
    t_state, s_state = teacher.state_dict(), student.state_dict()
    compared = 0
    for name, tensor in s_state.items():
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            assert torch.equal(tensor, t_state[f"blocks.{2 * int(i)}.{rest}"]), name
            compared += 1
        elif name == "embeddings.position.weight":
            assert torch.equal(tensor, t_state[name] + t_state["embeddings.segment.weight"][0])
        elif not name.startswith("pooler."):
            assert torch.equal(tensor, t_state[name]), name
    assert compared == 3 * sum(1 for k in t_state if k.startswith("blocks.0."))
    # a copy, not shared storage: training the student leaves the teacher alone
    with torch.no_grad():
        student.blocks[0].attn.qkv.weight.add_(1.0)
    assert not torch.equal(student.blocks[0].attn.qkv.weight, teacher.blocks[0].attn.qkv.weight)
    assert student.training and all(p.requires_grad for p in student.parameters())


def test_student_embeddings_equal_teacher_on_single_segment_input():
    teacher = teacher_encoder(6)
    student = student_from_teacher(teacher).eval()
    ids, mask = batch()
    t = teacher(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    s = student(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    # word + pos + seg0 vs word + (pos + seg0): equal up to the rounding of the regrouped sum
    assert_close(s[0], t[0], rtol=0, atol=1e-5)
    assert_close(s[1], t[1], rtol=0, atol=1e-5)  # student block 0 is teacher block 0
    # and the segment-0 row matters: without it the embeddings would differ
    emb = teacher.embeddings
    assert not torch.allclose(t[0], emb.norm(emb.word(ids) + emb.position.weight[: ids.shape[1]]))
    # a float64 teacher gives a float64 student, whose regrouping error is ~1e-16: the same function
    t64 = teacher_encoder(6).double()
    s64 = student_from_teacher(t64).eval()
    assert s64.embeddings.word.weight.dtype == torch.float64
    assert_close(s64(ids, attention_mask=mask, output_hidden_states=True).hidden_states[0],
                 t64(ids, attention_mask=mask, output_hidden_states=True).hidden_states[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_layers, every, chosen", [(5, 2, [0, 2, 4]), (6, 3, [0, 3]), (3, 1, [0, 1, 2])])
def test_student_layer_choice(n_layers, every, chosen):
    teacher = teacher_encoder(n_layers)
    student = student_from_teacher(teacher, every=every)
    assert student.config.n_layers == len(chosen) == math.ceil(n_layers / every)
    for i, t in enumerate(chosen):
        for (name, p), (_, q) in zip(student.blocks[i].named_parameters(), teacher.blocks[t].named_parameters()):
            assert torch.equal(p, q), (i, t, name)


def test_student_roberta_positions_and_factorised_embeddings():
    teacher = teacher_encoder(4, position_ids="roberta", pad_token_id=1, embedding_size=16)
    student = student_from_teacher(teacher).eval()
    assert student.config.position_ids == "roberta" and student.config.embedding_size == 16
    assert torch.equal(student.embeddings.project.weight, teacher.embeddings.project.weight)
    ids, mask = batch()
    ids[-1, 6:] = 1  # RoBERTa's [PAD]: the position ids depend on it
    t = teacher(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    s = student(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert_close(s[0], t[0], rtol=0, atol=1e-5)
    assert_close(s[1], t[1], rtol=0, atol=1e-5)


def test_student_rope_keeps_segment_table():
    teacher = teacher_encoder(4, position="rope")
    student = student_from_teacher(teacher).eval()
    assert student.config.type_vocab_size == teacher.config.type_vocab_size == 2
    assert torch.equal(student.embeddings.segment.weight, teacher.embeddings.segment.weight)
    ids, mask = batch()
    types = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    assert torch.equal(student(ids, mask, token_type_ids=types, output_hidden_states=True).hidden_states[1],
                       teacher(ids, mask, token_type_ids=types, output_hidden_states=True).hidden_states[1])


def test_student_carries_pruned_heads():
    teacher = teacher_encoder(6)
    teacher.prune_heads({1: [0], 2: [1, 3], 4: [2]})
    student = student_from_teacher(teacher)
    assert student.config.pruned_heads == {1: [1, 3], 2: [2]}
    assert student.n_heads_per_layer == [4, 2, 3]
    assert torch.equal(student.blocks[1].attn.qkv.weight, teacher.blocks[2].attn.qkv.weight)


# --- losses -------------------------------------------------------------------------------------


def test_kd_loss_zero_and_minimal_at_equal_logits():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(5, 7, generator=g)
    s = t.clone().requires_grad_(True)
    loss = kd_loss(s, t, temperature=2.0)
    loss.backward()
    loss = loss.detach()
    assert abs(loss.item()) < 1e-6
    assert_close(s.grad, torch.zeros_like(s), rtol=0, atol=1e-7)
    assert float(kd_loss(t + torch.randn(5, 7, generator=g), t, 2.0)) > 1e-3
    # shift-invariant per row (softmax), like the reference
    assert abs(float(kd_loss(t + 3.0, t, 2.0))) < 1e-6


def test_kd_loss_matches_hand_computation():
    s = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    t = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    T = 2.0

    def softmax(row):
        e = [math.exp(x / T) for x in row]
        return [x / sum(e) for x in e]

    total = 0.0
    for srow, trow in zip(s.tolist(), t.tolist()):
        ps, pt = softmax(srow), softmax(trow)
        total += sum(b * math.log(b / a) for a, b in zip(ps, pt))
    expected = total / 2 * T**2  # batchmean over 2 rows, times T^2
    assert_close(kd_loss(s, t, T), torch.tensor(expected), rtol=1e-6, atol=1e-7)
    # the reference's form: KLDivLoss(batchmean)(log_softmax(s/T), softmax(t/T)) * T^2
    ref = torch.nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(s / T, -1), torch.softmax(t / T, -1)) * T**2
    assert_close(kd_loss(s, t, T), ref)


def test_kd_loss_checks_and_empty():
    with pytest.raises(ValueError, match="temperature"):
        kd_loss(torch.zeros(2, 3), torch.zeros(2, 3), 0.0)
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        kd_loss(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)
    assert float(kd_loss(torch.zeros(0, 3), torch.zeros(0, 3), 2.0)) == 0.0


def test_hidden_cosine_loss_parallel_and_padding():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 4, 6, generator=g)
    assert abs(float(hidden_cosine_loss(3.0 * t, t, torch.ones(2, 4)))) < 1e-6  # parallel: 0
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    s = torch.randn(2, 4, 6, generator=g)
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    expected = sum(1 - float(torch.cosine_similarity(s[b, i], t[b, i], dim=0)) for b, i in rows) / len(rows)
    assert_close(hidden_cosine_loss(s, t, mask), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    s2 = s.clone()
    s2[0, 3], s2[1, 2:] = -t[0, 3], 100.0  # anything at the padding
    assert torch.equal(hidden_cosine_loss(s2, t, mask), hidden_cosine_loss(s, t, mask))
    assert abs(float(hidden_cosine_loss(-t, t, None)) - 2.0) < 1e-6  # anti-parallel: 2


# --- DistilConfig -------------------------------------------------------------------------------


def test_distil_config_defaults_round_trip_and_checks():
    cfg = DistilConfig(teacher="runs/bert")
    assert (cfg.temperature, cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos, cfg.every) == (2.0, 5.0, 2.0, 1.0, 2)
    assert DistilConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="alphas"):
        DistilConfig.from_dict({"teacher": "t", "alphas": 1})
    for bad, match in [({"temperature": 0.0}, "temperature"), ({"alpha_cos": -1.0}, "alpha_cos"),
                       ({"every": 0}, "every"), ({"alpha_ce": 0.0, "alpha_mlm": 0.0, "alpha_cos": 0.0}, "all 0"),
                       ({"teacher": ""}, "teacher")]:
        with pytest.raises(ValueError, match=match):
            DistilConfig(**{"teacher": "t", **bad})


# --- teacher loading and checks -----------------------------------------------------------------


def test_load_teacher_frozen_and_refuses_decoder(tmp_path):
    save(teacher_encoder(2), None, tmp_path / "enc")
    model, tok = load_teacher(tmp_path / "enc")
    assert isinstance(model, Encoder) and tok is None
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    save(Decoder(DecoderConfig(**TINY)), None, tmp_path / "dec")
    with pytest.raises(ValueError, match="must be an encoder"):
        load_teacher(tmp_path / "dec")


def test_check_teacher_refuses_fresh_mlm_head(tmp_path):
    model = teacher_encoder(2)
    fresh = sorted(k for k in model.state_dict() if k.startswith(("mlm.", "pooler.")))
    report = {"source": "x", "unknown_tensors": [], "ignored_tensors": [], "fresh_init": fresh,
              "mlm_head": "fresh init (not in the source checkpoint)"}  # as plmodels.hf.bert writes it
    save(model, None, tmp_path / "minilm", card={"import": report})
    save(model, None, tmp_path / "bert", card={"import": {**report, "fresh_init": ["pooler.bias"], "mlm_head": "imported"}})
    save(model, None, tmp_path / "trained")
    assert not read_card(tmp_path / "minilm").lm_head_trained
    assert read_card(tmp_path / "bert").lm_head_trained and read_card(tmp_path / "trained").lm_head_trained
    with pytest.raises(ValueError, match=r"minilm.*alpha_ce=0"):
        check_teacher(tmp_path / "minilm", DistilConfig(teacher=str(tmp_path / "minilm")))
    check_teacher(tmp_path / "minilm", DistilConfig(teacher="t", alpha_ce=0.0))  # MLM + cosine only: fine
    check_teacher(tmp_path / "bert", DistilConfig(teacher="t"))
    # only part of the head fresh (e.g. the decoder bias) still counts as untrained
    save(model, None, tmp_path / "partial", card={"import": {**report, "fresh_init": ["mlm.bias"], "mlm_head": "imported"}})
    assert not read_card(tmp_path / "partial").lm_head_trained
    # an ELECTRA discriminator's MLM head is never trained: no KD from it either
    save(model, None, tmp_path / "disc", card={"objective_name": "electra"})
    with pytest.raises(ValueError, match=r"disc.*alpha_ce=0"):
        check_teacher(tmp_path / "disc", DistilConfig(teacher=str(tmp_path / "disc")))


# --- distil_loss --------------------------------------------------------------------------------


def test_distil_loss_parts_combine_with_alphas():
    teacher = teacher_encoder(4).requires_grad_(False)
    torch.manual_seed(5)
    student = Encoder(EncoderConfig(**{**TINY, "n_layers": 2, "dropout": 0.0, "type_vocab_size": 0}))
    ids, mask, labels = masked_batch()
    cfg = DistilConfig(teacher="t", alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0, restrict_ce_to_mask=True)
    loss, parts = distil_loss(student, teacher, ids, labels, mask, cfg)
    assert set(parts) == {"kd", "mlm", "cos", "loss"}
    assert all(float(parts[k]) > 0 for k in ("kd", "mlm", "cos"))
    assert_close(loss.detach(), 5.0 * parts["kd"] + 2.0 * parts["mlm"] + 1.0 * parts["cos"])
    # each term by hand, from the public API
    sel = labels != -100
    s_last = student(ids, attention_mask=mask).last_hidden_state
    t_last = teacher(ids, attention_mask=mask).last_hidden_state
    s_logits, t_logits = student.mlm_logits(s_last[sel]), teacher.mlm_logits(t_last[sel])
    assert_close(parts["kd"], kd_loss(s_logits, t_logits, 2.0).detach())
    assert_close(parts["mlm"], torch.nn.functional.cross_entropy(s_logits, labels[sel]).detach())
    assert_close(parts["cos"], hidden_cosine_loss(s_last, t_last, mask).detach())
    loss.backward()
    assert student.blocks[0].attn.qkv.weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
    # weights change the sum, a weight of 0 drops its term
    cfg2 = DistilConfig(teacher="t", alpha_ce=0.0, alpha_mlm=1.0, alpha_cos=3.0)
    loss2, parts2 = distil_loss(student, teacher, ids, labels, mask, cfg2)
    assert set(parts2) == {"mlm", "cos", "loss"}
    assert_close(loss2.detach(), parts["mlm"] + 3.0 * parts["cos"])
    # the default (the README's command): KD over every real token
    _, parts3 = distil_loss(student, teacher, ids, labels, mask, DistilConfig(teacher="t"))
    real = mask.bool()
    assert_close(parts3["kd"], kd_loss(student.mlm_logits(s_last[real]), teacher.mlm_logits(t_last[real]), 2.0).detach())


def _selected_rows_reference(student, teacher, ids, labels, mask, cfg):
    """The triple loss as distil_loss computed it before issue 81: each term on the rows picked out
    by a boolean mask (the masked positions, the real tokens), batchmean / mean over them."""
    sel = labels != -100
    real = torch.ones_like(sel) if mask is None else mask.bool()
    s_last = student(ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        t_last = teacher(ids, attention_mask=mask).last_hidden_state
    at = sel if cfg.restrict_ce_to_mask else real
    T = cfg.temperature
    kd = F.kl_div(F.log_softmax(student.mlm_logits(s_last[at]) / T, -1),
                  F.log_softmax(teacher.mlm_logits(t_last[at]) / T, -1), reduction="batchmean", log_target=True) * T**2
    mlm = F.cross_entropy(student.mlm_logits(s_last[sel]), labels[sel])
    cos = F.cosine_embedding_loss(s_last[real], t_last[real], s_last.new_ones(int(real.sum())))
    return cfg.alpha_ce * kd + cfg.alpha_mlm * mlm + cfg.alpha_cos * cos


@pytest.mark.parametrize("restrict", [False, True], ids=["kd-real", "kd-masked"])
@pytest.mark.parametrize("padded", [False, True], ids=["mask", "no-mask"])
@pytest.mark.parametrize("sizes", [None, (8, 24)], ids=["own-slots", "padded-slots"])
def test_distil_loss_through_slots_is_the_selected_rows_loss_and_gradients(restrict, padded, sizes):
    # the loss and the student's gradients of one step equal the selection-based computation (fp32,
    # 1e-6), with the batch's own slots and with slots padded far past its counts (a compiled run's)
    teacher = teacher_encoder(4).requires_grad_(False)
    torch.manual_seed(5)
    student = Encoder(EncoderConfig(**{**TINY, "n_layers": 2, "dropout": 0.0, "type_vocab_size": 0}))
    ids, mask, labels = masked_batch()
    mask = mask if padded else None
    cfg = DistilConfig(teacher="t", restrict_ce_to_mask=restrict)
    want = _selected_rows_reference(student, teacher, ids, labels, mask, cfg)
    want_grads = torch.autograd.grad(want, list(student.parameters()), allow_unused=True)
    slots = None if sizes is None else masked_slots(labels, sizes)
    got, _ = distil_loss(student, teacher, ids, labels, mask, cfg, slots)
    got_grads = torch.autograd.grad(got, list(student.parameters()), allow_unused=True)
    assert_close(got, want, rtol=1e-6, atol=1e-6)
    for (name, _), g, w in zip(student.named_parameters(), got_grads, want_grads):
        assert (g is None) == (w is None), name
        if g is not None:
            assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)


def test_distil_loss_of_a_full_copy_is_zero_but_mlm():
    teacher = teacher_encoder(3)
    student = student_from_teacher(teacher, every=1).eval()  # the same function as the teacher
    ids, mask, labels = masked_batch()
    _, parts = distil_loss(student, teacher, ids, labels, mask, DistilConfig(teacher="t"))
    assert abs(float(parts["kd"])) < 1e-5 and abs(float(parts["cos"])) < 1e-5
    assert float(parts["mlm"]) > 0.1
