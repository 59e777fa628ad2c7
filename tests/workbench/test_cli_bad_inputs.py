"""The bad-input corpus of issue 75: each case run through the CLI (`workbench.cli.main`, in process:
the same parser, handler and library calls as the installed `workbench`, without a torch import per
case) ends in one stderr line naming the flag or file and field, exit 1, before any folder is made;
and the corrected command then succeeds in the same place with nothing deleted by hand.

Pretraining stays tiny here (a toy corpus, 3 steps of the `tiny` preset, a 200-word vocabulary: a
few seconds a run), as tests/plmodels/test_train.py keeps it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from plmodels import save
from plmodels.tokenizer import Tokenizer
from workbench import cli

from ..plmodels.tiny import tiny_encoder
from ..plmodels.toy_runs import toy_corpus
from .cli_runs import refused, succeeds

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return toy_corpus(d / "train.txt", 600, 0), toy_corpus(d / "valid.txt", 100, 1)


@pytest.fixture
def tiny(corpus):
    """--set flags that make `workbench pretrain encoder-tiny` a 3-step run on the toy corpus."""
    train, valid = corpus
    values = dict(train_source=str(train), train_split=None, eval_source=str(valid), eval_split=None,
                  vocab_size=200, tokenizer_sample_chars=20_000, seq_len=32, batch_size=4, max_steps=3,
                  eval_sequences=4, num_threads=1, bf16="off", ckpt_log_spaced=True, log_every=1000)
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("WORKBENCH_DEBUG", raising=False)


# ------------------------------------------------------------------------------- pretraining
@pytest.mark.parametrize("flags,expected", [
    # the review's case: it failed after the tokenizer and locked the folder
    (["--set", "model.n_heads=3.5"], r"--set model\.n_heads: input should be a valid integer, got 3\.5$"),
    # it blamed the shipped recipe file
    (["--set", "lr=abc"], r"^workbench pretrain: error: --set lr: input should be a valid number, got \"abc\"$"),
    (["--set", "model.n_headz=4"], r"--set model\.n_headz: unknown key \(known: vocab_size, d_model"),
    (["--set", "model.activation=swish"], r"--set model\.activation: input should be 'gelu', 'gelu_tanh'"),
    (["--set", "model.n_heads=5"], r"n_heads"),                          # a __post_init__ check: 32 % 5
    (["--set", "objective_args.rate=0.5"], r"objective 'mlm' takes no objective_args, got \['rate'\]"),
    (["--set", "preset=huge"], r"unknown preset 'huge'"),
    (["--set", "train_source=/no/such/corpus"], r"encoder-tiny\.json: train_source='/no/such/corpus': .*does not exist"),
    (["--set", "lr"], r"--set 'lr': expected key=value"),
])
def test_a_bad_pretraining_flag_is_refused_before_the_folder_and_the_fix_runs(tmp_path, capsys, tiny, flags,
                                                                               expected):
    out = tmp_path / "run"
    refused(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny, *flags], expected, absent=out)
    assert "checkpoint:" in succeeds(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny])
    assert (out / "final" / "checksums.json").is_file()


def test_a_bad_key_in_a_config_file_names_the_file(tmp_path, capsys, tiny):
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"extends": "encoder-tiny", "lrr": 1e-3}))
    out = tmp_path / "run"
    refused(capsys, ["pretrain", config, "--out", out, *tiny], r"mine\.json: unknown key 'lrr'", absent=out)
    config.write_text(json.dumps({"extends": "encoder-tiny", "model": {"n_layers": "two"}}))
    refused(capsys, ["pretrain", config, "--out", out, *tiny],
            r"mine\.json: model\.n_layers: input should be a valid integer, got \"two\"", absent=out)


def _locked_folder(out: Path, run_with) -> None:
    """The folder the old code left when a model config failed after the tokenizer: a tokenizer, a
    token cache and a config.resolved.json that differs from the corrected command's, no checkpoint."""
    run_with(out)
    for name in ("checkpoints", "final", "metrics.jsonl"):
        p = out / name
        if p.is_dir():
            import shutil
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    resolved = json.loads((out / "config.resolved.json").read_text())
    resolved["pretrain"]["model"] = {"n_heads": 3.5}
    resolved["model"]["n_heads"] = 3.5
    (out / "config.resolved.json").write_text(json.dumps(resolved))


def test_a_run_that_failed_before_its_first_checkpoint_never_locks_its_folder(tmp_path, capsys, tiny):
    out = tmp_path / "run"
    _locked_folder(out, lambda o: succeeds(capsys, ["pretrain", "encoder-tiny", "--out", o, *tiny]))
    capsys.readouterr()
    assert cli.main(["pretrain", "encoder-tiny", "--out", str(out), *tiny]) == 0   # the corrected command
    err = capsys.readouterr().err
    assert "starting the run in" in err and "no finished checkpoint and its config differs" in err, err
    assert json.loads((out / "config.resolved.json").read_text())["model"]["n_heads"] == 2   # the tiny preset's
    assert json.loads((out / "final" / "card.json").read_text())["steps"] == 3


def test_no_resume_starts_a_finished_run_over(tmp_path, capsys, tiny):
    out = tmp_path / "run"
    succeeds(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny])
    # a finished run with another config is refused, naming the keys ...
    refused(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny, "--set", "lr=0.01"],
            r"cannot resume the run in .*: the config differs in \['lr'\]")
    # a model field is named once (it differs both as the override pretrain.model.X and the resolved model.X)
    refused(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny, "--set", "model.n_heads=4"],
            r"the config differs in \['model\.n_heads'\] \(start a new folder")
    # ... and --no-resume does what it says: starts over with the new config
    succeeds(capsys, ["pretrain", "encoder-tiny", "--out", out, *tiny, "--set", "lr=0.01", "--no-resume"])
    assert json.loads((out / "config.resolved.json").read_text())["pretrain"]["lr"] == 0.01
    assert not (out / "resumes.json").exists()


# ------------------------------------------------------------------------------- zoo and run
def _zoo(tmp_path: Path, **system) -> Path:
    zoo = json.loads((REPO / "configs" / "zoo-tiny.json").read_text())
    zoo["systems"]["bert"].update(system)
    zoo["results_root"] = str(tmp_path / "runs")
    path = tmp_path / "zoo.json"
    path.write_text(json.dumps(zoo))
    return path


@pytest.mark.parametrize("system,expected", [
    ({"recipe": "bert-tinyy"}, r"zoo\.json: systems\.bert\.recipe: no pretraining recipe named 'bert-tinyy'"),
    ({"overrides": {"lr": "fast"}}, r"zoo\.json: systems\.bert \(bert-tiny\.json with its overrides\): lr: input "
                                    r"should be a valid number"),
    ({"overrides": {"model": {"n_heads": 3.5}}}, r"zoo\.json: systems\.bert .*model\.n_heads: input should be a "
                                                 r"valid integer, got 3\.5"),
])
def test_a_bad_zoo_system_names_the_zoo_file_and_system_before_the_run_folder(tmp_path, capsys, system, expected):
    path = _zoo(tmp_path, **system)
    for force in ([], ["--force"]):
        refused(capsys, ["zoo", path, *force], expected, absent=tmp_path / "runs")


def test_a_run_config_naming_a_missing_analysis_file_is_refused_before_its_folder(tmp_path, capsys):
    cfg = json.loads((REPO / "configs" / "tiny.json").read_text())
    cfg["results_root"] = str(tmp_path / "runs")
    cfg["heads"] = {**(cfg.get("heads") or {"models": list(cfg["models"])[:1]}), "config": str(tmp_path / "nope.json")}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg))
    refused(capsys, ["run", path], r"run\.json: heads\.config: .*nope\.json does not exist", absent=tmp_path / "runs")


# ------------------------------------------------------------------------------- analyses
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    texts = ["the cat sat on the mat", "a dog ran in the park"] * 5
    tok = Tokenizer.train_wordpiece(texts, vocab_size=61)
    return save(tiny_encoder(vocab_size=tok.vocab_size), tok, tmp_path_factory.mktemp("ckpt") / "model")


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    import shutil
    return Path(shutil.copytree(checkpoint, tmp_path / "model"))


def test_a_misspelt_key_in_a_copied_heads_json_is_the_error(tmp_path, capsys, checkpoint):
    config = tmp_path / "heads.json"
    config.write_text((REPO / "configs" / "heads.json").read_text().replace('"sink"', '"sinkk"'))
    out = tmp_path / "out"
    line = refused(capsys, ["heads", checkpoint, "--config", config, "--out", out],
                   r"heads\.json: unknown key 'sinkk' \(known: row_tolerance", absent=out)
    assert "'row_tolerance'" not in line   # the 16 good keys are not reported as unknown


@pytest.mark.parametrize("argv,expected", [
    (["probe", "{model}", "--tasks", "poss"], r"--tasks poss: unknown task \['poss'\]; known: arcs"),
    (["probe", "{model}", "--set", "seeds=3"], r"--set seeds: input should be a valid array, got 3$"),
    (["emergence", "does/not/exist"], r"pretraining run folder does/not/exist does not exist"),
    (["emergence", "{tmp}"], r"is not a pretraining run folder \(no checkpoints/step_\*\)"),
    (["heads", "{tmp}/absent"], r"error: \S+/absent is not a checkpoint folder"),
    (["compare", "{model}", "{tmp}/absent"], r"model_b: \S+/absent is not a checkpoint folder"),
    (["data", "tasks", "--tasks", "pos,bogus"], r"--tasks pos,bogus: unknown task \['bogus'\]"),
])
def test_an_analysis_refuses_bad_arguments_before_its_folder_or_model(tmp_path, capsys, checkpoint, argv, expected):
    out = tmp_path / "out"
    argv = [a.format(model=checkpoint, tmp=tmp_path) for a in argv] + ["--out", str(out)]
    refused(capsys, argv, expected, absent=out)


def test_finetune_checks_its_base_before_reading_any_data(tmp_path, capsys, checkpoint, monkeypatch):
    """The base checkpoint is checked first: the task data (seconds to read for EWT) is never touched."""
    import workbench.data.finetuning as finetuning

    def no_data(*args, **kwargs):
        raise AssertionError("the task data was read before the base checkpoint was checked")

    monkeypatch.setattr(finetuning, "load_task_data", no_data)
    out = tmp_path / "out"
    refused(capsys, ["finetune", "pos-frozen", "--set", f"base={tmp_path / 'absent'}", "--out", out],
            r"error: --set base: \S+/absent is not a checkpoint folder \(needs config\.json and model\.safetensors\)$",
            absent=out)
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"base": str(tmp_path / "absent"), "task": "pos"}))
    refused(capsys, ["finetune", config, "--out", out], r"error: \S+/mine\.json: base: \S+/absent is not a checkpoint",
            absent=out)
    model = _copy(checkpoint, tmp_path)
    _damage(model, "model.safetensors", "truncate")
    refused(capsys, ["finetune", "pos-frozen", "--set", f"base={model}", "--out", out],
            r"error: --set base: \S+/model/model\.safetensors: not a readable safetensors file", absent=out)


# ------------------------------------------------------------------------------- damaged checkpoints
def _damage(folder: Path, name: str, how: str) -> Path:
    path = folder / name
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_text(how)
    return path


@pytest.mark.parametrize("command", ["heads", "probe", "prune", "frozen-vs-finetuned", "extract"])
@pytest.mark.parametrize("name,how,expected", [
    ("model.safetensors", "truncate", r"model/model\.safetensors: not a readable safetensors file .*SafetensorError.*; "
                                      r"sha256 \w+\.\.\. does not match checksums\.json"),
    ("config.json", '{"kind": "encoder",', r"model/config\.json: invalid JSON at line 1"),
])
def test_a_damaged_checkpoint_is_named_before_any_folder(tmp_path, capsys, checkpoint, command, name, how, expected):
    model = _copy(checkpoint, tmp_path)
    _damage(model, name, how)
    out = tmp_path / "out"
    argv = [command, model] + (["pos"] if command == "extract" else []) + ["--out", out]
    refused(capsys, argv, expected, absent=out)


def test_export_and_import_name_a_damaged_file(tmp_path, capsys, checkpoint):
    model = _copy(checkpoint, tmp_path)
    _damage(model, "tokenizer/tokenizer.json", '{"version": ')
    refused(capsys, ["export-hf", model, tmp_path / "hf"], r"model/tokenizer: not a readable tokenizer folder",
            absent=tmp_path / "hf")
    hf = tmp_path / "hf-src"
    succeeds(capsys, ["export-hf", checkpoint, hf])   # a Hugging Face BERT folder ...
    _damage(hf, "model.safetensors", "truncate")        # ... whose weights were cut short
    refused(capsys, ["import-hf", hf, tmp_path / "imported"], r"hf-src/model\.safetensors: not a readable safetensors",
            absent=tmp_path / "imported")
    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))
    refused(capsys, ["import-hf", hf, tmp_path / "imported"], r"hf-src/config\.json: missing \['vocab_size'",
            absent=tmp_path / "imported")
