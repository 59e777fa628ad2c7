"""Imported checkpoint suites as zoo systems (issue 79): two random "suites" saved in the Hugging Face
layout by the test (a small BERT and a small GPT-NeoX, two seeds x two steps, each checkpoint its own
random weights), run through `workbench zoo` end to end: every checkpoint imported once with its
provenance on the card and in `zoo_checkpoints`, probing, heads and the multi-bootstrap over the
suite's seeds in `zoo_stats`, emergence rows at the suite's steps and tokens, and a second run with
one more step that imports only that step. Also: a bad suite entry names the field (and the folder)
before any work, and the shipped MultiBERTs / Pythia configs are valid zoo configs whose folders a
user without them is told about in one line."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from plmodels.checkpoint import file_sha256, read_card
from probes.multibootstrap import held_out_best, multi_bootstrap
from tests.plmodels.hf_bert_folder import save_bert_folder
from tests.plmodels.hf_files import write_gpt2_files
from workbench.analyses.zoo import import_suite, item_arrays
from workbench.core.paths import data_root
from workbench.core.results import load_table
from workbench.pipeline import validate_run_config
from workbench.zoo import ZooConfig, check_systems, expand_zoo, load_zoo, run_zoo

transformers = pytest.importorskip("transformers")   # the reference builds the suites' checkpoints
REPO = Path(__file__).resolve().parents[2]
SEEDS, STEPS = [0, 1], [0, 100]
TOKENS_PER_STEP = {"bert": 131072, "pythia": 2097152}


def _bert(folder: Path, seed: int, step: int) -> None:
    torch.manual_seed(1000 * seed + step)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=512)
    save_bert_folder(transformers.BertForMaskedLM(cfg).eval(), folder)


def _neox(folder: Path, seed: int, step: int) -> None:
    n = write_gpt2_files(folder, vocab_size=300)   # GPTNeoXTokenizer adds <|padding|>: one id more
    torch.manual_seed(1000 * seed + step)
    cfg = transformers.GPTNeoXConfig(vocab_size=n + 1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=2048, rotary_pct=0.5,
                                     use_parallel_residual=True, tie_word_embeddings=False)
    transformers.GPTNeoXForCausalLM(cfg).eval().save_pretrained(folder)


def write_suites(root: Path, steps=STEPS) -> dict[str, str]:
    """The two suites' folders under `root` (MultiBERTs' and Pythia's naming), -> system: pattern."""
    patterns = {"bert": str(root / "multiberts" / "seed_{seed}" / "step_{step}k"),
                "pythia": str(root / "pythia-tiny-seed{seed}" / "step{step}")}
    for system, build in (("bert", _bert), ("pythia", _neox)):
        for seed in SEEDS:
            for step in steps:
                folder = Path(patterns[system].format(seed=seed, step=step))
                if not folder.is_dir():
                    build(folder, seed, step)
    return patterns


def zoo_config(root: Path, patterns: dict[str, str], steps=STEPS) -> Path:
    zoo = {"name": "zoo-imported", "results_root": str(root / "runs"),
           "systems": {s: {"imported": p, "seeds": SEEDS, "steps": list(steps), "tokens_per_step": TOKENS_PER_STEP[s]}
                       for s, p in patterns.items()},
           "tasks": ["pos"],
           "probe": {"modes": ["single", "cumulative"], "seeds": [0], "max_train_targets": 200, "max_eval_targets": 100,
                     "max_epochs": 2, "n_boot": 0, "standardize": True},
           "heads": {"max_sentences": 10, "freq_max_chars": 20000, "similarity_max_words": 60, "n_boot": 5,
                     "induction_sequences": 2, "induction_length": 10},
           "cross_heads": None, "cka": None,
           "emergence": {"tasks": ["pos"], "max_train_targets": 100, "max_eval_targets": 60, "max_epochs": 1,
                         "head_sentences": None, "lm": False},
           "stats": {"n_boot": 50}}
    path = root / "zoo.json"
    path.write_text(json.dumps(zoo))
    return path


@pytest.fixture(scope="module")
def imported_zoo(tmp_path_factory):
    if not (data_root() / "ud_english_ewt").is_dir():
        pytest.skip("data root missing")
    root = tmp_path_factory.mktemp("imported-zoo")
    patterns = write_suites(root)
    path = zoo_config(root, patterns)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = run_zoo(path, run_dir=root / "runs" / "zoo-imported")
    finally:
        torch.set_num_threads(before)
    return root, patterns, run


@pytest.mark.slow
def test_an_imported_suite_runs_through_the_zoo_with_intervals_and_emergence(imported_zoo):
    root, patterns, run = imported_zoo
    models = [f"{s}-s{k}" for s in ("bert", "pythia") for k in SEEDS]
    # every checkpoint of every seed imported, its card saying where from and what it claims to be
    table = load_table(run, "zoo_checkpoints")
    assert len(table) == 2 * len(SEEDS) * len(STEPS) and sorted(table["model"].unique()) == models
    for r in table.itertuples():
        src = Path(patterns[r.system].format(seed=r.seed, step=r.step))
        assert (r.source, r.claimed_seed, r.claimed_step) == (str(src), r.seed, r.step)
        assert r.weights_sha256 == file_sha256(src / "model.safetensors")          # one file: its own sha256
        assert r.config_sha256 == file_sha256(src / "config.json")
        assert r.tokens == r.step * TOKENS_PER_STEP[r.system]
        card = read_card(run / r.checkpoint)
        assert card.provenance["weights_sha256"] == r.weights_sha256 and card.steps == r.step
    # each step its own weights: the suite's checkpoints are not one checkpoint copied
    assert table.groupby("model")["weights_sha256"].nunique().eq(len(STEPS)).all()
    # the model a seed is analysed as is its last step
    for name in models:
        final = read_card(run / "models" / name / "final")
        assert final.provenance["claimed_step"] == max(STEPS)
    member = run / "models" / "pythia-s1"
    final, last = (member / d / "model.safetensors" for d in ("final", f"checkpoints/step_{max(STEPS)}"))
    assert final.stat().st_ino == last.stat().st_ino     # final/ is the last step's files, linked, not imported again
    # intervals: the multi-bootstrap over the suite's seeds, recomputed from the per-item table
    items, stats = load_table(run, "probe_items"), load_table(run, "zoo_stats")
    for system in ("bert", "pythia"):
        single, layers = item_arrays(items, [f"{system}-s{k}" for k in SEEDS], "pos", "single")
        layer, chosen = held_out_best(single, "micro_f1")
        want = multi_bootstrap(chosen, "micro_f1", n_boot=50, seed=0)
        row = stats[(stats.statistic == "best_layer_score") & (stats.system == system)].iloc[0]
        assert (row["n_seeds"], row["interval"]) == (2, "multi-bootstrap")
        assert (row["value"], row["ci_low"], row["ci_high"]) == pytest.approx((want.value, want.low, want.high))
        assert row["ci_low"] < row["ci_high"]
    assert set(stats.loc[stats.statistic == "e_delta", "system"]) == {"bert", "pythia"}
    comps = load_table(run, "zoo_comparisons")
    pair = comps[(comps.statistic == "best_layer_score")].iloc[0]
    assert (pair["system_a"], pair["system_b"], pair["n_seed_pairs"]) == ("bert", "pythia", 4)
    assert (pair["contrast"], pair["architecture_diff"]) == ("objective + architecture", "kind: encoder vs decoder")
    training = load_table(run, "zoo_training").set_index("model")
    assert training.loc["pythia-s0", "tokens"] == max(STEPS) * TOKENS_PER_STEP["pythia"]
    # the head analysis ran on both families (2 layers x 2 heads each)
    heads = load_table(run, "heads_classes")
    per_model = heads.drop_duplicates(["model", "layer", "head"]).groupby("model").size()
    assert per_model.to_dict() == dict.fromkeys(models, 4)
    # emergence: one row set per model at each of the suite's steps, tokens = step x tokens_per_step
    em = load_table(run, "emergence")
    assert sorted(em["model"].unique()) == models
    for (model, step), g in em.groupby(["model", "step"]):
        assert g["tokens"].unique().tolist() == [step * TOKENS_PER_STEP[model.rsplit("-", 1)[0]]]
        assert "accuracy_best" in set(g["metric"])
    assert all(sorted(g["step"].unique()) == STEPS for _, g in em.groupby("model"))
    # the report shows what was analysed
    report = (run / "report" / "report.html").read_text()
    assert table["weights_sha256"].iloc[0][:12] in report


@pytest.mark.slow
def test_a_rerun_imports_nothing_and_one_more_step_imports_only_that_step(imported_zoo, tmp_path, capfd):
    root, patterns, run = imported_zoo
    capfd.readouterr()
    run_zoo(root / "zoo.json", run_dir=run)   # the same config: every step, the imports too, unchanged
    ran = [line for line in capfd.readouterr().err.splitlines() if ": running" in line]
    assert not ran, ran
    # one more step of the suite: only its checkpoint is imported, the others are kept as they are
    write_suites(root, STEPS + [200])
    member = tmp_path / "bert-s0"
    shutil.copytree(run / "models" / "bert-s0", member, copy_function=os.link)
    before = {p.parent.name: p.stat().st_ino for p in member.glob("checkpoints/step_*/model.safetensors")}
    folders = [(step, patterns["bert"].format(seed=0, step=step)) for step in STEPS + [200]]
    folders[0] = (folders[0][0], shutil.copytree(folders[0][1], tmp_path / "moved"))  # the suite's folder moved
    got = import_suite(folders, 0, member, TOKENS_PER_STEP["bert"])
    assert got == {"imported": 2, "kept": len(STEPS) - 1, "final": str(member / "final")}   # step_200, the moved step
    after = {p.parent.name: p.stat().st_ino for p in member.glob("checkpoints/step_*/model.safetensors")}
    assert set(after) - set(before) == {"step_200"}
    assert {k: after[k] == before[k] for k in before} == {f"step_{STEPS[0]}": False, f"step_{STEPS[1]}": True}
    assert read_card(member / "final").provenance["claimed_step"] == 200
    # a source whose bytes changed is imported again (the card's provenance no longer matches)
    _bert(folders[0][1], 5, 5)
    assert import_suite(folders, 0, member, TOKENS_PER_STEP["bert"])["imported"] == 1
    assert read_card(member / f"checkpoints/step_{STEPS[0]}").provenance["weights_sha256"] == \
        file_sha256(folders[0][1] / "model.safetensors")


def _entry(**kw) -> dict:
    return {"name": "z", "systems": {"s": {"imported": "x/seed_{seed}/step_{step}", "seeds": [0, 1], "steps": [0, 1],
                                           **kw}}}


@pytest.mark.parametrize("change,expected", [
    ({"imported": "x/step_{step}"}, r"systems\.s\.imported='x/step_\{step\}': the folder pattern must name \{seed\}"),
    ({"imported": "x/{seed}/{stepp}"}, r"systems\.s\.imported=.*only \{seed\} and \{step\} may be named"),
    ({"imported": "x/{seed}"}, r"systems\.s: the pattern 'x/\{seed\}' does not name \{step\} but the suite lists"),
    ({"steps": []}, r"systems\.s\.steps: a non-empty list of distinct integers"),
    ({"steps": None}, r"systems\.s: the pattern .* names \{step\} but the suite lists no 'steps'"),
    ({"seeds": [0, 0]}, r"systems\.s\.seeds: a non-empty list of distinct integers"),
    ({"tokens_per_step": 0}, r"systems\.s\.tokens_per_step: a positive integer"),
    ({"recipe": "bert-tiny"}, r"systems\.s: an imported suite takes .*unknown keys \['recipe'\]"),
])
def test_a_bad_suite_entry_names_the_field(change, expected):
    entry = _entry(**change)
    entry["systems"]["s"] = {k: v for k, v in entry["systems"]["s"].items() if v is not None}
    with pytest.raises(ValueError, match=expected):
        ZooConfig.from_dict(entry)


def test_a_missing_suite_folder_is_named_before_the_run_folder(tmp_path):
    """The one line a user gets for a folder the pattern names and the disk lacks, before any import."""
    write_suites(tmp_path, [0])
    patterns = {"bert": str(tmp_path / "multiberts" / "seed_{seed}" / "step_{step}k")}
    (tmp_path / "zoo.json").write_text(json.dumps({"name": "z", "results_root": str(tmp_path / "runs"), "systems": {
        "bert": {"imported": patterns["bert"], "seeds": [0, 1], "steps": [0, 20]}}}))
    with pytest.raises(FileNotFoundError) as e:
        run_zoo(tmp_path / "zoo.json")
    want = f"{tmp_path / 'zoo.json'}: systems.bert.imported: {tmp_path}/multiberts/seed_0/step_20k (seed 0, step 20) " \
           "does not exist"
    assert str(e.value) == want
    assert not (tmp_path / "runs").exists()
    (tmp_path / "multiberts" / "seed_0" / "step_20k").mkdir()
    with pytest.raises(FileNotFoundError, match=r"seed_0/step_20k \(seed 0, step 20\): .*has no config.json"):
        run_zoo(tmp_path / "zoo.json")


@pytest.mark.parametrize("name,systems", [
    ("zoo-multiberts.json", {"multiberts": (5, 2000)}),
    ("zoo-pythia.json", {"pythia-70m": (5, 143_000), "pythia-160m": (5, 143_000)})])
def test_the_shipped_suite_configs_load_and_name_the_missing_folder(name, systems, tmp_path, monkeypatch):
    """configs/zoo-multiberts.json and zoo-pythia.json: what a user with those folders runs. Here, without
    them, the first missing folder is named in one line before anything is written."""
    zoo = load_zoo(REPO / "configs" / name)
    assert set(zoo.systems) == set(systems)
    for system, (n_seeds, last) in systems.items():
        spec = zoo.systems[system]
        assert len(spec["seeds"]) == n_seeds and max(spec["steps"]) == last and "{seed}" in spec["imported"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"systems\.\S+\.imported: .* \(seed \d+, step \d+\) does not exist"):
        check_systems(zoo, name)
    # with the folders there (their kind given here), the study it expands to validates: every analysis config
    monkeypatch.setattr("workbench.zoo.system_kind", lambda spec: "encoder" if "multiberts" in spec["imported"]
                        else "decoder")
    cfg = expand_zoo(zoo)
    validate_run_config(cfg, name)
    analyses = ("probe", "heads", "prune", "emergence")
    assert {k for k in analyses if cfg.get(k, {}).get("models")} == set(analyses)
    assert len(cfg["models"]) == sum(n for n, _ in systems.values())


def test_a_mixed_zoo_shares_the_trained_tokenizer_and_keeps_each_suites_own(tmp_path):
    """Trained systems beside an imported suite: the trained ones read the first trained system's
    tokenizer, the suite's models their own; each system its own seeds; the suite's heads analysed;
    a teacher must be a trained system."""
    bert = str(tmp_path / "mb" / "seed_{seed}" / "step_{step}k")
    for seed in (3, 4):
        _bert(Path(bert.format(seed=seed, step=20)), seed, 20)
    zoo = ZooConfig.from_dict({"name": "z", "seeds": [0, 1], "systems": {
        "multiberts": {"imported": bert, "seeds": [3, 4], "steps": [20]},
        "gpt": {"recipe": "decoder-tiny"}, "bert": {"recipe": "bert-tiny"}}})
    cfg = expand_zoo(zoo)
    assert list(cfg["models"]) == ["multiberts-s3", "multiberts-s4", "gpt-s0", "gpt-s1", "bert-s0", "bert-s1"]
    assert cfg["zoo"]["systems"] == {"multiberts": [3, 4], "gpt": [0, 1], "bert": [0, 1]}
    assert [cfg["models"][m].get("tokenizer_from") for m in cfg["models"]] == [None, None, None, "gpt-s0", "gpt-s0",
                                                                            "gpt-s0"]
    assert cfg["models"]["multiberts-s4"] == {"import": bert.format(seed=4, step=20), "suite": {
        "seed": 4, "checkpoints": [[20, bert.format(seed=4, step=20)]], "tokens_per_step": 1}}
    assert cfg["heads"]["models"][:2] == ["multiberts-s3", "multiberts-s4"]
    # an imported encoder-decoder: heads read, but no pruning and no cross-attention alignments, which
    # replay the denoising objective a trained checkpoint's card names and an imported one lacks
    t5 = tmp_path / "t5" / "seed_{seed}"
    for seed in (0, 1):
        Path(str(t5).format(seed=seed)).mkdir(parents=True)
        (Path(str(t5).format(seed=seed)) / "config.json").write_text(json.dumps({"model_type": "t5"}))
    cfg = expand_zoo(ZooConfig.from_dict({"name": "z", "seeds": [0, 1], "prune": {}, "systems": {
        "t5-hub": {"imported": str(t5), "seeds": [0, 1]}, "t5": {"recipe": "t5-tiny"}}}))
    assert cfg["heads"]["models"] == ["t5-hub-s0", "t5-hub-s1", "t5-s0", "t5-s1"]
    assert cfg["prune"]["models"] == cfg["cross_heads"]["models"] == ["t5-s0", "t5-s1"]
    with pytest.raises(ValueError, match=r"systems\.d\.teacher='multiberts' is an imported suite"):
        ZooConfig.from_dict({"name": "z", "systems": {"d": {"recipe": "distilbert-tiny", "teacher": "multiberts"},
                                                      "multiberts": zoo.systems["multiberts"]}})
