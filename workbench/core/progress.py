"""A small progress reporter: count, rate and ETA on stderr.

`Progress(total, desc, unit)` is a context manager with `.update(n)` and `.close()`. On a terminal
it redraws one line at most every `interval` seconds (default 1 s); when stderr is not a TTY (logs,
CI, pytest) it prints a plain line only every `log_interval` seconds (default 30 s) and a final line
on close, so log files stay short. `total=None` means unknown length (no ETA).
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt_seconds(s: float) -> str:
    s = int(max(s, 0))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _fmt_count(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


class Progress:
    """Rate and ETA reporter. `update(n)` adds n units; `close()` prints the final line once."""

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", *,
                 stream: TextIO | None = None, interval: float = 1.0, log_interval: float = 30.0,
                 disable: bool = False):
        if total is not None and total < 0:
            raise ValueError(f"Progress: total must be >= 0 or None, got {total}")
        self.total = total
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else log_interval
        self.disable = disable
        self.n = 0
        self.start = time.perf_counter()
        self._last_print = self.start
        self._closed = False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def rate(self) -> float:
        """Units per second since start (0 before any time has passed)."""
        el = self.elapsed
        return self.n / el if el > 0 else 0.0

    def line(self) -> str:
        """The status line: `desc: n/total unit (pct) | rate unit/s | elapsed < eta`."""
        rate = self.rate
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            pct = 100.0 * self.n / self.total
            eta = (self.total - self.n) / rate if rate > 0 else float("nan")
            eta_s = _fmt_seconds(eta) if eta == eta else "?"
            return (f"{head}{_fmt_count(self.n)}/{_fmt_count(self.total)} {self.unit} ({pct:.0f}%) | "
                    f"{_fmt_count(rate)} {self.unit}/s | {_fmt_seconds(self.elapsed)} < {eta_s}")
        return f"{head}{_fmt_count(self.n)} {self.unit} | {_fmt_count(rate)} {self.unit}/s | {_fmt_seconds(self.elapsed)}"

    def _emit(self, final: bool = False) -> None:
        if self.disable:
            return
        if self.tty:
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._last_print >= self.interval:
            self._last_print = now
            self._emit()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._emit(final=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
