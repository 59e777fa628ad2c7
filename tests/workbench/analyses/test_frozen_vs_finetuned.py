"""workbench.analyses.frozen_vs_finetuned: the table has the schema, per-seed rows, a mean row per setting
and diff rows equal to finetune minus frozen means; a planted feature layer is picked up by a
frozen head; unknown config keys are errors."""
import numpy as np
import pytest
import scipy.stats
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
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


def _welch_by_hand(a, b):
    """Welch's t test of mean(a) = mean(b): (t, Welch-Satterthwaite df, two-sided p, se), a group of
    one value adding no variance (as documented in welch_ci)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va = np.sum((a - a.mean()) ** 2) / (len(a) - 1) / len(a) if len(a) > 1 else 0.0   # s_a^2 / n_a
    vb = np.sum((b - b.mean()) ** 2) / (len(b) - 1) / len(b) if len(b) > 1 else 0.0
    se = np.sqrt(va + vb)
    with np.errstate(divide="ignore", invalid="ignore"):  # se = 0: nan, checked by the caller
        df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if len(a) > 1 else 0.0)
                               + (vb ** 2 / (len(b) - 1) if len(b) > 1 else 0.0))
        t = (a.mean() - b.mean()) / se
    return t, df, 2 * scipy.stats.t.sf(abs(t), df), se


def _interval_level(lo, hi, se, df):
    """The two-sided p-value of the test 'difference = endpoint': 1 - level for a level interval."""
    return 2 * scipy.stats.t.sf((hi - lo) / 2 / se, df)


def test_welch_interval_by_hand():
    a, b = np.array([0.9, 0.92, 0.94]), np.array([0.8, 0.81, 0.85, 0.82])
    t, df, p, se = _welch_by_hand(a, b)
    # s_a^2 = 4e-4, s_b^2 = 1.4e-3 / 3; se^2 = 4e-4/3 + 1.4e-3/12 = 2.5e-4
    assert se ** 2 == pytest.approx(2.5e-4) and t == pytest.approx(0.1 / np.sqrt(2.5e-4))
    # df = (2.5e-4)^2 / ((4e-4/3)^2 / 2 + (1.4e-3/12)^2 / 3) = 4.655..., not n_a + n_b - 2 = 5
    assert df == pytest.approx(6.25e-8 / ((4e-4 / 3) ** 2 / 2 + (1.4e-3 / 12) ** 2 / 3)) and 4.6 < df < 4.7
    lo, hi = welch_ci(a, b)
    assert (lo + hi) / 2 == pytest.approx(0.1)
    # the 95% interval's ends are the differences a two-sided Welch test at df rejects at exactly 0.05
    assert _interval_level(lo, hi, se, df) == pytest.approx(0.05, rel=1e-6)
    assert _interval_level(*welch_ci(a, b, level=0.9), se, df) == pytest.approx(0.10, rel=1e-6)
    assert p < 0.05 and lo > 0  # difference 0 rejected <=> outside the interval
    # a group of one value adds no variance: se^2 = s_b^2 / n_b, df = n_b - 1 = 3
    lo1, hi1 = welch_ci(np.array([0.9]), b)
    _, df1, _, se1 = _welch_by_hand([0.9], b)
    assert df1 == pytest.approx(3) and se1 ** 2 == pytest.approx(1.4e-3 / 12)
    assert (lo1 + hi1) / 2 == pytest.approx(0.08) and _interval_level(lo1, hi1, se1, df1) == pytest.approx(0.05)
    # overlapping groups: p > 0.05 and 0 inside the interval
    c = np.array([0.86, 0.79, 0.9])
    _, _, p_c, _ = _welch_by_hand(c, b)
    lo_c, hi_c = welch_ci(c, b)
    assert p_c > 0.05 and lo_c < 0 < hi_c


def test_diff_rows_carry_the_welch_interval_of_the_seed_values(table):
    per_seed = table[table.seed >= 0]
    diff = table[table.setting.str.startswith("diff:")]
    checked = 0
    for _, r in diff.iterrows():
        ft = per_seed[(per_seed.task == r.task) & (per_seed.setting == "finetune")].value.to_numpy()
        fr = per_seed[(per_seed.task == r.task) & (per_seed.setting == r.setting[5:])].value.to_numpy()
        _, df, _, se = _welch_by_hand(ft, fr)
        if se == 0:  # every seed scored the same: no interval
            assert np.isnan(r.ci_low) and np.isnan(r.ci_high)
            continue
        assert (r.ci_low + r.ci_high) / 2 == pytest.approx(ft.mean() - fr.mean())
        assert _interval_level(r.ci_low, r.ci_high, se, df) == pytest.approx(0.05, rel=1e-6)
        checked += 1
    assert checked > 0


def test_unknown_config_key_is_an_error():
    with pytest.raises(ValueError, match="unknown key 'epochz'"):
        FvFConfig.from_dict({"epochz": 1})
    with pytest.raises(ValueError, match="layer:<int>"):
        FvFConfig.from_dict({"settings": ["layer:top"]})
