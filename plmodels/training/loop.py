"""The pretraining run: from a config to a trained checkpoint folder. Masked LM for encoders (BERT),
causal LM for decoders (GPT-2), fast on a CPU.

Library entry point (the CLI `workbench pretrain` calls this):
    pretrain(config, out_dir, resume=True, overrides=None) -> Path   # path of out_dir/final

`config` is a `PretrainConfig`, a JSON file or the name of a shipped recipe (plmodels/recipes/pretrain/*.json)
("encoder-mini"). `overrides` is a dict of config keys (nested "model" / "masking" dicts are
merged). Under `torchrun --nproc_per_node=N` the same call trains data-parallel (distributed.py);
only rank 0 writes.

Steps: tokenizer (WordPiece for the encoder, byte-level BPE for the decoder, trained on a bounded
sample of the corpus, or loaded) -> tokenize to a cache -> pack into `seq_len` rows (and, to train
short first, `short_seq_len` rows for the first `short_frac` of the schedule) (data.py) -> AdamW
(runtime.py) with warmup + decay (schedule.py) -> loop with gradient accumulation, clipping,
optional bf16 autocast and MLM logits computed only at the masked positions (loss.py) -> held-out
evaluation with a fixed mask (evaluation.py) -> `metrics.jsonl` -> checkpoints with the full
training state (state.py; safetensors + JSON, no pickles).

Run folder layout:
    out_dir/config.resolved.json      the resolved config (resume refuses a different one)
    out_dir/metrics.jsonl             {step, tokens, split, metric, value, time} per line
    out_dir/resumes.json              one record per resumption (absent if the run never resumed)
    out_dir/tokenizer/                the tokenizer used
    out_dir/cache/                    token caches
    out_dir/checkpoints/step_0000064/ plmodels.save folder + train_state.safetensors/.json
    out_dir/final/                    the last checkpoint (same layout)

Reproducibility: the data order is a function of (seed, epoch), the MLM mask and the dropout RNG are
functions of (seed, step), so a killed run resumed from its last checkpoint reaches bit-identical
weights (fp32) to an uninterrupted one, and the same metrics.jsonl rows.

Surviving a kill (SIGKILL, OOM killer, a lost node) at any point: every file the run rewrites is
written atomically (a temporary sibling, fsynced, renamed over the target: plmodels.files):
config.resolved.json, metrics.jsonl when a resumption rewrites it, and whole folders for the
tokenizer and each checkpoint (model, card, tokenizer and training state built in a hidden
`.<name>.tmp-*` folder, then renamed in), so a checkpoint folder is complete or absent.
metrics.jsonl is appended to when the loop reads the losses back (`_Loop._flush`: every `log_every`
steps and before each evaluation and checkpoint; no step waits on the host for its loss), one row
per step; a kill in an append can tear its last line. On
resumption `clean_metrics` drops that torn line (with a warning) and the rows the resumed run will
log again (those after its checkpoint's step), so the curve holds each row once; an unparseable line
elsewhere is an error naming file:line. What it dropped goes to resumes.json and the cards'
`resumes`. Temporaries left by a killed run are deleted when the run starts again (one process per
run folder: a second process writing the same folder is not supported). tests/plmodels/test_resume.py
SIGKILLs runs at each kind of write (runtime.kill_point) and at random moments and checks that the
resumed run's metrics and weights are the uninterrupted run's.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from plmodels.checkpoint import CONFIG_FILE, MODEL_KINDS, RUN_CONFIG_FILE, read_weights, save
from plmodels.config import build
from plmodels.files import atomic_open, remove_stale, replace_folder, temp_folder, write_json_atomic
from plmodels.families import family
from plmodels.families import preset as preset_fields
from plmodels.progress import progress

from .config import (
    RESUME_SAFE_KEYS,
    PretrainConfig,
    config_diff,
    config_path,
    load_config,
    resolve_path,
)
from . import corpus
from .corpus import PackedDataset
from .data import Batches, Prefetcher, prepare_tokenizer, token_cache
from .distil import DistilConfig
from .distributed import (
    Dist,
    any_rank,
    average_gradients,
    barrier,
    broadcast_parameters,
    init_distributed,
    rank0_value,
)
from .evaluation import Evaluator
from .masking import step_generator
from .objectives import objective_for
from .runtime import (
    append_metrics,
    fmt_time,
    kill_point,
    log,
    make_optimizer,
    read_jsonl,
    use_bf16,
    warn_if_steps_end_first,
)
from .schedule import lr_at, schedule_step
from .state import (
    latest_checkpoint,
    load_train_state,
    log_spaced,
    save_train_state,
    should_checkpoint,
)


@dataclass
class TrainResult:
    """What `run_training` hands back: the trained model (every rank), its folder, where it stopped."""

    model: torch.nn.Module
    path: Path | None
    step: int
    stopped_by: str


def build_model_config(cfg: PretrainConfig, tok) -> dict:
    """Preset fields, then the config's `model` overrides, then what the tokenizer fixes."""
    fields_ = {**preset_fields(cfg.kind, cfg.preset), **cfg.model, "vocab_size": tok.vocab_size}
    if family(cfg.kind).segments:
        fields_["pad_token_id"] = tok.pad_id
        if cfg.masking_config.nsp or cfg.masking_config.sop:  # SOP uses the same 2-way head on [CLS]
            fields_["use_nsp"] = True
    else:
        for k in ("type_vocab_size", "use_nsp", "pad_token_id"):
            fields_.pop(k, None)
    return fields_


def check_model_config(cfg: PretrainConfig, source: str = "", overrides: dict | None = None) -> None:
    """Type-check the model config a run will build (preset, then `cfg.model`), before any work: a
    tokenizer's vocabulary and special ids are not known yet, so the config's `vocab_size` stands
    in. Errors name `source` (the config file) and `model.<field>`, or `--set model.<field>` when
    the value came from `overrides`. DistilBERT's student is the teacher's shape (no preset), so
    only its teacher folder is checked here."""
    if cfg.objective == "distil":
        teacher = Path(DistilConfig.from_dict(cfg.objective_args, "objective_args (distil)").teacher).expanduser()
        if not (teacher / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{source or 'config'}: objective_args.teacher: {teacher} is not a checkpoint "
                                    f"folder (no {CONFIG_FILE})")
        return
    fields_ = {**preset_fields(cfg.kind, cfg.preset), **cfg.model, "vocab_size": cfg.vocab_size}
    if not family(cfg.kind).segments:
        for k in ("type_vocab_size", "use_nsp", "pad_token_id"):
            fields_.pop(k, None)
    build(MODEL_KINDS[cfg.kind][1], fields_, source or "model", (overrides or {}).get("model"), prefix="model.")


def check_sources(cfg: PretrainConfig, source: str = "") -> None:
    """Every corpus the run reads exists and has its split (corpus.source_key), before any work;
    errors name `source` and the field."""
    pairs = [("train_source", cfg.train_source, cfg.train_split), ("eval_source", cfg.eval_source, cfg.eval_split)]
    pairs += [(f"extra_eval.{name}", src, split) for name, (src, split) in cfg.extra_eval.items()]
    for field_, src, split in pairs:
        if src is None:
            continue
        try:
            corpus.source_key(resolve_path(src, cfg.data_dir), split)
        except (OSError, ValueError) as e:
            raise type(e)(f"{source or 'config'}: {field_}={src!r}: {e}") from None


RUN_FILES = (RUN_CONFIG_FILE, "metrics.jsonl", "resumes.json", "checkpoints", "final", "tokenizer")


def read_run_config(run_dir: str | Path) -> PretrainConfig | None:
    """The pretraining config a run folder was trained with (its config.resolved.json), or None
    when the folder holds no run; a damaged file is an error naming it."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        resolved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e}); it was torn or edited") from None
    return PretrainConfig.from_dict(resolved["pretrain"], source=str(path))


def start_over(out_dir: Path, why: str) -> None:
    """Delete what a run wrote in out_dir (RUN_FILES; the token caches, keyed by the tokenizer's
    fingerprint, stay) so that a new run starts there from step 0."""
    log(f"starting the run in {out_dir} over: {why}")
    for name in RUN_FILES:
        p = out_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def claim_folder(out_dir: Path, cfg: PretrainConfig, resume: bool) -> None:
    """Before the tokenizer: a folder whose run is not to be resumed is cleared (`start_over`).
    That is any run under resume=False (`--no-resume`: start again), and a run with no finished
    checkpoint whose pretraining config differs from `cfg` (it failed or was stopped before its
    first checkpoint: nothing is lost, and the corrected command takes the folder over instead of
    being refused). A run with a finished checkpoint and another config is refused by `check_resume`."""
    path = out_dir / RUN_CONFIG_FILE
    if not path.is_file():
        if any((out_dir / name).exists() for name in RUN_FILES):  # a run that died before writing it
            start_over(out_dir, "it has no config.resolved.json (a run stopped before it started)")
        return
    if not resume:
        start_over(out_dir, "--no-resume (resume=False)")
        return
    if latest_checkpoint(out_dir, quiet=True) is not None:
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("pretrain", {})
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        old = None
    new = cfg.to_dict()
    if old is None or [k for k in config_diff(old, new) if k.split(".")[0] not in RESUME_SAFE_KEYS]:
        start_over(out_dir, "it has no finished checkpoint and its config differs from this one")


def check_resume(out_dir: Path, resolved: dict, resume: bool) -> bool:
    """Whether a run exists in out_dir to resume; refuses a different config (listing the keys)."""
    path = out_dir / RUN_CONFIG_FILE
    if not path.is_file():
        return False
    if not resume:   # claim_folder has cleared it; another process wrote it since
        raise FileExistsError(f"{out_dir} already holds a run (config.resolved.json); resume it or use another folder")
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e}); it was torn or edited") from None
    # a key added to PretrainConfig after the run was written is the same config if it has its default
    defaults = {f.name: f.default for f in fields(PretrainConfig) if f.default is not MISSING}
    for k, v in resolved.get("pretrain", {}).items():
        if k not in old.get("pretrain", {}) and k in defaults and v == defaults[k]:
            old.setdefault("pretrain", {})[k] = v
    strip = lambda r: {**r, "pretrain": {k: v for k, v in r["pretrain"].items() if k not in RESUME_SAFE_KEYS}}  # noqa: E731
    # a model field shows twice, as pretrain.model.X (the override) and model.X (the resolved model): once here
    diff = list(dict.fromkeys(k.removeprefix("pretrain.") for k in config_diff(strip(old), strip(resolved))))
    if diff:
        raise ValueError(f"cannot resume the run in {out_dir}: the config differs in {diff} "
                         f"(start a new folder, or restore these keys)")
    return True


def clean_metrics(path: Path, step: int, cfg: PretrainConfig) -> dict:
    """Make metrics.jsonl (`path`) hold what a run resumed at `step` has logged and will not log
    again; returns what it dropped: {"metrics_rows_dropped", "torn_lines_dropped", "torn_bytes_dropped"}.

    Dropped: a torn last line (`read_jsonl`; a warning says how many bytes), every row after `step`,
    and the held-out rows at `step` when the resumed run evaluates there again: at step 0 (the
    evaluation before training; `step` is 0 when no checkpoint was finished) and at or past
    max_steps (the final evaluation, logged before `final` is saved, which a resumption from `final`
    or from a checkpoint at max_steps redoes). The kept lines are rewritten as they were, atomically.
    """
    got = read_jsonl(path)
    redo_evals = step == 0 or step >= cfg.max_steps
    keep = [line for r, line in zip(got.rows, got.lines)
            if r["step"] < step or (r["step"] == step and (r["split"] == "train" or not redo_evals))]
    dropped = {"metrics_rows_dropped": len(got.rows) - len(keep), "torn_lines_dropped": got.torn_lines,
               "torn_bytes_dropped": got.torn_bytes}
    if got.torn_lines:
        log(f"warning: {path}: dropped its last line, {got.torn_bytes} bytes torn by a killed append")
    if dropped["metrics_rows_dropped"]:
        log(f"{path.name}: dropped {dropped['metrics_rows_dropped']} rows that the run resumed at step {step} "
            f"logs again")
    text = "".join(line + "\n" for line in keep)
    if path.is_file() and path.read_bytes() != text.encode("utf-8"):
        with atomic_open(path) as f:
            f.write(text)
            kill_point("resume", f)  # tests: die with the new file written, not yet renamed in
    return dropped


LEFTOVER_FOLDERS = (".", "checkpoints", "cache", "tokenizer")


def remove_leftovers(out_dir: Path) -> int:
    """Delete the temporaries of atomic writes a killed run left in its folder (hidden entries
    named `.<name>.<random>.tmp`, `.<name>.tmp-*` or `.<name>.old-*`: `plmodels.files.remove_stale`);
    returns how many. Folders named with the pid of another live process are kept."""
    return sum(remove_stale(out_dir / sub) for sub in LEFTOVER_FOLDERS)


def _record_resume(out_dir: Path, record: dict) -> list[dict]:
    """Add `record` to out_dir/resumes.json (rewritten atomically); returns every record."""
    path = out_dir / "resumes.json"
    records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    records.append(record)
    write_json_atomic(path, records)
    return records


def _seed_step(seed: int, step: int, rank: int) -> None:
    """Dropout draws from the global RNG: reseed it from (seed, step, rank) so resumption replays it."""
    torch.manual_seed(int(step_generator(seed, step, stream=rank).initial_seed()))


def run_training(cfg: PretrainConfig, out_dir: str | Path, resume: bool = True,
                 stop_at_step: int | None = None) -> TrainResult:
    """The pretraining loop (see module docstring). `stop_at_step` ends the process's work right
    after that step's checkpoint without writing `final` — it simulates a kill, for tests. A process
    group this call joined is destroyed before it returns: a process that exits with the group alive
    can be aborted while gloo's threads are torn down ("terminate called without an active
    exception", exit status -6; seen in the two-process test). Every rank has passed the loop's
    last barrier by then."""
    d, device, joined = init_distributed()
    try:
        return _train(cfg, Path(out_dir), resume, stop_at_step, d, device)
    finally:
        if joined:
            dist.destroy_process_group()


def _train(cfg: PretrainConfig, out_dir: Path, resume: bool, stop_at_step: int | None, d: Dist,
           device: torch.device) -> TrainResult:
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if d.main:
        out_dir.mkdir(parents=True, exist_ok=True)
        claim_folder(out_dir, cfg, resume)
    barrier(d)
    objective = objective_for(cfg)
    tok = prepare_tokenizer(cfg, out_dir, d, objective.tokenizer_path())
    model_cfg = objective.model_config(build_model_config(cfg, tok))
    resolved = {"pretrain": cfg.to_dict(), "model": model_cfg, "tokenizer": tok.fingerprint(), "world_size": d.world}
    resuming = check_resume(out_dir, resolved, resume)
    leftovers = 0
    if d.main:  # after check_resume: a refused call leaves the folder as it was
        leftovers = remove_leftovers(out_dir)
        if leftovers:
            log(f"removed {leftovers} temporaries of writes a killed run left unfinished in {out_dir}")
    barrier(d)
    if d.main and not resuming:
        write_json_atomic(out_dir / RUN_CONFIG_FILE, resolved)

    train_ids = token_cache(cfg.train_source, cfg.train_split, cfg, tok, out_dir, d, cfg.max_train_texts)
    short = None if cfg.short_seq_len is None else PackedDataset.for_tokenizer(train_ids, cfg.short_seq_len, cfg.seed, tok)
    batches = Batches(PackedDataset.for_tokenizer(train_ids, cfg.seq_len, cfg.seed, tok), cfg, d, tok, short, objective)
    counts = torch.from_numpy(np.bincount(train_ids, minlength=tok.vocab_size)).double()
    log_unigram = ((counts + 1) / (counts.sum() + tok.vocab_size)).log()
    evals = []
    if d.main:
        for name, (src, split) in [("eval", (cfg.eval_source, cfg.eval_split))] + list(cfg.extra_eval.items()):
            if src is not None:
                ids = token_cache(src, split, cfg, tok, out_dir, Dist())
                ds = PackedDataset.for_tokenizer(ids, cfg.heldout_len, cfg.seed, tok)
                evals.append(Evaluator(name, ds, cfg, tok, log_unigram, device))

    torch.manual_seed(cfg.seed)
    model = objective.build(cfg.kind, model_cfg).to(device)  # the trained module (objectives.py)
    analysed = objective.analysed(model)
    if getattr(analysed.config, "output", "softmax") == "adaptive":
        analysed.set_vocab_order(counts)  # the shortlist = the most frequent training tokens
    optimizer = make_optimizer(model, cfg)
    step, tokens, elapsed = 0, 0, 0.0
    ckpt = latest_checkpoint(out_dir) if resuming else None
    if ckpt is not None:
        analysed.load_state_dict(read_weights(ckpt, device=str(device)))
        objective.load_extras(model, ckpt, device)
        info = load_train_state(ckpt, optimizer)
        step, tokens, elapsed = info["step"], info["tokens"], info["elapsed"]
        if d.main:
            log(f"resuming from {ckpt} at step {step} (epoch {info['epoch']}, position {info['position']})")
    resumes: list[dict] = []
    if d.main and resuming:  # with no finished checkpoint the run starts again from step 0
        if ckpt is None:
            log(f"resuming the run in {out_dir} from step 0: it has no finished checkpoint")
        dropped = clean_metrics(out_dir / "metrics.jsonl", step, cfg)
        resumes = _record_resume(out_dir, {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from": None if ckpt is None else str(ckpt.relative_to(out_dir)),
            "step": step, **dropped, "leftovers_removed": leftovers})
    broadcast_parameters(model, d)
    autocast = use_bf16(cfg.bf16, device)
    if d.main:
        why = "as set" if cfg.bf16 != "auto" else ("native" if autocast else "no native") + " bf16 on this device"
        log(f"precision: {'bf16 autocast' if autocast else 'fp32'} (bf16: {cfg.bf16!r}, {why})")
    loop = _Loop(cfg, d, device, objective, model, optimizer, batches, evals, tok, out_dir, autocast, train_ids,
                 resumes)
    return loop.run(step, tokens, elapsed, stop_at_step)


def loss_curve(metrics_path: Path, last_step: int) -> dict:
    """Summary of metrics.jsonl for the card: train loss at steps 1, 2, 4, ... and the last step,
    and every held-out loss, as [step, value] pairs."""
    out: dict[str, list] = {"train_loss": []}
    for r in read_jsonl(metrics_path).rows:
        if r["split"] == "train" and r["metric"] == "loss" and (log_spaced(r["step"]) or r["step"] == last_step):
            out["train_loss"].append([r["step"], round(r["value"], 4)])
        elif r["split"] != "train" and r["metric"] == "loss":
            out.setdefault(f"{r['split']}_loss", []).append([r["step"], round(r["value"], 4)])
    return out


class CompiledStep:
    """The model as `lm_loss` sees it in a compiled train step: `forward` and the encoder's
    `hidden_at` through torch.compile, every other attribute the plain model's (same parameters).
    `torch.compile(model)` alone compiles only `forward`, which the encoder's loss does not call, and
    setting an attribute on its wrapper sets it on the model; this wrapper leaves the model as it
    was, so eval, hooks and saving run uncompiled. The batches of a compiled run carry slots of
    sizes fixed by the config (`Objective.slot_sizes`), so `hidden_at` compiles once per batch shape
    (the short and the long rows), however many positions each batch masks; XLNet's and BART's
    batches are padded to one shape per row length the same way (`Objective.static_shapes`; T5's
    have one already)."""

    def __init__(self, model, backend: str = "inductor") -> None:
        self._model = model
        self._forward = torch.compile(model, backend=backend)
        if hasattr(model, "hidden_at"):  # an encoder's loss; other attributes fall through (__getattr__)
            self.hidden_at = torch.compile(model.hidden_at, backend=backend)

    def __call__(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class _Loop:
    """The optimisation loop and what it writes (state kept here so each method stays short)."""

    def __init__(self, cfg, d, device, objective, model, optimizer, batches, evals, tok, out_dir, autocast,
                 train_ids, resumes=()):
        self.cfg, self.d, self.device, self.model, self.opt = cfg, d, device, model, optimizer
        self.objective, self.analysed = objective, objective.analysed(model)  # trained module, saved model
        self.resumes = list(resumes)  # the run's resumption records (resumes.json), for the cards
        self.batches, self.evals, self.tok, self.out_dir, self.autocast = batches, evals, tok, out_dir, autocast
        self.n_train_tokens = int(len(train_ids))
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * d.world
        self.last_eval: dict[str, float] = {}
        # the compiled view shares the parameters; eval, hooks and saving use the plain model
        self.step_model = CompiledStep(model) if cfg.compile else model
        self.prefetch: Prefetcher | None = None  # batches built ahead while the model trains (`run`)

    def train_step(self, step: int, elapsed: float) -> tuple[torch.Tensor, dict]:
        """One optimizer step; returns the mean loss over its micro-batches and the mean of the
        objective's parts (e.g. ELECTRA's mlm_loss, rtd_loss), as they are on the device: a 0-d
        float64 tensor for the loss, tensors or floats for the parts. Nothing here reads a device
        value on the host, so on CUDA the step's kernels are queued and the host goes on to the next
        step; `_flush` reads the losses of many steps at once."""
        cfg = self.cfg
        _seed_step(cfg.seed, step, self.d.rank)
        budget = cfg.max_minutes * 60 if cfg.schedule_clock == "time" else None
        at = schedule_step(step, elapsed, budget, cfg.max_steps)
        if budget is not None:  # every rank must use the same rate
            at = int(rank0_value(at, self.d, self.device))
        lr = lr_at(at, peak=cfg.lr, warmup=cfg.warmup_steps, total=cfg.max_steps,
                   schedule=cfg.schedule, min_ratio=cfg.min_lr_ratio, decay_frac=cfg.decay_frac)
        for g in self.opt.param_groups:
            g["lr"] = lr
        total, parts = None, {}
        progress = at / cfg.max_steps
        for micro in range(cfg.grad_accum):
            if self.prefetch is not None:
                batch = self.prefetch.get(step, micro)
            else:
                batch = self.batches.get(step, micro, self.device, progress)
            loss, _, got = self.objective.loss(self.step_model, batch, self.autocast)
            (loss / cfg.grad_accum).backward()
            # float64, as the Python float sum of `loss.item() / grad_accum` that the log held before
            share = loss.detach().double() / cfg.grad_accum
            total = share if total is None else total + share
            for k, v in got.items():
                v = v.detach().double() if isinstance(v, torch.Tensor) else v
                parts[k] = parts.get(k, 0.0) + v / cfg.grad_accum
        average_gradients(self.model, self.d)
        if cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total, parts

    def _flush(self, pending: list[tuple[int, int, float, torch.Tensor, dict]]) -> list[float]:
        """Read the losses and parts of the steps in `pending` (step, tokens, time, loss, parts) in
        one transfer, write their metrics.jsonl rows (rank 0) and empty `pending`; returns their
        losses. The only host sync of the loop between two log lines, checkpoints or evaluations."""
        if not pending:
            return []
        keys = list(dict.fromkeys(k for *_, parts in pending for k in parts))
        values = torch.stack([torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device)
                                           for v in (loss, *(parts[k] for k in keys))])
                              for _, _, _, loss, parts in pending]).tolist()  # (steps, 1 + parts)
        if self.d.main:
            for (step, tokens, now, _, parts), row in zip(pending, values):
                got = {"loss": row[0], **{k: v for k, v in zip(keys, row[1:]) if k in parts}}
                append_metrics(self.out_dir / "metrics.jsonl", step, tokens, "train", got, now)
                kill_point("step")  # tests: die between a step's row and its checkpoint
        pending.clear()
        return [row[0] for row in values]

    def evaluate(self, step: int, tokens: int, t: float) -> None:
        for ev in self.evals:
            m = ev(self.objective.mlm_model(self.model), self.autocast)
            append_metrics(self.out_dir / "metrics.jsonl", step, tokens, ev.name, m, t)
            self.last_eval.update({f"{ev.name}_{k}": v for k, v in m.items()})
            log(f"  eval {ev.name} @ {step}: loss {m['loss']:.4f} ppl {m['ppl']:.1f} acc {m['acc']:.3f} "
                f"(unigram loss {m['unigram_loss']:.4f})")

    def card(self, step: int, tokens: int, stopped_by: str) -> dict:
        cfg = self.cfg
        return {
            **({"resumes": self.resumes} if self.resumes else {}),
            "data": {"train": [cfg.train_source, cfg.train_split], "train_tokens": self.n_train_tokens,
                     "eval": [cfg.eval_source, cfg.eval_split], "extra_eval": cfg.extra_eval,
                     "tokenizer": {"kind": self.tok.kind, "vocab_size": self.tok.vocab_size}},
            "steps": step, "tokens": tokens, "metrics": dict(self.last_eval),
            "loss_curve": loss_curve(self.out_dir / "metrics.jsonl", step),
            "objective": self.objective.describe(), "objective_name": self.objective.name,
            "objective_args": self.objective.args.to_dict(), "lm_head_trained": self.objective.lm_head_trained,
            "preset": cfg.preset, "stopped_by": stopped_by, "bf16": self.autocast,
            "seed": cfg.seed,  # the initial weights' and data order's seed: the analyses' random-init floor reads it
        }

    def save(self, path: Path, step: int, tokens: int, elapsed: float, stopped_by: str) -> None:
        """The checkpoint folder, whole: built in a hidden temporary sibling (model, tokenizer, card,
        training state), fsynced and renamed to `path` (plmodels.files.replace_folder)."""
        tmp = temp_folder(path)
        try:
            card = {"name": path.name, **self.card(step, tokens, stopped_by)}
            save(self.analysed, self.tok, tmp, card=card)
            self.objective.save_extras(self.model, tmp, self.tok, card)
            epoch, pos = self.batches.position(step)
            save_train_state(tmp, self.opt, {"step": step, "tokens": tokens, "elapsed": elapsed, "epoch": epoch,
                                             "position": pos, "seed": self.cfg.seed, "world_size": self.d.world})
            kill_point("checkpoint")  # tests: die with the folder built, not yet renamed in
            replace_folder(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def run(self, step: int, tokens: int, elapsed: float, stop_at_step: int | None) -> TrainResult:
        cfg, d = self.cfg, self.d
        self.model.train()
        t0, t_log, tok_log, loss_sum, n_loss = time.monotonic(), time.monotonic(), tokens, 0.0, 0
        budget = None if cfg.max_minutes is None else cfg.max_minutes * 60
        stopped_by, warned = "max_steps", False
        if d.main and step == 0 and self.evals:
            self.evaluate(0, 0, 0.0)
        # a bar over steps from where this run resumes; a line every log_every steps (refresh below).
        # With a time budget the run ends at max_steps or the budget, whichever comes first, and so
        # does the bar's ETA (end_within).
        bar = progress(cfg.max_steps, "pretrain", "step", initial=step, log_interval=math.inf, disable=not d.main)
        pending: list[tuple[int, int, float, torch.Tensor, dict]] = []  # steps not yet read back (`_flush`)
        if cfg.schedule_clock == "steps":  # a time clock's batches depend on the time a step starts at
            self.prefetch = Prefetcher(self.batches, self.device, step, cfg.max_steps, cfg.grad_accum, cfg.max_steps)
        try:
            while step < cfg.max_steps:
                loss, parts = self.train_step(step, elapsed + time.monotonic() - t0)
                step, tokens = step + 1, tokens + self.tokens_per_step
                now = elapsed + time.monotonic() - t0
                pending.append((step, tokens, now, loss, parts))
                logged = False
                log_now = step % cfg.log_every == 0 or step == cfg.max_steps
                eval_now = bool(cfg.eval_every) and step % cfg.eval_every == 0 and step < cfg.max_steps
                ckpt_now = should_checkpoint(step, cfg)
                stop_now = stop_at_step is not None and step >= stop_at_step
                out_of_time = any_rank(budget is not None and now >= budget, d, self.device)
                if log_now or eval_now or ckpt_now or stop_now or out_of_time:
                    # every row up to this step is in metrics.jsonl before a log line, an evaluation's
                    # rows or a checkpoint (which a resumed run's clean_metrics keeps rows up to)
                    losses = self._flush(pending)
                    loss_sum, n_loss = loss_sum + sum(losses), n_loss + len(losses)
                if d.main:
                    bar.update(1)
                    if budget is not None:
                        bar.end_within(budget - now)
                    if log_now:
                        rate = (tokens - tok_log) / max(1e-9, time.monotonic() - t_log)
                        bar.set_postfix_str(f"loss {loss_sum / n_loss:.4f}, lr {self.opt.param_groups[0]['lr']:.2e}, "
                                            f"{rate:,.0f} tok/s", refresh=False)
                        if not warned and cfg.schedule_clock == "time" and step >= 2 * cfg.log_every:
                            to_max_steps = (cfg.max_steps - step) * self.tokens_per_step / max(rate, 1e-9)
                            warned = warn_if_steps_end_first(cfg, now + to_max_steps, rate)
                        t_log, tok_log, loss_sum, n_loss, logged = time.monotonic(), tokens, 0.0, 0, True
                    if eval_now:
                        self.evaluate(step, tokens, now)
                if logged and step < cfg.max_steps and not out_of_time:
                    bar.refresh()  # the last line is the bar's closing one
                if d.main and ckpt_now:
                    self.save(self.out_dir / "checkpoints" / f"step_{step:07d}", step, tokens, now, "checkpoint")
                if stop_now:
                    barrier(d)
                    return TrainResult(self.analysed, None, step, "killed")
                if out_of_time:
                    stopped_by = "time budget"
                    break
        finally:
            if self.prefetch is not None:
                self.prefetch.close()
                self.prefetch = None
            bar.close()
        now = elapsed + time.monotonic() - t0
        final = self.out_dir / "final"
        if d.main:
            if self.evals:
                self.evaluate(step, tokens, now)
            self.save(final, step, tokens, now, stopped_by)
            log(f"done: {step} steps, {tokens:,} tokens, {fmt_time(now)}; stopped by {stopped_by}; -> {final}")
        barrier(d)
        return TrainResult(self.analysed, final, step, stopped_by)


def pretrain(config: PretrainConfig | str | Path, out_dir: str | Path, resume: bool = True,
             overrides: dict | None = None) -> Path:
    """Pretrain from a config (object, JSON path or recipe name); returns out_dir/final.

    resume=True continues the run in out_dir from its last checkpoint (same data order, optimizer
    state and masks); a changed config is refused with the differing keys listed, unless the run
    has no finished checkpoint yet (it is then started over with the new config: `claim_folder`).
    resume=False starts over in a folder that already holds a run. The whole config, the model's
    included, is checked before the folder is made or a tokenizer trained.
    """
    cfg = load_config(config, overrides)
    source = str(config_path(config)) if isinstance(config, (str, Path)) else "config"
    check_model_config(cfg, source, overrides)   # before the tokenizer and the run folder
    check_sources(cfg, source)
    return run_training(cfg, out_dir, resume=resume).path
