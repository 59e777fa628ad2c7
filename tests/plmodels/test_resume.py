"""Pretraining survives a kill at any point: a torn metrics.jsonl, a half-built checkpoint or a
half-rewritten log are cleaned up on resumption, and the resumed run's loss curve is the
uninterrupted run's, row for row (issue 61, item 5)."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from plmodels.files import current_umask, write_text_atomic
from plmodels.training import pretrain
from plmodels.training.loop import run_training
from plmodels.training.runtime import KILL_ENV, read_jsonl

from .toy_runs import fixed_wordpiece, toy_config, toy_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return toy_corpus(d / "train.txt", 4000, 0), toy_corpus(d / "valid.txt", 400, 1)


@pytest.fixture(scope="module")
def tokenizer(data, tmp_path_factory):
    """One fixed WordPiece for every run (a trained one may number tied tokens differently)."""
    return str(fixed_wordpiece(data[0], tmp_path_factory.mktemp("tok")))


def _rows(run):
    """metrics.jsonl as (step, split, metric, value), in file order (the time column left out)."""
    return [(r["step"], r["split"], r["metric"], r["value"]) for r in read_jsonl(run / "metrics.jsonl").rows]


def _weights_equal(a, b):
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_read_jsonl_drops_only_a_torn_last_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "va')
    got = read_jsonl(p)
    assert got.rows == [{"step": 1}, {"step": 2}] and (got.torn_lines, got.torn_bytes) == (1, len(b'{"step": 3, "va'))
    p.write_bytes(b'{"step": 1}\n{"step": 2}' + b"\0" * 7)   # the zeros a crash can leave at the end
    assert (read_jsonl(p).torn_lines, read_jsonl(p).torn_bytes) == (1, 18)
    p.write_text('{"step": 1}\n\n{"step": 2}')            # a whole last row without its newline is kept
    assert read_jsonl(p).rows == [{"step": 1}, {"step": 2}] and read_jsonl(p).torn_lines == 0
    p.write_text('{"step": 1}\n{"step": 2, "va\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: not a JSON row"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "absent.jsonl").rows == []


def test_write_text_atomic_leaves_the_old_file_on_failure(tmp_path):
    p = tmp_path / "f.txt"
    write_text_atomic(p, "old\n")
    with pytest.raises(TypeError):
        write_text_atomic(p, 3)  # fails inside the write
    assert p.read_text() == "old\n" and [q.name for q in tmp_path.iterdir()] == ["f.txt"]


def test_torn_metrics_line_and_rows_after_the_checkpoint_are_dropped(data, tokenizer, tmp_path, capsys):
    # the review's failure: a kill tore the last line and the resumed run died with JSONDecodeError
    cfg = toy_config(data, max_steps=7, eval_every=2, tokenizer_path=tokenizer)
    straight = pretrain(cfg, tmp_path / "a")
    run_training(cfg, tmp_path / "b", stop_at_step=5)   # last checkpoint: step 4; step 5's row after it
    torn = '{"step": 6, "tokens": 1536, "split": "tra'
    with open(tmp_path / "b" / "metrics.jsonl", "a") as f:
        f.write(torn)
    ckpts = tmp_path / "b" / "checkpoints"
    (ckpts / f".step_0000008.tmp-{2**22 + 1}-0123abcd").mkdir()   # a killed save's folder (no such pid)
    live = ckpts / f".step_0000009.tmp-{os.getppid()}-0123abcd"    # one of a live process: kept
    live.mkdir()
    capsys.readouterr()
    resumed = pretrain(cfg, tmp_path / "b")
    err = capsys.readouterr().err
    assert f"dropped its last line, {len(torn)} bytes torn by a killed append" in err, err
    assert _rows(tmp_path / "b") == _rows(tmp_path / "a")   # each row once, the same values
    assert _weights_equal(straight, resumed)
    record = {"from": "checkpoints/step_0000004", "step": 4, "metrics_rows_dropped": 1, "torn_lines_dropped": 1,
              "torn_bytes_dropped": len(torn), "leftovers_removed": 1}
    [got] = json.loads((tmp_path / "b" / "resumes.json").read_text())
    assert {k: got[k] for k in record} == record
    assert json.loads((resumed / "card.json").read_text())["resumes"] == [got]
    assert "resumes" not in json.loads((straight / "card.json").read_text())
    assert list(ckpts.glob(".*")) == [live]
    # the rewritten log and the checkpoint folders have the modes open() and mkdir() give
    umask = current_umask()
    assert (tmp_path / "b" / "metrics.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask
    assert {p.stat().st_mode & 0o777 for p in [resumed, resumed / "tokenizer", tmp_path / "b" / "tokenizer"]} == {
        0o777 & ~umask}


def test_an_unparseable_middle_line_is_an_error_naming_file_and_line(data, tokenizer, tmp_path):
    cfg = toy_config(data, max_steps=4, tokenizer_path=tokenizer)
    run_training(cfg, tmp_path / "r", stop_at_step=2)
    path = tmp_path / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON row"):
        pretrain(cfg, tmp_path / "r")


def test_resumed_runs_log_each_row_once(data, tokenizer, tmp_path):
    # Before: a run killed before its first checkpoint kept its rows and logged them again, and a run
    # resumed at max_steps (a finished run run again, or one killed while saving `final`) logged the
    # final evaluation twice.
    cfg = toy_config(data, max_steps=4, eval_every=2, ckpt_log_spaced=False, tokenizer_path=tokenizer)
    pretrain(cfg, tmp_path / "a")
    run_training(cfg, tmp_path / "b", stop_at_step=3)   # no checkpoint: starts again from step 0
    pretrain(cfg, tmp_path / "b")
    assert _rows(tmp_path / "b") == _rows(tmp_path / "a")
    cfg = toy_config(data, max_steps=4, eval_every=2, tokenizer_path=tokenizer)
    pretrain(cfg, tmp_path / "c")
    expected = _rows(tmp_path / "c")
    pretrain(cfg, tmp_path / "c")                       # resumes at step 4 = max_steps
    assert _rows(tmp_path / "c") == expected
    records = json.loads((tmp_path / "c" / "resumes.json").read_text())
    assert [(r["step"], r["metrics_rows_dropped"]) for r in records] == [(4, 5)]   # the 5 final eval rows


# --- kills from outside: a subprocess per launch, SIGKILLed at a point (the PLMODELS_TEST_KILL_AT
# hook, plmodels.training.runtime.kill_point) or after a random number of rows (a random moment)

RUN = "import sys; from plmodels.training import pretrain; pretrain(sys.argv[1], sys.argv[2])"


def _launch(config, run, kill_at=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(KILL_ENV, None)
    if kill_at:
        env[KILL_ENV] = kill_at
    return subprocess.Popen([sys.executable, "-c", RUN, str(config), str(run)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _run(config, run, kill_at):
    proc = _launch(config, run, kill_at)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, err[-3000:])


def _kill_after_rows(config, run, n_more, deadline_s=60):
    """Launch, SIGKILL as soon as metrics.jsonl has `n_more` more lines (wherever the run is then:
    between steps, in an append, in a checkpoint save). True if the kill came before the run ended."""
    path = run / "metrics.jsonl"
    count = lambda: path.read_bytes().count(b"\n") if path.is_file() else 0
    target, proc = count() + n_more, _launch(config, run)
    t0 = time.monotonic()
    while proc.poll() is None and count() < target and time.monotonic() - t0 < deadline_s:
        time.sleep(0.001)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err[-3000:]
    return proc.returncode != 0


@pytest.fixture(scope="module")
def kill_cfg(data, tokenizer, tmp_path_factory):
    """(config file, uninterrupted run): checkpoints at 1, 2, 3, 4, 6, 8, 9, 12; held-out evaluations
    at 0, 4, 8 and the final one at 12."""
    cfg = toy_config(data, max_steps=12, eval_every=4, ckpt_every=3, tokenizer_path=tokenizer)
    d = tmp_path_factory.mktemp("kill")
    (d / "config.json").write_text(json.dumps(cfg.to_dict()))
    pretrain(cfg, d / "straight")
    return d / "config.json", d / "straight"


def _finish_and_compare(config, run, straight):
    proc = _launch(config, run)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    rows = _rows(run)
    assert [r for r in rows if r[1] == "train"] == [r for r in _rows(straight) if r[1] == "train"]
    assert [r[0] for r in rows if r[1] == "train"] == list(range(1, 13))
    assert rows == _rows(straight)                     # the held-out rows too, each once
    assert _weights_equal(straight / "final", run / "final")
    assert not [p for p in run.rglob(".*")]             # no temporaries left behind
    return json.loads((run / "resumes.json").read_text())


@pytest.mark.slow
def test_sigkill_at_each_kind_of_write_resumes_to_the_uninterrupted_curve(kill_cfg, tmp_path):
    config, straight = kill_cfg
    run, metrics = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"
    _run(config, run, "metrics:4")      # halfway through step 3's row (rows: eval at 0, steps 1, 2, 3)
    assert not metrics.read_bytes().endswith(b"\n")
    _run(config, run, "resume:1")       # resumed at 2: the cleaned log written, not yet renamed in
    assert list(run.glob(".metrics.jsonl.*.tmp")) and not metrics.read_bytes().endswith(b"\n")
    _run(config, run, "checkpoint:2")   # resumed at 2: step 3's checkpoint saved, step 4's built, not renamed
    assert list((run / "checkpoints").glob(".step_0000004.tmp-*"))
    assert not (run / "checkpoints" / "step_0000004").exists()
    _run(config, run, "step:5")         # resumed at 3: after step 8's row, before its evaluation and checkpoint
    _run(config, run, "metrics:8")      # resumed at 6: halfway through the final evaluation's rows
    assert (run / "checkpoints" / "step_0000012").is_dir() and not (run / "final").exists()
    records = _finish_and_compare(config, run, straight)
    # one record per resumption that got through its cleaning (the one killed in it left none)
    assert [(r["step"], r["torn_lines_dropped"], r["leftovers_removed"]) for r in records] == [
        (2, 1, 1), (3, 0, 1), (6, 0, 0), (12, 1, 0)]


@pytest.mark.slow
def test_sigkill_at_random_moments_resumes_to_the_uninterrupted_curve(kill_cfg, tmp_path):
    config, straight = kill_cfg
    run, rng = tmp_path / "run", random.Random(0)
    # rows come at 1 per step, 5 more per evaluation: 20 + 4 * 5 = 35 in all (fewer after a resumption)
    kills = [_kill_after_rows(config, run, rng.randint(2, 9)) for _ in range(3)]
    assert kills[0], "the first kill came after the run had ended"
    _finish_and_compare(config, run, straight)


@pytest.mark.parametrize("damage", ["weights", "train_state"])
def test_a_truncated_last_checkpoint_is_skipped_for_the_previous_good_one(data, tokenizer, tmp_path, capsys, damage):
    """Issue 75: a torn model.safetensors in the latest checkpoint gave a raw SafetensorError and
    the run could not resume. It is recognised by its checksum, skipped with a warning naming it,
    and the run resumes from the checkpoint before, reaching the uninterrupted run's weights."""
    cfg = toy_config(data, max_steps=7, eval_every=2, tokenizer_path=tokenizer)
    straight = pretrain(cfg, tmp_path / "a")
    run_training(cfg, tmp_path / "b", stop_at_step=5)   # checkpoints at steps 1, 2, 4
    name = "model.safetensors" if damage == "weights" else "train_state.safetensors"
    torn = tmp_path / "b" / "checkpoints" / "step_0000004" / name
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    capsys.readouterr()
    resumed = pretrain(cfg, tmp_path / "b")
    err = capsys.readouterr().err
    assert f"skipping the damaged checkpoint step_0000004: {torn}: sha256" in err, err
    assert "resuming from" in err and "step_0000002 at step 2" in err, err
    assert json.loads((tmp_path / "b" / "resumes.json").read_text())[0]["from"] == "checkpoints/step_0000002"
    assert _rows(tmp_path / "b") == _rows(tmp_path / "a")
    assert _weights_equal(straight, resumed)


def test_a_checkpoint_without_checksums_is_still_read(data, tokenizer, tmp_path):
    """A folder written before checksums existed (no checksums.json, no sha256 in train_state.json)
    resumes as before; a truncated one of them is still recognised, by reading it whole."""
    from plmodels.training.state import STATE_JSON, latest_checkpoint

    cfg = toy_config(data, max_steps=4, tokenizer_path=tokenizer)
    run_training(cfg, tmp_path / "r", stop_at_step=3)   # checkpoints at steps 1, 2
    for step in (1, 2):
        folder = tmp_path / "r" / "checkpoints" / f"step_{step:07d}"
        (folder / "checksums.json").unlink()
        info = json.loads((folder / STATE_JSON).read_text())
        del info["sha256"]
        (folder / STATE_JSON).write_text(json.dumps(info))
    assert latest_checkpoint(tmp_path / "r").name == "step_0000002"
    w = tmp_path / "r" / "checkpoints" / "step_0000002" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    assert latest_checkpoint(tmp_path / "r").name == "step_0000001"
