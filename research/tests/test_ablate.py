"""Tests for research.ablate: equal-token budgets, the head summary, and a tiny two-variant ablation."""
import json
import math
import random

import numpy as np
import pandas as pd
import pytest

import plmodels
from research.ablate import (
    AblationEval,
    check_targets,
    gain_interval,
    heldout_c,
    load_spec,
    measure_variant,
    pick_sentences,
    pos_by_layer,
    probe_layers,
    run_ablation,
    seed_summary,
    seeds_markdown,
    summarise_heads,
    to_markdown,
    variant_config,
    with_seeds,
)


def _corpus(path, n, seed):
    rng = random.Random(seed)
    nouns = ["the cat", "a dog", "the king", "my friend", "the old man", "the cats", "two dogs"]
    verbs = ["sees", "likes", "follows", "calls", "see", "like"]
    objs = ["the river", "a small house", "the green hill", "her brother", "the night sky"]
    path.write_text("\n".join(f"{rng.choice(nouns)} {rng.choice(verbs)} {rng.choice(objs)} ." for _ in range(n)) + "\n")
    return path


def _planted_probe_data(n_sentences, rng, means):
    """Two "layers" of word vectors for 3 labels: layer 0 one strong feature (label + noise), layer 1
    200 weak ones (a small label-dependent mean in each): averaging them needs a strong L2 penalty."""
    counts = rng.integers(2, 9, size=n_sentences)
    y = rng.integers(0, 3, size=int(counts.sum()))
    return counts, y, [np.c_[y + rng.normal(0, 0.5, len(y))], means[y] + rng.normal(size=(len(y), means.shape[1]))]


def test_heldout_c_picks_the_penalty_on_held_out_training_sentences():
    rng = np.random.default_rng(0)
    means = rng.normal(0, 0.15, size=(3, 200))
    counts, y, X = _planted_probe_data(100, rng, means)
    counts_te, y_te, X_te = _planted_probe_data(300, rng, means)
    picked, table = heldout_c(X, y, counts)
    # the held-out words are whole sentences: the last 20 of 100, read nowhere else
    cut = int(counts[:80].sum())
    by_hand = probe_layers([x[:cut] for x in X], y[:cut], [x[cut:] for x in X], y[cut:], C=0.1)
    assert table[table["C"] == 0.1].set_index("layer")["heldout_acc"].to_dict() == pytest.approx(by_hand)
    # the many weak features want a strong penalty, the one strong feature a weak one; picking on
    # training fit (always the largest C) or the worst C breaks this
    assert picked[1] <= 0.03 < picked[0]
    at_1, at_picked = probe_layers(X, y, X_te, y_te, C=1.0), probe_layers(X, y, X_te, y_te, C=picked)
    assert at_picked[1] - at_1[1] >= 0.03, (at_1, at_picked)
    assert abs(at_picked[0] - at_1[0]) <= 0.01
    # the torch solver reads C as scikit-learn does
    torch_acc = probe_layers(X, y, X_te, y_te, C=picked, solver="torch")
    assert torch_acc == pytest.approx(at_picked, abs=0.01)
    with pytest.raises(ValueError, match="sums to"):
        heldout_c(X, y, counts[:-1])
    with pytest.raises(ValueError, match="one value per layer"):
        probe_layers(X, y, X_te, y_te, C={0: 1.0})
    with pytest.raises(ValueError, match="> 0"):
        probe_layers(X, y, X_te, y_te, C=0.0)


def test_pick_sentences_first_or_spread_over_a_treebank_stored_by_genre():
    # 10 sentences stored by genre (4 weblog, then 6 email): "first" 5 are weblog but one,
    # "spread" 5 takes indices 0, 2, 4 (round(4.5) = 4), 7, 9, two weblog and three email
    sents = [f"weblog-{i}" for i in range(4)] + [f"email-{i}" for i in range(6)]
    assert pick_sentences(sents, 5) == sents[:5]
    assert pick_sentences(sents, 5, "spread") == ["weblog-0", "weblog-2", "email-0", "email-3", "email-5"]
    assert pick_sentences(sents, 10, "spread") == pick_sentences(sents, 99, "spread") == sents
    with pytest.raises(ValueError, match="how must be"):
        pick_sentences(sents, 5, "random")
    with pytest.raises(ValueError, match="pos_sample"):
        AblationEval(pos_sample="last")


def test_gain_interval_by_hand_and_when_every_sentence_is_alike():
    # 3 sentences of 2, 1, 3 words; layer 1 right on 5 of 6 words, layer 0 on 3, layer 2 on 4
    correct = {0: np.array([1, 0, 1, 0, 1, 0], bool), 1: np.array([1, 1, 1, 1, 0, 1], bool),
               2: np.array([1, 1, 0, 1, 1, 0], bool)}
    out = gain_interval(correct, [2, 1, 3], n_boot=50)
    assert out["gain"] == pytest.approx(2 / 6) and out["best_layer"] == 1
    assert (out["n_sentences"], out["n_words"]) == (3, 6) and out["lo"] <= out["hi"]
    # `keep` drops the 2nd word (first sentence); sentences keep their identity
    kept = {k: v[[0, 2, 3, 4, 5]] for k, v in correct.items()}
    out = gain_interval(kept, [2, 1, 3], keep=np.array([1, 0, 1, 1, 1, 1], bool), n_boot=50, choose="in_sample")
    assert out["gain"] == pytest.approx(4 / 5 - 3 / 5) and out["n_words"] == 5
    # held out: the first sentence (1 kept word) ties every layer -> layer 0, which scores 2 of the other
    # 4 words; the other half picks layer 1 (3 of 4), which is right on the first word: (2 + 1) / 5 - 3 / 5
    out = gain_interval(kept, [2, 1, 3], keep=np.array([1, 0, 1, 1, 1, 1], bool), n_boot=50)
    assert out["gain"] == pytest.approx(0.0) and out["best_layer"] == -1
    # identical sentences: every resample is the sample, so the interval is the point
    same = {0: np.tile([1, 0, 0], 20).astype(bool), 1: np.tile([1, 1, 0], 20).astype(bool)}
    out = gain_interval(same, [3] * 20)
    assert out["lo"] == pytest.approx(out["gain"]) == pytest.approx(out["hi"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="layer 0"):
        gain_interval({1: same[1]}, [3] * 20)
    with pytest.raises(ValueError, match="choose"):
        gain_interval(same, [3] * 20, choose="dev")
    with pytest.raises(ValueError, match="scored words"):
        gain_interval(same, [3] * 19)


def test_gain_interval_chooses_the_layer_on_the_other_half():
    # 4 sentences of 2 words. Layer 1 is right on the first two sentences only, layer 2 on the last two
    # only, layer 3 on 3 of 4 words of each half, layer 0 on every other word. In sample, layer 3 wins:
    # gain 0.75 - 0.5. Held out, the first half picks layer 1, which scores 0 on the second half, and the
    # second half picks layer 2, which scores 0 on the first: gain 0 - 0.5, no single best layer.
    correct = {0: np.tile([1, 0], 4), 1: np.array([1, 1, 1, 1, 0, 0, 0, 0]), 2: np.array([0, 0, 0, 0, 1, 1, 1, 1]),
               3: np.array([1, 1, 1, 0, 1, 1, 1, 0])}
    correct = {k: v.astype(bool) for k, v in correct.items()}
    held = gain_interval(correct, [2] * 4, n_boot=50)
    assert held["gain"] == pytest.approx(-0.5) and held["best_layer"] == -1
    assert held["gain_in_sample"] == pytest.approx(0.25)
    inside = gain_interval(correct, [2] * 4, n_boot=50, choose="in_sample")
    assert inside["gain"] == pytest.approx(0.25) and inside["best_layer"] == 3


def test_gain_interval_covers_a_planted_gain_when_words_of_a_sentence_move_together():
    """Planted: each sentence has a difficulty shared by its words and every layer, and a
    context effect (how much the contextual layers help it) shared by its words. The true gain is
    the population's; the 95% interval over whole sentences must cover it about 95% of the time,
    while resampling words as if independent covers it far less often."""
    from scipy.special import expit

    rng = np.random.default_rng(0)

    def draw(n_sent, words=12):
        d = np.repeat(rng.normal(0, 1.0, n_sent), words)       # shared difficulty
        e = np.repeat(rng.normal(0, 1.5, n_sent), words)       # shared context effect
        p = {0: expit(1.6 + d), 1: expit(2.8 + d + e), 2: expit(2.0 + d + 0.5 * e)}
        return {k: rng.random(len(v)) < v for k, v in p.items()}, p

    _, p = draw(400_000, words=1)
    truth = max(v.mean() for v in p.values()) - p[0].mean()    # 86.8% (layer 1) - 79.3% (layer 0)
    assert truth == pytest.approx(0.075, abs=0.002)
    cover_sent = cover_word = 0
    for _ in range(100):
        correct, _ = draw(100)
        a = gain_interval(correct, [12] * 100, n_boot=400, seed=1)
        b = gain_interval(correct, [1] * 1200, n_boot=400, seed=1)
        cover_sent += a["lo"] <= truth <= a["hi"]
        cover_word += b["lo"] <= truth <= b["hi"]
        assert b["gain"] == pytest.approx(a["gain"])
    assert cover_sent >= 88, cover_sent                        # 92 of 100 with these draws
    assert cover_word <= 86 and cover_sent - cover_word >= 8, (cover_sent, cover_word)  # 77


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    train, valid = _corpus(d / "train.txt", 2000, 0), _corpus(d / "valid.txt", 200, 1)
    return dict(kind="encoder", train_source=str(train), train_split=None, eval_source=str(valid), eval_split=None,
                preset="tiny", vocab_size=200, tokenizer_sample_chars=100_000, seq_len=32, batch_size=8,
                lr=3e-3, warmup_steps=5, max_steps=8, eval_every=0, eval_sequences=16, log_every=1000,
                bf16="off", seed=3, model={"norm": "pre", "dropout": 0.0})


def test_variant_config_spends_the_same_tokens_whatever_the_batch(base, tmp_path):
    from plmodels.training import PretrainConfig

    cfg0 = PretrainConfig.from_dict(base)
    ev = AblationEval(warmup_frac=0.25, evals_per_run=2)
    a = variant_config(cfg0, {}, 10_000, ev)
    b = variant_config(cfg0, {"batch_size": 16, "model": {"position": "rope"}, "warmup_frac": 0.5}, 10_000, ev)
    assert a.max_steps == math.ceil(10_000 / (8 * 32)) == 40 and b.max_steps == math.ceil(10_000 / (16 * 32)) == 20
    assert (a.warmup_steps, b.warmup_steps) == (10, 10)  # 0.25 * 40 and the variant's own 0.5 * 20
    assert b.model == {"norm": "pre", "dropout": 0.0, "position": "rope"}  # nested dicts merge
    assert a.eval_every == 20 and not a.ckpt_log_spaced and a.max_minutes is None and a.num_threads == 1
    c = variant_config(cfg0, {"warmup_steps": 3}, 10_000, ev)
    assert c.warmup_steps == 3  # an explicit warmup wins


def test_variant_config_equal_wall_time_puts_the_schedule_on_the_clock(base):
    from plmodels.training import PretrainConfig

    cfg0 = PretrainConfig.from_dict(base)
    ev = AblationEval(warmup_frac=0.2, tokens_per_s=1024)
    a = variant_config(cfg0, {}, None, ev, budget_minutes=2)
    b = variant_config(cfg0, {"batch_size": 16}, None, ev, budget_minutes=2)
    # 1024 tok/s x 120 s = 122,880 tokens: 480 steps of 8 x 32, 240 of 16 x 32; warmup 20% of each
    assert (a.max_steps, b.max_steps) == (480, 240) and (a.warmup_steps, b.warmup_steps) == (96, 48)
    assert a.max_minutes == 2 and a.schedule_clock == "time"
    with pytest.raises(ValueError, match="exactly one"):
        variant_config(cfg0, {}, 1000, ev, budget_minutes=2)
    with pytest.raises(ValueError, match="exactly one"):
        variant_config(cfg0, {}, None, ev)


def test_summarise_heads_margin_is_best_direction_minus_baseline():
    rel = pd.DataFrame({"relation": ["det", "det", "case", "nsubj"], "direction": ["a", "b", "a", "a"],
                        "test_acc": [0.80, 0.50, 0.40, 0.9], "baseline_acc": [0.60, 0.10, 0.55, 0.1]})
    heads = pd.DataFrame({"score": ["positional_share:-1", "positional_share:+1", "positional_share:-2"],
                          "value": [0.3, 0.95, 0.99]})
    out = summarise_heads(heads, rel)
    assert out["det_margin"] == pytest.approx(0.40)  # direction b: 0.50 - 0.10 beats a: 0.20
    assert out["case_margin"] == pytest.approx(-0.15)
    assert out["positional_max"] == pytest.approx(0.95)  # offset -2 does not count


@pytest.mark.slow
def test_tiny_ablation_rows_and_rerun_is_cached(base, tmp_path):
    ev = {"evals_per_run": 2, "eval_sequences": 16, "pos_train_sentences": 30, "pos_test_sentences": 20,
          "head_sentences": 12}
    variants = {"learned": {}, "rope_lr": {"model": {"position": "rope"}, "lr": 5e-3}}
    df = run_ablation(base, variants, tmp_path / "abl", budget_tokens=12 * 8 * 32, eval=ev)
    assert list(df["variant"]) == ["learned", "rope_lr"]
    assert (df["tokens"] == 12 * 8 * 32).all() and (df["steps"] == 12).all()
    assert (df["tokens_per_s"] > 0).all()
    assert (df["eval_loss"] < df["unigram_loss"] + 1.0).all()  # trained past random init (ln 200 = 5.3)
    assert ((df["pos_layer0"] > 0.2) & (df["pos_layer0"] <= 1)).all()  # 17 UPOS labels: chance ~ 0.17 at best
    np.testing.assert_allclose(df["pos_gain"], df["pos_best"] - df["pos_layer0"], atol=1e-12)
    assert (df["pos_gain"] <= df["pos_gain_in_sample"] + 1e-12).all()   # a held-out choice never beats the maximum
    assert json.loads(df.loc[1, "overrides"])["lr"] == 5e-3
    assert (tmp_path / "abl" / "ablation.parquet").is_file()
    assert "| rope_lr |" in (tmp_path / "abl" / "ablation.md").read_text()
    assert ((df["positional_ceiling"] > 0.5) & (df["positional_ceiling"] <= 1)).all()  # same sentences, same tokenizer
    assert df["positional_ceiling"].nunique() == 1 and "positional_ceiling" in (tmp_path / "abl" / "ablation.md").read_text()
    stamp = (tmp_path / "abl" / "rope_lr" / "final" / "model.safetensors").stat().st_mtime_ns
    df2 = run_ablation(base, variants, tmp_path / "abl", budget_tokens=12 * 8 * 32, eval=ev, only=["rope_lr"])
    assert (tmp_path / "abl" / "rope_lr" / "final" / "model.safetensors").stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(df, df2)
    with pytest.raises(ValueError, match="unknown variants"):
        run_ablation(base, variants, tmp_path / "abl", budget_tokens=100, only=["nope"])
    # the torch fit of the POS probe minimises scikit-learn's objective: on these few words both converge
    model, tok = plmodels.load(tmp_path / "abl" / "rope_lr" / "final")
    ev_small = AblationEval(pos_train_sentences=30, pos_test_sentences=20)
    by_solver = {s: pos_by_layer(model, tok, tmp_path / "pos-store", ev_small, solver=s) for s in ("sklearn", "torch")}
    assert by_solver["sklearn"].keys() == by_solver["torch"].keys()
    for layer, acc in by_solver["sklearn"].items():
        assert abs(by_solver["torch"][layer] - acc) <= 0.02, (layer, by_solver)
    with pytest.raises(ValueError, match="solver"):
        pos_by_layer(model, tok, tmp_path / "pos-store", ev_small, solver="liblinear")
    # a row cached with one solver is measured again when the other is asked for, and says which
    final, ev_run = tmp_path / "abl" / "rope_lr" / "final", AblationEval(**ev)
    assert df.loc[1, "pos_solver"] == "sklearn"
    row = measure_variant("rope_lr", final, ev_run, {}, solver="torch")
    assert row["pos_solver"] == "torch"
    assert -1 <= row["pos_gain_lo"] <= row["pos_gain_hi"] <= 1  # the held-out gain's interval over test sentences
    for layer, acc in json.loads(df.loc[1, "pos_by_layer"]).items():
        assert abs(json.loads(row["pos_by_layer"])[layer] - acc) <= 0.02, (layer, row["pos_by_layer"])
    assert measure_variant("rope_lr", final, ev_run, {}, solver="torch") == row  # now cached


@pytest.mark.slow
def test_tiny_ablation_over_seeds_trains_each_seed_and_summarises(base, tmp_path):
    ev = {"evals_per_run": 1, "eval_sequences": 16, "pos_train_sentences": 30, "pos_test_sentences": 20,
          "head_sentences": 12}
    out = tmp_path / "abl"
    df = run_ablation(base, {"rope": {"model": {"position": "rope"}}}, out, budget_tokens=4 * 8 * 32, eval=ev,
                      seeds=[1, 2])
    assert list(df["variant"]) == ["rope@s1", "rope@s2"] and list(df["group"]) == ["rope", "rope"]
    assert list(df["seed"]) == [1, 2]
    from safetensors.torch import load_file

    w1, w2 = (load_file(str(out / n / "final" / "model.safetensors")) for n in ("rope@s1", "rope@s2"))
    assert not all(w1[k].equal(w2[k]) for k in w1)  # another seed: another initialisation and data order
    assert df.loc[0, "eval_loss"] != df.loc[1, "eval_loss"]
    summary = pd.read_parquet(out / "ablation_seeds.parquet")
    loss = summary.set_index("measure").loc["eval_loss"]
    assert loss["n"] == 2 and loss["mean"] == pytest.approx(df["eval_loss"].mean())
    assert loss["min"] == pytest.approx(df["eval_loss"].min()) and loss["sd"] > 0
    assert "Over seeds" in (out / "ablation.md").read_text()


def test_with_seeds_names_one_run_per_variant_and_seed():
    runs = with_seeds({"a": {"lr": 1e-3}, "b": {"seed": 9, "model": {"position": "rope"}}}, [0, 2])
    assert list(runs) == ["a@s0", "a@s2", "b@s0", "b@s2"]
    assert runs["a@s2"] == ("a", {"lr": 1e-3, "seed": 2})
    assert runs["b@s0"] == ("b", {"seed": 0, "model": {"position": "rope"}})  # the seed list wins
    assert with_seeds({"a": {"lr": 1e-3}}, None) == {"a": ("a", {"lr": 1e-3})}
    with pytest.raises(ValueError, match="repeats"):
        with_seeds({"a": {}}, [1, 1])
    with pytest.raises(ValueError, match="@s"):
        with_seeds({"x@s1": {}}, [0, 1])


def test_seed_summary_mean_sd_min_max_by_hand():
    nan = float("nan")
    df = pd.DataFrame({"group": ["x", "x", "x", "y"], "eval_acc": [0.30, 0.34, 0.38, 0.5],
                       "positional_max": [0.9, nan, 0.5, 0.7], "eval_loss": [3.0, 3.2, 3.4, 2.0]})
    s = seed_summary(df, ["eval_acc", "positional_max", "eval_loss"]).set_index(["group", "measure"])
    acc = s.loc[("x", "eval_acc")]
    # mean 0.34; sample sd sqrt((0.04^2 + 0 + 0.04^2) / 2) = 0.04
    assert (acc["n"], acc["mean"], acc["sd"], acc["min"], acc["max"]) == (3, pytest.approx(0.34), pytest.approx(0.04),
                                                                        pytest.approx(0.30), pytest.approx(0.38))
    pos = s.loc[("x", "positional_max")]
    assert pos["n"] == 2 and pos["mean"] == pytest.approx(0.7)  # the missing value is not a zero
    assert math.isnan(s.loc[("y", "eval_acc")]["sd"])  # one run: no spread
    md = seeds_markdown(seed_summary(df, ["eval_acc", "positional_max", "eval_loss"]))
    assert "| x | 3 | 3.200 ± 0.200 (3.000–3.400) | 34.0 ± 4.0 (30.0–38.0) | 70.0 ± 28.3 (50.0–90.0) |" in md
    assert "| y | 1 | 2.000 (2.000–2.000) | 50.0 (50.0–50.0) | 70.0 (70.0–70.0) |" in md


def test_load_spec_checks_seeds(tmp_path):
    spec = {"base": "encoder-mini-cram", "budget_minutes": 1, "variants": {"a": {}}}
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({**spec, "seeds": [0, 1]}))
    bad.write_text(json.dumps({**spec, "seeds": "0,1"}))
    assert load_spec(good)["seeds"] == [0, 1]
    with pytest.raises(ValueError, match=r"bad\.json: seeds: input should be a valid array"):
        load_spec(bad)


def test_to_markdown_formats_percentages():
    df = pd.DataFrame([{"variant": "x", "tokens": 1000, "tokens_per_s": 512.4, "eval_loss": 3.21, "eval_acc": 0.123,
                        "eval_ppl": 24.8, "pos_layer0": 0.8, "pos_best": 0.85, "pos_gain": 0.05,
                        "det_margin": float("nan"), "case_margin": 0.2, "positional_max": 0.9, "load_avg": 9.0}])
    md = to_markdown(df)
    assert "| x | 1,000 | 512 | 3.210 | 12.3 | 24.8 | 80.0 | 85.0 | 5.0 |  | 20.0 | 90.0 | 9.000 |" in md
    assert "bigram" not in md  # encoder rows: no decoder columns


def test_to_markdown_adds_decoder_columns():
    row = {"variant": "d", "tokens": 10, "tokens_per_s": 1.0, "eval_loss": 4.0, "eval_acc": 0.3, "eval_ppl": 54.6,
           "pos_layer0": 0.8, "pos_best": 0.83, "pos_gain": 0.03, "det_margin": 0.1, "case_margin": 0.2,
           "positional_max": 0.5, "load_avg": 2.0, "pos_last_gain": 0.042, "model_ppl": 54.6, "bigram_ppl": 148.64,
           "unigram_ppl": 898.6, "wikitext2_model_ppl": 2794.0, "wikitext2_bigram_ppl": 3179.1}
    md = to_markdown(pd.DataFrame([row]))
    header, _, line = md.splitlines()
    assert header.endswith("| eval_ppl | pos_layer0 | pos_best | pos_gain | det_margin | case_margin | positional_max | "
                           "pos_last_gain | bigram_ppl | wikitext2_model_ppl | wikitext2_bigram_ppl | load_avg |")
    assert line.endswith("| 4.2 | 148.6 | 2794.0 | 3179.1 | 2.000 |")


def test_check_targets_passes_only_at_or_above_target_and_fails_nan():
    row = {"eval_acc": 0.38, "pos_gain": 0.049, "positional_max_tokens": 0.95, "det_margin": float("nan"),
           "case_margin": 0.2}
    out = check_targets(row).set_index("measure")["passed"].to_dict()
    assert out == {"eval_acc": True, "pos_gain": False, "positional_max_tokens": True, "det_margin": False,
                   "case_margin": True}
    # the POS gain's interval is shown, and a miss whose interval reaches the target stays a miss
    t = check_targets({**row, "pos_gain_lo": 0.03, "pos_gain_hi": 0.07}).set_index("measure")
    assert (t.loc["pos_gain", "lo"], t.loc["pos_gain", "hi"]) == (0.03, 0.07) and not t.loc["pos_gain", "passed"]
    assert t.drop("pos_gain")[["lo", "hi"]].isna().all().all()


def test_the_positional_target_reads_voitas_token_share_not_the_word_share():
    """A perfect token-level -1 head (share 1.0 on tokens) scores at most the tokenizer's word-level
    ceiling on words (about 0.91 for the recipe's vocabulary); the target follows Voita et al. 2019,
    whose 90% is set on tokens, so a row with a 0.86 word share and a 0.98 token share passes and a
    0.95 word share with a 0.85 token share does not."""
    base = {"eval_acc": 0.45, "pos_gain": 0.06, "det_margin": 0.2, "case_margin": 0.2}
    ok = check_targets({**base, "positional_max": 0.86, "positional_max_tokens": 0.98})
    assert ok["passed"].all() and "positional_max" not in set(ok["measure"])
    bad = check_targets({**base, "positional_max": 0.95, "positional_max_tokens": 0.85}).set_index("measure")
    assert not bad.loc["positional_max_tokens", "passed"] and bad["passed"].sum() == 4
