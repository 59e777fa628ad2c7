"""scripts/screen_equal_tokens.py: the settings that replay a clock-scheduled hour at equal steps."""
import json

import pandas as pd
import pytest

from .conftest import ROOT, load_script


@pytest.fixture(scope="module")
def screen():
    return load_script("screen_equal_tokens")


def test_warmup_keeps_the_configs_share_and_the_schedule_runs_on_steps(screen, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"extends": str(ROOT / "configs/pretrain/decoder-mini-cram.json")}))
    s = screen.run_settings(cfg, {"max_steps": 1810, "seed": 1}, threads=2, dry=False)
    # the decoder config warms up over 6,720 of 22,400 steps: 30%, so 543 of 1,810
    assert s["warmup_steps"] == 543 and s["max_steps"] == 1810 and s["seed"] == 1
    assert s["schedule_clock"] == "steps" and s["max_minutes"] is None and s["bf16"] == "off"
    assert screen.run_settings(cfg, {"max_steps": 1000, "warmup_steps": 7}, 2, False)["warmup_steps"] == 7
    assert screen.run_settings(cfg, {"max_steps": 1810}, 2, True)["max_steps"] == 3


def test_every_run_needs_max_steps(screen):
    with pytest.raises(ValueError, match="max_steps"):
        screen.run_settings(ROOT / "configs/pretrain/decoder-mini-cram.json", {"seed": 0}, 2, False)


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
