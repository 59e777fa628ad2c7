"""The pretraining seed on a checkpoint's card (`plmodels.checkpoint.training_seed`) and the random-init
floor it gives (`floor_seed`): a plain-MLM run's floor at analysis seed 0 is the network it started from."""
import json
import shutil

import pytest
import torch

import plmodels
from plmodels.checkpoint import CARD_FILE, RUN_CONFIG_FILE, floor_seed, random_init_model, read_card, training_seed
from plmodels.training import loop, pretrain

from .tiny import tiny_encoder
from .toy_runs import toy_config, toy_corpus


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """A two-step plain-MLM encoder run under seed 3 whose weights never move: the config refuses lr 0, so
    the schedule is patched to 0 (AdamW's decoupled weight decay is lr x wd x p: 0 too)."""
    tmp = tmp_path_factory.mktemp("seed3")
    data = toy_corpus(tmp / "train.txt", 300, 0), toy_corpus(tmp / "valid.txt", 40, 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "lr_at", lambda *a, **k: 0.0)
        pretrain(toy_config(data, seed=3, max_steps=2, warmup_steps=1), tmp / "run")
    return tmp / "run"


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_card_records_the_pretraining_seed(frozen_run):
    for folder in (frozen_run / "final", frozen_run / "checkpoints" / "step_0000001"):
        assert read_card(folder).fields["seed"] == 3
        assert training_seed(folder) == 3


def test_the_floor_of_a_plain_mlm_checkpoint_is_the_network_its_pretraining_started_from(frozen_run):
    """At analysis seed 0 the floor is drawn under the run's own seed (3 + 0), which rebuilds the very
    initial weights: lr 0 kept them, so they are the checkpoint's."""
    model, _ = plmodels.load(frozen_run / "final")
    floor = random_init_model(model, floor_seed(0, training_seed(frozen_run / "final")))
    assert _same_weights(floor, model)
    # not true of any draw: the analysis seed's own (0) is another network
    assert not _same_weights(random_init_model(model, 0), model)


def test_floor_seed_offsets_the_analysis_seed_by_the_training_seed():
    assert [floor_seed(s, 3) for s in (0, 1, 2)] == [3, 4, 5]
    assert [floor_seed(s, 0) for s in (0, 1, 2)] == [0, 1, 2]       # seed-0 checkpoints keep today's floors
    assert [floor_seed(s, None) for s in (0, 1, 2)] == [0, 1, 2]    # unknown: the analysis seed


def _without_seed(src, dest):
    """A copy of checkpoint folder `src` at `dest` whose card has no "seed" (a card written before it)."""
    shutil.copytree(src, dest)
    card = json.loads((dest / CARD_FILE).read_text())
    del card["seed"]
    (dest / CARD_FILE).write_text(json.dumps(card))
    return dest


def test_an_older_card_reads_the_seed_from_its_runs_resolved_config(frozen_run, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(frozen_run / RUN_CONFIG_FILE, old / RUN_CONFIG_FILE)
    resolved = json.loads((old / RUN_CONFIG_FILE).read_text())
    resolved["pretrain"]["seed"] = 7   # the file is read, not the folder's history
    (old / RUN_CONFIG_FILE).write_text(json.dumps(resolved))
    final = _without_seed(frozen_run / "final", old / "final")
    step = _without_seed(frozen_run / "checkpoints" / "step_0000001", old / "checkpoints" / "step_0000001")
    assert training_seed(final) == 7 and training_seed(step) == 7
    # another objective's run config is not this checkpoint's
    resolved["pretrain"]["objective"] = "clm"
    (old / RUN_CONFIG_FILE).write_text(json.dumps(resolved))
    assert training_seed(final) is None
    # and without a run config beside it: unknown
    assert training_seed(_without_seed(frozen_run / "final", tmp_path / "alone")) is None


def test_an_imported_checkpoint_has_no_training_seed(tmp_path):
    """An imported Hugging Face model's card has an import report and no seed: the floor keeps the analysis
    seed. An imported suite's checkpoint states the seed it claims, and that is read."""
    model = tiny_encoder()
    imported = plmodels.save(model, None, tmp_path / "hf", card={"import": {"fresh_init": []}})
    assert training_seed(imported) is None
    suite = plmodels.save(model, None, tmp_path / "suite", card={"import": {"fresh_init": []}, "seed": 2})
    assert training_seed(suite) == 2
