"""Every ablation spec of research/configs/ablations builds a valid config for each variant, and the
rounds keep the baselines their results were read against (research/notebook.md).

A typo in a variant's key, or a base recipe change that silently moves an ablation's baseline,
would otherwise only show up an hour into a run.
"""
import json
from pathlib import Path

import pytest

from plmodels.recipes import RECIPES
from plmodels.training import load_config
from research.ablate import AblationEval, load_spec, variant_config

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(p for p in (ROOT / "research" / "configs" / "ablations").glob("*.json")
               if "variants" in json.loads(p.read_text(encoding="utf-8")))


def spec_base(path: Path):
    """The spec, its AblationEval and its base config, as `run_ablation` builds them (bases are
    relative to the repository root, so call it from there)."""
    spec = load_spec(path)
    base = load_config(spec["base"], dict(spec.get("base_overrides") or {}))
    return spec, AblationEval.from_dict(spec.get("eval") or {}), base


def round_configs(name: str) -> dict:
    """{variant: PretrainConfig} of research/configs/ablations/<name>, at the spec's budget, as `run_ablation`
    builds them (call from the repository root)."""
    spec, ev, base = spec_base(ROOT / "research" / "configs" / "ablations" / name)
    return {v: variant_config(base, o, spec.get("budget_tokens"), ev, spec.get("budget_minutes"))
            for v, o in spec["variants"].items()}


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_ablation_variant_builds_a_config(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec, ev, base = spec_base(path)
    for name, overrides in spec["variants"].items():
        cfg = variant_config(base, overrides, spec.get("budget_tokens"), ev, spec.get("budget_minutes"))
        assert cfg.max_steps >= 1, name
        if "budget_minutes" in spec:
            assert cfg.schedule_clock == "time" and cfg.max_minutes == spec["budget_minutes"], name


def test_encoder_time_ablations_keep_the_pre_ablation_baseline(monkeypatch):
    """encoder-time.json's results (research/notebook.md, 1b) are against lr 2e-3 and 15% masking; the
    default recipe has moved on since, so the spec pins the old base in base_overrides."""
    monkeypatch.chdir(ROOT)
    built = round_configs("encoder-time.json")
    cram = built["cram"]
    assert cram.lr == 0.002 and cram.masking["rate"] == 0.15
    assert cram.warmup_steps == round(0.2 * cram.max_steps)
    m40 = built["m40_warmup35"]
    assert m40.masking["rate"] == 0.4 and m40.masking["mask_frac"] == 0.8  # nested keys merge
    assert m40.warmup_steps == round(0.35 * m40.max_steps)
    assert cram.model["norm"] == "pre" and cram.model["position"] == "rope" and cram.model["n_heads"] == 4
    recipe = load_config(RECIPES / "pretrain" / "encoder-mini-cram.json")
    assert (recipe.lr, recipe.masking["rate"]) == (0.001, 0.25)   # lr 1e-3 since 2026-11-28


def test_second_encoder_round_keeps_its_pre_ln_baseline(monkeypatch):
    """encoder-time-2.json's table (research/notebook.md, 1d) is against the pre-LN recipe with 4 heads; the
    recipe became post-LN after it, and then 8 heads, which must move neither its `recipe` row nor its
    `post_ln` variant."""
    monkeypatch.chdir(ROOT)
    built = round_configs("encoder-time-2.json")

    assert built["recipe"].model["norm"] == "pre" and built["recipe"].model["n_heads"] == 4
    assert built["post_ln"].model["norm"] == "post" and built["post_ln"].model["n_heads"] == 4
    assert built["alibi"].model == {**built["recipe"].model, "position": "alibi"}  # nested keys merge
    assert built["recipe"].lr == 0.0015   # the round's peak; the recipe's is 1e-3 since 2026-11-28
    recipe = load_config(RECIPES / "pretrain" / "encoder-mini-cram.json")
    assert recipe.model["norm"] == "post" and recipe.model["position"] == "rope"
    assert recipe.model["n_heads"] == 8 and recipe.preset == "mini"   # 8 heads of 32 on the mini's 256


def test_decoder_time_ablations_keep_a_ten_percent_warmup_baseline(monkeypatch):
    """decoder-time.json's table (research/notebook.md, 1c) is against a 10% warmup; the decoder recipe
    now warms up over 30% of the hour, which must not move the spec's `cram` baseline."""
    monkeypatch.chdir(ROOT)
    built = round_configs("decoder-time.json")
    cram = built["cram"]
    assert cram.warmup_steps == round(0.1 * cram.max_steps)
    assert cram.batch_size == 64   # the table's batch, pinned by base_overrides; the recipe has 32
    wu30 = built["warmup30"]
    assert wu30.warmup_steps == round(0.3 * wu30.max_steps)
    recipe = load_config(RECIPES / "pretrain" / "decoder-mini-cram.json")
    assert recipe.warmup_steps == round(0.3 * recipe.max_steps) and recipe.schedule_clock == "time"
    assert recipe.batch_size == 32


def test_third_encoder_round_is_the_post_ln_recipe_with_one_change_each(monkeypatch):
    """encoder-time-3.json's table (research/notebook.md, 1e) is against the post-LN recipe with 4 heads
    (wd 0.01, linear decay, 10% warmup). The recipe moved to 8 heads after it, so the spec pins 4 in
    base_overrides (as rounds 1b and 1d pin theirs); if the recipe moves again, this fails."""
    monkeypatch.chdir(ROOT)
    built = round_configs("encoder-time-3.json")

    control = built["recipe"]
    assert control.model["norm"] == "post" and control.model["position"] == "rope"
    assert control.model["n_heads"] == 4
    assert (control.lr, control.weight_decay, control.schedule, control.masking["rate"]) == (0.0015, 0.01, "linear", 0.25)
    assert control.warmup_steps == round(0.1 * control.max_steps)
    assert built["wd0.1"].weight_decay == 0.1
    wsd = built["wsd"]
    assert (wsd.schedule, wsd.decay_frac, wsd.warmup_steps) == ("wsd", 0.3, control.warmup_steps)
    onecycle = built["onecycle"]
    assert onecycle.schedule == "onecycle" and onecycle.warmup_steps == round(0.5 * onecycle.max_steps)
    for name in ("wd0.1", "wsd", "onecycle"):   # one change each: everything else is the control's
        other = built[name]
        changed = {k for k in ("lr", "weight_decay", "schedule", "decay_frac", "warmup_steps", "batch_size", "model", "masking")
                   if getattr(other, k) != getattr(control, k)}
        assert changed <= {"wd0.1": {"weight_decay"}, "wsd": {"schedule", "decay_frac"},
                           "onecycle": {"schedule", "warmup_steps"}}[name], (name, changed)


def test_fourth_encoder_round_changes_only_the_row_length_and_scores_on_one_held_out_set(monkeypatch):
    """encoder-time-4.json (research/notebook.md, 1f): every variant reads the recipe's 8,192 tokens a step
    and is scored on the same held-out rows of 128 tokens, whatever length it trains on."""
    monkeypatch.chdir(ROOT)
    built = round_configs("encoder-time-4.json")

    control = built["recipe"]
    assert control.model["norm"] == "post" and (control.seq_len, control.batch_size) == (128, 64)
    assert control.model["n_heads"] == 4   # pinned: the recipe has 8 heads since this round
    assert control.lr == 0.0015            # pinned: the recipe peaks at 1e-3 since 2026-11-28
    assert control.short_seq_len is None
    lengths = {"recipe": (128, 64, None), "seq64": (64, 128, None), "short64": (128, 64, 64), "seq256": (256, 32, None)}
    for name, (seq_len, batch, short) in lengths.items():
        cfg = built[name]
        assert (cfg.seq_len, cfg.batch_size, cfg.short_seq_len, cfg.eval_seq_len) == (seq_len, batch, short, 128), name
        assert cfg.batch_size * cfg.seq_len == 8192 and cfg.max_steps == control.max_steps, name
        assert cfg.warmup_steps == control.warmup_steps, name
        for k in ("lr", "weight_decay", "schedule", "model", "masking", "clip"):
            assert getattr(cfg, k) == getattr(control, k), (name, k)
    assert built["short64"].short_frac == 0.5


def test_fifth_encoder_round_changes_only_the_shape_and_its_control_is_the_fourth_rounds(monkeypatch):
    """encoder-time-5.json (research/notebook.md, 1g) reuses round 4's control run, so its control must be
    the same config; every variant keeps 64-dimensional heads and FFN = 4 x width."""
    monkeypatch.chdir(ROOT)
    built = {n: round_configs(n) for n in ("encoder-time-4.json", "encoder-time-5.json")}
    control = built["encoder-time-5.json"]["recipe"]
    assert control == built["encoder-time-4.json"]["recipe"]
    for name, cfg in built["encoder-time-5.json"].items():
        m = {**control.model, **cfg.model}
        shape = {k: m.get(k) for k in ("n_layers", "d_model", "n_heads", "d_ff")}
        if name == "recipe":
            assert shape["n_layers"] is None and shape["n_heads"] == 4   # the preset's 4 x 256, FFN 1024; 4 heads pinned
            continue
        assert shape["d_model"] == 64 * shape["n_heads"] and shape["d_ff"] == 4 * shape["d_model"], name
        rest = {k: v for k, v in cfg.model.items() if k not in shape}
        assert rest == {k: v for k, v in control.model.items() if k not in shape}, name
        assert (cfg.lr, cfg.batch_size, cfg.seq_len, cfg.warmup_steps, cfg.masking) == (
            control.lr, control.batch_size, control.seq_len, control.warmup_steps, control.masking), name
