"""Pretraining: masked LM for encoders (BERT), causal LM for decoders (GPT-2), fast on a CPU.

Library entry point (the CLI `workbench pretrain` calls this):

    pretrain(config, out_dir, resume=True, overrides=None) -> Path   # path of out_dir/final

`config` is a `PretrainConfig`, a JSON file (configs/pretrain/*.json) or the name of one
("encoder-mini"). `overrides` is a dict of config keys (nested "model" / "masking" dicts are
merged). Under `torchrun --nproc_per_node=N` the same call trains data-parallel (see `plmodels.ddp_*`
helpers below); only rank 0 writes.

Steps: tokenizer (WordPiece for the encoder, byte-level BPE for the decoder, trained on a bounded
sample of the corpus, or loaded) -> tokenize to a cache -> pack into `seq_len` rows (and, to train
short first, `short_seq_len` rows for the first `short_frac` of the schedule) -> AdamW
(Loshchilov & Hutter 2019; no weight decay on biases, norms and embeddings' LayerNorm) with
warmup + decay (`plmodels.schedule`) -> loop with gradient accumulation, clipping, optional bf16
autocast and MLM logits computed only at the masked positions -> held-out evaluation (fixed mask)
-> `metrics.jsonl` -> checkpoints with the full training state (safetensors + JSON, no pickles).

Run folder layout:
    out_dir/config.resolved.json      the resolved config (resume refuses a different one)
    out_dir/metrics.jsonl             {step, tokens, split, metric, value, time} per line
    out_dir/tokenizer/                the tokenizer used
    out_dir/cache/                    token caches
    out_dir/checkpoints/step_0000064/ plmodels.save folder + train_state.safetensors/.json
    out_dir/final/                    the last checkpoint (same layout)

Reproducibility: the data order is a function of (seed, epoch), the MLM mask and the dropout RNG are
functions of (seed, step), so a killed run resumed from its last checkpoint reaches bit-identical
weights (fp32) to an uninterrupted one.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file

from plmodels import corpus
from plmodels.checkpoint import build_model, save
from plmodels.corpus import PackedDataset, sample_texts_for_tokenizer
from plmodels.files import make_shared, save_safetensors
from plmodels.masking import (
    IGNORE_INDEX,
    MaskingConfig,
    continuation_ids,
    mask_tokens,
    nsp_pairs,
    step_generator,
    word_starts,
)
from plmodels.presets import preset as preset_fields
from plmodels.schedule import SCHEDULES, lr_at, schedule_step
from plmodels.tokenizer import Tokenizer

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "pretrain"
# Keys that may change when a run resumes: they change neither the data, the model nor the updates.
RESUME_SAFE_KEYS = {"max_minutes", "log_every", "num_threads", "name", "compile"}


# ------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class PretrainConfig:
    """Everything a pretraining run depends on; no hidden defaults are read from elsewhere."""

    kind: Literal["encoder", "decoder"]          # masked LM (BERT) or causal LM (GPT-2)
    train_source: str                             # corpus folder or file (plmodels.corpus), relative to data_dir
    train_split: str | None = "train"             # its split (None: the format's first)
    eval_source: str | None = None                # held-out corpus for the eval loss (None: no eval)
    eval_split: str | None = "valid"
    extra_eval: dict = field(default_factory=dict)  # name -> [source, split]: extra perplexity corpora
    data_dir: str = "${WORKBENCH_DATA}"           # base of relative paths (env var, else ../shared/data)
    name: str = ""                                # free text, for the card
    preset: str = "mini"                          # tiny | mini | small | base (plmodels.presets)
    model: dict = field(default_factory=dict)     # overrides of the preset's model-config fields
    tokenizer_path: str | None = None             # reuse a saved tokenizer folder instead of training
                                                  # (a relative path is taken from the current directory,
                                                  # like --out: tokenizers are run outputs, not data)
    vocab_size: int = 16000                       # tokenizer vocabulary when trained
    tokenizer_sample_chars: int = 5_000_000       # characters sampled from the train split to train it
    lowercase: bool = False                       # WordPiece lowercasing
    max_train_texts: int | None = None            # cap on training documents read (None: all)
    seq_len: int = 128                            # tokens per packed row
    short_seq_len: int | None = None              # "short first": rows of this length for the first
    short_frac: float = 0.0                       # short_frac of the schedule (steps, or time on the clock),
                                                  # batch_size * seq_len / short_seq_len rows a step (the same
                                                  # tokens per step); then seq_len (Devlin et al. 2019, A.2:
                                                  # 128 for 90% of the steps, then 512)
    eval_seq_len: int | None = None               # held-out row length (None: seq_len); fix it to compare
                                                  # runs trained at different lengths on the same targets
    batch_size: int = 32                          # rows per micro-batch (per process)
    grad_accum: int = 1                           # micro-batches per optimizer step
    lr: float = 5e-4                              # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)      # AdamW betas (RoBERTa)
    eps: float = 1e-6                             # AdamW epsilon
    weight_decay: float = 0.01
    warmup_steps: int = 100
    schedule: str = "linear"                      # linear | cosine | constant | onecycle | wsd
    min_lr_ratio: float = 0.0                     # floor of the decay as a share of lr
    decay_frac: float = 0.2                       # "wsd": share of the post-warmup steps spent decaying
    clip: float = 1.0                             # max global grad norm (0 = off)
    max_steps: int = 1000                         # optimizer steps; also the schedule's length
    max_minutes: float | None = None              # wall-clock training budget (whichever comes first)
    schedule_clock: str = "steps"                 # "steps" | "time": lr schedule over max_steps, or over
                                                  # max_minutes too (ends with the budget; not replayable)
    eval_every: int = 200                         # steps between evaluations (0 = only at the end)
    eval_sequences: int = 256                     # held-out rows evaluated (fixed rows, fixed mask)
    log_every: int = 10                           # steps between progress lines on stderr
    ckpt_every: int = 0                           # checkpoint every N steps (0 = off)
    ckpt_log_spaced: bool = True                  # also checkpoint at steps 1, 2, 4, 8, ... (2^k)
    bf16: str = "auto"                            # "auto" | "on" | "off": autocast to bfloat16
    seed: int = 0
    num_threads: int | None = None                # torch.set_num_threads (None: leave as is)
    compile: bool = False                         # torch.compile what the train step runs (CompiledStep)
    masking: dict = field(default_factory=dict)   # MaskingConfig fields (encoder only)
    eval_masking: dict = field(default_factory=dict)  # MaskingConfig fields of the held-out mask (encoder);
                                                  # empty = BERT's 15% 80/10/10, whatever `masking` is

    def __post_init__(self) -> None:
        if self.kind not in ("encoder", "decoder"):
            raise ValueError(f"kind must be 'encoder' or 'decoder', got {self.kind!r}")
        if not self.train_source:
            raise ValueError("train_source must name a corpus folder or file")
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "log_every", "vocab_size", "tokenizer_sample_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "eval_sequences"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_seq_len is not None and self.eval_seq_len < 1:
            raise ValueError(f"eval_seq_len must be >= 1 or null, got {self.eval_seq_len}")
        if (self.short_seq_len is None) != (self.short_frac == 0.0):
            raise ValueError(f"short_seq_len and short_frac go together (a length and a share of the schedule), "
                             f"got short_seq_len={self.short_seq_len}, short_frac={self.short_frac}")
        if self.short_seq_len is not None:
            if not 0.0 < self.short_frac < 1.0:
                raise ValueError(f"short_frac must be in (0, 1), got {self.short_frac}")
            if not 1 <= self.short_seq_len < self.seq_len:
                raise ValueError(f"short_seq_len must be in [1, seq_len={self.seq_len}), got {self.short_seq_len}")
            if (self.batch_size * self.seq_len) % self.short_seq_len:
                raise ValueError(f"short_seq_len={self.short_seq_len} must divide batch_size * seq_len = "
                                 f"{self.batch_size * self.seq_len}, so that a short step reads the same tokens")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {self.schedule!r}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"decay_frac must be in (0, 1], got {self.decay_frac}")
        if self.bf16 not in ("auto", "on", "off"):
            raise ValueError(f"bf16 must be 'auto', 'on' or 'off', got {self.bf16!r}")
        if self.lr <= 0 or self.clip < 0 or self.weight_decay < 0:
            raise ValueError(f"need lr > 0, clip >= 0, weight_decay >= 0; got {self.lr}, {self.clip}, {self.weight_decay}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or null, got {self.max_minutes}")
        if self.schedule_clock not in ("steps", "time"):
            raise ValueError(f"schedule_clock must be 'steps' or 'time', got {self.schedule_clock!r}")
        if self.schedule_clock == "time" and self.max_minutes is None:
            raise ValueError("schedule_clock 'time' needs max_minutes (the budget the schedule spans)")
        preset_fields(self.kind, self.preset)  # checks the preset name
        MaskingConfig.from_dict(self.masking)  # checks the masking keys
        em = MaskingConfig.from_dict(self.eval_masking)
        if em.nsp or em.rate_final is not None:
            raise ValueError("eval_masking.nsp must be false and eval_masking.rate_final null (the held-out "
                             "mask is fixed and has no NSP pairs)")

    @property
    def heldout_len(self) -> int:
        """Tokens per held-out row: eval_seq_len, else seq_len."""
        return self.eval_seq_len or self.seq_len

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "PretrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{source}: unknown PretrainConfig keys {unknown}; known: {sorted(known)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    @property
    def masking_config(self) -> MaskingConfig:
        return MaskingConfig.from_dict(self.masking)


def merge_overrides(d: dict, overrides: dict | None) -> dict:
    """`d` updated by `overrides`; the nested dicts "model", "masking", "eval_masking", "extra_eval" are merged."""
    out = dict(d)
    for k, v in (overrides or {}).items():
        if k in ("model", "masking", "eval_masking", "extra_eval") and isinstance(v, dict):
            out[k] = {**out.get(k, {}), **v}
        else:
            out[k] = v
    return out


def config_path(config: str | Path, relative_to: Path | None = None) -> Path:
    """The file of a pretraining config: a path (relative to `relative_to` when given, else to the
    working directory) or a name in configs/pretrain/."""
    path = Path(config) if relative_to is None else relative_to / config
    if path.is_file():
        return path
    named = CONFIG_DIR / f"{config}.json"
    if not named.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
        raise FileNotFoundError(f"no config file {path} and no config named {config!r}; known: {known}")
    return named


def read_config_file(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """A pretraining config file as a dict. A file with `"extends": BASE` is BASE's dict updated by
    the file's own keys as `merge_overrides` updates (the nested dicts merged key by key); BASE is a
    path relative to the file's folder or a name in configs/pretrain/, and may extend another."""
    path = Path(path)
    chain = _chain + (path.resolve(),)
    if chain[-1] in _chain:
        raise ValueError("config 'extends' cycle: " + " -> ".join(str(p) for p in chain))
    d = read_json_file(path)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a config file must hold a JSON object, got {type(d).__name__}")
    base = d.pop("extends", None)
    if base is None:
        return d
    if not isinstance(base, str):
        raise ValueError(f"{path}: 'extends' must name a config file or config, got {base!r}")
    try:
        base_path = config_path(base, relative_to=path.parent)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path}: 'extends': {e}") from None
    return merge_overrides(read_config_file(base_path, chain), d)


def load_config(config: "PretrainConfig | str | Path", overrides: dict | None = None) -> PretrainConfig:
    """A PretrainConfig from an object, a JSON path or a name in configs/pretrain/, with overrides
    (a file may extend another: `read_config_file`)."""
    if isinstance(config, PretrainConfig):
        return PretrainConfig.from_dict(merge_overrides(config.to_dict(), overrides)) if overrides else config
    path = config_path(config)
    return PretrainConfig.from_dict(merge_overrides(read_config_file(path), overrides), source=str(path))


def resolve_path(p: str, data_dir: str) -> Path:
    """`p` if absolute, else under `data_dir` (where "${WORKBENCH_DATA}" is the env var or ../shared/data)."""
    if os.path.isabs(p):
        return Path(p)
    if "${WORKBENCH_DATA}" in data_dir:
        env = os.environ.get("WORKBENCH_DATA") or str(Path(__file__).resolve().parent.parent.parent / "shared" / "data")
        data_dir = data_dir.replace("${WORKBENCH_DATA}", env)
    return Path(data_dir).expanduser() / p


def config_diff(a: dict, b: dict) -> list[str]:
    """Sorted keys whose values differ between two config dicts (nested dicts as "model.x")."""
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += [f"{k}.{s}" for s in config_diff(va, vb)]
        elif va != vb:
            keys.append(k)
    return keys


# ------------------------------------------------------------------------------------------- runtime
def use_bf16(flag: str, device: torch.device) -> bool:
    """bf16 autocast: "on"/"off", or "auto" = on where it is faster (CUDA with bf16, CPUs with
    AVX512-BF16 or AMX: native bf16 dot products)."""
    if flag != "auto":
        return flag == "on"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in cpuinfo or "amx_bf16" in cpuinfo


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _warn_if_steps_end_first(cfg: PretrainConfig, finish: float, rate: float) -> bool:
    """With the lr schedule on the clock, a machine fast enough to reach max_steps before max_minutes
    ends the run early: the schedule then follows the steps (`schedule_step` takes the further of
    the two clocks) and the run stops short of its budget. Log it once, as soon as the rate is known
    (returns True when it logged). `finish`: the projected elapsed seconds at max_steps."""
    budget = cfg.max_minutes * 60
    if finish >= 0.98 * budget:
        return False
    log(f"warning: at {rate:,.0f} tok/s this run reaches max_steps={cfg.max_steps} after about "
        f"{_fmt_time(finish)} of its {_fmt_time(budget)} budget, so the lr schedule follows the steps and the "
        f"run ends early; to train for the whole budget raise max_steps (and warmup_steps in proportion) to "
        f"at least {math.ceil(cfg.max_steps * budget / finish)}")
    return True


def log_spaced(step: int) -> bool:
    """True at steps 1, 2, 4, 8, ... (powers of two): checkpoints to follow how structure emerges."""
    return step >= 1 and step & (step - 1) == 0


def should_checkpoint(step: int, cfg: PretrainConfig) -> bool:
    return (cfg.ckpt_log_spaced and log_spaced(step)) or (cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matrices (dim >= 2), none on biases and norm weights (dim 1)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, cfg: PretrainConfig) -> torch.optim.AdamW:
    """AdamW over `param_groups`, with the fused kernel (one pass over each parameter's state
    instead of foreach's ~8 elementwise passes: ~3x faster optimizer step on CPU)."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas,
                             eps=cfg.eps, fused=True)


def append_metrics(path: Path, step: int, tokens: int, split: str, metrics: dict, t: float) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for k, v in metrics.items():
            f.write(json.dumps({"step": step, "tokens": tokens, "split": split, "metric": k,
                                "value": float(v), "time": round(t, 3)}) + "\n")


def read_json_file(path: Path) -> Any:
    """json.load of `path`; invalid JSON is a ValueError naming the file and line."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    make_shared(tmp)  # mkstemp makes 0600 files
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- the train step
@dataclass
class Batch:
    """One micro-batch: input ids (B, T), labels (B, T) with -100 where ignored, optional NSP."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    nsp_labels: torch.Tensor | None = None


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i CE(h_i W^T + b, y_i) over rows with y_i != -100, computed in row chunks (fused linear
    cross-entropy, as in Liger-Kernel / Wijmans et al. 2024 "Cut Your Losses").

    For each chunk of rows the logits z = h W^T + b (c, V) are formed, the loss is lse(z) - z_y, and
    the gradient dL/dz = softmax(z) - onehot(y) is written over z in place (softmax, with the loss
    -log softmax(z)_y read off it; rows whose p_y is below 1e-30 get lse(z) - z_y recomputed exactly);
    then dL/dh = dz W and dL/dW += dz^T h, dL/db += sum dz. So the full (N, V) logits, their fp32 log-softmax copy and the
    separate backward pass over them are never materialised; backward only scales the stored
    gradients by the incoming scalar. Same FLOPs as linear + F.cross_entropy (3 matmuls).

    `compute_dtype` bfloat16 is the bf16-autocast version: the three matmuls run in bf16 (as
    autocast runs F.linear and its backward), the softmax and the loss in fp32 on an fp32 copy of
    the bf16 logits (as `F.cross_entropy(logits.float())` does), dz is rounded to bf16 for the two
    backward matmuls, and dL/dW accumulates over chunks in fp32.
    hidden (N, D), weight (V, D), bias (V,) or None, targets (N,) long -> scalar (sum, not mean).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_rows: int, compute_dtype=torch.float32):
        n = hidden.shape[0]
        low = compute_dtype != torch.float32
        h_all, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        grad_h = torch.empty_like(h_all)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and ctx.needs_input_grad[2] else None
        total = hidden.new_zeros((), dtype=torch.float32)
        # one logits buffer for all chunks: a fresh (c, V) tensor per chunk (64 MB for the mini
        # decoder) is a fresh mmap whose pages fault in on first touch
        rows = min(chunk_rows, n)
        buf = h_all.new_empty(rows, weight.shape[0])  # logits in the compute dtype
        buf32 = buf.new_empty(rows, weight.shape[0], dtype=torch.float32) if low else buf
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk_rows):
                h, y = h_all[s: s + chunk_rows], targets[s: s + chunk_rows]
                z = buf[: h.shape[0]]  # (c, V), contiguous
                torch.mm(h, w.t(), out=z) if b is None else torch.addmm(b, h, w.t(), out=z)
                z32 = buf32[: h.shape[0]].copy_(z) if low else z
                valid = y != IGNORE_INDEX
                y0 = y.clamp_min(0)[:, None]  # (c, 1); ignored rows are zeroed below
                torch._softmax(z32, -1, False, out=z32)  # probabilities, in place (one fused kernel)
                p_y = z32.gather(1, y0)[:, 0]
                nll = -p_y.log()  # -log p_y = lse(z) - z_y
                tiny = p_y < 1e-30  # p_y near fp32 underflow: recompute lse(z) - z_y exactly
                if bool(tiny.any()):
                    if low:  # z still holds the bf16 logits
                        exact = z[tiny].float()
                    else:
                        exact = h[tiny] @ w.t() if b is None else torch.addmm(b, h[tiny], w.t())
                    nll[tiny] = exact.logsumexp(-1) - exact.gather(1, y0[tiny])[:, 0]
                total += (nll * valid).sum()
                z32.scatter_add_(1, y0, torch.full_like(y0, -1, dtype=z32.dtype))  # - onehot(y)
                if not bool(valid.all()):
                    z32[~valid] = 0.0  # ignored rows contribute nothing
                dz = z.copy_(z32) if low else z32  # dL/dz in the compute dtype
                torch.mm(dz, w, out=grad_h[s: s + chunk_rows])
                if grad_w is not None:
                    grad_w.add_(dz.t() @ h) if low else grad_w.addmm_(dz.t(), h)
                if grad_b is not None:
                    grad_b += dz.sum(0, dtype=torch.float32)
        ctx.save_for_backward(grad_h.to(hidden.dtype), grad_w, grad_b)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scale = lambda g: None if g is None else g * grad_out.to(g.dtype)  # noqa: E731
        return scale(grad_h), scale(grad_w), scale(grad_b), None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Summed cross-entropy of the logits hidden @ weight.T + bias against targets (-100 ignored).

    With grad enabled it takes the fused chunked path (`LinearCrossEntropy`): in fp32 when autocast
    is off and the inputs are fp32, in bf16 under CPU bf16 autocast. Otherwise it is exactly
    `F.cross_entropy(F.linear(...).float(), ...)`.
    hidden (N, D), weight (V, D), bias (V,) or None, targets (N,) -> scalar fp32.
    """
    if torch.is_grad_enabled():
        device = hidden.device.type
        if not torch.is_autocast_enabled(device) and hidden.dtype == weight.dtype == torch.float32:
            return LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows)
        if (device == "cpu" and torch.is_autocast_enabled(device)
                and torch.get_autocast_dtype(device) == torch.bfloat16):
            return LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows, torch.bfloat16)
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")


def lm_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over labelled positions, and their count.

    Encoder: hidden states at the masked positions only, hidden[labels != -100] (M, D), go through
    the MLM transform and the (tied) vocabulary projection: with 15% masking this skips 85% of the
    projection, the largest matmul of a small model; without NSP the last block itself runs at
    those positions only (`Encoder.masked_hidden`). Decoder: next-token logits at every position
    against the shifted labels. Both use `linear_cross_entropy`, which never materialises the
    full logits when training in fp32; a decoder with the adaptive output uses its own loss
    (`Decoder.adaptive_loss`), which evaluates a tail cluster only for the targets in it.
    """
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        if model.kind == "encoder":
            sel = batch.labels != IGNORE_INDEX
            targets = batch.labels[sel]
            n = int(targets.numel())
            if batch.nsp_labels is None:  # the last block at the masked positions only (exact)
                hidden = model.masked_hidden(batch.input_ids, sel, batch.token_type_ids)  # (M, D)
            else:  # NSP also needs [CLS]'s last hidden state: the whole forward
                out = model(batch.input_ids, token_type_ids=batch.token_type_ids, attn_impl="sdpa")
                hidden = out.last_hidden_state[sel]
            loss = linear_cross_entropy(model.mlm_transform(hidden), *model.mlm_projection(), targets) / max(1, n)
            if batch.nsp_labels is not None:
                nsp = model.nsp_logits(out.pooler_output)
                loss = loss + F.cross_entropy(nsp.float(), batch.nsp_labels)
        else:
            out = model(batch.input_ids, attn_impl="sdpa", return_logits=False)
            n = int((batch.labels != IGNORE_INDEX).sum())
            h = out.last_hidden_state.flatten(0, 1)  # (B T, D)
            if model.config.output == "adaptive":
                labels = batch.labels.flatten()
                sel = labels != IGNORE_INDEX
                loss = model.adaptive_loss(h[sel], labels[sel]) / max(1, n)
            else:
                loss = linear_cross_entropy(h, model.lm_weight(), None, batch.labels.flatten()) / max(1, n)
    return loss, n


# ----------------------------------------------------------------------- training state (no pickles)
STATE_TENSORS, STATE_JSON = "train_state.safetensors", "train_state.json"


def save_train_state(folder: Path, optimizer: torch.optim.Optimizer, info: dict) -> None:
    """Optimizer state flattened to safetensors ("optim.{param}.{name}") + JSON (param groups, step...).

    `train_state.json` is written last: a folder without it is an unfinished checkpoint.
    """
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    save_safetensors(tensors, folder / STATE_TENSORS)
    write_json_atomic(folder / STATE_JSON, {**info, "param_groups": sd["param_groups"], "scalar_state": scalars})


def load_train_state(folder: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore the optimizer from a checkpoint folder; returns the JSON info (step, tokens, ...)."""

    info = json.loads((folder / STATE_JSON).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / STATE_TENSORS))
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = v
    for key, v in info.pop("scalar_state").items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = v
    groups = info.pop("param_groups")
    for g in groups:
        g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    return info


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The finished checkpoint (train_state.json present) with the highest step, or None."""
    found = []
    for d in list((out_dir / "checkpoints").glob("step_*")) + [out_dir / "final"]:
        if (d / STATE_JSON).is_file():
            found.append((json.loads((d / STATE_JSON).read_text())["step"], d.name != "final", d))
    return max(found)[2] if found else None


# ------------------------------------------------------------------------------------ distribution
@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun job (RANK / WORLD_SIZE / LOCAL_RANK env vars)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> tuple[Dist, torch.device, bool]:
    """Join the process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU) and pick the device;
    the flag says whether this call joined it (and so should destroy it when done)."""

    world = int(os.environ.get("WORLD_SIZE", "1"))
    d = Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device(f"cuda:{d.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    joined = world > 1 and not dist.is_initialized()
    if joined:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return d, device, joined


def barrier(d: Dist) -> None:
    if d.world > 1:

        dist.barrier()


def average_gradients(model: torch.nn.Module, d: Dist) -> None:
    """Data parallelism as DistributedDataParallel does it: all-reduce and average the gradients
    (one flat buffer). Done by hand because the MLM head runs outside `forward` (on masked
    positions only), which DDP's forward-graph bookkeeping does not see."""
    if d.world == 1:
        return

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= d.world
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(model: torch.nn.Module, d: Dist) -> None:
    if d.world > 1:

        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def rank0_value(x: float, d: Dist, device: torch.device) -> float:
    """Rank 0's `x` on every rank (decisions that depend on the clock are made by rank 0)."""
    if d.world == 1:
        return x

    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def any_rank(flag: bool, d: Dist, device: torch.device) -> bool:
    """True on every rank when `flag` is True on rank 0 (stop decisions are made by rank 0)."""
    return bool(rank0_value(1.0 if flag else 0.0, d, device))


# --------------------------------------------------------------------------------------------- data
def prepare_tokenizer(cfg: PretrainConfig, out_dir: Path, d: Dist):
    """out_dir/tokenizer if present (resume), else cfg.tokenizer_path, else trained by rank 0 on a
    bounded sample of the training split (WordPiece for encoders, byte-level BPE for decoders)."""

    tok_dir = out_dir / "tokenizer"
    if d.main and not (tok_dir / "tokenizer.json").is_file():
        if cfg.tokenizer_path:
            tok = Tokenizer.load(Path(cfg.tokenizer_path).expanduser())
        else:
            t0 = time.monotonic()
            texts = sample_texts_for_tokenizer(resolve_path(cfg.train_source, cfg.data_dir),
                                               cfg.tokenizer_sample_chars, cfg.train_split, seed=cfg.seed)
            if cfg.kind == "encoder":
                tok = Tokenizer.train_wordpiece(texts, cfg.vocab_size, lowercase=cfg.lowercase)
            else:
                tok = Tokenizer.train_bpe(texts, cfg.vocab_size)
            log(f"tokenizer: {tok} trained on {sum(map(len, texts)):,} chars in {time.monotonic() - t0:.1f}s")
        tok.save(tok_dir)
    barrier(d)
    return Tokenizer.load(tok_dir)


def token_cache(source: str, split: str | None, cfg: PretrainConfig, tok, out_dir: Path, d: Dist,
                max_texts: int | None = None):
    """The flat id stream of a corpus split, tokenized once by rank 0 into out_dir/cache."""


    src = resolve_path(source, cfg.data_dir)
    name = f"{src.name.removesuffix('.gz')}.{split}.{max_texts or 'all'}.{tok.fingerprint()[:12]}.ids"
    key = {**corpus.source_key(src, split), "max_texts": max_texts}
    texts = lambda: itertools.islice(corpus.iter_texts(src, split), max_texts)  # noqa: E731
    if d.main:
        corpus.tokenize_to_cache(texts(), tok, out_dir / "cache" / name, key=key, label=f"{src.name} {split}")
    barrier(d)
    return corpus.tokenize_to_cache(texts(), tok, out_dir / "cache" / name, key=key, progress=False)


class _Rows:
    """One packing of the train stream read as a pure function of (step, micro, rank): the global
    batch of step s is order(epoch)[pos : pos + B*A*W] with epoch = s // steps_per_epoch, and rank
    r's micro-batch a is its slice (a*W + r)*B ... + B."""

    def __init__(self, ds, rows_per_micro: int, cfg: PretrainConfig, d: Dist):
        self.ds, self.B, self.d = ds, rows_per_micro, d
        self.global_batch = rows_per_micro * cfg.grad_accum * d.world
        self.steps_per_epoch = len(ds) // self.global_batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"the corpus packs into {len(ds)} rows of {ds.seq_len} tokens, fewer than one "
                             f"global batch ({self.global_batch}); use more text or a smaller batch_size")
        self._orders: dict[int, torch.Tensor] = {}

    def position(self, step: int) -> tuple[int, int]:
        return step // self.steps_per_epoch, (step % self.steps_per_epoch) * self.global_batch

    def rows(self, step: int, micro: int) -> torch.Tensor:
        epoch, pos = self.position(step)
        if epoch not in self._orders:
            self._orders = {epoch: self.ds.order(epoch)}
        start = pos + (micro * self.d.world + self.d.rank) * self.B
        idx = self._orders[epoch][start: start + self.B]
        return torch.from_numpy(np.stack([self.ds[int(k)] for k in idx]))


class Batches:
    """Micro-batches as a pure function of (step, micro, rank, schedule position): disjoint shards
    per rank, and nothing to store for resumption but the step. With `short_seq_len`, a step whose
    schedule position is under `short_frac` reads `short_ds` (the same stream packed into short
    rows, batch_size * seq_len / short_seq_len of them: the same tokens per step) at the same step
    index; later steps read `ds`."""

    def __init__(self, ds, cfg: PretrainConfig, d: Dist, tok, short_ds=None):
        self.cfg, self.d, self.tok = cfg, d, tok
        self.long = _Rows(ds, cfg.batch_size, cfg, d)
        self.short = None if short_ds is None else _Rows(short_ds, cfg.batch_size * cfg.seq_len // cfg.short_seq_len,
                                                          cfg, d)
        self.masking = cfg.masking_config
        self.cont_ids = continuation_ids(tok.hf.get_vocab()) if self.masking.whole_word else None

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, row position in the epoch) where step `step` starts in the seq_len packing."""
        return self.long.position(step)

    def rows(self, step: int, micro: int, progress: float = 1.0) -> torch.Tensor:
        short = self.short is not None and progress < self.cfg.short_frac
        return (self.short if short else self.long).rows(step, micro)

    def get(self, step: int, micro: int, device: torch.device, progress: float = 0.0) -> Batch:
        """The micro-batch of (step, micro) on this rank; `progress` in [0, 1] (the schedule's
        position) picks the row length (`short_frac`) and sets the masking rate when it decays
        (`MaskingConfig.rate_final`)."""
        rows = self.rows(step, micro, progress)
        gen = step_generator(self.cfg.seed, step, stream=micro * self.d.world + self.d.rank)
        masking = self.masking
        if masking.rate_final is not None:
            masking = replace(masking, rate=masking.rate_at(progress), rate_final=None)
        return make_batch(rows, self.tok, masking, gen, self.cont_ids, device)


def make_batch(rows: torch.Tensor, tok, masking: MaskingConfig, gen: torch.Generator, cont_ids, device) -> Batch:
    """Training targets for packed rows: MLM (+NSP) for WordPiece rows (B, L), shift for BPE (B, L+1)."""
    if tok.kind != "wordpiece":
        return Batch(rows[:, :-1].contiguous().to(device), rows[:, 1:].contiguous().to(device))
    types = nsp = None
    if masking.nsp:

        rows, types, nsp = nsp_pairs(rows[:, 1:-2], cls_id=tok.cls_id, sep_id=tok.sep_id, generator=gen)
    starts = word_starts(rows, cont_ids) if masking.whole_word else None
    ids, labels = mask_tokens(rows, mask_id=tok.mask_id, vocab_size=tok.vocab_size, special_ids=tok.special_ids,
                              generator=gen, cfg=masking, starts=starts)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return Batch(ids.to(device), labels.to(device), mv(types), mv(nsp))


# --------------------------------------------------------------------------------------- evaluation
EVAL_BATCH = 64  # rows per held-out forward (does not change the targets or the mask)


class Evaluator:
    """Held-out loss on fixed rows with a fixed mask (encoder: masked-token loss and accuracy;
    decoder: loss and perplexity), plus the unigram baseline on the same targets. The rows and the
    mask depend on (seed, eval_sequences, heldout_len, eval_masking) only, not on the
    training masking, the batch size or a short first phase.

    Unigram baseline: p(w) = (count_train(w) + 1) / (N + V) (add-one), loss = mean -log p(target);
    a model that has only learnt token frequencies sits on this "unigram plateau".
    """

    def __init__(self, name: str, ds, cfg: PretrainConfig, tok, log_unigram: torch.Tensor, device):
        self.name, self.device = name, device
        n = min(cfg.eval_sequences, len(ds))
        if n == 0:
            raise ValueError(f"eval corpus {name!r} packs into no row of {ds.seq_len} tokens")
        idx = torch.linspace(0, len(ds) - 1, n).long().tolist()  # spread over the whole split
        rows = torch.from_numpy(np.stack([ds[i] for i in idx]))
        # the held-out mask is BERT's standard one unless eval_masking says otherwise, drawn once over
        # all rows: runs with other training masks or batch sizes are scored on the same targets
        masking = MaskingConfig.from_dict(cfg.eval_masking)
        cont = continuation_ids(tok.hf.get_vocab()) if masking.whole_word else None
        gen = step_generator(cfg.seed, 0, stream=1_000_003)  # the fixed eval mask
        whole = make_batch(rows, tok, masking, gen, cont, device)
        self.batches = [Batch(whole.input_ids[i: i + EVAL_BATCH], whole.labels[i: i + EVAL_BATCH])
                        for i in range(0, n, EVAL_BATCH)]
        targets = torch.cat([b.labels[b.labels != IGNORE_INDEX].cpu() for b in self.batches])
        self.unigram_loss = float(-log_unigram[targets].mean())

    @torch.no_grad()
    def __call__(self, model, autocast: bool) -> dict[str, float]:
        was_training = model.training
        model.eval()
        total, count, correct = 0.0, 0, 0
        for b in self.batches:
            with torch.autocast(b.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                sel = b.labels != IGNORE_INDEX
                if model.kind == "encoder":
                    logits = model.mlm_logits(model.masked_hidden(b.input_ids, sel))
                else:
                    logits = model(b.input_ids, attn_impl="sdpa").logits[sel]
            targets = b.labels[sel]
            total += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += int(targets.numel())
        model.train(was_training)
        loss = total / max(1, count)
        out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": correct / max(1, count),
               "unigram_loss": self.unigram_loss, "unigram_ppl": math.exp(min(self.unigram_loss, 50.0))}
        return out


# ------------------------------------------------------------------------------------------ the run
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
    if cfg.kind == "encoder":
        fields_["pad_token_id"] = tok.pad_id
        if cfg.masking_config.nsp:
            fields_["use_nsp"] = True
    else:
        for k in ("type_vocab_size", "use_nsp", "pad_token_id"):
            fields_.pop(k, None)
    return fields_


def check_resume(out_dir: Path, resolved: dict, resume: bool) -> bool:
    """Whether a run exists in out_dir to resume; refuses a different config (listing the keys)."""
    path = out_dir / "config.resolved.json"
    if not path.is_file():
        return False
    if not resume:
        raise FileExistsError(f"{out_dir} already holds a run (config.resolved.json); resume it or use another folder")
    old = json.loads(path.read_text(encoding="utf-8"))
    # a key added to PretrainConfig after the run was written is the same config if it has its default
    defaults = {f.name: f.default for f in fields(PretrainConfig) if f.default is not MISSING}
    for k, v in resolved.get("pretrain", {}).items():
        if k not in old.get("pretrain", {}) and k in defaults and v == defaults[k]:
            old.setdefault("pretrain", {})[k] = v
    strip = lambda r: {**r, "pretrain": {k: v for k, v in r["pretrain"].items() if k not in RESUME_SAFE_KEYS}}  # noqa: E731
    diff = [k.removeprefix("pretrain.") for k in config_diff(strip(old), strip(resolved))]
    if diff:
        raise ValueError(f"cannot resume the run in {out_dir}: the config differs in {diff} "
                         f"(start a new folder, or restore these keys)")
    return True


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
    barrier(d)
    tok = prepare_tokenizer(cfg, out_dir, d)
    model_cfg = build_model_config(cfg, tok)
    resolved = {"pretrain": cfg.to_dict(), "model": model_cfg, "tokenizer": tok.fingerprint(), "world_size": d.world}
    resuming = check_resume(out_dir, resolved, resume)
    barrier(d)
    if d.main and not resuming:
        write_json_atomic(out_dir / "config.resolved.json", resolved)


    train_ids = token_cache(cfg.train_source, cfg.train_split, cfg, tok, out_dir, d, cfg.max_train_texts)
    short = None if cfg.short_seq_len is None else PackedDataset.for_tokenizer(train_ids, cfg.short_seq_len, cfg.seed, tok)
    batches = Batches(PackedDataset.for_tokenizer(train_ids, cfg.seq_len, cfg.seed, tok), cfg, d, tok, short)
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
    model = build_model(cfg.kind, model_cfg).to(device)
    if getattr(model.config, "output", "softmax") == "adaptive":
        model.set_vocab_order(counts)  # the shortlist = the most frequent training tokens
    optimizer = make_optimizer(model, cfg)
    step, tokens, elapsed = 0, 0, 0.0
    metrics_path = out_dir / "metrics.jsonl"
    ckpt = latest_checkpoint(out_dir) if resuming else None
    if ckpt is not None:

        model.load_state_dict(load_file(str(ckpt / "model.safetensors"), device=str(device)))
        info = load_train_state(ckpt, optimizer)
        step, tokens, elapsed = info["step"], info["tokens"], info["elapsed"]
        if d.main:
            log(f"resuming from {ckpt} at step {step} (epoch {info['epoch']}, position {info['position']})")
            if metrics_path.is_file():  # drop rows logged after the checkpoint: they will be redone
                keep = [r for r in metrics_path.read_text().splitlines() if json.loads(r)["step"] <= step]
                metrics_path.write_text("".join(r + "\n" for r in keep))
    broadcast_parameters(model, d)
    autocast = use_bf16(cfg.bf16, device)
    if d.main:
        why = "as set" if cfg.bf16 != "auto" else ("native" if autocast else "no native") + " bf16 on this device"
        log(f"precision: {'bf16 autocast' if autocast else 'fp32'} (bf16: {cfg.bf16!r}, {why})")
    loop = _Loop(cfg, d, device, model, optimizer, batches, evals, tok, out_dir, autocast, train_ids)
    return loop.run(step, tokens, elapsed, stop_at_step)


def loss_curve(metrics_path: Path, last_step: int) -> dict:
    """Summary of metrics.jsonl for the card: train loss at steps 1, 2, 4, ... and the last step,
    and every held-out loss, as [step, value] pairs."""
    out: dict[str, list] = {"train_loss": []}
    if not metrics_path.is_file():
        return out
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["split"] == "train" and (log_spaced(r["step"]) or r["step"] == last_step):
            out["train_loss"].append([r["step"], round(r["value"], 4)])
        elif r["split"] != "train" and r["metric"] == "loss":
            out.setdefault(f"{r['split']}_loss", []).append([r["step"], round(r["value"], 4)])
    return out


class CompiledStep:
    """The model as `lm_loss` sees it in a compiled train step: `forward` and the encoder's
    `masked_hidden` through torch.compile, every other attribute the plain model's (same parameters).
    `torch.compile(model)` alone compiles only `forward`, which the encoder's loss does not call, and
    setting an attribute on its wrapper sets it on the model; this wrapper leaves the model as it
    was, so eval, hooks and saving run uncompiled. In `masked_hidden` the blocks compile with static
    shapes and the last block again once the masked-row count varies (`_selected_counts`)."""

    def __init__(self, model) -> None:
        self._model = model
        self._forward = torch.compile(model)
        if model.kind == "encoder":  # other attributes fall through to the model (__getattr__)
            self.masked_hidden = torch.compile(model.masked_hidden)

    def __call__(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class _Loop:
    """The optimisation loop and what it writes (state kept here so each method stays short)."""

    def __init__(self, cfg, d, device, model, optimizer, batches, evals, tok, out_dir, autocast, train_ids):
        self.cfg, self.d, self.device, self.model, self.opt = cfg, d, device, model, optimizer
        self.batches, self.evals, self.tok, self.out_dir, self.autocast = batches, evals, tok, out_dir, autocast
        self.n_train_tokens = int(len(train_ids))
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * d.world
        self.last_eval: dict[str, float] = {}
        # the compiled view shares the parameters; eval, hooks and saving use the plain model
        self.step_model = CompiledStep(model) if cfg.compile else model

    def train_step(self, step: int, elapsed: float) -> float:
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
        total = 0.0
        progress = at / cfg.max_steps
        for micro in range(cfg.grad_accum):
            loss, _ = lm_loss(self.step_model, self.batches.get(step, micro, self.device, progress), self.autocast)
            (loss / cfg.grad_accum).backward()
            total += loss.item() / cfg.grad_accum
        average_gradients(self.model, self.d)
        if cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def evaluate(self, step: int, tokens: int, t: float) -> None:
        for ev in self.evals:
            m = ev(self.model, self.autocast)
            append_metrics(self.out_dir / "metrics.jsonl", step, tokens, ev.name, m, t)
            self.last_eval.update({f"{ev.name}_{k}": v for k, v in m.items()})
            log(f"  eval {ev.name} @ {step}: loss {m['loss']:.4f} ppl {m['ppl']:.1f} acc {m['acc']:.3f} "
                f"(unigram loss {m['unigram_loss']:.4f})")

    def card(self, step: int, tokens: int, stopped_by: str) -> dict:
        cfg = self.cfg
        return {
            "data": {"train": [cfg.train_source, cfg.train_split], "train_tokens": self.n_train_tokens,
                     "eval": [cfg.eval_source, cfg.eval_split], "extra_eval": cfg.extra_eval,
                     "tokenizer": {"kind": self.tok.kind, "vocab_size": self.tok.vocab_size}},
            "steps": step, "tokens": tokens, "metrics": dict(self.last_eval),
            "loss_curve": loss_curve(self.out_dir / "metrics.jsonl", step),
            "objective": "masked LM (BERT 80/10/10, dynamic)" if cfg.kind == "encoder" else "causal LM",
            "preset": cfg.preset, "stopped_by": stopped_by, "bf16": self.autocast,
        }

    def save(self, path: Path, step: int, tokens: int, elapsed: float, stopped_by: str) -> None:

        save(self.model, self.tok, path, card=self.card(step, tokens, stopped_by))
        epoch, pos = self.batches.position(step)
        save_train_state(path, self.opt, {"step": step, "tokens": tokens, "elapsed": elapsed, "epoch": epoch,
                                          "position": pos, "seed": self.cfg.seed, "world_size": self.d.world})

    def run(self, step: int, tokens: int, elapsed: float, stop_at_step: int | None) -> TrainResult:
        cfg, d = self.cfg, self.d
        self.model.train()
        t0, t_log, tok_log, loss_sum, n_loss = time.monotonic(), time.monotonic(), tokens, 0.0, 0
        budget = None if cfg.max_minutes is None else cfg.max_minutes * 60
        stopped_by, warned = "max_steps", False
        if d.main and step == 0 and self.evals:
            self.evaluate(0, 0, 0.0)
        while step < cfg.max_steps:
            loss = self.train_step(step, elapsed + time.monotonic() - t0)
            step, tokens = step + 1, tokens + self.tokens_per_step
            now = elapsed + time.monotonic() - t0
            loss_sum, n_loss = loss_sum + loss, n_loss + 1
            if d.main:
                append_metrics(self.out_dir / "metrics.jsonl", step, tokens, "train", {"loss": loss}, now)
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    rate = (tokens - tok_log) / max(1e-9, time.monotonic() - t_log)
                    to_max_steps = (cfg.max_steps - step) * self.tokens_per_step / max(rate, 1e-9)
                    left = to_max_steps if budget is None else min(to_max_steps, budget - now)
                    log(f"step {step}/{cfg.max_steps} | loss {loss_sum / n_loss:.4f} | lr {self.opt.param_groups[0]['lr']:.2e}"
                        f" | {rate:,.0f} tok/s | {_fmt_time(now)} elapsed | ETA {_fmt_time(left)}")
                    if not warned and cfg.schedule_clock == "time" and step >= 2 * cfg.log_every:
                        warned = _warn_if_steps_end_first(cfg, now + to_max_steps, rate)
                    t_log, tok_log, loss_sum, n_loss = time.monotonic(), tokens, 0.0, 0
                if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                    self.evaluate(step, tokens, now)
            out_of_time = any_rank(budget is not None and now >= budget, d, self.device)
            if d.main and should_checkpoint(step, cfg):
                self.save(self.out_dir / "checkpoints" / f"step_{step:07d}", step, tokens, now, "checkpoint")
            if stop_at_step is not None and step >= stop_at_step:
                barrier(d)
                return TrainResult(self.model, None, step, "killed")
            if out_of_time:
                stopped_by = "time budget"
                break
        now = elapsed + time.monotonic() - t0
        final = self.out_dir / "final"
        if d.main:
            if self.evals:
                self.evaluate(step, tokens, now)
            self.save(final, step, tokens, now, stopped_by)
            log(f"done: {step} steps, {tokens:,} tokens, {_fmt_time(now)}; stopped by {stopped_by}; -> {final}")
        barrier(d)
        return TrainResult(self.model, final, step, stopped_by)


def pretrain(config: PretrainConfig | str | Path, out_dir: str | Path, resume: bool = True,
             overrides: dict | None = None) -> Path:
    """Pretrain from a config (object, JSON path or name in configs/pretrain/); returns out_dir/final.

    resume=True continues the run in out_dir from its last checkpoint (same data order, optimizer
    state and masks); a changed config is refused with the differing keys listed. resume=False
    refuses a folder that already holds a run.
    """
    cfg = load_config(config, overrides)
    return run_training(cfg, out_dir, resume=resume).path
