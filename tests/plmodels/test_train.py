"""Tests for pretraining: loss goes down, bit-exact resume, config checks, checkpoint schedule."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from plmodels.training import PretrainConfig, load_config, pretrain
from plmodels.training.loop import run_training
from plmodels.training.state import should_checkpoint

from .toy_runs import fixed_wordpiece, toy_config, toy_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return toy_corpus(d / "train.txt", 4000, 0), toy_corpus(d / "valid.txt", 400, 1)


def _eval_losses(run):
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["value"]) for r in rows if r["split"] == "eval" and r["metric"] == "loss"], rows


# The encoder uses the pre-LN / RoPE / no-dropout recipe: BERT's post-LN sits on the unigram
# plateau far longer than a test may take.
@pytest.mark.parametrize("kind,steps,extra", [
    ("encoder", 120, {"model": {"norm": "pre", "dropout": 0.0, "position": "rope"}, "lr": 5e-3}),
    ("decoder", 80, {"vocab_size": 300}),
    ("decoder", 80, {"vocab_size": 300, "model": {"output": "adaptive", "tie_embeddings": False,
                                                  "adaptive_cutoffs": [40, 120]}}),
], ids=["encoder", "decoder", "decoder-adaptive"])
def test_tiny_pretraining_lowers_heldout_loss_below_unigram(data, tmp_path, kind, steps, extra):
    if kind == "encoder":  # a trained WordPiece numbers tied tokens in hash order, which moved this
        extra = {**extra, "tokenizer_path": str(fixed_wordpiece(data[0], tmp_path / "tok"))}  # loss by 0.12
    final = pretrain(toy_config(data, kind, max_steps=steps, ckpt_log_spaced=False, **extra), tmp_path / "run")
    if extra.get("model", {}).get("output") == "adaptive":  # the shortlist holds the corpus's most frequent ids
        ids = np.fromfile(next((tmp_path / "run" / "cache").glob("*train*.ids")), dtype=np.uint16)
        rank = load_file(str(final / "model.safetensors"))["vocab_rank"]
        assert int(rank[int(np.bincount(ids).argmax())]) == 0
    losses, rows = _eval_losses(tmp_path / "run")
    (s0, first), (s1, last) = losses[0], losses[-1]
    unigram = next(r["value"] for r in rows if r["metric"] == "unigram_loss")
    assert (s0, s1) == (0, steps)
    assert last < first - 1.5 and last < unigram - 0.2, (first, last, unigram)
    card = json.loads((final / "card.json").read_text())
    assert card["steps"] == steps and card["tokens"] == steps * 8 * 32
    assert card["metrics"]["eval_loss"] == pytest.approx(last)
    assert card["metrics"]["eval_unigram_loss"] == pytest.approx(unigram)
    assert card["loss_curve"]["train_loss"][0][0] == 1


@pytest.mark.parametrize("kind,extra", [
    ("encoder", {}), ("encoder", {"short_seq_len": 16, "short_frac": 0.5}),
    ("decoder", {"vocab_size": 300,
                 "model": {"output": "adaptive", "tie_embeddings": False, "adaptive_cutoffs": [40, 120]}}),
], ids=["plain", "short-first", "decoder-adaptive"])
def test_killed_run_resumes_bit_exact(data, tmp_path, monkeypatch, kind, extra):
    # With a short first phase the kill (step 4) falls on its last step: steps 0-3 of 7 are short.
    # Both runs share one tokenizer: the WordPiece trainer breaks frequency ties in no fixed order,
    # so two separately trained tokenizers may number the vocabulary differently. The tokenizer path
    # is relative: it is taken from the current directory (not the data root), as on the CLI.
    pretrain(toy_config(data, kind, max_steps=1, vocab_size=extra.get("vocab_size", 200)), tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    cfg = toy_config(data, kind, max_steps=7, tokenizer_path="tok/tokenizer", **extra)
    straight = pretrain(cfg, tmp_path / "a")
    killed = run_training(cfg, tmp_path / "b", stop_at_step=4)  # last checkpoint: step 4 (log-spaced)
    assert killed.path is None and not (tmp_path / "b" / "final").exists()
    resumed = pretrain(cfg, tmp_path / "b")
    wa, wb = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    oa, ob = (load_file(str(p / "train_state.safetensors")) for p in (straight, resumed))
    assert all(torch.equal(oa[k], ob[k]) for k in oa) and oa.keys() == ob.keys()
    # and the resumed run really started from step 4: its metrics hold each train step once
    steps = [r["step"] for r in _eval_losses(tmp_path / "b")[1] if r["split"] == "train"]
    assert steps == list(range(1, 8))


def test_progress_lines_count_steps_from_the_resumed_step(data, tmp_path, capsys):
    # off a terminal the bar writes a line when it opens, every log_every steps and when it closes
    cfg = toy_config(data, max_steps=8, log_every=2)
    run_training(cfg, tmp_path / "run", stop_at_step=4)  # last checkpoint: step 4 (log-spaced)
    capsys.readouterr()
    pretrain(cfg, tmp_path / "run")
    err = capsys.readouterr().err.splitlines()
    bars = [line for line in err if line.startswith("pretrain:")]
    assert [b.split(" step ")[0].split()[-1] for b in bars] == ["4/8", "6/8", "8/8"], err
    assert "tok/s" in bars[-1] and " loss " in bars[-1] and ", lr " in bars[-1]
    assert any(line.startswith("resuming from ") for line in err)  # log lines stay whole lines
    assert err[-1].startswith("done: 8 steps")


@pytest.mark.slow
@pytest.mark.parametrize("kind,extra", [
    ("encoder", {"model": {"norm": "post", "dropout": 0.0, "position": "rope"}}),
    ("decoder", {"vocab_size": 300, "model": {"dropout": 0.0}}),
])
def test_compiled_training_matches_eager_and_leaves_the_model_plain(data, tmp_path, monkeypatch, kind, extra):
    # `compile` must compile what the loss calls (the encoder's hidden_at, not only forward) and
    # nothing else: the same weights as eager (fp32, no dropout), and the returned model uncompiled.
    pretrain(toy_config(data, kind, max_steps=1, vocab_size=extra.get("vocab_size", 200)), tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    cfg = dict(max_steps=4, eval_every=2, tokenizer_path="tok/tokenizer", **extra)
    torch._dynamo.reset()
    eager = run_training(toy_config(data, kind, **cfg), tmp_path / "eager")
    compiled = run_training(toy_config(data, kind, compile=True, **cfg), tmp_path / "compiled")
    counts = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert counts > 0  # something was compiled
    wa, wb = (load_file(str(r.path / "model.safetensors")) for r in (eager, compiled))
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5, msg=k)
    la, lb = (_eval_losses(tmp_path / name)[0] for name in ("eager", "compiled"))
    assert [s for s, _ in la] == [s for s, _ in lb] == [0, 2, 4]
    assert [v for _, v in lb] == pytest.approx([v for _, v in la], abs=1e-4)
    model = compiled.model
    assert "hidden_at" not in vars(model) and not hasattr(model, "_orig_mod")
    ids = torch.randint(5, 100, (2, 16))
    with torch.no_grad():  # the plain model compiles nothing new
        model(ids)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == counts


def test_resume_with_changed_config_refuses_listing_keys(data, tmp_path):
    cfg = toy_config(data, max_steps=2)
    pretrain(cfg, tmp_path / "r")
    with pytest.raises(ValueError, match=r"\['lr', 'seq_len'\]"):
        pretrain(cfg, tmp_path / "r", overrides={"lr": 1e-2, "seq_len": 16})
    # resume=False (`--no-resume`) starts the run over with the new config: the same weights as a
    # fresh folder gets, and none of the old run's rows or checkpoints left
    changed = {"lr": 1e-2, "seq_len": 16, "tokenizer_path": str(fixed_wordpiece(data[0], tmp_path / "tok"))}
    over = pretrain(cfg, tmp_path / "r", resume=False, overrides=changed)
    fresh = pretrain(cfg, tmp_path / "fresh", overrides=changed)
    wa, wb = load_file(str(over / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((tmp_path / "r" / "config.resolved.json").read_text())["pretrain"]["lr"] == 1e-2
    rows = [[{k: v for k, v in r.items() if k != "time"} for r in _eval_losses(tmp_path / name)[1]]
            for name in ("r", "fresh")]
    assert rows[0] == rows[1] and rows[0][-1]["step"] == 2
    assert not (tmp_path / "r" / "resumes.json").exists()


def test_resume_accepts_a_key_added_later_at_its_default(data, tmp_path):
    cfg = toy_config(data, max_steps=2)
    pretrain(cfg, tmp_path / "r")
    path = tmp_path / "r" / "config.resolved.json"
    old = json.loads(path.read_text())
    del old["pretrain"]["decay_frac"]          # as written before the field existed
    path.write_text(json.dumps(old))
    pretrain(cfg, tmp_path / "r", overrides={"max_minutes": 5})   # resumes: same config
    path.write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"\['decay_frac'\]"):
        pretrain(cfg, tmp_path / "r", overrides={"decay_frac": 0.5})


def test_unknown_config_key_is_named(tmp_path):
    with pytest.raises(ValueError, match="bogus_key"):
        PretrainConfig.from_dict({"kind": "encoder", "train_source": "x", "bogus_key": 1})
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"kind": "encoder", "train_source": "x", "lrr": 1}))
    with pytest.raises(ValueError, match=r"c\.json.*lrr"):
        load_config(p)
    with pytest.raises(ValueError, match="masking: unknown key 'ratee'"):
        PretrainConfig.from_dict({"kind": "encoder", "train_source": "x", "masking": {"ratee": 0.2}})


def test_a_wrong_type_is_named_with_its_file_and_field(tmp_path):
    # the example: a string where a number belongs used to die with a bare TypeError deep in
    # the optimiser; now the loader names the file, the field and the value
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"extends": "encoder-tiny", "lr": "1e-3"}))
    with pytest.raises(ValueError, match=r'c\.json: lr: input should be a valid number, got "1e-3"'):
        load_config(p)
    with pytest.raises(ValueError, match=r"masking: rate: input should be a valid number"):
        load_config("encoder-tiny", {"masking": {"rate": "high"}})
    # a value from the overrides (the CLI's --set flags) is named as the flag, not blamed on the file
    with pytest.raises(ValueError, match=r"^--set model: input should be an object, got 8$"):
        load_config(load_config("encoder-tiny"), {"model": 8})
    with pytest.raises(ValueError, match=r"^--set lr: input should be a valid number, got \"abc\"$"):
        load_config("encoder-tiny", {"lr": "abc"})


def test_a_config_file_extends_another(tmp_path):
    (tmp_path / "sub").mkdir()
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"kind": "encoder", "train_source": "x", "lr": 1e-3, "batch_size": 64,
                                "model": {"n_heads": 8, "norm": "post"}, "masking": {"rate": 0.25}}))
    mid = tmp_path / "sub" / "mid.json"   # the base path is relative to the extending file's folder
    mid.write_text(json.dumps({"extends": "../base.json", "batch_size": 32, "model": {"n_heads": 4}}))
    top = tmp_path / "sub" / "top.json"
    top.write_text(json.dumps({"extends": "mid.json", "masking": {"mask_frac": 0.5}}))
    cfg = load_config(top, {"lr": 2e-3})
    assert (cfg.lr, cfg.batch_size, cfg.train_source) == (2e-3, 32, "x")
    assert cfg.model == {"n_heads": 4, "norm": "post"}          # nested dicts merge key by key
    assert cfg.masking["rate"] == 0.25 and cfg.masking["mask_frac"] == 0.5
    base.write_text(json.dumps({"kind": "encoder", "train_source": "x", "lr": 5e-4}))
    assert load_config(top).lr == 5e-4                           # a base change reaches the derived file
    (tmp_path / "a.json").write_text(json.dumps({"extends": "b.json"}))
    (tmp_path / "b.json").write_text(json.dumps({"extends": "a.json"}))
    with pytest.raises(ValueError, match=r"cycle: .*a\.json -> .*b\.json -> .*a\.json"):
        load_config(tmp_path / "a.json")
    (tmp_path / "c.json").write_text(json.dumps({"extends": "nowhere.json"}))
    with pytest.raises(FileNotFoundError, match=r"c\.json: 'extends': no config file .*nowhere"):
        load_config(tmp_path / "c.json")
    (tmp_path / "d.json").write_text(json.dumps({"extends": 3}))
    with pytest.raises(ValueError, match=r"d\.json: 'extends' must name"):
        load_config(tmp_path / "d.json")


def test_heldout_targets_do_not_depend_on_training_mask_or_batch(data, tmp_path):
    # the eval mask is BERT's 15% whatever the training masking and batch size, so runs that differ
    # in those are scored on the same targets (same unigram loss, same count); eval_masking changes it
    def eval_row(name, **kw):
        pretrain(toy_config(data, max_steps=1, ckpt_log_spaced=False, **kw), tmp_path / name)
        _, rows = _eval_losses(tmp_path / name)
        return next(r["value"] for r in rows if r["metric"] == "unigram_loss" and r["step"] == 0)

    a = eval_row("a")
    assert eval_row("b", masking={"rate": 0.4}, batch_size=4) == a
    assert eval_row("c", eval_masking={"rate": 0.4}) != a
    with pytest.raises(ValueError, match="eval_masking"):
        toy_config(data, eval_masking={"nsp": True})


def test_short_first_phase_reads_short_rows_then_seq_len_rows(data, tmp_path, monkeypatch):
    # the first short_frac of the schedule reads rows of short_seq_len (twice as many: the same tokens
    # per step), the rest rows of seq_len; the held-out rows stay at seq_len
    import plmodels.training.objectives as objectives

    shapes, real = [], objectives.masked_lm_loss
    monkeypatch.setattr(objectives, "masked_lm_loss", lambda model, batch, autocast: shapes.append(tuple(batch.input_ids.shape))
                        or real(model, batch, autocast))
    final = pretrain(toy_config(data, max_steps=8, short_seq_len=16, short_frac=0.5, ckpt_log_spaced=False), tmp_path / "r")
    assert shapes == [(16, 16)] * 4 + [(8, 32)] * 4
    assert json.loads((final / "card.json").read_text())["tokens"] == 8 * 8 * 32
    _, rows = _eval_losses(tmp_path / "r")
    assert [r["tokens"] for r in rows if r["split"] == "train"] == [k * 256 for k in range(1, 9)]


def test_eval_seq_len_scores_runs_of_any_length_on_the_same_targets(data, tmp_path):
    def eval_row(name, **kw):
        pretrain(toy_config(data, max_steps=1, ckpt_log_spaced=False, **kw), tmp_path / name)
        _, rows = _eval_losses(tmp_path / name)
        return [(r["metric"], r["value"]) for r in rows if r["metric"] == "unigram_loss" and r["step"] == 0]

    at32 = eval_row("a")
    assert eval_row("b", seq_len=16, batch_size=16, eval_seq_len=32) == at32
    assert eval_row("c", short_seq_len=16, short_frac=0.5) == at32
    assert eval_row("d", seq_len=16, batch_size=16) != at32


def test_short_first_and_eval_length_are_checked():
    base = dict(kind="encoder", train_source="x", seq_len=128, batch_size=64)
    for bad, match in [({"short_seq_len": 64}, "go together"), ({"short_frac": 0.3}, "go together"),
                       ({"short_seq_len": 128, "short_frac": 0.3}, r"short_seq_len must be in \[1, seq_len=128\)"),
                       ({"short_seq_len": 64, "short_frac": 1.0}, r"short_frac must be in \(0, 1\)"),
                       ({"short_seq_len": 60, "short_frac": 0.3}, "must divide batch_size \\* seq_len = 8192"),
                       ({"eval_seq_len": 0}, "eval_seq_len")]:
        with pytest.raises(ValueError, match=match):
            PretrainConfig.from_dict({**base, **bad})
    assert PretrainConfig.from_dict({**base, "short_seq_len": 64, "short_frac": 0.3}).short_frac == 0.3


def test_time_clock_needs_a_budget_and_a_known_name():
    with pytest.raises(ValueError, match="needs max_minutes"):
        PretrainConfig(kind="encoder", train_source="x", schedule_clock="time")
    with pytest.raises(ValueError, match="schedule_clock"):
        PretrainConfig(kind="encoder", train_source="x", schedule_clock="wall", max_minutes=1)
    assert PretrainConfig(kind="encoder", train_source="x", schedule_clock="time", max_minutes=1).max_minutes == 1


def test_time_clock_schedule_ends_with_the_budget(data, tmp_path, monkeypatch):
    # a fake clock that advances 1 s per reading: the 30 s budget runs out long before max_steps,
    # and the schedule on the clock has decayed the rate to (almost) zero by then, where the step
    # clock would still be near the peak
    import plmodels.training.loop as train

    fake = iter(range(0, 10**6))
    monkeypatch.setattr(train.time, "monotonic", lambda: float(next(fake)))
    final = pretrain(toy_config(data, max_steps=1000, warmup_steps=2, max_minutes=0.5, schedule_clock="time",
                          ckpt_log_spaced=False, eval_sequences=8), tmp_path / "run")
    state = json.loads((final / "train_state.json").read_text())
    card = json.loads((final / "card.json").read_text())
    assert card["stopped_by"] == "time budget" and state["step"] < 100
    last_lr = state["param_groups"][0]["lr"]
    assert last_lr < 0.1 * 3e-3, last_lr  # step clock at step < 100 of 1000: > 0.9 of the peak


def test_time_clock_warns_when_max_steps_would_end_the_run_first(data, tmp_path, monkeypatch, capsys):
    # 1 s per clock reading: 40 steps take a few minutes of an hour's budget, so max_steps ends the
    # run long before the clock does; the log must say so (once) and name a max_steps that fits
    import plmodels.training.loop as train

    fake = iter(range(0, 10**6))
    monkeypatch.setattr(train.time, "monotonic", lambda: float(next(fake)))
    final = pretrain(toy_config(data, max_steps=40, warmup_steps=4, max_minutes=60, schedule_clock="time", log_every=5,
                          ckpt_log_spaced=False, eval_every=0), tmp_path / "run")
    err = capsys.readouterr().err
    assert json.loads((final / "card.json").read_text())["stopped_by"] == "max_steps"
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "max_steps=40" in warnings[0], err
    suggested = int(warnings[0].rsplit(" ", 1)[1])
    assert suggested > 10 * 40   # an hour at a few seconds per step
    # a budget that runs out long before max_steps: the clock ends the run, no warning
    final = pretrain(toy_config(data, max_steps=1000, warmup_steps=2, max_minutes=5, schedule_clock="time", log_every=5,
                          ckpt_log_spaced=False, eval_every=0), tmp_path / "run2")
    err = capsys.readouterr().err
    assert json.loads((final / "card.json").read_text())["stopped_by"] == "time budget"
    assert "pretrain:   1% 10/1000 step" in err and "warning: " not in err, err
    assert "precision: fp32 (bf16: 'off', as set)" in err   # the start of the log says what it trains in


def test_shipped_configs_load():
    for name in ["encoder-tiny", "encoder-mini", "encoder-small", "encoder-base", "encoder-mini-rope",
                 "decoder-tiny", "decoder-mini", "decoder-small", "decoder-base"]:
        cfg = load_config(name)
        assert cfg.kind == name.split("-")[0]
    rope = load_config("encoder-mini-rope")
    assert rope.model["position"] == "rope" and rope.lr == 2e-3 and rope.batch_size == 64 and rope.clip == 0.5


def test_log_spaced_checkpoint_steps(data, tmp_path):
    cfg = toy_config(data, max_steps=40, ckpt_every=10)
    assert [s for s in range(1, 41) if should_checkpoint(s, cfg)] == [1, 2, 4, 8, 10, 16, 20, 30, 32, 40]
    pretrain(toy_config(data, max_steps=5), tmp_path / "run")
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_0000001", "step_0000002", "step_0000004"]
