"""What a training process sets up and reports, apart from the model and the data: the precision
(bf16 autocast where the hardware has native bf16), the optimizer (AdamW, Loshchilov & Hutter 2019,
without weight decay on biases and norm weights), log lines on stderr (plmodels.progress draws the
bars), rows of metrics.jsonl (appended one step at a time; read back with `read_jsonl`, which
drops the torn last line a killed run can leave) and `kill_point`, the fault-injection hook of the
kill tests.
Pretraining (loop.py) and finetuning (finetune.py) both use it.
"""
from __future__ import annotations

import json
import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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
    """Append one row per metric. An append is not atomic: a run killed in it can leave a torn last
    line, which a resumed run drops (`read_jsonl`, loop.py `clean_metrics`)."""
    text = "".join(json.dumps({"step": step, "tokens": tokens, "split": split, "metric": k, "value": float(v),
                               "time": round(t, 3)}) + "\n" for k, v in metrics.items())
    with open(path, "a", encoding="utf-8") as f:
        cut = len(text) // 2
        f.write(text[:cut])
        kill_point("metrics", f)  # tests: die with half the rows written
        f.write(text[cut:])


@dataclass
class JsonlRows:
    """What `read_jsonl` read: the rows, each line as written (without its newline), and the torn
    last line it dropped (`torn_bytes` bytes; `torn_lines` 0 or 1)."""

    rows: list[dict]
    lines: list[str]
    torn_lines: int = 0
    torn_bytes: int = 0


def read_jsonl(path: Path) -> JsonlRows:
    """The JSON object per line of an appended log (metrics.jsonl), empty if the file is missing.

    An unparseable LAST line is the tail of an append cut short by a kill: it is dropped and
    counted. An unparseable line anywhere else is damage no kill leaves: ValueError naming
    file:line. Blank lines are skipped.
    """
    out = JsonlRows([], [])
    if not path.is_file():
        return out
    data = path.read_bytes()
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":  # the file ends with a newline
        raw.pop()
    for i, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
            why = None if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            why = str(e)
        if why is not None:
            if i == len(raw):
                out.torn_lines, out.torn_bytes = 1, len(data) - sum(len(r) + 1 for r in raw[:-1])
                break
            raise ValueError(f"{path}:{i}: not a JSON row ({why}); only the last line of an appended log can be "
                             f"torn by a kill, so this file was damaged otherwise: repair or remove the line")
        out.rows.append(row)
        out.lines.append(line.decode("utf-8"))
    return out


KILL_ENV = "PLMODELS_TEST_KILL_AT"
_kill_counts: dict[str, int] = {}


def kill_point(name: str, file: IO | None = None) -> None:
    """Fault injection for tests/plmodels/test_resume.py, inert unless the environment variable
    PLMODELS_TEST_KILL_AT is "<name>:<n>": then the n-th call of `kill_point(name)` in this process
    flushes `file` (what a write so far has put in it) and SIGKILLs the process, as a kill from
    outside at that moment would. Points: "metrics" (halfway through a row append), "checkpoint" (a
    checkpoint folder built, not yet renamed into place), "resume" (the rewritten metrics.jsonl
    written to its temporary, not yet renamed) and "step" (after a step's rows, before its checkpoint).
    """
    spec = os.environ.get(KILL_ENV)
    if not spec or spec.rpartition(":")[0] != name:
        return
    _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if _kill_counts[name] == int(spec.rpartition(":")[2]):
        if file is not None:
            file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
