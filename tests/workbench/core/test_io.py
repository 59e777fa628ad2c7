"""Atomic writes keep the old file when a write fails, and leave no temporaries behind."""
import json
import os
from pathlib import Path

import pandas as pd
import pytest

import plmodels.files
from workbench.core import io


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_atomic_write_bytes_and_text_round_trip(tmp_path):
    p = tmp_path / "sub" / "a.bin"
    io.atomic_write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    io.atomic_write_text(p, "héllo")
    assert p.read_text(encoding="utf-8") == "héllo"
    assert _leftovers(p.parent) == []


def test_atomic_write_json_keeps_old_file_when_serialisation_raises(tmp_path):
    p = tmp_path / "x.json"
    io.atomic_write_json(p, {"a": 1})
    with pytest.raises(TypeError):
        io.atomic_write_json(p, {"a": object()})
    assert json.loads(p.read_text()) == {"a": 1}
    assert _leftovers(tmp_path) == []


def test_atomic_file_keeps_old_file_when_write_raises_midway(tmp_path):
    p = tmp_path / "x.txt"
    io.atomic_write_text(p, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_file(p, "w") as f:
            f.write("half of the new")
            raise RuntimeError("killed")
    assert p.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_write_parquet_atomic_keeps_old_on_failure(tmp_path):
    p = tmp_path / "t.parquet"
    io.write_parquet_atomic(pd.DataFrame({"a": [1, 2]}), p)
    bad = pd.DataFrame({"a": [object()]})  # pyarrow cannot convert a bare object
    with pytest.raises(Exception):
        io.write_parquet_atomic(bad, p)
    assert pd.read_parquet(p)["a"].tolist() == [1, 2]
    assert _leftovers(tmp_path) == []


def test_atomic_dir_success_failure_and_overwrite(tmp_path):
    target = tmp_path / "store"
    with pytest.raises(ValueError):
        with io.atomic_dir(target) as d:
            (d / "half").write_text("x")
            raise ValueError("boom")
    assert not target.exists() and _leftovers(tmp_path) == []
    with io.atomic_dir(target) as d:
        (d / "f").write_text("1")
    assert (target / "f").read_text() == "1"
    with pytest.raises(FileExistsError):
        with io.atomic_dir(target):
            pass
    with io.atomic_dir(target, overwrite=True) as d:
        (d / "g").write_text("2")
    assert sorted(os.listdir(target)) == ["g"]
    assert _leftovers(tmp_path) == []


def test_atomic_dir_is_the_one_folder_writer_of_plmodels_files():
    assert io.atomic_dir is plmodels.files.atomic_dir


@pytest.mark.parametrize("where", ["block", "fsync"])
def test_a_failed_rebuild_keeps_the_old_folder_whole_and_no_temporaries(tmp_path, monkeypatch, where):
    target = tmp_path / "store"
    with io.atomic_dir(target) as d:
        (d / "f").write_text("old")
    if where == "fsync":    # the disk fails while the finished folder is flushed, before the swap
        monkeypatch.setattr(plmodels.files, "fsync_path", lambda p: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        with io.atomic_dir(target, overwrite=True) as d:
            (d / "f").write_text("new")
            (d / "g").write_text("new")
            if where == "block":
                raise OSError("killed mid-write")
    assert sorted(os.listdir(target)) == ["f"] and (target / "f").read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_clean_stale_tmp_removes_dead_pid_folders_only(tmp_path):
    dead = tmp_path / ".s.tmp-999999999-abc"
    dead.mkdir()
    live = tmp_path / f".s.tmp-{os.getppid()}-abc"
    live.mkdir()
    assert io.clean_stale_tmp(tmp_path, "s") == 1
    assert not dead.exists() and live.exists()


@pytest.fixture
def umask():
    """Set the process umask for one test and put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_every_writer_gives_the_mode_open_would(umask, tmp_path, mask, file_mode, dir_mode):
    # mkstemp creates 0600 files and mkdtemp 0700 folders: without a chmod, tables and stores written
    # atomically could be read by their owner only, whatever the umask says
    umask(mask)
    io.atomic_write_text(tmp_path / "a.txt", "x")
    io.write_parquet_atomic(pd.DataFrame({"a": [1]}), tmp_path / "t.parquet")
    with io.atomic_file(tmp_path / "b.bin") as f:
        f.write(b"y")
    with io.atomic_dir(tmp_path / "d") as d:
        (d / "inner.txt").write_text("z")
    for name in ("a.txt", "t.parquet", "b.bin"):
        assert (tmp_path / name).stat().st_mode & 0o777 == file_mode, name
    assert (tmp_path / "d").stat().st_mode & 0o777 == dir_mode


def test_the_file_writers_are_the_one_atomic_writer_of_plmodels_files(tmp_path, monkeypatch):
    """Every file writer here goes through `plmodels.files.atomic_open` (one writer, one durability:
    the folder is fsynced after the rename too)."""
    synced = []
    real = plmodels.files.fsync_path
    monkeypatch.setattr(plmodels.files, "fsync_path", lambda p: (synced.append(Path(p)), real(p))[1])
    io.atomic_write_text(tmp_path / "sub" / "a.txt", "x")
    io.atomic_write_json(tmp_path / "b.json", {"k": 1})
    io.write_parquet_atomic(pd.DataFrame({"v": [1]}), tmp_path / "c.parquet")
    assert synced == [tmp_path / "sub", tmp_path, tmp_path]
    assert io.make_shared is plmodels.files.make_shared
