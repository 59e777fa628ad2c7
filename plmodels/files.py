"""The mode of the files plmodels writes atomically (`workbench.core.io.make_shared` does the same there),
and the one way plmodels writes safetensors files and JSON files (training state, resolved configs).

Atomic writers build a temporary sibling with `tempfile.mkstemp` (mode 0600) or `mkdtemp` (0700) and
rename it into place, so without a chmod every checkpoint, table and cache would be readable by its
owner only, unlike a file written with `open()`. `make_shared` gives a path the mode `open()` or
`mkdir()` would have: 0666 (files) or 0777 (folders) less the process umask, read at each call.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import save_file


def current_umask() -> int:
    """The process umask (os.umask can only be read by setting it, so set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_shared(path: str | os.PathLike, folder: bool = False) -> None:
    """chmod `path` to 0666 (0777 for a folder) less the umask, as `open()` / `mkdir()` create."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """safetensors' `save_file`, atomically (a temporary sibling, then a rename) and with the mode
    `open()` gives, where `save_file` alone creates a 0600 file."""

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        make_shared(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """`obj` as indented, key-sorted JSON at `path`, atomically and with the mode `open()` gives."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    make_shared(tmp)  # mkstemp makes 0600 files
    os.replace(tmp, path)
