"""Keeping a long loop's resident memory flat: `HeapTrimmer`.

A loop whose batches differ in shape (extraction's length-sorted batches: every batch a different
number of tokens) allocates and frees buffers of ever-different sizes. glibc keeps freed heap memory
for reuse instead of returning it, and buffers of new sizes do not fit the old holes, so the resident
set grows batch after batch. With oneDNN's linear layers (`plmodels.components.cpu_linear`),
extracting every layer of EWT train with a 6 x 384 encoder peaked at 2,023 MiB of resident memory
against 1,376 MiB on MKL, though no batch needs more than a few hundred MiB. `malloc_trim(0)` hands
the free memory back; it costs about 40 ms, so `HeapTrimmer` calls it only when the resident set has
grown by `step_mib` since the last call (never, on a small extraction). Elsewhere than glibc it does
nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform


def resident_mib() -> float:
    """This process's resident set in MiB (/proc/self/statm), or 0.0 where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


class HeapTrimmer:
    """Call once per batch: returns freed heap memory to the system when the resident set has grown
    by `step_mib` MiB since the last trim (glibc only; a no-op elsewhere). `trims` counts the trims."""

    def __init__(self, step_mib: float = 256.0) -> None:
        self.step_mib, self.trims = step_mib, 0
        self._trim = None
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            self._trim = getattr(libc, "malloc_trim", None)
        self.mark = resident_mib()

    def __call__(self) -> None:
        if self._trim is None or resident_mib() <= self.mark + self.step_mib:
            return
        self._trim(0)
        self.trims += 1
        self.mark = resident_mib()
