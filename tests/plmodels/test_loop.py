"""Tests for the training loop's host side (plmodels/training/loop.py, issue 81): the losses stay on
the device between log lines and are read back in one transfer, with the rows and weights a
per-step read gives."""
import json
import threading

import pytest
import torch
from safetensors.torch import load_file

from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from plmodels.training import load_config
from plmodels.training.corpus import PackedDataset
from plmodels.training.data import Batch, Batches, Prefetcher, token_cache
from plmodels.training.distributed import Dist
from plmodels.training.loop import CompiledStep, _Loop, _seed_step, build_model_config, run_training
from plmodels.training.loss import masked_lm_loss
from plmodels.training.masking import continuation_ids, masked_slots, slot_sizes, step_generator
from plmodels.training.objectives import Objective, objective_for

from .host_reads import HostReads
from .kinds import packed_rows
from .toy_runs import fixed_wordpiece, toy_config, toy_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return toy_corpus(d / "train.txt", 2000, 0), toy_corpus(d / "valid.txt", 200, 1)


def _train_rows(run):
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["tokens"], r["metric"], r["value"]) for r in rows if r["split"] == "train"]


def _assert_trained_alike(want, got) -> None:
    """Two finished runs' checkpoints logged the same train steps and losses (1e-5) and hold the same
    weights (fp32 tolerances)."""
    a, b = _train_rows(want.parent), _train_rows(got.parent)
    assert [r[:3] for r in b] == [r[:3] for r in a]
    assert [r[3] for r in b] == pytest.approx([r[3] for r in a], abs=1e-5)
    wa, wb = (load_file(str(p / "model.safetensors")) for p in (want, got))
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5, msg=k)


def _batches(cfg, run) -> tuple[Batches, Tokenizer]:
    """The run's `Batches`, built as `run_training` builds them (run/tokenizer exists)."""
    tok = Tokenizer.load(run / "tokenizer")
    ids = token_cache(cfg.train_source, cfg.train_split, cfg, tok, run, Dist(), cfg.max_train_texts)
    short = None if cfg.short_seq_len is None else PackedDataset.for_tokenizer(ids, cfg.short_seq_len, cfg.seed, tok)
    return Batches(PackedDataset.for_tokenizer(ids, cfg.seq_len, cfg.seed, tok), cfg, Dist(), tok, short,
                   objective_for(cfg)), tok


def _first_step_loss(cfg, run) -> float:
    """The loss of step 1 recomputed outside the loop: the seeded initial model on batch 0."""
    batches, tok = _batches(cfg, run)
    objective = batches.objective
    torch.manual_seed(cfg.seed)
    model = objective.build(cfg.kind, objective.model_config(build_model_config(cfg, tok)))
    model.train()
    _seed_step(cfg.seed, 0, 0)
    loss, _, _ = objective.loss(model, batches.get(0, 0, torch.device("cpu"), 0.0), False)
    return loss.item()


@pytest.mark.slow
@pytest.mark.parametrize("kind,extra", [
    ("encoder", {}), ("decoder", {"vocab_size": 300}), ("encoder", {"objective": "span", "grad_accum": 2}),
], ids=["mlm", "clm", "span-accum"])
def test_losses_read_every_log_every_steps_match_a_read_every_step(data, tmp_path, kind, extra):
    # log_every=1 reads each step's loss back at once (what the loop did with loss.item() per step);
    # 1000 leaves all 7 on the device until the end; 3 reads at 3, 6 and 7 and at the checkpoints
    # (log-spaced: 1, 2, 4). Rows and weights must not depend on when the losses are read.
    # one tokenizer for the three runs (a WordPiece trained twice may number ties differently)
    tok = run_training(toy_config(data, kind, max_steps=1, eval_source=None, **extra), tmp_path / "tok").path
    runs = {}
    for every in (1, 3, 1000):
        cfg = toy_config(data, kind, max_steps=7, eval_source=None, log_every=every,
                         tokenizer_path=str(tok / "tokenizer"), **extra)
        runs[every] = (cfg, run_training(cfg, tmp_path / f"every{every}").path.parent)
    cfg, ref = runs[1]
    want = _train_rows(ref)
    assert [r[0] for r in want if r[2] == "loss"] == list(range(1, 8))   # one loss row per step
    if extra.get("objective") == "span":
        assert {r[2] for r in want} == {"loss", "mlm_loss", "sbo_loss"}
    else:
        assert want[0][3] == pytest.approx(_first_step_loss(cfg, ref), abs=1e-6)  # row 1 is step 1's loss
    w_ref = (ref / "final" / "model.safetensors").read_bytes()
    for every in (3, 1000):
        got = _train_rows(runs[every][1])
        assert [r[:3] for r in got] == [r[:3] for r in want]
        assert [r[3] for r in got] == pytest.approx([r[3] for r in want], abs=1e-6, rel=0)
        assert (runs[every][1] / "final" / "model.safetensors").read_bytes() == w_ref


def test_host_reads_sees_the_syncs_it_is_named_for():
    # the instrument of the test below: each of these reads the device, each is seen once
    x, calls = torch.arange(6.0), []
    with HostReads(calls):
        x.sum().item(), bool(x.any()), int(x[0]), x[x > 2], x.nonzero()
        y = x.clone()
        y[x > 4] = 0.0
        x[torch.tensor([1, 2])], x.index_select(0, torch.tensor([1])), x.gather(0, torch.tensor([0]))
    assert calls == ["aten::_local_scalar_dense"] * 3 + ["aten::index with a mask", "aten::nonzero",
                                                         "aten::index_put_ with a mask"]


# the runs of each objective whose step is checked for host reads: (kind, config fields); "teacher"
# asks for a DistilBERT teacher trained first (one step), "compile_slots" for a compiled run's slots
HOST_READ_RUNS = {
    "mlm": ("encoder", {}), "clm": ("decoder", {}), "span": ("encoder", {"objective": "span"}),
    "electra": ("encoder", {"objective": "electra"}), "mlm-fixed-slots": ("encoder", {"compile_slots": True}),
    "clm-bf16": ("decoder", {"bf16": "on"}), "distil": ("encoder", {"objective": "distil", "teacher": True}),
    "t5": ("seq2seq", {"objective": "t5", "objective_args": {"n_sentinels": 16},
                       "model": load_config("t5-tiny").model}),
    "bart": ("seq2seq", {"objective": "bart", "model": load_config("bart-tiny").model}),
    "plm": ("xlnet", {"objective_args": {"partial_k": 3}, "model": load_config("xlnet-tiny").model}),
    "bilm": ("bilm", {}), "tbilm": ("tbilm", {}),
}


def _step_host_reads(data, tmp_path, monkeypatch, kind, extra, plant=False) -> list[str]:
    """The reads of a device value on the host (on CUDA: waits for the queue) made while the steps of
    a 4-step run execute, on the thread running them, leaving out building the batch (host work on
    host tensors, before the copy; in line, or on the prefetcher's thread): the Python-level reads,
    and below them every aten op that reads a value or selects by a mask (`HostReads`), backward
    included. `plant` adds one selection by a mask to the objective's loss (the test's null)."""
    extra = dict(extra)
    if extra.pop("teacher", False):  # trained before the spies go in: its steps are not counted
        teacher = run_training(toy_config(data, max_steps=1, eval_source=None, vocab_size=300), tmp_path / "teacher")
        extra["objective_args"] = {"teacher": str(teacher.path)}
    calls: list[str] = []
    active = threading.local()

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            if getattr(active, "on", False):
                calls.append(name)
            return original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy"):
        counting(name)

    def spy(method, on: bool):
        def wrapper(*a, **k):
            was, active.on = getattr(active, "on", False), on
            try:
                if not on:
                    return method(*a, **k)
                with HostReads(calls):
                    return method(*a, **k)
            finally:
                active.on = was
        return wrapper

    monkeypatch.setattr(_Loop, "train_step", spy(_Loop.train_step, True))
    monkeypatch.setattr(Batches, "get", spy(Batches.get, False))
    if extra.pop("compile_slots", False):  # the slots a compiled run's batches carry, on the eager step
        monkeypatch.setattr(Objective, "slot_sizes", lambda self, rows: slot_sizes(*rows.shape, 0.15))
    cfg = toy_config(data, kind, max_steps=4, eval_source=None, vocab_size=300, **extra)
    if plant:
        cls = type(objective_for(cfg))
        loss = cls.loss

        def planted(self, module, batch, autocast):
            batch.labels[batch.labels != -100]  # the selection the losses made before issue 81
            return loss(self, module, batch, autocast)
        monkeypatch.setattr(cls, "loss", planted)
    run_training(cfg, tmp_path / "run")
    assert [r[0] for r in _train_rows(tmp_path / "run") if r[2] == "loss"] == [1, 2, 3, 4]
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("run", list(HOST_READ_RUNS))
def test_a_training_step_reads_nothing_back_to_the_host(data, tmp_path, monkeypatch, run):
    assert _step_host_reads(data, tmp_path, monkeypatch, *HOST_READ_RUNS[run]) == []


@pytest.mark.slow
@pytest.mark.parametrize("run", ["distil", "t5", "bart", "plm", "bilm"])
def test_a_host_read_planted_in_an_objectives_loss_is_seen(data, tmp_path, monkeypatch, run):
    # the null of the test above, in the same runs: one selection by a mask per step (4 steps)
    calls = _step_host_reads(data, tmp_path, monkeypatch, *HOST_READ_RUNS[run], plant=True)
    assert calls == ["aten::index with a mask"] * 4


def _tensors(batch):
    out = [batch.input_ids, batch.labels, batch.token_type_ids, batch.nsp_labels]
    if batch.slots is not None:
        s = batch.slots
        out += [s.index, s.rows, s.positions, s.targets, s.count]
    for k in sorted(batch.extras):
        v = batch.extras[k]
        out += list(v) if isinstance(v, tuple) else [v] if isinstance(v, torch.Tensor) else []
    return [t for t in out if t is not None]


@pytest.mark.parametrize("extra", [
    {"grad_accum": 2, "short_seq_len": 16, "short_frac": 0.5, "masking": {"nsp": True}},
    {"objective": "span"},
], ids=["mlm-accum-short-nsp", "span"])
def test_prefetched_batches_are_the_in_line_stream(data, tmp_path, extra):
    # from step 2 of 8 (a resumed run): the short phase (steps < 4) and the long one, each
    # micro-batch, the objective's extras (SpanBERT's boundary tuples) included
    fixed_wordpiece(data[0], tmp_path)
    cfg = toy_config(data, "encoder", max_steps=8, tokenizer_path=str(tmp_path / "tokenizer"), **extra)
    batches, _ = _batches(cfg, tmp_path)
    feed = Prefetcher(batches, torch.device("cpu"), 2, cfg.max_steps, cfg.grad_accum, cfg.max_steps)
    try:
        shapes = set()
        for step in range(2, cfg.max_steps):
            for micro in range(cfg.grad_accum):
                want = _tensors(batches.get(step, micro, torch.device("cpu"), step / cfg.max_steps))
                got = _tensors(feed.get(step, micro))
                assert len(got) == len(want) > 2
                for g, w in zip(got, want):
                    assert torch.equal(g, w), (step, micro)
                shapes.add(want[0].shape[1])
    finally:
        feed.close()
    assert len(shapes) == (2 if "short_seq_len" in extra else 1)


def test_prefetcher_raises_the_workers_error_and_a_wrong_order(data, tmp_path):
    fixed_wordpiece(data[0], tmp_path)
    cfg = toy_config(data, "encoder", max_steps=4, tokenizer_path=str(tmp_path / "tokenizer"))
    batches, _ = _batches(cfg, tmp_path)
    feed = Prefetcher(batches, torch.device("cpu"), 0, 4, 1, 4)
    with pytest.raises(RuntimeError, match=r"prefetched batch \(0, 0\) asked for as \(1, 0\)"):
        feed.get(1, 0)
    feed.close()

    def broken(step, micro, device, progress):
        raise ValueError(f"no rows for step {step}")
    batches.get = broken
    feed = Prefetcher(batches, torch.device("cpu"), 3, 4, 1, 4)
    with pytest.raises(ValueError, match="no rows for step 3"):
        feed.get(3, 0)
    feed.close()


def _compiled_graphs(sizes_of, counts=(0.1, 0.2, 0.3, 0.15)) -> list[int]:
    """Dynamo's graph count after each of four MLM losses through a `CompiledStep` (backend "eager":
    what is counted is dynamo's tracing, which recompiles on a new shape whatever the backend), on
    batches masking a different share of their positions each; `sizes_of(labels)` gives the slots' sizes."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model("encoder", {**preset("encoder", "tiny"), "vocab_size": 50, "dropout": 0.0}).train()
    step = CompiledStep(model, backend="eager")
    graphs = []
    for i, rate in enumerate(counts):
        ids = torch.randint(5, 50, (4, 16), generator=torch.Generator().manual_seed(i))
        labels = torch.where(torch.rand(4, 16, generator=torch.Generator().manual_seed(10 + i)) < rate, ids, -100)
        loss, _ = masked_lm_loss(step, Batch(ids, labels, slots=masked_slots(labels, sizes_of(labels))), False)
        loss.backward()
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return graphs


@pytest.mark.slow
def test_a_compiled_mlm_step_compiles_once_over_batches_with_different_masked_counts():
    fixed = _compiled_graphs(lambda labels: slot_sizes(*labels.shape, 0.3))
    assert fixed[0] > 0 and fixed == [fixed[0]] * 4
    # the null: slots of each batch's own counts recompile on the second count seen
    own = _compiled_graphs(lambda labels: None)
    assert own[-1] > own[0]


def _objective_graphs(data, tok_dir, objective: str, compile: bool) -> tuple[list[int], list[int]]:
    """Dynamo's new graphs after each of four losses of XLNet's "plm" or BART's "bart" objective
    through a `CompiledStep` (backend "eager", as above) on batches that `objective.batch` builds for
    a run with `compile` set or not, and each batch's varying size (XLNet's P, BART's encoder length).
    XLNet's rows hold 0, 3, 6 and 0 document breaks ([SEP]): 4, 3, 2 and 4 targets at K = 3; BART's
    noised rows are as long as their draws leave them."""
    if objective == "plm":
        run = dict(kind="xlnet", seq_len=16, objective_args={"partial_k": 3}, model={"dropout": 0.0})
    else:
        run = dict(kind="seq2seq", seq_len=24, objective="bart",
                   model={**load_config("bart-tiny").model, "dropout": 0.0})
    cfg = toy_config(data, compile=compile, tokenizer_path=str(tok_dir), **run)
    tok = Tokenizer.load(tok_dir)
    obj = objective_for(cfg)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = obj.build(cfg.kind, obj.model_config(build_model_config(cfg, tok))).train()
    step = CompiledStep(model, backend="eager")
    cont = continuation_ids(tok.hf.get_vocab())
    start = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    graphs, sizes = [], []
    for i, breaks in enumerate((0, 3, 6, 0)):
        _, rows = packed_rows(tok_dir, 4, cfg.seq_len, seed=i)
        if objective == "plm":
            rows[:, 1:1 + breaks] = tok.sep_id
        b = obj.batch(rows, tok, cfg.masking_config, step_generator(0, i), cont, torch.device("cpu"))
        loss, _, _ = obj.loss(step, b, False)
        loss.backward()
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - start)
        sizes.append(b.labels.shape[1] if objective == "plm" else b.input_ids.shape[1])
    return graphs, sizes


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["plm", "bart"])
def test_a_compiled_xlnet_or_bart_step_compiles_once_over_batches_of_different_sizes(data, tmp_path, objective):
    tok_dir = fixed_wordpiece(data[0], tmp_path)
    graphs, sizes = _objective_graphs(data, tok_dir, objective, compile=True)
    assert graphs[0] > 0 and graphs == [graphs[0]] * 4
    assert sizes == ([5] * 4 if objective == "plm" else [24] * 4)  # prediction_slots(16, 3); the row length
    # the null: an eager run's batches, each of its own size, recompile on the second size seen
    graphs, sizes = _objective_graphs(data, tok_dir, objective, compile=False)
    assert len(set(sizes)) > 1 and graphs[-1] > graphs[0]
    if objective == "plm":
        assert sizes == [4, 3, 2, 4]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["plm", "bart", "t5"])
def test_a_compiled_xlnet_or_seq2seq_run_trains_the_eager_runs_weights(data, tmp_path, monkeypatch, objective):
    # `compile: true` for XLNet, BART and T5 (their loss calls the model's forward): 6 steps through
    # `run_training` compiled (dynamo with its "eager" backend: the tracing and the static batches,
    # not inductor's kernels) give the eager run's losses and weights (fp32, no dropout)
    fixed_wordpiece(data[0], tmp_path)
    run = {"plm": dict(kind="xlnet"), "bart": dict(kind="seq2seq", objective="bart"),
           "t5": dict(kind="seq2seq", objective="t5", objective_args={"n_sentinels": 16})}[objective]
    if objective != "plm":
        run["model"] = {**load_config(f"{objective}-tiny").model, "dropout": 0.0}
    cfg = dict(max_steps=6, eval_source=None, log_every=1, tokenizer_path=str(tmp_path / "tokenizer"),
               **{"model": {"dropout": 0.0}, **run})
    own = run_training(toy_config(data, **cfg), tmp_path / "eager").path
    monkeypatch.setattr("plmodels.training.loop.CompiledStep", lambda model: CompiledStep(model, backend="eager"))
    torch._dynamo.reset()
    start = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = run_training(toy_config(data, compile=True, **cfg), tmp_path / "compiled").path
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > start  # the step went through dynamo
    _assert_trained_alike(own, compiled)
    with pytest.raises(ValueError, match="compile: true covers the objectives"):  # SpanBERT's model is not reached
        toy_config(data, objective="span", compile=True)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"masking": {"nsp": True}}, {"objective": "span"}, {"objective": "electra"}],
                         ids=["mlm", "mlm-nsp", "span", "electra"])
def test_fixed_size_slots_train_the_weights_of_the_batches_own_counts(data, tmp_path, monkeypatch, extra):
    # 6 steps with the slots of a compiled run (bounds from the config: padding slots in every batch)
    # and with each batch's own counts: the same losses and weights (fp32, no dropout: dropout would
    # draw its masks over a different number of rows)
    fixed_wordpiece(data[0], tmp_path)
    cfg = toy_config(data, max_steps=6, eval_source=None, log_every=1, tokenizer_path=str(tmp_path / "tokenizer"),
                     model={"dropout": 0.0}, **extra)
    own = run_training(cfg, tmp_path / "own").path
    used = []

    def config_bounds(self, rows):
        used.append(slot_sizes(*rows.shape, 0.15))
        return used[-1]
    monkeypatch.setattr(Objective, "slot_sizes", config_bounds)
    fixed = run_training(cfg, tmp_path / "fixed").path
    assert used == [(24, 80)] * 6  # 32 tokens a row at 15%: 4.8 + 6 * 2.02 -> 24, 8 rows: 38.4 + 6 * 5.71 -> 80
    _assert_trained_alike(own, fixed)
