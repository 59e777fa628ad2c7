"""The configs shipped in configs/ load, and the recipes differ from each other only where they say.

A typo in a key, or a recipe change that reached one file and not the other, would otherwise only
show up an hour into a run. (The ablation specs of research/ are checked in research/tests.)
"""
from pathlib import Path

import pytest

from plmodels.recipes import RECIPES
from plmodels.training import load_config
from probes.heads import HeadConfig
from workbench.analyses.amnesic import AmnesicRunConfig
from workbench.analyses.compare import CompareRunConfig
from workbench.analyses.gating import GateRunConfig
from workbench.analyses.probing import ProbeRunConfig
from workbench.analyses.prune import PruneRunConfig

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = sorted((RECIPES / "pretrain").glob("*.json"))


ANALYSIS_DEFAULTS = {"probe": ProbeRunConfig, "prune": PruneRunConfig, "compare": CompareRunConfig,
                     "heads": HeadConfig, "gate": GateRunConfig, "amnesic": AmnesicRunConfig}


@pytest.mark.parametrize("name", sorted(ANALYSIS_DEFAULTS))
def test_the_analysis_config_files_are_copies_of_the_code_defaults(name):
    """configs/<name>.json is the defaults written out, to copy and edit: the code, not the file,
    is what runs when no --config is given (so a wheel install behaves as a clone does)."""
    cls = ANALYSIS_DEFAULTS[name]
    assert cls.load(ROOT / "configs" / f"{name}.json") == cls()


@pytest.mark.parametrize("path", PRETRAIN, ids=[p.stem for p in PRETRAIN])
def test_pretrain_configs_load(path):
    if path.stem.startswith("distilbert"):  # a student needs its teacher, named on the command line
        with pytest.raises(ValueError, match="objective_args.teacher"):
            load_config(path)
        cfg = load_config(path, {"objective_args": {"teacher": "runs/bert-mini/final"}})
    else:
        cfg = load_config(path)
    assert cfg.name == path.stem


def test_the_fp32_encoder_config_is_the_recipe_at_batch_32():
    """encoder-mini-cram-fp32.json (research/notebook.md, "Batch 32 on a CPU without native bf16") is the
    recipe with half the batch and twice the steps, so its warmup stays 10% of the hour, and its own
    peak lr: 1.06e-3, the recipe's 1.5e-3 of the time scaled by sqrt(1/2) for the half batch (section
    2, "The fp32 config at lr 1.06e-3"); the recipe's peak moved to 1e-3 on 2026-11-28 on bf16 hours
    and GPU replays, which say nothing of the fp32 hour. Any other difference would be a recipe
    change that reached one file and not the other."""
    recipe = load_config(RECIPES / "pretrain" / "encoder-mini-cram.json").to_dict()
    fp32 = load_config(RECIPES / "pretrain" / "encoder-mini-cram-fp32.json").to_dict()
    changed = {k for k in recipe.keys() | fp32.keys() if recipe.get(k) != fp32.get(k)}
    assert changed == {"name", "batch_size", "max_steps", "warmup_steps", "lr", "compile"}
    assert recipe["compile"] and not fp32["compile"]  # compile: 1.04x on the AVX2 EPYC's fp32 step, not worth it (docs/training.md)
    assert fp32["batch_size"] * 2 == recipe["batch_size"] and fp32["max_steps"] == 2 * recipe["max_steps"]
    assert fp32["lr"] == 0.00106 and abs(fp32["lr"] - 0.0015 * 0.5 ** 0.5) < 1e-5 and recipe["lr"] == 0.001
    assert fp32["warmup_steps"] / fp32["max_steps"] == recipe["warmup_steps"] / recipe["max_steps"] == 0.1
    assert fp32["schedule_clock"] == "time" and fp32["max_minutes"] == recipe["max_minutes"] == 60


def test_the_fp32_decoder_config_is_the_recipe_with_the_adaptive_output():
    """decoder-mini-cram-fp32.json (research/notebook.md, "The adaptive softmax for the decoder's hour")
    changes the output layer and nothing else: same tokenizer size, batch, lr and clock schedule."""
    recipe = load_config(RECIPES / "pretrain" / "decoder-mini-cram.json").to_dict()
    fp32 = load_config(RECIPES / "pretrain" / "decoder-mini-cram-fp32.json").to_dict()
    changed = {k for k in recipe.keys() | fp32.keys() if recipe.get(k) != fp32.get(k)}
    assert changed == {"name", "model"}
    model = {k: v for k, v in fp32["model"].items() if recipe["model"].get(k) != v}
    assert model == {"output": "adaptive", "tie_embeddings": False, "adaptive_cutoffs": [2000, 6000], "adaptive_div": 4.0}
    assert fp32["schedule_clock"] == "time" and fp32["max_minutes"] == 60 and fp32["vocab_size"] == 16000


RUNS = [ROOT / "configs" / f"{n}.json" for n in ("demo", "full", "tiny")]


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_every_pretraining_step_of_a_run_config_builds_a_config(path, monkeypatch):
    """The `workbench run` configs: each model's pretraining config with the run's overrides, as
    `workbench.pipeline` passes them to `pretrain` (a misspelt override would otherwise surface only
    when the run reaches that step)."""
    from workbench.pipeline import load_run_config

    monkeypatch.chdir(ROOT)
    models = load_run_config(path)["models"]
    built = {name: load_config(spec["pretrain"], dict(spec.get("overrides") or {}))
             for name, spec in models.items() if "pretrain" in spec}
    assert built, path
    if path.stem == "demo":
        # both demo models take many small steps (research/notebook.md 2b); the encoder's schedule runs on a
        # 5-minute clock, so a CPU too slow to reach max_steps still ends with the lr decayed
        enc, dec = built["encoder"], built["decoder"]
        assert enc.model["norm"] == "post" and enc.model["n_heads"] == 8 and enc.masking["rate"] == 0.25
        assert (enc.batch_size, enc.max_steps, enc.schedule_clock, enc.max_minutes) == (8, 1280, "time", 5.0)
        assert enc.lr == 0.0015   # the demo's figures (research/notebook.md 2b) were taken at this peak
        assert (dec.batch_size, dec.max_steps, dec.schedule_clock) == (8, 220, "steps")
