"""Atomic writes: a file or folder appears complete or not at all.

The file writers here are the workbench's names for the one atomic writer, `plmodels.files.atomic_open`
(a temporary sibling in the same folder, fsynced, given the mode `open()` gives, `os.replace`d over the
target, then the folder fsynced); they add only that the parent folder is created. An exception (or a
kill) before the rename leaves the old target untouched and removes the temporary where it can. (This
module once kept its own copy so that importing it would not import torch with plmodels; every module
that imports it loads plmodels anyway, through `workbench.core.paths` or `results`.) `atomic_dir(path)`
is `plmodels.files.atomic_dir`, re-exported: the same for a whole folder, built in
`<parent>/.<name>.tmp-<pid>-<rand>` and swapped into place on success; `clean_stale_tmp(parent, name)`
is `plmodels.files.remove_stale`: it deletes the ones a killed writer left. `file_lock(path)` serialises a
read-modify-write of `path` between processes (steps of `workbench run` with workers > 1).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator

from plmodels.files import atomic_dir, atomic_open, make_shared
from plmodels.files import remove_stale as clean_stale_tmp

__all__ = ["make_shared", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_file",
           "write_parquet_atomic", "atomic_dir", "file_lock", "clean_stale_tmp"]

def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file, fsync, os.replace). Returns the path."""
    path = Path(path)
    with atomic_file(path, "wb") as f:
        f.write(data)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` atomically."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Serialise `obj` as JSON (sorted keys are NOT forced; order kept) and write it atomically.

    Serialisation happens before the temp file is opened, so an unserialisable object leaves the
    old file intact.
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"
    return atomic_write_text(path, text)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temp sibling of `path` for writing (text modes in UTF-8); rename it over `path` when the
    block succeeds (`plmodels.files.atomic_open`, its parent folder created first)."""
    path = Path(path)
    if "w" not in mode:
        raise ValueError(f"atomic_file: mode must be a write mode, got {mode!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, mode) as f:
        yield f


def write_parquet_atomic(df, path: str | os.PathLike, **kwargs) -> Path:
    """Write a pandas DataFrame to Parquet atomically (kwargs go to `DataFrame.to_parquet`, which
    writes into the open temporary file)."""
    path = Path(path)
    with atomic_file(path, "wb") as f:
        df.to_parquet(f, **kwargs)
    return path


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock (`fcntl.flock`) on the sibling `.<name>.lock` of `path` for the
    block: two processes that read, change and write `path` under it do not lose each other's change.
    The lock file stays (empty); the lock goes with the process, so a killed holder frees it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock
