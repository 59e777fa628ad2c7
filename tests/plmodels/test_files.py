"""plmodels/files.py's folder copy and its cleanup: `copy_atomic` swaps a whole copy in over the old one,
and `remove_stale` deletes exactly the temporaries killed writers left (not a live writer's, not
another name's)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from plmodels.files import copy_atomic, remove_stale, temp_folder


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_remove_stale_deletes_dead_writers_temporaries_of_the_name_only(tmp_path):
    dead, live = 999_999_999, os.getppid()
    for entry in (f".t.tmp-{dead}-ab12cd34", f".t.old-{dead}-ab12cd34", f".t.tmp-{live}-ab12cd34",
                  f".t.old-{live}-ab12cd34", f".u.tmp-{dead}-ab12cd34", "t", f".t.tmp-{os.getpid()}-ab12cd34"):
        (tmp_path / entry).mkdir()
        (tmp_path / entry / "f").write_text("x")
    (tmp_path / f".t.tmp-{dead}-ef56ab78").write_text("a killed file copy")
    assert remove_stale(tmp_path, "t") == 4   # dead pid's tmp, old and file; this process' own
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".t.tmp-{live}-ab12cd34", f".t.old-{live}-ab12cd34", f".u.tmp-{dead}-ab12cd34", "t"])
    assert remove_stale(tmp_path / "absent", "t") == 0


def test_copy_atomic_replaces_a_folder_or_a_file_whole(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "out" / "tables"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"1")
    (src / "sub" / "b").write_bytes(b"22")
    (src / ".a.lock").write_bytes(b"")
    dest.parent.mkdir()
    assert copy_atomic(src, dest, ignore=shutil.ignore_patterns(".*")) == dest
    assert _tree(dest) == {"a": b"1", "sub/b": b"22"}
    (src / "a").unlink()
    (src / "c").write_bytes(b"333")
    copy_atomic(src, dest, ignore=shutil.ignore_patterns(".*"))
    assert _tree(dest) == {"c": b"333", "sub/b": b"22"}      # the old copy's "a" is gone: a swap, not a merge
    copy_atomic(src / "c", tmp_path / "out" / "run.json")
    assert (tmp_path / "out" / "run.json").read_bytes() == b"333"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["run.json", "tables"]


def test_a_failed_copy_keeps_the_old_copy_and_no_temporary(tmp_path, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "a").write_bytes(b"old")
    copy_atomic(src, dest)
    (src / "a").write_bytes(b"new")
    (src / "b").write_bytes(b"new")

    def fail(s, d):
        raise OSError("disk full")
    copytree = shutil.copytree
    monkeypatch.setattr(shutil, "copytree", lambda s, d, **kw: copytree(s, d, **{**kw, "copy_function": fail}))
    with pytest.raises(OSError, match="disk full"):
        copy_atomic(src, dest)
    assert _tree(dest) == {"a": b"old"} and sorted(p.name for p in tmp_path.iterdir()) == ["dest", "src"]


def test_temporaries_carry_the_writers_pid(tmp_path):
    assert temp_folder(tmp_path / "x").name.startswith(f".x.tmp-{os.getpid()}-")


def test_without_a_name_every_dead_writers_leftover_goes_atomic_opens_too(tmp_path):
    (tmp_path / ".a.json.k2j3h4_q.tmp").write_text("x")                  # atomic_open's: names no pid
    (tmp_path / ".b.old-999999999-ab12cd34").mkdir()
    (tmp_path / f".c.tmp-{os.getppid()}-ab12cd34").mkdir()                # a live writer's
    (tmp_path / ".hidden").write_text("not a temporary")
    assert remove_stale(tmp_path, "a.json") == 0    # a pid-less one only when a folder's owner clears it all
    assert remove_stale(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".c.tmp-{os.getppid()}-ab12cd34", ".hidden"]
