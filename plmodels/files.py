"""The one atomic writer of the house: `atomic_open` for a file and `atomic_dir` for a folder
(`workbench.core.io` re-exports them under the workbench's names), and the way plmodels writes
safetensors files, JSON and text files (training state, resolved configs, tokenizers, the corpus
cache, rewritten logs), swaps whole folders into place (checkpoints, exports, activation stores) and
copies a file or folder over an older copy (`copy_atomic`: a study's results folder).

Atomic writers build a temporary sibling (same folder, so same file system) with `tempfile.mkstemp`
(mode 0600) or `mkdtemp` (0700), fsync it and `os.replace` it over the target, then fsync the
folder: a reader, a killed writer or a crash leaves the old file or the new one, never a part of
either. Without a chmod every checkpoint, table and cache would be readable by its owner only,
unlike a file written with `open()`: `make_shared` gives a path the mode `open()` or `mkdir()`
would have: 0666 (files) or 0777 (folders) less the process umask, read at each call.
Temporaries are named `.<name>.<random>.tmp` (files) and `.<name>.tmp-<pid>-<random>` (folders, and
the copies of `copy_atomic`); a folder being replaced is moved aside as `.<name>.old-<pid>-<random>`.
`remove_stale` deletes the pid-named ones whose writer is dead, so a killed copy or swap leaves nothing
that the next one trips over or that a folder's size counts.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from safetensors.torch import save_file


def current_umask() -> int:
    """The process umask (os.umask can only be read by setting it, so set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_shared(path: str | os.PathLike, folder: bool = False) -> None:
    """chmod `path` to 0666 (0777 for a folder) less the umask, as `open()` / `mkdir()` create."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's or a folder's data to the disk (a folder: its entries, e.g. a rename)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file and folder under `folder`, and `folder` itself (before renaming it into place)."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """A temporary sibling of `path` open for writing; when the block ends without an exception it
    is flushed, fsynced, given `open()`'s mode and renamed over `path`. An exception (or a kill)
    before then leaves `path` as it was (an exception also removes the temporary)."""
    path = Path(path)
    if "w" not in mode:
        raise ValueError(f"atomic_open: mode must be a write mode, got {mode!r}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        make_shared(tmp)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs (one of another user counts as running): the owner of a
    temporary named with its pid may still be writing it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """`text` (UTF-8) at `path`, atomically and with the mode `open()` gives."""
    with atomic_open(path) as f:
        f.write(text)


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """safetensors' `save_file`, atomically (a temporary sibling, fsynced, then a rename) and with
    the mode `open()` gives, where `save_file` alone creates a 0600 file."""

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        fsync_path(tmp)
        make_shared(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """`obj` as indented, key-sorted JSON at `path`, atomically and with the mode `open()` gives.
    The object is serialised first: one that does not serialise leaves the old file as it was."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def temp_folder(path: str | os.PathLike) -> Path:
    """A fresh name (not created) beside `path` to build a folder in before `replace_folder`:
    `.<name>.tmp-<pid>-<random>`, hidden from globs such as `step_*`."""
    path = Path(path)
    return path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """A fresh temporary sibling folder of `path` (`temp_folder`, mode as `mkdir()` gives) to build
    in; when the block ends without an exception it is fsynced and swapped into place
    (`replace_folder`). An exception (or a kill) before then leaves `path` as it was; an exception
    also removes the temporary. An existing `path` is a FileExistsError unless `overwrite` (checked
    before the block runs and again before the swap, for a folder that appeared meanwhile)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"atomic_dir: {path} already exists (pass overwrite=True to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder(path)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists() and not overwrite:
            raise FileExistsError(f"atomic_dir: {path} appeared while it was being built")
        replace_folder(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_folder(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Move the finished folder `tmp` (see `temp_folder`) to `path`, its files fsynced first.

    A new `path` appears whole in one rename. An existing one is moved aside, `tmp` renamed in and
    the old one deleted: a kill between the two renames leaves no `path` (and a hidden
    `.<name>.old-*` sibling), never a mixed folder.
    """
    tmp, path = Path(tmp), Path(path)
    fsync_tree(tmp)
    if path.exists():
        old = path.parent / f".{path.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(path, old)
        os.replace(tmp, path)
        fsync_path(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
        fsync_path(path.parent)
    return path


# the temporaries of this module's writers: `.<name>.tmp-<pid>-<rand>` and `.<name>.old-<pid>-<rand>`
# (temp_folder, replace_folder), and atomic_open's `.<name>.<rand>.tmp`, which names no pid
_TEMPORARY = re.compile(r"\.(?P<name>.+?)\.(?:(?:tmp|old)-(?P<pid>\d+)-.+|[^.]+\.tmp)")


def stale_temporary(path: str | os.PathLike, name: str | None = None) -> bool:
    """Whether `path` is a temporary of this module's writers that a dead writer left: one named with
    the pid of no live process, or of this one (which asks before it writes that name again). With
    `name`, only the pid-named temporaries of `parent/<name>`; without, any name's, and atomic_open's
    pid-less ones too (a folder's one owner clearing every leftover: a resumed training run)."""
    m = _TEMPORARY.fullmatch(Path(path).name)
    if m is None or (name is not None and (m["name"] != name or m["pid"] is None)):
        return False
    return m["pid"] is None or int(m["pid"]) == os.getpid() or not pid_alive(int(m["pid"]))


def remove_stale(parent: str | os.PathLike, name: str | None = None) -> int:
    """Delete the entries of `parent` that are `stale_temporary` (of `name`, or of every name), files
    or folders (a link itself, never its target); returns how many."""
    parent = Path(parent)
    stale = [p for p in parent.iterdir() if stale_temporary(p, name)] if parent.is_dir() else []
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(stale)


def copy_atomic(src: str | os.PathLike, dest: str | os.PathLike, ignore: Any = None) -> Path:
    """Copy the file or folder `src` to `dest`, replacing an older copy there in one swap: the copy is
    built in `temp_folder(dest)` (a file too) and moved into place (`replace_folder` for a folder, one
    rename for a file), so `dest` is the old copy or the new one, whole. A killed copy leaves only
    that pid-named temporary, which the next copy to `dest` deletes first (`remove_stale`). `ignore`
    is `shutil.copytree`'s (a folder's entries to leave out). Returns `dest`."""
    src, dest = Path(src), Path(dest)
    remove_stale(dest.parent, dest.name)
    tmp = temp_folder(dest)
    try:
        if src.is_dir():
            shutil.copytree(src, tmp, ignore=ignore)
            return replace_folder(tmp, dest)
        shutil.copy2(src, tmp)
        fsync_path(tmp)
        os.replace(tmp, dest)
        fsync_path(dest.parent)
        return dest
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
