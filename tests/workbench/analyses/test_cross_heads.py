"""workbench.analyses.cross_heads: the cross_heads table of tiny trained T5 / BART checkpoints, and a
planted alignment head (set by hand through the `cross_attn.pattern` hook) recovered as the top head."""
import json

import numpy as np
import pytest
import torch

from plmodels.checkpoint import load
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig
from plmodels.training.config import BartArgs, T5Args
from plmodels.training.data import sentinel_ids
from plmodels.training.denoising import bart_text_infilling
from workbench.analyses.cross_heads import NoisedExample, analyse_cross_heads, cross_head_table, noise_rows
from workbench.core.results import load_table

from .seq2seq_runs import checkpoint  # noqa: F401  (the tiny T5 / BART fixture)

SCORES = {"align_acc", "align_acc:low", "align_acc:high", "align_mass", "entropy", "monotonic"}


def test_a_checkpoint_gets_every_layer_and_head_scored_in_unit_range(checkpoint, tmp_path):
    fam, path = checkpoint
    tables = analyse_cross_heads(path, out_dir=tmp_path, n_sentences=24, seed=0, n_boot=50)
    df = tables["cross_heads"]
    assert list(df.columns) == ["model", "layer", "head", "score", "value"]
    L, H = 2, 2  # the tiny preset's decoder (card: n_heads_per_layer [2, 2])
    scores = SCORES | ({"sentinel_acc"} if fam == "t5" else set())  # BART has no sentinels
    assert set(df.score) == scores
    assert len(df) == L * H * len(scores) and not df.duplicated(["layer", "head", "score"]).any()
    assert set(zip(df["layer"], df["head"])) == {(l, h) for l in range(L) for h in range(H)}
    assert df.value.notna().all() and ((df.value >= 0) & (df.value <= 1)).all()
    v = df.set_index(["layer", "head", "score"]).value
    assert all(v[l, h, "align_acc:low"] <= v[l, h, "align_acc"] <= v[l, h, "align_acc:high"]
               for l in range(L) for h in range(H))
    if fam == "t5":  # T5's only aligned target positions are its sentinels
        assert all(v[l, h, "sentinel_acc"] == v[l, h, "align_acc"] for l in range(L) for h in range(H))
    written = load_table(tmp_path, "cross_heads")
    assert len(written) == len(df) and set(written.model) == {df.model.iloc[0]}
    record = json.loads((tmp_path / "cross_heads_run.json").read_text())
    assert record["objective"] == fam and record["n_sentences"] > 0
    assert record["objective_args_source"] == "card"  # the trainer writes them into the card
    again = analyse_cross_heads(path, n_sentences=24, seed=0, n_boot=50)["cross_heads"]
    assert np.array_equal(again.value.to_numpy(), df.value.to_numpy())  # a fixed seed: the same noise


def test_noised_examples_align_target_tokens_to_their_copies_in_the_input(checkpoint):
    fam, path = checkpoint
    _, tok = load(path)
    rows = [torch.tensor(tok.encode("the cat sees the river . two dogs like the green hill ."))] * 3
    args = T5Args(n_sentinels=16) if fam == "t5" else BartArgs()
    examples = noise_rows(rows, tok, fam, args, torch.Generator().manual_seed(0))
    sentinels = set(sentinel_ids(tok, 16)) if fam == "t5" else set()
    for e in examples:
        hit = e.alignment >= 0
        assert int(hit.sum()) >= 1
        assert torch.equal(e.inputs[e.alignment[hit]], e.targets[hit])  # the same id, at that input position
        assert int(e.inputs[0]) == tok.cls_id and int(e.inputs[-1]) == tok.sep_id == int(e.targets[-1])
        if fam == "t5":  # only the sentinels are aligned; the span tokens are not
            assert torch.equal(e.sentinel, hit) and {int(t) for t in e.targets[hit]} <= sentinels
            assert not any(int(t) in sentinels for t in e.targets[~hit])
        else:  # BART: the targets are the row, every unmasked token aligned, monotonic
            assert e.sentinel is None and torch.equal(e.targets, rows[0])
            assert bool((e.alignment[hit].diff() > 0).all()) and int(hit.sum()) < len(e.targets)


def test_other_kinds_are_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"kind": "encoder", "config": {}}))
    with pytest.raises(ValueError, match="kind 'seq2seq'.*'encoder'"):
        analyse_cross_heads(tmp_path)


def test_a_planted_cross_attention_head_is_the_top_align_acc_head():
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.bart(vocab_size=60, d_model=32, n_heads=4, n_layers=2, n_decoder_layers=2, d_ff=64,
                             max_positions=64, dropout=0.0)
    model = Seq2Seq(cfg).eval()
    g = torch.Generator().manual_seed(1)
    examples = []
    for _ in range(12):
        ids = torch.cat([torch.tensor([3]), torch.randint(5, 60, (int(torch.randint(8, 20, (1,), generator=g)),),
                                                          generator=g), torch.tensor([4])])
        n = bart_text_infilling(ids, mask_id=5, generator=g, random_ratio=0.0, return_alignment=True)
        examples.append(NoisedExample(n.inputs, n.targets, n.alignment))
    current = iter(examples)

    def plant(pattern, name):  # (1, H, Td, Te): head 1 of layer 0 looks at the aligned source token
        e = next(current)
        Td, Te = len(e.targets), len(e.inputs)
        rows = torch.full((Td, Te), 1.0 / Te)
        hit = e.alignment >= 0
        rows[hit] = torch.nn.functional.one_hot(e.alignment[hit], Te).float()
        pattern = pattern.clone()
        pattern[0, 1] = rows
        return pattern

    with model.hooks([("decoder.blocks.0.cross_attn.pattern", plant)]):
        df = cross_head_table(model, examples, "planted", pad_id=cfg.pad_token_id, batch_size=1, n_boot=0)
    acc = df[df.score == "align_acc"].set_index(["layer", "head"]).value
    assert acc.idxmax() == (0, 1) and acc[0, 1] == 1.0
    assert acc.drop((0, 1)).max() < 0.5
    v = df.set_index(["layer", "head", "score"]).value
    assert v[0, 1, "align_mass"] == pytest.approx(1.0) and v[0, 1, "monotonic"] == 1.0
