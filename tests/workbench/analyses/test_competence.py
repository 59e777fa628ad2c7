"""workbench.analyses.competence: the bigram's context token of each target by hand, and a tiny run's
competence rows against what its trainer logged on the same held-out targets."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.workbench.analyses.pretrain_runs import pretrain_run as _run
from workbench.analyses import competence
from workbench.analyses.competence import BIGRAM_CONTEXT, competence_table
from workbench.analyses.emergence import HeldOutEval, bigram_baseline

IGN = -100


def test_an_encoder_targets_context_is_the_original_token_left_of_it():
    """Row 10 11 [M] 13 [M] with 12 and 14 masked: 14's context is 13, 12's is 11 (the originals,
    never the [MASK] in the input)."""
    ids = torch.tensor([[2, 10, 11, 99, 13, 99, 3]])
    labels = torch.tensor([[IGN, IGN, IGN, 12, IGN, 14, IGN]])
    prev, tgt = BIGRAM_CONTEXT["encoder"](ids, labels)
    assert prev.tolist() == [11, 13] and tgt.tolist() == [12, 14]
    labels = torch.tensor([[IGN, IGN, 11, 12, IGN, IGN, IGN]])      # two adjacent masks: 12 follows 11
    prev, _ = BIGRAM_CONTEXT["encoder"](torch.tensor([[2, 10, 99, 99, 13, 14, 3]]), labels)
    assert prev.tolist() == [10, 11]


def test_a_decoder_targets_context_is_its_input_token():
    ids = torch.tensor([[5, 6, 7, 8]])
    prev, tgt = BIGRAM_CONTEXT["decoder"](ids, torch.tensor([[6, 7, 8, IGN]]))
    assert prev.tolist() == [5, 6, 7] and tgt.tolist() == [6, 7, 8]


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_competence_rows_match_the_trainers_held_out_loss(tmp_path, kind):
    run = _run(tmp_path, kind, 12, ckpt_log_spaced=False, model={"dropout": 0.0}, vocab_size=300)
    t = competence_table(run, "m").set_index("metric")["value"]
    logged = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    last = {r["metric"]: r["value"] for r in logged if r["split"] == "eval" and r["step"] == 12}
    assert t["lm_loss"] == pytest.approx(last["loss"], rel=1e-4)        # the final model on the same targets
    assert t["unigram_loss"] == pytest.approx(last["unigram_loss"], rel=1e-6)
    # the bigram on exactly those targets, its contexts taken as the module says
    ev = HeldOutEval(run, None)
    pairs = [BIGRAM_CONTEXT[kind](b.input_ids, b.labels) for b in ev.evaluator.batches]
    prev, tgt = (np.concatenate(x) for x in zip(*pairs))
    assert t["bigram_loss"] == pytest.approx(bigram_baseline(np.asarray(ev.train_ids), prev, tgt,
                                                             ev.tokenizer.vocab_size)["bigram_loss"])
    assert t["bigram_loss"] < t["unigram_loss"] - 0.3      # the toy language is bigram-predictable


def test_a_checkpoint_whose_lm_head_is_untrained_gets_its_floors_only(tmp_path, monkeypatch):
    """ELECTRA's discriminator: its card says the LM head is untrained, so its head's loss is not how far
    it got; the table keeps the floors on the same targets and leaves lm_loss and lm_acc out."""
    run = _run(tmp_path, "encoder", 4, ckpt_log_spaced=False, model={"dropout": 0.0}, vocab_size=300)
    card = competence.read_card(run / "final")
    monkeypatch.setattr(competence, "read_card", lambda folder: type(card)(**{**vars(card), "lm_head_trained": False}))
    t = competence_table(run, "m")
    assert set(t["metric"]) == {"unigram_loss", "bigram_loss"}
