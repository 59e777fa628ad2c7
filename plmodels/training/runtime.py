"""What a training process sets up and reports, apart from the model and the data: the precision
(bf16 autocast where the hardware has native bf16), the optimizer (AdamW, Loshchilov & Hutter 2019,
without weight decay on biases and norm weights), log lines on stderr (plmodels.progress draws the
bars) and rows of metrics.jsonl.
Pretraining (loop.py) and finetuning (finetune.py) both use it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from plmodels.progress import write

from .config import PretrainConfig


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
    """One line on stderr, above a progress bar drawn there (not through it)."""
    write(msg)


def fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def warn_if_steps_end_first(cfg: PretrainConfig, finish: float, rate: float) -> bool:
    """With the lr schedule on the clock, a machine fast enough to reach max_steps before max_minutes
    ends the run early: the schedule then follows the steps (`schedule_step` takes the further of
    the two clocks) and the run stops short of its budget. Log it once, as soon as the rate is known
    (returns True when it logged). `finish`: the projected elapsed seconds at max_steps."""
    budget = cfg.max_minutes * 60
    if finish >= 0.98 * budget:
        return False
    log(f"warning: at {rate:,.0f} tok/s this run reaches max_steps={cfg.max_steps} after about "
        f"{fmt_time(finish)} of its {fmt_time(budget)} budget, so the lr schedule follows the steps and the "
        f"run ends early; to train for the whole budget raise max_steps (and warmup_steps in proportion) to "
        f"at least {math.ceil(cfg.max_steps * budget / finish)}")
    return True


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
