"""HeapTrimmer: trims only after the resident set has grown by its step, and never without glibc."""
import platform

import pytest

from workbench.core import memory
from workbench.core.memory import HeapTrimmer, resident_mib


def test_it_trims_when_the_resident_set_has_grown_by_the_step(monkeypatch):
    rss = iter([100.0, 150.0, 360.0, 120.0, 300.0, 390.0, 130.0])   # MiB, as resident_mib reads them
    monkeypatch.setattr(memory, "resident_mib", lambda: next(rss))
    calls = []
    trim = HeapTrimmer(step_mib=256.0)                              # mark 100
    trim._trim = calls.append
    trim()                  # 150: no
    trim()                  # 360 > 356: trim, mark 120
    trim()                  # 300: no
    trim()                  # 390 > 376: trim, mark 130
    assert calls == [0, 0] and trim.trims == 2 and trim.mark == 130.0


def test_without_glibc_it_does_nothing(monkeypatch):
    trim = HeapTrimmer(step_mib=0.0)
    trim._trim = None
    trim()
    assert trim.trims == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_is_found_and_the_resident_set_is_read():
    assert HeapTrimmer()._trim is not None and resident_mib() > 10
