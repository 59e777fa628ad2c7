"""One typed way to read every config: frozen dataclasses of primitives, validated by pydantic.

A config class is a stdlib `@dataclass(frozen=True)` that subclasses `Config`. Its fields' type
hints are the schema (`int`, `float`, `str | None`, `Literal[...]`, `tuple[int, ...]`, `dict`);
pydantic checks a dict against them in strict JSON mode, so

- an unknown key is an error that names the file and the key;
- a value of the wrong type (`"lr": "1e-3"`, `"n_heads": 8.5`, `"seeds": 3`) is an error that names
  the file, the field and the value: nothing is coerced except JSON's int -> float and list -> tuple;
- the class' own `__post_init__` checks (ranges, choices that depend on other fields) run after,
  their message prefixed with the file.

    cfg = ProbeRunConfig.load("configs/probe.json", overrides={"seeds": [0]})
    cfg = ProbeRunConfig.from_dict({"tasks": ["pos"]}, source="--set")
    cfg.to_dict()                                   # JSON-ready: tuples as lists

Overrides on the command line: `parse_overrides(["model.n_heads=8", '{"lr": 1e-3}'])` turns
`--set` values (dotted `key=value`, the value read as JSON when it parses, or a JSON object) into one
nested dict; `merge` applies it to a config dict, nested dicts key by key.

Defaults live in the classes (and in files shipped as package data that name them), never in files
found relative to the repository.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, ClassVar, Mapping, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A config that does not fit its schema; the message names the source (file or flag) and field."""


def read_json(path: str | Path) -> Any:
    """The JSON value in `path`; a missing file or invalid JSON is an error naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")   # a UTF-8 BOM is not an error
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None


def read_json_object(path: str | Path) -> dict:
    """`read_json`, which must give a JSON object."""
    d = read_json(path)
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: a config file must hold a JSON object, got {type(d).__name__}")
    return d


def merge(base: Mapping, overrides: Mapping | None) -> dict:
    """`base` updated by `overrides`; where both hold a dict under a key, they merge key by key."""
    out = dict(base)
    for k, v in (overrides or {}).items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text   # a bare word: a string


def parse_overrides(values: list[str] | None) -> dict:
    """`--set` values -> one nested dict. Each value is a JSON object (`'{"lr": 1e-3}'`) or a dotted
    assignment (`model.n_heads=8`, `tasks=["pos"]`, `name=enc-2`); the value of an assignment is read
    as JSON when it parses and as a string otherwise. Later values win."""
    out: dict = {}
    for raw in values or []:
        text = raw.strip()
        if text.startswith("{"):
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--set {raw!r}: invalid JSON at column {e.colno}: {e.msg}") from None
        else:
            key, eq, val = text.partition("=")
            if not eq or not key.strip() or any(not p for p in key.strip().split(".")):
                raise ConfigError(f"--set {raw!r}: expected key=value (dotted keys for nested fields) or a JSON object")
            d = _value(val.strip())
            for part in reversed(key.strip().split(".")):
                d = {part: d}
        out = merge(out, d)
    return out


def _from_overrides(loc: tuple, overrides: Mapping | None) -> bool:
    """Whether the field at `loc` (or a dict above it) was set by `overrides`."""
    node: Any = overrides
    for part in loc:
        if not isinstance(node, Mapping) or str(part) not in node:
            return False
        node = node[str(part)]
        if not isinstance(node, Mapping):
            return True
    return True


def _class_at(cls: type, loc: tuple) -> type:
    """The dataclass whose fields are at `loc` inside `cls` (a field typed `Section | None` is walked
    into), so an unknown key of a nested section lists that section's keys; `cls` where it cannot tell."""
    for part in loc:
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        inner = [t for t in typing.get_args(hints.get(str(part))) or (hints.get(str(part)),)
                 if dataclasses.is_dataclass(t)]
        if len(inner) != 1:
            return cls
        cls = inner[0]
    return cls


def _describe(e: ValidationError, cls: type, source: str, overrides: Mapping | None = None,
              prefix: str = "") -> str:
    """One line per error; a field whose value came from `overrides` is named as the `--set` flag
    that gave it (`--set lr: ...`), the others under `source` (the file). `prefix` is the dotted
    path of the config inside its parent (e.g. "model." for a pretraining config's model fields)."""
    lines, from_flag = [], []
    for err in e.errors():
        field = prefix + ".".join(str(p) for p in err["loc"])
        flag = bool(err["loc"]) and _from_overrides(err["loc"], overrides)
        where = f"--set {field}" if flag else field
        if err["type"] == "unexpected_keyword_argument":
            known = ", ".join(f.name for f in dataclasses.fields(_class_at(cls, err["loc"][:-1])))
            lines.append(f"--set {field}: unknown key (known: {known})" if flag
                         else f"unknown key {field!r} (known: {known})")
        elif err["type"] == "value_error":   # a __post_init__ check: its own message names the field
            lines.append(str(err["ctx"]["error"]) if "ctx" in err else err["msg"])
        else:
            lines.append(f"{where}: {err['msg'].lower()}, got {json.dumps(err.get('input'), default=str)}")
        from_flag.append(flag)
    if from_flag and all(from_flag):   # the file is not to blame: the flag names itself
        head = ""
    else:
        head = f"{source}: " if source else f"{cls.__name__}: "
    return head + ("; ".join(lines) if len(lines) < 2 else "\n  " + "\n  ".join(lines))


def _adapter(cls: type) -> TypeAdapter:
    if "_adapter" not in cls.__dict__:
        cls._adapter = TypeAdapter(cls)
    return cls._adapter


def build(cls: type[C], d: Mapping, source: str | None = None, overrides: Mapping | None = None,
          prefix: str = "") -> C:
    """Validate `d` against the fields' types of the config class `cls` and build it; every error is
    a ConfigError naming `source` (a file, a flag) and the field, or the `--set` flag when the
    field's value came from `overrides` (the part of `d` given on the command line)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{source or cls.__name__}: expected a JSON object, got {type(d).__name__}")
    try:
        return _adapter(cls).validate_json(json.dumps(dict(d), default=str))
    except ValidationError as e:
        raise ConfigError(_describe(e, cls, source or "", overrides, prefix)) from None


class Config:
    """Mixin for the workbench's config dataclasses: typed `from_dict`, `load` and `to_dict`.

    Subclasses may set DEFAULT_FILE (a path, e.g. one shipped as package data) that `resolve(None)`
    reads; without one, `resolve(None)` is the class' defaults.
    """

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    DEFAULT_FILE: ClassVar[Path | None] = None

    def to_dict(self) -> dict:
        """The fields as JSON-ready values (tuples as lists, nested dataclasses as dicts)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    @classmethod
    def from_dict(cls: type[C], d: Mapping, source: str | None = None, overrides: Mapping | None = None) -> C:
        """Validate `d` against the fields' types and build the config; ConfigError names `source`,
        or the `--set` flag for a field whose value came from `overrides`."""
        return build(cls, d, source, overrides)

    @classmethod
    def load(cls: type[C], path: str | Path | None = None, overrides: Mapping | None = None) -> C:
        """The config in the JSON file `path` (default DEFAULT_FILE), updated by `overrides`."""
        path = path if path is not None else cls.DEFAULT_FILE
        if path is None:
            raise ValueError(f"{cls.__name__}.load: no path given and no DEFAULT_FILE")
        return cls.from_dict(merge(read_json_object(path), overrides), str(path), overrides)

    @classmethod
    def resolve(cls: type[C], config: Any = None, overrides: Mapping | None = None) -> C:
        """None -> DEFAULT_FILE (or the defaults); a dict -> its keys over the defaults; a path ->
        that file; a config -> itself. `overrides` (e.g. from `parse_overrides`) apply last."""
        if isinstance(config, cls):
            return cls.from_dict(merge(config.to_dict(), overrides), "overrides", overrides) if overrides else config
        if config is None:
            if cls.DEFAULT_FILE is not None and Path(cls.DEFAULT_FILE).is_file():
                return cls.load(cls.DEFAULT_FILE, overrides)
            return cls.from_dict(dict(overrides or {}), f"{cls.__name__} overrides", overrides)
        if isinstance(config, Mapping):
            return cls.from_dict(merge(config, overrides), f"{cls.__name__} dict", overrides)
        return cls.load(config, overrides)
