"""Learning-rate schedules as pure functions of the step.

`lr_at(step, ...)` gives the rate used for optimizer step `step` (0-based). All schedules share a
linear warmup from 0: lr = peak * (step + 1) / warmup for step < warmup (so step 0 is not a wasted
step at lr 0). After warmup, with progress p = (step - warmup) / max(1, total - warmup) clipped to
[0, 1] and floor m = min_ratio * peak:
- "linear"   (BERT, Devlin et al. 2019): lr = m + (peak - m) * (1 - p)
- "cosine"   (Loshchilov & Hutter 2017, no restarts): lr = m + (peak - m) * (1 + cos(pi p)) / 2
- "constant": lr = peak
- "onecycle" (Smith 2018, triangular one-cycle): the warmup is the rising half; after it lr falls
  linearly to m at `total` — identical in shape to "linear" but meant with warmup ~ total / 2.
- "wsd" (warmup-stable-decay; the "trapezoidal" schedule of Zhai et al. 2022, MiniCPM's WSD, Hu et
  al. 2024): lr = peak until the last `decay_frac` of the post-warmup steps, then linear to m,
  i.e. with q = (p - (1 - decay_frac)) / decay_frac: lr = peak for q <= 0, m + (peak - m)(1 - q)
  after. Under a short budget it keeps the rate high for longer than "linear" does.

Schedules run on the step count, or on the clock (`schedule_step`): with a wall-clock budget the
schedule position is the further of the step and the share of the budget used, so the decay ends
when the budget does, whatever the machine's speed (as in Geiping & Goldstein 2022, "Cramming",
whose schedules are tied to the time budget).
"""
from __future__ import annotations

import math
from typing import Callable

ScheduleFn = Callable[[float, float], float]  # (progress p in [0, 1], decay_frac) -> multiplier in [0, 1]


def _linear(p: float, decay_frac: float) -> float:
    return 1.0 - p


def _cosine(p: float, decay_frac: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * p))


def _constant(p: float, decay_frac: float) -> float:
    return 1.0


def _wsd(p: float, decay_frac: float) -> float:
    q = (p - (1.0 - decay_frac)) / decay_frac  # progress through the final decay phase
    return 1.0 if q <= 0.0 else 1.0 - min(q, 1.0)


SCHEDULES: dict[str, ScheduleFn] = {
    "linear": _linear,
    "cosine": _cosine,
    "constant": _constant,
    "onecycle": _linear,
    "wsd": _wsd,
}


def lr_at(step: int, *, peak: float, warmup: int, total: int, schedule: str = "linear",
          min_ratio: float = 0.0, decay_frac: float = 0.2) -> float:
    """The learning rate for 0-based optimizer step `step` (see module docstring for the formulas);
    `decay_frac` in (0, 1] is used by "wsd" only."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {sorted(SCHEDULES)}")
    if not 0.0 < decay_frac <= 1.0:
        raise ValueError(f"decay_frac must be in (0, 1], got {decay_frac}")
    if step < 0 or warmup < 0 or total < 1:
        raise ValueError(f"need step >= 0, warmup >= 0, total >= 1; got step={step}, warmup={warmup}, total={total}")
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
    floor = min_ratio * peak
    return floor + (peak - floor) * SCHEDULES[schedule](p, decay_frac)


def schedule_step(step: int, elapsed_s: float, budget_s: float | None, total: int) -> int:
    """The step at which to read the schedule: `step`, or, with a time budget, the further of `step`
    and the budget's used share mapped onto the `total` steps, floor(total * elapsed / budget)."""
    if budget_s is None:
        return step
    if budget_s <= 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    return max(step, min(total, int(total * max(0.0, elapsed_s) / budget_s)))
