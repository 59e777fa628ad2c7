"""workbench.analyses.frozen_vs_finetuned: the table has the schema, per-seed rows, a mean row per setting
and diff rows equal to finetune minus frozen means; a planted feature layer is picked up by a
frozen head; unknown config keys are errors."""
import numpy as np
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.presets import preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.frozen_vs_finetuned import COLUMNS, FrozenHead, FvFConfig, frozen_vs_finetuned, welch_ci
from workbench.data.tasks import ud_sentences

CFG = dict(tasks=["sst2", "pos"], settings=["last", "mean_last", "layer:1", "scalar_mix", "concat_last4"],
           seeds=[0, 1], finetune_seeds=[0, 1], max_train_examples=40, max_dev_examples=20, seq_len=24,
           batch_size=16, head_epochs=2, finetune_overrides={"epochs": 1, "max_steps": 2, "eval_every": 2},
           num_threads=1)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]]
    tok = Tokenizer.train_wordpiece(texts, 300)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "n_layers": 4, "d_model": 32, "d_ff": 64, "n_heads": 2,
              "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    tmp = tmp_path_factory.mktemp("fvf")
    plmodels.save(build_model("encoder", fields), tok, tmp / "tiny")
    return frozen_vs_finetuned(tmp / "tiny", out_dir=tmp / "out", config=CFG, model_name="tiny",
                               progress=False)["frozen_vs_finetuned"]


def test_schema_and_rows(table):
    assert list(table.columns) == COLUMNS
    per_seed = table[table.seed >= 0]
    sst = per_seed[per_seed.task == "sst2"]
    assert set(sst.setting) == {"last", "mean_last", "layer:1", "scalar_mix", "concat_last4", "finetune"}
    assert "mean_last" not in set(per_seed[per_seed.task == "pos"].setting)  # sentence-only setting
    assert (sst.groupby("setting").size() == 2).all()
    assert per_seed.value.between(0, 1).all()


def test_diff_rows_are_finetune_minus_frozen(table):
    mean = table[(table.seed == -1) & ~table.setting.str.startswith("diff:")].set_index(["task", "setting"]).value
    diff = table[table.setting.str.startswith("diff:")]
    assert len(diff) == 5 + 4  # every frozen setting of both tasks
    for _, r in diff.iterrows():
        frozen = r.setting.split(":", 1)[1]
        assert r.value == pytest.approx(mean[(r.task, "finetune")] - mean[(r.task, frozen)])
        assert r.metric == "accuracy_diff"
    m = table[(table.seed == -1) & (table.setting == "last") & (table.task == "sst2")].iloc[0]
    vals = table[(table.seed >= 0) & (table.setting == "last") & (table.task == "sst2")].value
    assert m.value == pytest.approx(vals.mean())


def test_frozen_head_and_scalar_mix_find_the_planted_layer():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (400,), generator=g)
    X = torch.randn(400, 3, 8, generator=g)
    X[:, 2, 0] += 3.0 * (2 * y - 1)  # only layer 2 carries the label
    head = FrozenHead(2, mix=True, epochs=30, lr=0.05, seed=0).fit(X[:300], y[:300])
    assert head.score(X[300:], y[300:]) > 0.9
    assert int(np.argmax(head.net_[0].numpy_weights())) == 2
    assert FrozenHead(2, epochs=30, lr=0.05).fit(X[:300, 0], y[:300]).score(X[300:, 0], y[300:]) < 0.7


def test_welch_interval_by_hand():
    a, b = np.array([0.9, 0.92, 0.94]), np.array([0.8, 0.81, 0.85, 0.82])
    lo, hi = welch_ci(a, b)
    assert lo < a.mean() - b.mean() < hi and lo > 0


def test_unknown_config_key_is_an_error():
    with pytest.raises(ValueError, match="unknown key 'epochz'"):
        FvFConfig.from_dict({"epochz": 1})
    with pytest.raises(ValueError, match="layer:<int>"):
        FvFConfig.from_dict({"settings": ["layer:top"]})
