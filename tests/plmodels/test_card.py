"""The typed checkpoint card (plmodels.checkpoint: `Card`, `read_card`, `lm_head_rule`): what the
trainer writes is read back as it is; older cards get their missing fields derived once, in the
loader (objective_args from the run's config.resolved.json beside the checkpoint, the LM-head rule
from the import report and the objective)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from plmodels.checkpoint import CheckpointError, read_card, save

from .tiny import tiny_encoder

FRESH = {"source": "x", "fresh_init": ["mlm.bias", "mlm.dense.weight"], "mlm_head": "fresh init (not in the source)"}


def _run(tmp_path: Path, card: dict, pretrain: dict | None) -> Path:
    """A run folder with a checkpoint `final` carrying `card` and, if given, the run's resolved config."""
    run = tmp_path / "run"
    save(tiny_encoder(), None, run / "final", card=card)
    if pretrain is not None:
        (run / "config.resolved.json").write_text(json.dumps({"pretrain": pretrain}))
    return run / "final"


def test_a_complete_card_is_read_as_written(tmp_path):
    path = _run(tmp_path, {"objective_name": "plm", "objective_args": {"partial_k": 4}, "lm_head_trained": True,
                           "data": {"train": ["gutenberg_pd", "train"], "tokenizer": {"kind": "wordpiece"}}},
                pretrain={"objective": "plm", "objective_args": {"partial_k": 7}})  # ignored: the card has them
    card = read_card(path)
    assert (card.objective_name, dict(card.objective_args), card.objective_args_source) == ("plm", {"partial_k": 4}, "card")
    assert (card.train_source, card.train_split, card.tokenizer) == ("gutenberg_pd", "train", {"kind": "wordpiece"})
    assert card.kind == "encoder" and card.lm_head_trained and card.fields["objective_args"] == {"partial_k": 4}


def test_an_older_card_takes_its_objective_args_from_the_run_config_once(tmp_path):
    path = _run(tmp_path, {"objective_name": "t5"}, pretrain={"objective": "t5", "objective_args": {"n_sentinels": 9}})
    card = read_card(path)
    assert dict(card.objective_args) == {"n_sentinels": 9}
    assert card.objective_args_source == str(path.parent / "config.resolved.json")


@pytest.mark.parametrize("pretrain", [None, {"objective": "bart", "objective_args": {"mask_ratio": 0.5}}],
                         ids=["no run config", "another objective"])
def test_an_older_card_without_its_run_config_gets_the_defaults(tmp_path, pretrain):
    card = read_card(_run(tmp_path, {"objective_name": "t5"}, pretrain))
    assert dict(card.objective_args) == {} and card.objective_args_source == "defaults"


@pytest.mark.parametrize("card,trained", [
    ({}, True),                                                           # trained here, before the field
    ({"import": FRESH}, False),                                           # an imported sentence encoder
    ({"import": {"fresh_init": ["pooler.bias"], "mlm_head": "imported"}}, True),
    ({"import": {"fresh_init": ["mlm.bias"], "mlm_head": "imported"}}, False),  # part of the head fresh
    ({"import": {"fresh_init": ["lm_head.weight"]}}, False),              # a decoder's untied head
    ({"import": {"fresh_init": [], "mlm_head": "fresh init (no MLM head in the source)"}}, False),  # said in words
    ({"objective_name": "electra"}, False),                               # the discriminator
    ({"objective_name": "electra", "role": "ELECTRA generator"}, True),   # its generator
    ({"objective_name": "electra", "lm_head_trained": True}, True),       # what the card says wins
    ({"lm_head_trained": False}, False),
], ids=["plain", "fresh-import", "imported-head", "partial-head", "lm_head", "mlm_head-words", "electra", "generator",
        "explicit", "explicit-false"])
def test_one_rule_says_whether_the_lm_head_is_trained(tmp_path, card, trained):
    assert read_card(_run(tmp_path, card, None)).lm_head_trained is trained


def test_no_card_and_a_damaged_card(tmp_path):
    assert read_card(tmp_path) == read_card(tmp_path)  # a folder without card.json: the defaults
    assert read_card(tmp_path).lm_head_trained and read_card(tmp_path).objective_name is None
    (tmp_path / "card.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"card\.json: expected a JSON object, got list"):
        read_card(tmp_path)
