"""research/scripts/screen_equal_tokens.py: the settings that replay a clock-scheduled hour at equal steps."""
import json

import pandas as pd
import pytest

from plmodels.recipes import RECIPES

from .scripts import load_script


@pytest.fixture(scope="module")
def screen():
    return load_script("screen_equal_tokens")


def test_warmup_keeps_the_configs_share_and_the_schedule_runs_on_steps(screen, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"extends": str(RECIPES / "pretrain" / "decoder-mini-cram.json")}))
    s = screen.run_settings(cfg, {"max_steps": 1810, "seed": 1}, threads=2, dry=False)
    # the decoder config warms up over 6,720 of 22,400 steps: 30%, so 543 of 1,810
    assert s["warmup_steps"] == 543 and s["max_steps"] == 1810 and s["seed"] == 1
    assert s["schedule_clock"] == "steps" and s["max_minutes"] is None and s["bf16"] == "off"
    assert screen.run_settings(cfg, {"max_steps": 1000, "warmup_steps": 7}, 2, False)["warmup_steps"] == 7
    assert screen.run_settings(cfg, {"max_steps": 1810}, 2, True)["max_steps"] == 3


def test_every_run_needs_max_steps(screen):
    with pytest.raises(ValueError, match="max_steps"):
        screen.run_settings(RECIPES / "pretrain" / "decoder-mini-cram.json", {"seed": 0}, 2, False)


def test_table_is_tidy(screen, tmp_path):
    rows = [{"run": "a", "tokens": 10, "first": {0: 0.5, 1: 0.6}, "last": {0: 0.55, 1: 0.7}}]
    screen.write_table(rows, tmp_path / "t.parquet")
    df = pd.read_parquet(tmp_path / "t.parquet")
    assert list(df.columns) == ["run", "tokens", "pooling", "layer", "accuracy"]
    assert df.set_index(["pooling", "layer"])["accuracy"].to_dict() == {("first", 0): 0.5, ("first", 1): 0.6,
                                                                      ("last", 0): 0.55, ("last", 1): 0.7}
    assert not (tmp_path / "t.tmp").exists()


def test_table_keeps_only_the_probed_poolings(screen, tmp_path):
    screen.write_table([{"run": "a", "tokens": 10, "first": {0: 0.5, 1: 0.6}}], tmp_path / "t.parquet", ("first",))
    df = pd.read_parquet(tmp_path / "t.parquet")
    assert set(df["pooling"]) == {"first"} and len(df) == 2


def test_full_rows_one_per_run_and_the_summary_reads_them(screen, tmp_path):
    rows = [{"run": "s3", "eval_acc": 0.468, "pos_gain": 0.0499, "positional_max_tokens": 0.977,
             "det_margin": 0.208, "case_margin": 0.221, "targets_met": 4},
            {"run": "s2", "eval_acc": 0.464, "pos_gain": 0.0514, "positional_max_tokens": 0.96,
             "det_margin": 0.279, "case_margin": 0.265, "targets_met": 5}]
    screen.write_rows(rows, tmp_path / "t.parquet")
    df = pd.read_parquet(tmp_path / "t.parquet")
    assert list(df["run"]) == ["s2", "s3"] and df.set_index("run")["targets_met"].to_dict() == {"s2": 5, "s3": 4}
    line = screen.summary_line(rows[0], (), full=True)
    assert line == "acc 46.8 POS gain +4.99 ±1 tokens 97.7 det +20.8 case +22.1 targets 4/5"
    # a decoder row has no targets_met; the POS-only mode reads the per-layer dicts
    assert "targets" not in screen.summary_line({k: v for k, v in rows[1].items() if k != "targets_met"}, (), True)
    assert screen.summary_line({"first": {0: 0.80, 1: 0.83}}, ("first",), full=False) == "POS gain first +3.00"
