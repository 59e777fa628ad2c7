"""Tests for workbench.analyses.emergence: the table over a tiny run's log-spaced checkpoints, n-gram baselines."""
import json
import math

import numpy as np
import pytest

from workbench.presentation.analysis_figures import write_analysis_figures
from workbench.analyses.emergence import (HeldOutEval, bigram_baseline, checkpoints, decoder_baselines, emergence,
                                 emergence_cli)

from .pretrain_runs import pretrain_run as _run
from .pretrain_runs import svo_corpus


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("enc"), "encoder", 16, model={"norm": "pre", "dropout": 0.0, "position": "rope"})


def test_checkpoints_are_log_spaced_and_final_is_not_doubled(encoder_run):
    found = checkpoints(encoder_run)
    assert [s for s, _, _ in found] == [1, 2, 4, 8, 16]  # final (step 16) = checkpoint 16, kept once
    assert [t for _, t, _ in found] == [s * 8 * 32 for s in (1, 2, 4, 8, 16)]


@pytest.mark.slow
def test_emergence_table_one_row_per_checkpoint_and_score(encoder_run, tmp_path):
    cfg = {"tasks": ["pos"], "max_train_targets": 300, "max_eval_targets": 150, "max_epochs": 2,
           "head_sentences": 8, "eval_sequences": 16}
    out = emergence_cli(encoder_run, tmp_path / "em", config=cfg)
    df = out["emergence"]
    assert list(df.columns) == ["model", "step", "tokens", "task_or_score", "metric", "value"]
    per = df.groupby("step").size()
    assert list(per.index) == [1, 2, 4, 8, 16] and per.nunique() == 1  # same scores at every checkpoint
    assert not df.duplicated(["step", "task_or_score", "metric"]).any()
    toks = df.groupby("step")["tokens"].first()
    assert (np.diff(toks.values) > 0).all()
    assert {"lm", "pos", "heads"} <= set(df["task_or_score"])
    lm = df[(df.task_or_score == "lm") & (df.metric == "loss")].set_index("step")["value"]
    assert lm[16] < lm[1] - 1.0  # planted: the model learns the toy language between steps 1 and 16
    uni = df[(df.task_or_score == "lm") & (df.metric == "unigram_loss")]["value"]
    assert uni.nunique() == 1  # the same targets are scored at every checkpoint
    metrics = json.loads((encoder_run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["step"] == 0
    assert (tmp_path / "em" / "tables" / "emergence.parquet").is_file()
    # the heads' random-init floor of every checkpoint: drawn under the run's seed 3 plus the heads' seed 0
    drawn = {json.loads(f.read_text())["random_init_seed"] for f in (tmp_path / "em").rglob("heads_run.json")}
    assert drawn == {3}
    write_analysis_figures("emergence", out, tmp_path / "em")   # what `workbench emergence` draws
    page = (tmp_path / "em" / "emergence.html").read_text()
    assert "<script src=" not in page and "Plotly.newPlot" in page   # self-contained: opens offline


def test_bigram_baseline_planted_cycle():
    # A deterministic cycle 5,6,...,14: the next token is fixed by the previous one.
    train = np.tile(np.arange(5, 15), 500)
    prev, tgt = np.arange(5, 14), np.arange(6, 15)
    out = bigram_baseline(train, prev, tgt, vocab=20)
    assert out["unigram_ppl"] == pytest.approx(math.exp(-math.log(501 / (5000 + 20))), rel=1e-9)
    assert out["bigram_ppl"] < 1.01 and out["beta"] == 0.1
    with pytest.raises(ValueError, match="equal"):
        bigram_baseline(train, prev, tgt[:3], vocab=20)


def test_decoder_baselines_match_the_trainers_unigram(tmp_path):
    other = svo_corpus(tmp_path / "other.txt", 150, 7)
    run = _run(tmp_path, "decoder", 2, vocab_size=300, ckpt_log_spaced=False,
               extra_eval={"other": [str(other), None]})
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    for name in ("eval", "other"):  # the main held-out set and an extra_eval set, by name
        out = decoder_baselines(run, eval_name=name)
        uni = next(r["value"] for r in rows if r["metric"] == "unigram_loss" and r["split"] == name)
        assert out["unigram_loss"] == pytest.approx(uni, rel=1e-6)
        assert out["bigram_loss"] < out["unigram_loss"] - 0.5  # the toy language is very bigram-predictable
        # bytes per target, checked against decoding the held-out rows back to text
        ev = HeldOutEval(run, None, name)
        tok, n_bytes, n_targets = ev.tokenizer, 0, 0
        for b in ev.evaluator.batches:
            for ids, labels in zip(b.input_ids, b.labels):
                targets = labels[labels != -100].tolist()
                assert targets[:-1] == ids[1:].tolist()  # a decoder row's targets: the row shifted by one
                n_bytes += len(tok.hf.decode(targets, skip_special_tokens=True).encode("utf-8"))
                n_targets += len(targets)
        assert out["bytes_per_target"] == pytest.approx(n_bytes / n_targets, rel=1e-12)
        assert out["bigram_bpb"] == pytest.approx(out["bigram_loss"] / math.log(2) / (n_bytes / n_targets))
    with pytest.raises(ValueError, match="no held-out set 'wiki'"):
        decoder_baselines(run, eval_name="wiki")


def test_emergence_refuses_unknown_steps(encoder_run, tmp_path):
    with pytest.raises(ValueError, match=r"no checkpoint at steps \[3\]"):
        emergence(encoder_run, tmp_path / "em", config={"steps": [1, 3], "tasks": []})


def test_held_out_eval_reads_the_runs_held_out_length(tmp_path):
    # a run trained on rows of 16 and scored on rows of 32 (eval_seq_len): the emergence step scores
    # its checkpoints on the trainer's rows, so it reproduces the trainer's final held-out loss
    from plmodels.checkpoint import load
    from workbench.analyses.emergence import HeldOutEval

    run = _run(tmp_path, "encoder", 4, seq_len=16, batch_size=16, eval_seq_len=32, ckpt_log_spaced=False,
               model={"norm": "pre", "dropout": 0.0, "position": "rope"})
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    trainer = {r["metric"]: r["value"] for r in rows if r["split"] == "eval" and r["step"] == 4}
    ours = HeldOutEval(run, eval_sequences=None)(load(run / "final")[0])
    assert ours["unigram_loss"] == pytest.approx(trainer["unigram_loss"], rel=1e-9)
    assert ours["loss"] == pytest.approx(trainer["loss"], rel=1e-5)
    at16 = HeldOutEval(run, eval_sequences=None, eval_seq_len=16)
    assert at16.evaluator.batches[0].input_ids.shape[1] == 16


@pytest.mark.slow
def test_minimal_pairs_over_checkpoints_match_scoring_each_one_with_its_floors(encoder_run, tmp_path):
    """Each step's pairs rows are `score_pairs_model` on that checkpoint (its first scorer, pooled over
    conditions); the floors, scored once, equal the floors scored on the later checkpoint itself."""
    from workbench.analyses.minimal_pairs import score_pairs_model

    pairs = {"suites": ["templates"], "max_pairs_per_condition": 2, "n_per_template": 8, "n_boot": 20,
             "scorers": ["pll", "masked_word"], "corpus_chars": 20_000}
    df = emergence(encoder_run, tmp_path / "em", config={"steps": [1, 16], "tasks": [], "lm": False,
                                                         "head_sentences": None, "pairs": pairs})
    rows = df[df["task_or_score"].str.startswith("pairs:")]
    assert set(rows["step"]) == {1, 16}
    cell = "pairs:templates:agreement_pp:template"
    for step in (1, 16):
        direct = score_pairs_model(encoder_run / "checkpoints" / f"step_{step:07d}", config=pairs, progress=False,
                                   cache_dir=tmp_path / "em" / "cache" / "minimal_pairs")["minimal_pairs"]
        direct = direct[(direct["condition"] == "all") & (direct["phenomenon"] == "agreement_pp")].set_index("scorer")
        got = rows[(rows["step"] == step) & (rows["task_or_score"] == cell)].set_index("metric")["value"]
        assert got["accuracy"] == direct.loc["pll", "value"] and got["n_items"] == direct.loc["pll", "n_items"]
        assert (got["accuracy_low"], got["accuracy_high"]) == (direct.loc["pll", "ci_low"], direct.loc["pll", "ci_high"])
        for floor in ("floor:chance", "floor:frequency", "floor:bigram"):
            assert got[floor] == direct.loc[floor, "value"]
        assert got["floor:random_init"] == direct.loc["floor:random_init:pll", "value"]
    assert {"floor:chance", "floor:frequency", "floor:bigram", "floor:random_init"} <= set(rows["metric"])
    with pytest.raises(ValueError, match="PairsRunConfig.floors"):
        emergence(encoder_run, tmp_path / "bad", config={"tasks": [], "pairs": {"floors": ["unigram"]}})
