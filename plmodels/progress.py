"""Progress with rate and ETA for every long step (pretraining, tokenizing, extraction, probing,
heads, pruning), through one library: tqdm.

    with progress(total=n_tokens, desc="extract", unit="tok") as bar:
        bar.update(k)
        bar.set_postfix_str("loss 3.21")
    write("eval @ 200: loss 3.10")       # a log line that does not break a bar

On a terminal it is tqdm's own bar; a bar opened inside another (extraction inside probing) goes
away when it closes. Elsewhere (log files, CI, pytest) a redrawn bar would fill the log with
carriage returns, so it writes plain lines instead: one when it opens, one every `log_interval`
seconds (default 30; `math.inf` for none, when the caller calls `refresh()` itself) and a last one
when it closes, with the overall rate:

    extract: 100% 48.2k/48.2k tok [00:12<00:00, 3.98ktok/s]

`disable=True` shows nothing (and, as in tqdm, counts nothing). A run that also stops on a clock (a
pretraining time budget) tells the bar with `end_within(seconds)`, and its ETA is then the smaller of
the count's and the clock's.
"""
from __future__ import annotations

import math
import sys
from typing import TextIO

from tqdm import tqdm


class _Lines:
    """A file for tqdm off a terminal: each redraw becomes one line, blank redraws are dropped."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, s: str) -> int:
        text = s.replace("\r", "").replace("\x1b[A", "").strip()
        if text:
            self.stream.write(text + "\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


# tqdm's default right-hand side, spelt out so that `remaining` can be the clock-capped ETA
TTY_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
LOG_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
LOG_FORMAT_OPEN = "{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]"  # total unknown: no ETA


class Bar(tqdm):
    """tqdm with an optional clock: `end_within(s)` caps the ETA at s seconds from now. (Keys added
    to `format_dict` override what tqdm's `format_meter` computes.)"""

    _deadline: float | None = None

    def end_within(self, seconds: float) -> None:
        """The work stops at the latest `seconds` from now whatever the count (a time budget)."""
        if not self.disable:
            self._deadline = self._time() + max(0.0, seconds)

    @property
    def format_dict(self):
        d = super().format_dict
        if d.get("unit_scale") is True:  # small whole counts as 0 and 48, not tqdm's 0.00 and 48.0
            d.update({f"{k}_fmt": str(int(d[k])) for k in ("n", "total")
                      if d[k] is not None and abs(d[k]) < 999.5 and float(d[k]).is_integer()})
        if self._deadline is None or not self.total:
            return d
        rate = d["rate"]  # the smoothed rate; None at close, where tqdm uses the overall one
        if not rate and d["elapsed"]:
            rate = (d["n"] - d["initial"]) / d["elapsed"]
        by_count = (d["total"] - d["n"]) / rate if rate else math.inf
        left = min(by_count, max(0.0, self._deadline - self._time()))
        return {**d, "remaining": tqdm.format_interval(left), "remaining_s": left}


def progress(total: float | None = None, desc: str = "", unit: str = "it", *, scale: bool = False,
             stream: TextIO | None = None, log_interval: float = 30.0, disable: bool = False,
             initial: float = 0) -> Bar:
    """A tqdm bar on `stream` (default stderr): `update(n)`, `set_postfix_str(s)`, `refresh()`,
    `close()`, `end_within(seconds)`, a context manager. `total=None` is an unknown length (a
    rate, no ETA); `scale` prints large counts as 1.2M; `initial` resumes a count (the rate and ETA
    count only what this process does)."""
    stream = stream if stream is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if tty:
        options = {"file": stream, "leave": None, "bar_format": TTY_FORMAT if total else None}
    else:  # miniters=1: look at the clock on every update, so a line comes every log_interval
        options = {"file": _Lines(stream), "leave": True, "mininterval": log_interval,
                   "maxinterval": log_interval, "miniters": 1,
                   "bar_format": LOG_FORMAT if total else LOG_FORMAT_OPEN}
    return Bar(total=total, desc=desc or None, unit=unit, unit_scale=scale, disable=disable, initial=initial,
               smoothing=0.1, **options)


def write(msg: str, stream: TextIO | None = None) -> None:
    """One log line on `stream` (default stderr) that does not break a bar drawn there."""
    stream = stream if stream is not None else sys.stderr
    tqdm.write(msg, file=stream)
    stream.flush()
