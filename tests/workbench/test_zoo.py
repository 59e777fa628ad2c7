"""`workbench zoo` on configs/zoo-tiny.json (four systems: a BERT, the same BERT with RoPE instead of
learned positions, an ELMo and a T5, two pretraining seeds each, a few steps): the expansion, every step
of the study, the zoo's tables on what the pipeline really wrote, the statistics against a
recomputation from the written per-item results, no claim at two seeds a system, each comparison's
contrast and compute, and a second run that skips every step."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.multibootstrap import held_out_best, holm, layer_curve, multi_bootstrap, score
from tests.apps.fixtures import app_page
from workbench.analyses.zoo import COMPARISON_COLUMNS, adjust_claims, contrast, item_arrays
from workbench.core.results import load_table
from workbench.presentation import views
from workbench.presentation.report import heads_section
from workbench.zoo import NO_TIME_LIMIT, ZooConfig, expand_zoo, load_zoo, run_zoo, step_budget_overrides

ZOO_TINY = Path(__file__).resolve().parents[2] / "configs" / "zoo-tiny.json"
SYSTEMS = {"bert": [0, 1], "bert-rope": [0, 1], "elmo": [0, 1], "t5": [0, 1]}


def _script(name: str):
    """scripts/<name>.py as a module (the scripts folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ZOO_TINY.parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_expansion_shares_one_tokenizer_and_skips_heads_where_there_are_none():
    cfg = expand_zoo(load_zoo(ZOO_TINY))
    names = [f"{s}-s{k}" for s in SYSTEMS for k in (0, 1)]
    assert list(cfg["models"]) == names
    assert all(cfg["models"][n].get("tokenizer_from") == "bert-s0" for n in names[1:])
    assert "tokenizer_from" not in cfg["models"]["bert-s0"]
    assert [cfg["models"][n]["overrides"]["seed"] for n in names] == [0, 1] * len(SYSTEMS)
    assert cfg["probe"]["config"]["keep_items"] is True and cfg["probe"]["models"] == names
    assert cfg["heads"]["models"] == cfg["prune"]["models"] == ["bert-s0", "bert-s1", "bert-rope-s0", "bert-rope-s1",
                                                                "t5-s0", "t5-s1"]
    assert cfg["zoo"]["systems"] == SYSTEMS
    assert cfg["zoo"]["primary"] == {"pos": "best_layer_score", "structural_distance": "best_layer_score"}


def test_a_system_whose_lm_head_is_untrained_is_read_for_heads_but_not_pruned():
    # pruning scores heads by the LM loss, and ELECTRA's discriminator has no trained LM head (its card
    # says so, and workbench.analyses.prune refuses it): the expansion leaves it out of "prune" only
    zoo = ZooConfig.from_dict({"name": "z", "seeds": [0], "prune": {}, "heads": {},
                               "systems": {"bert": {"recipe": "bert-tiny"}, "electra": {"recipe": "electra-tiny"},
                                           "bert-electra": {"recipe": "bert-tiny", "overrides": {"objective": "electra"}}}})
    cfg = expand_zoo(zoo)
    assert cfg["heads"]["models"] == ["bert-s0", "electra-s0", "bert-electra-s0"]
    assert cfg["prune"]["models"] == ["bert-s0"]


def test_a_teacher_trains_first_and_bad_configs_name_the_field():
    zoo = ZooConfig.from_dict({"name": "z", "seeds": [3], "systems": {
        "distilbert": {"recipe": "distilbert-tiny", "teacher": "bert"}, "bert": {"recipe": "bert-tiny"}}})
    cfg = expand_zoo(zoo)
    assert list(cfg["models"]) == ["bert-s3", "distilbert-s3"]
    assert cfg["models"]["distilbert-s3"]["teacher_from"] == "bert-s3"
    with pytest.raises(ValueError, match="teacher='gpt' is not a system"):
        ZooConfig.from_dict({"name": "z", "systems": {"a": {"recipe": "bert-tiny", "teacher": "gpt"}}})
    with pytest.raises(ValueError, match="seeds must be distinct"):
        ZooConfig.from_dict({"name": "z", "seeds": [0, 0], "systems": {"a": {"recipe": "bert-tiny"}}})
    with pytest.raises(ValueError, match="systems.a: needs 'recipe'"):
        ZooConfig.from_dict({"name": "z", "systems": {"a": {"recipes": "bert-tiny"}}})
    one = {"name": "z", "tasks": ["pos", "structural_depth"], "systems": {"a": {"recipe": "bert-tiny"}}}
    with pytest.raises(ValueError, match=r"primary.ner: not one of the zoo's tasks \['pos', 'structural_depth'\]"):
        ZooConfig.from_dict({**one, "primary": {"ner": "best_layer_score"}})
    with pytest.raises(ValueError, match=r"primary.pos='mdl': choose one of \['best_layer_score', 'e_delta'\]"):
        ZooConfig.from_dict({**one, "primary": {"pos": "mdl"}})
    with pytest.raises(ValueError, match="primary.structural_depth: a structural probe has no cumulative"):
        ZooConfig.from_dict({**one, "primary": {"structural_depth": "e_delta"}})


def test_a_zoo_runs_steps_at_once_only_with_budgets_in_updates():
    """Checkpoints trained at once share the CPU: with a wall-clock budget each would train fewer updates
    than one step at a time, so workers > 1 needs update budgets; the expansion carries `workers` to the run."""
    one = {"name": "z", "systems": {"a": {"recipe": "bert-tiny"}}}
    with pytest.raises(ValueError, match=r"workers=2 needs budgets in updates .* wall-clock budget of 15 min"):
        ZooConfig.from_dict({**one, "workers": 2})
    zoo = ZooConfig.from_dict({**one, "workers": 2, "budget_minutes": NO_TIME_LIMIT})
    assert expand_zoo(zoo)["workers"] == 2
    assert expand_zoo(ZooConfig.from_dict(one))["workers"] == 1


@pytest.mark.slow
def test_the_tiny_zoo_writes_every_table_and_resumes(zoo_run, tmp_path, capfd):
    run = zoo_run
    training = load_table(run, "zoo_training")
    assert sorted(training["model"]) == sorted(f"{s}-s{k}" for s in SYSTEMS for k in (0, 1))
    assert (training["steps"] == 20).all() and (training["flops_6nd"] == 6.0 * training["n_parameters"]
                                                 * training["tokens"]).all()
    # the same tokenizer everywhere: every model was probed on the same test items
    items = load_table(run, "probe_items")
    assert items.groupby(["model", "task", "mode", "layer"])["item"].count().groupby("task").nunique().eq(1).all()
    # statistics: the layer curve of each system recomputed from the per-item table
    stats = load_table(run, "zoo_stats")
    for system, seeds in SYSTEMS.items():
        single, layers = item_arrays(items, [f"{system}-s{k}" for k in seeds], "pos", "single")
        want = layer_curve(single, "micro_f1", n_boot=200, seed=0)
        got = stats[(stats.statistic == "layer_score") & (stats.task == "pos") & (stats.system == system)]
        assert got["layer"].tolist() == layers
        np.testing.assert_allclose(got["value"], [w.value for w in want])
        np.testing.assert_allclose(got["ci_low"], [w.low for w in want])
        # the procedure-level interval is at least as wide as the items-only one, seed by seed data
        assert ((got["ci_high"] - got["ci_low"]) >= (got["item_ci_high"] - got["item_ci_low"]) - 1e-9).all()
        per_seed = [score(single[k, -1], "micro_f1") for k in range(len(seeds))]
        assert got["value"].iloc[-1] == pytest.approx(np.mean(per_seed))
        # the best layer chosen on held-out items: the cross-fitted items recomputed, their seed mean
        layer, chosen = held_out_best(single, "micro_f1")
        row = stats[(stats.statistic == "best_layer_score") & (stats.task == "pos") & (stats.system == system)].iloc[0]
        assert row["layer"] == (layers[layer] if layer >= 0 else -1)
        assert row["value"] == pytest.approx(multi_bootstrap(chosen, "micro_f1", n_boot=1).value)
    assert set(stats["statistic"]) >= {"layer_score", "best_layer_score", "e_delta", "prunable_share"}
    assert set(stats.loc[stats.statistic == "prunable_share", "system"]) == {"bert", "bert-rope", "t5"}  # not ELMo
    assert (stats.loc[stats.statistic == "prunable_share", "interval"] == "seeds-only").all()
    comps = load_table(run, "zoo_comparisons")
    assert list(comps.columns) == COMPARISON_COLUMNS
    best = comps[(comps.statistic == "best_layer_score") & (comps.task == "pos")]
    assert len(best) == 6 and (best["n_seed_pairs"] == 4).all() and best["flips"].between(0, 4).all()
    # two seeds a system: no comparison is claimed, on any statistic, before or after Holm's correction,
    # while the intervals and p-values are there
    assert (comps["claim"] == "no claim").all() and (comps["claim_unadjusted"] == "no claim").all()
    assert (comps["n_seeds"] == 2).all() and comps.loc[comps["statistic"] == "best_layer_score", "ci_low"].notna().all()
    assert set(comps.loc[comps.statistic == "e_delta", "task"]) == {"pos"}   # no cumulative structural probes
    primary = comps[comps["family"] == "primary"]
    assert set(primary["statistic"]) == {"best_layer_score"} and len(primary) == 12
    # every system beside the structural probe's model-free trees, on its own items, in the floor family
    floors = comps[comps["system_b"].str.startswith("floor:")]
    assert (floors["family"] == "floor").all()
    tree = floors[floors.task == "structural_distance"]
    assert set(zip(tree.system_a, tree.system_b)) >= {(s, f"floor:{f}") for s in SYSTEMS
                                                      for f in ("chain", "position", "random_tree")}
    np.testing.assert_allclose(primary["p_holm"], holm(primary["p_value"]))
    # what each pair differs in, from the checkpoints: the positions arm is the architecture alone
    pair = comps[(comps.system_a == "bert") & (comps.system_b == "bert-rope")].iloc[0]
    assert (pair["contrast"], pair["architecture_diff"]) == ("architecture only", "position: learned vs rope")
    pair = comps[(comps.system_a == "bert") & (comps.system_b == "t5")].iloc[0]
    assert (pair["contrast"], pair["architecture_diff"]) == ("objective + architecture", "kind: encoder vs seq2seq")
    # compute beside every comparison: each system's seed means of zoo_training, the flag above 25%
    per_system = training.groupby("system")[["steps", "tokens", "flops_6nd"]].mean()
    for r in comps[comps.system_b.isin(SYSTEMS)].itertuples():   # (not a system against its minimal-pair floor)
        a, b = per_system.loc[r.system_a], per_system.loc[r.system_b]
        assert (r.steps_a, r.tokens_a, r.flops_a, r.flops_b) == (a.steps, a.tokens, a.flops_6nd, b.flops_6nd)
        assert r.compute_ratio == pytest.approx(max(a.flops_6nd, b.flops_6nd) / min(a.flops_6nd, b.flops_6nd))
        assert r.budget_differs == (r.compute_ratio > 1.25)
    assert comps.loc[(comps.system_a == "bert") & (comps.system_b == "t5"), "budget_differs"].all()
    # the structural probe's UUAS, carried as counts whose micro F1 it is, for every system (no E_delta:
    # no cumulative structural probes)
    probing = load_table(run, "probing")
    for system, seeds in SYSTEMS.items():
        single, layers = item_arrays(items, [f"{system}-s{k}" for k in seeds], "structural_distance", "single")
        uuas = probing[(probing.task == "structural_distance") & (probing.metric == "uuas") & (probing["mode"] == "single")
                       & (probing.model == f"{system}-s0") & (probing.seed == 0)].sort_values("layer")
        np.testing.assert_allclose([score(single[0, i], "micro_f1") for i in range(len(layers))], uuas["value"])
    structural = stats[stats.task == "structural_distance"]
    assert set(structural.loc[structural.statistic == "best_layer_score", "system"]) == set(SYSTEMS)
    assert "e_delta" not in set(structural["statistic"])
    cka = load_table(run, "zoo_cka")
    assert len(cka.groupby(["model_a", "model_b"])) == 28  # every pair of the eight checkpoints
    assert cka["value"].between(-1e-6, 1 + 1e-6).all()
    # a second run: every step unchanged
    capfd.readouterr()
    run_zoo(ZOO_TINY, run_dir=run)
    err = capfd.readouterr().err
    ran = [line for line in err.splitlines() if ": running" in line]
    assert not ran, ran
    assert json.loads((run / "run.json").read_text())["steps"]["zoo:stats"]["status"] == "done"


def test_holm_claims_within_each_family():
    """adjust_claims on a hand-made table: the primary family is each task's declared statistic (best-layer
    score where none is declared), Holm within each family, a claim only where the adjusted p <= 0.05."""
    rows = [("best_layer_score", "pos", "b", 0.001, "A > B"), ("best_layer_score", "ner", "b", 0.03, "B > A"),
            ("e_delta", "pos", "b", 0.004, "A > B"), ("e_delta", "ner", "b", 0.02, "A > B"),
            ("heads_syntactic", "", "b", 0.3, "no claim"),
            ("best_layer_score", "pos", "floor:random_init", 0.02, "A > B"),
            ("best_layer_score", "pos", "floor:chain", 0.01, "A > B")]
    df = pd.DataFrame([{"statistic": st, "task": t, "system_a": "a", "system_b": b, "p_value": p, "claim": c}
                       for st, t, b, p, c in rows])
    out = adjust_claims(df, {"ner": "e_delta"})
    # a system against its floors: a family of its own, whatever the statistic
    assert out["family"].tolist() == ["primary", "secondary", "secondary", "primary", "secondary", "floor", "floor"]
    np.testing.assert_allclose(out["p_holm"], [0.002, 0.06, 0.012, 0.02, 0.3, 0.02, 0.02])
    assert out["claim"].tolist() == ["A > B", "no claim", "A > B", "A > B", "no claim", "A > B", "A > B"]
    assert out["claim_unadjusted"].tolist() == df["claim"].tolist()


def test_contrast_reads_the_objective_and_the_model_config():
    enc = {"objective": "mlm", "architecture": {"kind": "encoder", "position": "rope", "n_layers": 4}}
    assert contrast(enc, {**enc, "objective": "rtd"}) == ("objective only", "")
    learned = {**enc, "architecture": {**enc["architecture"], "position": "learned"}}
    assert contrast(enc, learned) == ("architecture only", "position: rope vs learned")
    assert contrast(enc, {**learned, "objective": "rtd"})[0] == "objective + architecture"
    assert contrast(enc, enc) == ("training only", "")


def test_zoo_configs_expand(tmp_path):
    """The shipped zoo configs are valid and expand (no training)."""
    for name in ("zoo-small.json", "zoo.json", "zoo-steps.json"):
        cfg = expand_zoo(load_zoo(ZOO_TINY.parent / name))
        assert cfg["probe"]["config"]["keep_items"] and cfg["zoo"]["systems"]
        assert len(cfg["models"]) == sum(len(v) for v in cfg["zoo"]["systems"].values())
        assert isinstance(pd.DataFrame(cfg["models"]).T, pd.DataFrame)
    # zoo-steps.json is zoo.json with each system's budget in updates (scripts/zoo_calibrate.py)
    wall, steps = (expand_zoo(load_zoo(ZOO_TINY.parent / n)) for n in ("zoo.json", "zoo-steps.json"))
    assert list(wall["models"]) == list(steps["models"]) and wall["probe"] == steps["probe"]
    for name, spec in steps["models"].items():
        over = spec["overrides"]
        assert over["schedule_clock"] == "steps" and over["max_minutes"] == NO_TIME_LIMIT
        assert 0 < over["warmup_steps"] < over["max_steps"]
        assert {k: v for k, v in over.items() if k not in ("max_steps", "warmup_steps", "schedule_clock", "max_minutes")} \
            == {k: v for k, v in wall["models"][name]["overrides"].items()
                if k not in ("max_steps", "warmup_steps", "schedule_clock", "max_minutes")}


@pytest.mark.slow
def test_the_gpu_replay_fixes_each_systems_steps_to_the_cpu_zoos(zoo_run):
    replay = _script("zoo_replay")
    assert replay.seeds_arg("0-3") == [0, 1, 2, 3] and replay.seeds_arg("2,5") == [2, 5]
    over = replay.replay_overrides(zoo_run, load_zoo(ZOO_TINY))
    assert {s: o["overrides"]["max_steps"] for s, o in over["systems"].items()} == {s: 20 for s in SYSTEMS}
    cfg = expand_zoo(load_zoo(ZOO_TINY, {**over, "seeds": [0, 1, 2]}))
    assert len(cfg["models"]) == 3 * len(SYSTEMS) and cfg["models"]["t5-s2"]["overrides"]["schedule_clock"] == "steps"
    with pytest.raises(ValueError, match="no checkpoints of"):
        replay.replay_overrides(zoo_run, load_zoo(ZOO_TINY, {"systems": {"xlnet": {"recipe": "xlnet-tiny"}}}))


def test_a_step_budget_keeps_the_wall_clock_schedules_warmup_share():
    """zoo.json warms up for 2,000 of 20,000 scheduled steps on the clock (10 %), RoBERTa for 500 (2.5 %):
    fixed to 3,000 and 1,000 updates they warm up for 300 and 25, counted in steps, with no time limit."""
    zoo = load_zoo(ZOO_TINY.parent / "zoo.json")
    steps = {s: 3000 for s in zoo.systems} | {"roberta": 1000}
    over = step_budget_overrides(zoo, steps)
    cfg = expand_zoo(load_zoo(ZOO_TINY.parent / "zoo.json", over))
    bert, roberta = cfg["models"]["bert-s0"]["overrides"], cfg["models"]["roberta-s4"]["overrides"]
    assert (bert["max_steps"], bert["warmup_steps"], bert["schedule_clock"]) == (3000, 300, "steps")
    assert (roberta["max_steps"], roberta["warmup_steps"]) == (1000, 25)
    assert bert["max_minutes"] == roberta["max_minutes"] == NO_TIME_LIMIT
    assert bert["model"]["position"] == "rope"  # the system's own overrides stay
    # the positions ablation: BERT's recipe and overrides but learned positions, BERT's updates in zoo-steps
    learned = cfg["models"]["bert-learned-s0"]["overrides"]
    assert learned["model"] == {**bert["model"], "position": "learned"}
    assert {k: v for k, v in learned.items() if k != "model"} == {k: v for k, v in bert.items() if k != "model"} | {
        "seed": 0, "name": "bert-learned-s0"}
    steps = load_zoo(ZOO_TINY.parent / "zoo-steps.json")
    assert steps.systems["bert-learned"]["overrides"]["max_steps"] == steps.systems["bert"]["overrides"]["max_steps"]
    with pytest.raises(ValueError, match=r"no step count for the systems \['gpt'\]"):
        step_budget_overrides(zoo, {s: 10 for s in zoo.systems if s != "gpt"})


@pytest.mark.slow
def test_the_encoder_decoders_cross_heads_reach_the_report_and_the_heads_page(zoo_run, monkeypatch):
    """The zoo runs the cross-attention analysis on its T5 checkpoints; the report's heads section and
    the app's Heads page show each model's best head with the interval the table holds."""
    raw = load_table(zoo_run, "cross_heads")
    assert sorted(raw["model"].unique()) == ["t5-s0", "t5-s1"]
    best = views.cross_heads_best(zoo_run)
    for model, g in best.groupby("model"):
        acc = g.set_index("score").loc["align_acc"]
        want = raw[(raw.model == model) & (raw.score == "align_acc")]["value"].max()
        assert acc["value"] == pytest.approx(want) and acc["ci_low"] <= acc["value"] <= acc["ci_high"]
    findings = [f for f in heads_section(zoo_run).findings if "cross-attention head" in f]
    assert len(findings) == 2 and all("sentinels" in f for f in findings)
    at = app_page(monkeypatch, zoo_run.parent, "app_pages/heads.py")
    assert not at.exception
    assert "Cross-attention heads" in [h.value for h in at.subheader]
    assert len(at.dataframe[-1].value) == len(best)


def test_the_calibration_reads_the_rate_after_the_warm_up(tmp_path):
    """scripts/zoo_calibrate.py: updates per second over the second half of a short run (a slow start,
    compilation or the first evaluation, is left out), and a run too short to read one is refused."""
    calibrate = _script("zoo_calibrate")
    rows = [{"step": 0, "split": "eval", "metric": "loss", "value": 9.0, "time": 0.0}]
    rows += [{"step": s, "split": "train", "metric": "loss", "value": 5.0, "time": t}
             for s, t in ((10, 50.0), (20, 55.0), (30, 60.0), (50, 70.0), (70, 80.0))]  # 2 / s after a slow start
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert calibrate.update_rate(metrics, 100.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="too few training rows after 75 s"):
        calibrate.update_rate(metrics, 100.0 * 1.5)
