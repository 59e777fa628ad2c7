"""One way to read a run config: a frozen dataclass filled from JSON, where unknown keys are errors.

The analyses' configs (probe, heads, prune, compare, frozen vs finetuned) subclass `JsonConfig`;
it gives them `to_dict`, `from_dict` (unknown keys name themselves and the file), `load` (JSON errors
name the line) and `resolve` (None -> the class's default file, or its defaults when there is none;
a dict; a path; or a config object).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

from plmodels.train import read_json_file


def read_json_keys(path: str | Path, known: set[str], required: tuple[str, ...] = ()) -> dict:
    """A JSON object from `path` whose keys must be among `known` and include `required`; every
    error names the file (and the line, for invalid JSON)."""

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    d = read_json_file(path)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {sorted(known)}")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing}")
    return d


class JsonConfig:
    """Mixin for frozen dataclasses of primitives that round-trip through JSON."""

    DEFAULT_FILE: ClassVar[Path | None] = None   # read by resolve(None) when it exists

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping, where: str | None = None) -> Any:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{where or cls.__name__}: unknown keys {unknown}; valid keys: {sorted(names)}")
        return cls(**dict(d))

    @classmethod
    def read_json(cls, path: str | Path) -> dict:
        path = Path(path)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{cls.__name__}: config file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None

    @classmethod
    def load(cls, path: str | Path | None = None) -> Any:
        """The config in the JSON file `path` (default: DEFAULT_FILE)."""
        path = path if path is not None else cls.DEFAULT_FILE
        if path is None:
            raise ValueError(f"{cls.__name__}.load: no path given and no DEFAULT_FILE")
        return cls.from_dict(cls.read_json(path), str(path))

    @classmethod
    def resolve(cls, config: Any) -> Any:
        """None -> DEFAULT_FILE (or the defaults); a dict -> its keys; a path -> that file; a config -> itself."""
        if config is None:
            return cls.load(cls.DEFAULT_FILE) if cls.DEFAULT_FILE and Path(cls.DEFAULT_FILE).exists() else cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        return cls.load(config)
