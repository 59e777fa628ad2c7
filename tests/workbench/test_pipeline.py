"""The main job on the `tiny` config: every step runs, the report holds every section, a second run
does nothing, and a run killed mid-step resumes and gives the same tables as an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from plmodels.recipes import RECIPES
from workbench.core.paths import data_root
from workbench.pipeline import (
    rerun_steps,
    NO_TIME_LIMIT,
    Step,
    _estimate,
    _eta,
    build_steps,
    load_run_config,
    run_pipeline,
    step_keys,
)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.json"

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")


def test_unknown_config_key_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "seed": 0, "models": {}, "probes": {}}))
    with pytest.raises(ValueError, match="probes"):
        load_run_config(bad)


def test_steps_follow_the_config():
    cfg = load_run_config(TINY)
    names = [s.name for s in build_steps(cfg)]
    assert names[0] == "tasks" and names[-1] == "report"
    assert names.index("pretrain:encoder") < names.index("finetune:encoder-sst2") < names.index(
        "compare:encoder:encoder-sst2")
    assert {"probe:encoder", "probe:decoder", "heads:encoder", "heads:decoder", "prune:encoder", "gate:encoder",
            "amnesic:encoder"} <= set(names)
    assert names.index("heads:encoder") < names.index("gate:encoder") > names.index("prune:encoder")
    assert {"pairs:encoder", "pairs:decoder", "competence:encoder", "competence:decoder"} <= set(names)
    assert names.index("pretrain:decoder") < names.index("competence:decoder")
    assert "competence:encoder-sst2" not in names     # a finetuned model has no held-out LM text of its own


def test_keys_follow_config_files_and_upstream_steps(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"seeds": [0]}))
    cfg = load_run_config(TINY)
    cfg["probe"] = dict(cfg["probe"], config=str(probe))
    before = step_keys(cfg)
    probe.write_text(json.dumps({"seeds": [0, 1]}))          # same path, new content
    after = step_keys(cfg)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"probe:encoder", "probe:decoder", "report"}
    cfg["seed"] = 1                                            # the seed reaches every step
    assert all(step_keys(cfg)[k] != after[k] for k in after)


def test_keys_follow_the_base_of_a_config_that_extends_one(tmp_path):
    """A pretraining config with "extends": the step key reads the base's content too."""
    base = tmp_path / "base.json"
    base.write_text((RECIPES / "pretrain" / "decoder-mini.json").read_text())
    derived = tmp_path / "derived.json"
    derived.write_text(json.dumps({"extends": "base.json", "name": "derived", "batch_size": 4}))
    cfg = load_run_config(TINY)
    cfg["models"]["decoder"] = dict(cfg["models"]["decoder"], pretrain=str(derived))
    before = step_keys(cfg)
    base.write_text(json.dumps(dict(json.loads(base.read_text()), lr=1e-4)))   # only the base changes
    after = step_keys(cfg)
    assert before["pretrain:decoder"] != after["pretrain:decoder"]
    assert before["pretrain:encoder"] == after["pretrain:encoder"]


def test_rerun_runs_the_named_steps_and_their_readers_whatever_the_cache_says(tmp_path):
    """--rerun (after a code change, which no step key holds): the named step or every step of a named
    kind, and every step that reads one, transitively; the rest stay skipped. A name that selects no
    step is refused with the kinds there are, before run.json is touched."""
    cfg = load_run_config(TINY)
    steps, keys = build_steps(cfg), step_keys(cfg)
    (tmp_path / "run.json").write_text(json.dumps({"steps": {s.name: {"status": "done", "key": keys[s.name]}
                                                             for s in steps}}))
    ran: list[list[str]] = []

    def record(steps, todo, *rest):
        ran.append([s.name for s in todo])

    run_pipeline(TINY, run_dir=tmp_path, runner=record)
    run_pipeline(TINY, run_dir=tmp_path, runner=record, rerun=["competence:decoder"])
    run_pipeline(TINY, run_dir=tmp_path, runner=record, rerun=["probe", "gate:encoder"])
    assert ran == [[], ["competence:decoder", "report"], ["probe:encoder", "probe:decoder", "gate:encoder", "report"]]
    # transitively: heads:encoder is read by gate:encoder, which the report reads
    assert rerun_steps(steps, ["heads:encoder"]) == {"heads:encoder", "gate:encoder", "report"}
    before = (tmp_path / "run.json").read_text()
    with pytest.raises(ValueError, match=r"--rerun prob: no step .* kinds: tasks, pretrain, .*competence, report"):
        run_pipeline(TINY, run_dir=tmp_path, runner=record, rerun=["prob"])
    assert (tmp_path / "run.json").read_text() == before


def _tables(run: Path) -> dict[str, pd.DataFrame]:
    out = {}
    for p in sorted((run / "tables").glob("*.parquet")):
        df = pd.read_parquet(p)
        out[p.stem] = df.sort_values(list(df.columns)).reset_index(drop=True)
    return out


def _steps(run: Path) -> dict:
    try:
        return json.loads((run / "run.json").read_text()).get("steps", {})
    except (OSError, ValueError):
        return {}


# Tables whose values include wall-clock measurements (speed), which no two runs share.
TIMED = {"pruned_speed"}


@pytest.mark.slow
def test_tiny_pipeline_end_to_end_cache_and_resume(tiny_run, tmp_path, capfd):
    run_a = tiny_run                      # run_pipeline(TINY) into a fresh folder, once per session
    steps = _steps(run_a)
    expected = [s.name for s in build_steps(load_run_config(TINY))]
    assert set(steps) == set(expected)          # two at a time (tiny.json's workers): in the order they started
    assert all(s["status"] == "done" for s in steps.values())
    for name in ("training", "probing", "probing_summary", "mix_weights", "heads", "heads_classes", "relations",
                 "importance", "pruning", "cka", "head_change", "frozen_vs_finetuned", "emergence", "gating",
                 "head_passport", "amnesic", "minimal_pairs", "minimal_pair_items", "competence", "interventions",
                 "interventions_attribution"):
        assert (run_a / "tables" / f"{name}.parquet").exists(), name
    html = (run_a / "report" / "report.html").read_text()
    md = (run_a / "report" / "summary.md").read_text()
    for section in ("Models and training", "Per-layer probing", "Attention heads", "Head importance and pruning",
                    "Frozen vs finetuned", "How structure emerges", "Minimal pairs (behaviour)", "Structural probes"):
        assert section.lower() in html.lower(), section
        assert section.lower() in md.lower(), section
    _faces_read_what_the_pipeline_wrote(run_a, md)
    info = json.loads((run_a / "run.json").read_text())
    assert info["seed"] == 0 and info["code_version"] and info["data_checksums"]

    # A second run changes nothing: every step is skipped and no table is rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in (run_a / "tables").glob("*.parquet")}
    capfd.readouterr()
    run_pipeline(TINY, run_dir=run_a)
    err = capfd.readouterr().err
    assert err.count("unchanged, skipped") == len(expected)
    assert stamps == {p: p.stat().st_mtime_ns for p in (run_a / "tables").glob("*.parquet")}

    # A run killed in the middle of an analysis step resumes there and ends with the same tables.
    # It starts from run A's trained models (pretraining resumption has its own bit-exact test), so
    # the comparison is not blurred by tokenizer training, which the tokenizers library does not
    # make deterministic.
    run_b = tmp_path / "b"
    shutil.copytree(run_a / "models", run_b / "models")
    shutil.copytree(run_a / "tasks", run_b / "tasks")
    (run_b / "tables").mkdir()
    shutil.copy(run_a / "tables" / "training.parquet", run_b / "tables")   # what the kept pretrain steps wrote
    keep = {k: v for k, v in steps.items() if k.split(":")[0] in ("tasks", "pretrain", "finetune")}
    (run_b / "run.json").write_text(json.dumps({"steps": keep}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(TINY), "--run-dir", str(run_b)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while _steps(run_b).get("probe:decoder", {}).get("status") != "running":
        assert proc.poll() is None, "the run ended before reaching probe:decoder"
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _steps(run_b)["probe:decoder"]["status"] == "running"
    capfd.readouterr()
    run_pipeline(TINY, run_dir=run_b)
    assert "probe:decoder: running (resuming)" in capfd.readouterr().err
    a, b = _tables(run_a), _tables(run_b)
    assert set(a) == set(b)
    for name in set(a) - TIMED:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=False, rtol=1e-5, atol=1e-6, obj=name)


def _faces_read_what_the_pipeline_wrote(run: Path, md: str) -> None:
    """The floors' faces on the tiny run's own tables: every minimal-pair scorer of both models beside its
    four floors, the competence line opening the sections with both pretrained models, the structural
    floors in the report (issue 74 part 5, issue 77 part 4)."""
    from workbench.presentation import views

    pairs = pd.read_parquet(run / "tables" / "minimal_pairs.parquet")
    assert {"floor:chance", "floor:frequency", "floor:bigram", "floor:random_init:clm",
            "floor:random_init:masked_word", "clm", "masked_word"} <= set(pairs["scorer"])
    summary = views.pairs_summary(run)
    assert set(summary["model"]) == {"encoder", "decoder"} and summary[["chance", "frequency", "bigram",
                                                                          "random_init"]].notna().all().all()
    comp = pd.read_parquet(run / "tables" / "competence.parquet")
    assert set(comp["model"]) == {"encoder", "decoder"}
    assert set(comp["metric"]) == {"lm_loss", "lm_acc", "unigram_loss", "bigram_loss"}
    line = "*How far each model got, held-out LM loss in nats per target"
    for title in ("Per-layer probing", "Structural probes", "Minimal pairs (behaviour)", "Attention heads"):
        body = md.split(f"## {title}\n\n", 1)[1]
        assert body.startswith(line) and "encoder " in body.split("\n", 1)[0], title
    # the tiny tokenizers split the verbs: the mediation step scores each form by all its subwords
    iv = pd.read_parquet(run / "tables" / "interventions.parquet")
    te = iv[(iv["site"] == "input") & (iv["metric"] == "te_log")]
    assert set(te["model"]) == {"encoder", "decoder"} and set(te["variant"]) == {"trained", "random_init"}
    assert (te["n_items"] > 0).all() and te["value"].notna().all()
    assert "## Interventions (causal mediation of agreement)" in md
    floors = views.structural_floors(run)
    assert set(floors["source"]) == {"model", "random_tree", "chain", "position", "random_init"}
    assert "Best layer beside the four floors" in md


def test_the_eta_reads_a_time_budget_and_otherwise_the_finished_steps_of_a_kind():
    """A pretraining step with a wall-clock budget is estimated from it (+10 %); one budgeted in
    updates (max_minutes = NO_TIME_LIMIT, a zoo's step budgets) and every other kind from the mean of
    the finished steps of their kind, else unknown."""
    def step(name, minutes=None):
        return Step(name, {"overrides": {} if minutes is None else {"max_minutes": minutes}}, lambda ctx: {})

    done = {"pretrain": [600.0, 800.0], "probe": [30.0]}
    assert _estimate(step("pretrain:a", 15.0), done) == pytest.approx(990.0)
    assert _estimate(step("pretrain:a", NO_TIME_LIMIT), done) == 700.0
    assert _estimate(step("pretrain:a", NO_TIME_LIMIT), {}) is None
    assert _estimate(step("pretrain:a"), done) is None
    assert _estimate(step("probe:a"), done) == 30.0 and _estimate(step("heads:a"), done) is None
    assert _eta([step("pretrain:a", 15.0), step("probe:a")], 0, done) == "about 17 min left"
