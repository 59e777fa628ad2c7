"""Checkpoint folders: save, load and hash a model with its tokenizer (docs/design.md, "Checkpoints").

Layout of a checkpoint folder:
    config.json        {"kind": "encoder" | "decoder" | "bilm" | "tbilm" | "seq2seq" | "xlnet",
                        "config": {...}}
                       (pruned heads included)
    model.safetensors  the state dict (safetensors only; nothing is ever unpickled)
    tokenizer/         Tokenizer.save output (absent when saved without a tokenizer)
    card.json          model card: data, steps, tokens, metrics, created, ... (free-form extras)
    README.md          the card as prose
    checksums.json     {"model.safetensors": sha256 hex}, written last
Saving writes a temporary sibling folder and renames it into place, so a reader never sees half a
checkpoint. A folder torn all the same (a copy cut short, a disk that filled, a file truncated by
hand) is recognised: `read_weights` compares the weights with checksums.json (a folder without
one, from an older version or another writer, is read as it is), and every reader here reports a
damaged file in one line naming it and what is wrong (`CheckpointError`, a ValueError). Tied weights are not a problem: the tied heads reuse the embedding matrix in
`F.linear` and own no parameter of their own, so the state dict holds each tensor once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from .families import FAMILIES
from .files import atomic_dir, save_safetensors
from .tokenizer import Tokenizer

# kind -> (model class, config class), read off the family records (plmodels/families.py)
MODEL_KINDS: dict[str, tuple[type[nn.Module], type]] = {k: (f.model_class, f.config_class) for k, f in FAMILIES.items()}
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_DIR, CARD_FILE, README_FILE, CHECKSUMS_FILE = (
    "config.json", "model.safetensors", "tokenizer", "card.json", "README.md", "checksums.json",
)


class CheckpointError(ValueError):
    """A checkpoint file that is damaged or not what it should be; the message names the file."""


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_checksums(folder: str | Path, names: tuple[str, ...] = (WEIGHTS_FILE,)) -> None:
    """checksums.json: the sha256 of each named file of `folder`; write it after them."""
    folder = Path(folder)
    sums = {name: file_sha256(folder / name) for name in names}
    (folder / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json_file(path: str | Path) -> Any:
    """The JSON in a checkpoint file; invalid JSON or text is a CheckpointError naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start}); the file is damaged") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg} "
                              f"(a torn or edited file)") from None


def checksum_mismatches(folder: str | Path) -> list[str]:
    """The files of `folder` whose sha256 differs from its checksums.json, each as one phrase naming
    it ([] when they all match or the folder has no checksums.json)."""
    folder = Path(folder)
    if not (folder / CHECKSUMS_FILE).is_file():
        return []
    sums = read_json_file(folder / CHECKSUMS_FILE)
    if not isinstance(sums, dict):
        raise CheckpointError(f"{folder / CHECKSUMS_FILE}: expected a JSON object of file -> sha256")
    bad = []
    for name, want in sums.items():
        if not (folder / name).is_file():
            bad.append(f"{folder / name}: missing (listed in {CHECKSUMS_FILE})")
            continue
        got = file_sha256(folder / name)
        if got != want:
            bad.append(f"{folder / name}: sha256 {got[:12]}... does not match {CHECKSUMS_FILE} "
                       f"({want[:12]}...; {(folder / name).stat().st_size} bytes)")
    return bad


def verify_checksums(folder: str | Path) -> None:
    """Every file of `folder` matches its checksums.json (none: nothing to compare), else a
    CheckpointError naming the first that does not: what resumption asks of a checkpoint."""
    bad = checksum_mismatches(folder)
    if bad:
        raise CheckpointError(bad[0] + ": the file is torn or was changed")


def read_safetensors(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated or damaged one is a CheckpointError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return load_file(str(path), device=device)
    except Exception as e:   # noqa: BLE001 - safetensors raises its own SafetensorError (not an OSError)
        raise CheckpointError(f"{path}: not a readable safetensors file ({path.stat().st_size} bytes; "
                              f"{type(e).__name__}: {e})") from None


def read_weights(folder: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """model.safetensors of a checkpoint folder, compared with its checksums.json. A file that does
    not parse (torn: cut short, zeros at its end) is a CheckpointError naming it and the mismatch;
    a complete file whose bytes differ (weights rewritten in place on purpose, as tests and
    hand-edits do, or damaged inside) loads with a warning naming it. Resumption is strict
    instead (plmodels.training.state.check_checkpoint)."""
    folder = Path(folder)
    bad = [b for b in checksum_mismatches(folder) if b.startswith(str(folder / WEIGHTS_FILE))]
    try:
        state = read_safetensors(folder / WEIGHTS_FILE, device)
    except CheckpointError as e:
        raise CheckpointError(f"{e}{'; ' + bad[0].split(': ', 1)[1] if bad else ''}") from None
    if bad:
        warnings.warn(f"{bad[0]}: the weights were changed after the checkpoint was saved", stacklevel=2)
    return state


def check_weights(folder: str | Path) -> None:
    """model.safetensors of a checkpoint folder is whole, without loading it: its bytes against
    checksums.json when the folder has one, else its header against its size (safetensors refuses
    a file shorter than its header says). A CheckpointError names the file otherwise."""
    folder = Path(folder)
    bad = [b for b in checksum_mismatches(folder) if b.startswith(str(folder / WEIGHTS_FILE))]
    path = folder / WEIGHTS_FILE
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except Exception as e:   # noqa: BLE001 - safetensors' own SafetensorError
        raise CheckpointError(f"{path}: not a readable safetensors file ({path.stat().st_size} bytes; "
                              f"{type(e).__name__}: {e}){'; ' + bad[0].split(': ', 1)[1] if bad else ''}") from None


def read_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer/ of a checkpoint folder; a damaged one is a CheckpointError naming the folder."""
    folder = Path(folder)
    try:
        return Tokenizer.load(folder)
    except (FileNotFoundError, CheckpointError):
        raise
    except Exception as e:   # noqa: BLE001 - the tokenizers library raises plain Exceptions
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{folder}: not a readable tokenizer folder ({type(e).__name__}: {msg})") from None


def build_model(kind: str, config: dict) -> nn.Module:
    """A freshly initialised model of `kind` (a key of MODEL_KINDS) in the config's (pruned) shape."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(MODEL_KINDS)}")
    model_cls, config_cls = MODEL_KINDS[kind]
    return model_cls(config_cls.from_dict(config))


def random_init_model(model: nn.Module, seed: int) -> nn.Module:
    """The same architecture (kind and config) with fresh weights from the family's own init, drawn under
    `seed` (the global torch generator is left as it was), in eval mode: the random-initialisation
    floor of the analyses, drawn under `floor_seed(analysis seed, training_seed(checkpoint))`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(model.kind, model.config.to_dict()).eval()


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model: nn.Module, tokenizer: Any, path: str | Path, card: dict | None = None) -> Path:
    """Write a checkpoint folder at `path` atomically (`plmodels.files.atomic_dir`: a temporary sibling,
    fsynced, then swapped in); returns the path.

    tokenizer: a plmodels Tokenizer or None. card: extra card fields (data, steps, tokens, metrics...).
    An existing folder at `path` is replaced.
    """
    path = Path(path)
    with atomic_dir(path, overwrite=True) as tmp:   # an existing folder is swapped out only when this one is whole
        meta = {"kind": model.kind, "config": model.config.to_dict()}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        # One metadata key only: safetensors writes metadata from a hash map, so several keys come
        # out in a random order and identical weights would hash differently (checkpoint_hash).
        save_safetensors(state, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_DIR)
        full_card = {
            "name": path.name,
            "kind": model.kind,
            "n_parameters": n_parameters(model),
            "n_heads_per_layer": list(model.n_heads_per_layer),
            "data": None,
            "steps": None,
            "tokens": None,
            "metrics": {},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **(card or {}),
        }
        (tmp / CARD_FILE).write_text(json.dumps(full_card, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        (tmp / README_FILE).write_text(card_prose(full_card, meta), encoding="utf-8")
        write_checksums(tmp)   # last: what the weights were when the folder was complete
    return path


def card_prose(card: dict, meta: dict) -> str:
    """The model card as Markdown."""
    lines = [f"# {card.get('name', 'model')}", "", f"A {meta['kind']} saved by plm-workbench on {card.get('created')}.", ""]
    lines += ["## Architecture", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["config"].items()]
    lines += ["", f"Parameters: {card.get('n_parameters')}; heads per layer: {card.get('n_heads_per_layer')}.", ""]
    lines += ["## Training", ""]
    for key in ("data", "steps", "tokens"):
        lines.append(f"- {key}: {card.get(key)}")
    metrics = card.get("metrics") or {}
    lines += ["", "## Metrics", ""] + ([f"- {k}: {v}" for k, v in metrics.items()] or ["(none)"])
    extras = {k: v for k, v in card.items() if k not in {"name", "kind", "n_parameters", "n_heads_per_layer", "data", "steps", "tokens", "metrics", "created"}}
    if extras:
        lines += ["", "## Notes", ""] + [f"- {k}: {json.dumps(v, default=str)}" for k, v in extras.items()]
    return "\n".join(lines) + "\n"


def check_state(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], where: str) -> None:
    """Raise ValueError listing missing, extra and misshapen tensors (by name) between two state dicts."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    misshapen = sorted(
        f"{k}: expected {tuple(expected[k].shape)}, found {tuple(found[k].shape)}"
        for k in set(expected) & set(found)
        if expected[k].shape != found[k].shape
    )
    if missing or extra or misshapen:
        raise ValueError(f"{where}: state does not match the config; missing={missing} extra={extra} misshapen={misshapen}")


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, Any]:
    """Read a checkpoint folder -> (model in eval mode on map_location, tokenizer or None).

    The model is built from config.json (pruned heads re-applied) before the weights are loaded.
    """
    path = Path(path)
    meta = read_meta(path)
    model_cls, config_cls = MODEL_KINDS[meta["kind"]]
    model = model_cls(config_cls.from_dict(meta["config"], str(path / CONFIG_FILE)))
    state = read_weights(path)
    check_state(model.state_dict(), state, str(path / WEIGHTS_FILE))
    model.load_state_dict(state, strict=True)
    model.to(map_location).eval()
    tokenizer = None
    if (path / TOKENIZER_DIR).is_dir():
        tokenizer = read_tokenizer(path / TOKENIZER_DIR)
    return model, tokenizer


def read_meta(path: str | Path) -> dict:
    """config.json of a checkpoint folder, checked to be {"kind": a MODEL_KINDS key, "config": {...}};
    a folder that is not a checkpoint, or a damaged config.json, is an error naming the file."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    meta = read_json_file(path / CONFIG_FILE)
    if not isinstance(meta, dict) or set(meta) - {"kind", "config"} or "kind" not in meta or "config" not in meta:
        got = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{path / CONFIG_FILE}: expected keys 'kind' and 'config', got {got}")
    if meta["kind"] not in MODEL_KINDS:
        raise CheckpointError(f"{path / CONFIG_FILE}: unknown model kind {meta['kind']!r}; known: {sorted(MODEL_KINDS)}")
    return meta


RUN_CONFIG_FILE = "config.resolved.json"  # a pretraining run's resolved config, beside its checkpoints
LM_HEAD_PREFIXES = ("mlm.", "lm_head.")  # the LM head's tensors in an import report's fresh_init list
UNTRAINED_LM_HEAD_OBJECTIVES = ("electra",)  # objectives whose analysed model's LM head is never trained


@dataclass(frozen=True)
class Card:
    """A checkpoint's card.json, typed (`read_card` is its one reader). The trainer writes every
    field; a card from an older version or an importer gets the defaults below, or values derived
    once here (`read_card`). `fields` keeps the whole JSON object (steps, tokens, metrics, ...)."""

    name: str | None = None  # the folder's name when saved
    kind: str | None = None  # the model family (config.json's kind)
    objective_name: str | None = None  # plmodels.training.objectives.OBJECTIVES key; None: not trained here
    objective: str | None = None  # the objective in words
    objective_args: Mapping[str, Any] = field(default_factory=dict)  # its arguments, complete ({} = defaults)
    objective_args_source: str = "card"  # "card", the run config they were read from (older cards), or "defaults"
    train_source: str | None = None  # the pretraining corpus (data.train[0]); None: not trained here
    train_split: str | None = None  # its split (data.train[1])
    tokenizer: Mapping[str, Any] | None = None  # {"kind", "vocab_size"} of the run's tokenizer
    import_report: Mapping[str, Any] | None = None  # what an importer mapped, left out, initialised fresh
    # an imported checkpoint's source folder, config and weights sha256, the seed and step it claims
    # (plmodels.hf.registry.provenance); None: not imported
    provenance: Mapping[str, Any] | None = None
    lm_head_trained: bool = True  # the LM head's logits mean something (module docstring of lm_head_rule)
    role: str | None = None  # e.g. "ELECTRA generator"
    steps: int | None = None
    tokens: int | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    # the seed the pretraining run drew its initial weights and data order under (older cards: the run's
    # config.resolved.json); an imported suite's checkpoint: the seed it claims; None: not known
    seed: int | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)  # the whole card.json


def lm_head_rule(card: Mapping[str, Any]) -> bool:
    """Whether a card's model has a trained LM head, the one rule for cards written before the trainer
    recorded it: False when the import report says the head was not in the imported weights
    ("mlm_head" = "fresh init ..." or an LM-head tensor in "fresh_init": an imported sentence encoder
    such as all-MiniLM-L6-v2) or when the objective never trains the analysed model's head (ELECTRA's
    discriminator; its generator, role "ELECTRA generator", is a trained MLM); True otherwise."""
    if "lm_head_trained" in card:
        return bool(card["lm_head_trained"])
    report = card.get("import") or {}
    fresh = [n for n in report.get("fresh_init") or [] if n.startswith(LM_HEAD_PREFIXES)]
    if fresh or str(report.get("mlm_head", "")).startswith("fresh"):
        return False
    return card.get("objective_name") not in UNTRAINED_LM_HEAD_OBJECTIVES or card.get("role") == "ELECTRA generator"


def _run_config(path: Path, name: str | None) -> tuple[dict, Path] | None:
    """(the "pretrain" section, its file) of the config.resolved.json of the pretraining run that wrote
    the checkpoint folder `path` (`final/` or `checkpoints/step_*/` of the run folder) when that run
    trained objective `name` (objective "auto": the kind's `Family.default_objective`, as the trainer
    resolves it); None for a checkpoint not trained here (no objective, or another run's)."""
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    resolved = run / RUN_CONFIG_FILE
    if name is None or not resolved.is_file():
        return None
    pretrain = read_json_file(resolved).get("pretrain", {})
    trained = pretrain.get("objective", "auto")
    if trained == "auto":
        family = FAMILIES.get(pretrain.get("kind"))
        trained = family.default_objective if family is not None else None
    return (pretrain, resolved) if trained == name else None


def _legacy_objective_args(path: Path, name: str | None) -> tuple[dict, str]:
    """(objective_args, where from) of a card written before the trainer put them in it: the run's
    config.resolved.json when that run trained `name`, else the defaults."""
    run = _run_config(path, name)
    if run is not None:
        return dict(run[0].get("objective_args") or {}), str(run[1])
    return {}, "defaults"


def _legacy_seed(path: Path, name: str | None) -> int | None:
    """The pretraining seed of a card written before the trainer put it in it: the run's
    config.resolved.json when that run trained `name` (PretrainConfig.seed, default 0), else None."""
    run = _run_config(path, name)
    return None if run is None else int(run[0].get("seed", 0))


def read_card(path: str | Path) -> Card:
    """The card of a checkpoint folder (a default Card when it has no card.json); a damaged one is a
    CheckpointError naming the file. Cards without the newer fields load with them derived once
    here: objective_args and seed from the run's config.resolved.json, lm_head_trained by `lm_head_rule`."""
    path = Path(path)
    card_path = path / CARD_FILE
    raw = read_json_file(card_path) if card_path.is_file() else {}
    if not isinstance(raw, dict):
        raise CheckpointError(f"{card_path}: expected a JSON object, got {type(raw).__name__}")
    name = raw.get("objective_name")
    if "objective_args" in raw:
        args, source = dict(raw["objective_args"] or {}), "card"
    else:
        args, source = _legacy_objective_args(path, name)
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    train = data.get("train") or [None, None]
    return Card(name=raw.get("name"), kind=raw.get("kind"), objective_name=name, objective=raw.get("objective"),
                objective_args=args, objective_args_source=source, train_source=train[0],
                train_split=train[1] if len(train) > 1 else None, tokenizer=data.get("tokenizer"),
                import_report=raw.get("import"), provenance=raw.get("provenance"), lm_head_trained=lm_head_rule(raw), role=raw.get("role"),
                steps=raw.get("steps"), tokens=raw.get("tokens"), metrics=raw.get("metrics") or {},
                seed=raw["seed"] if "seed" in raw else _legacy_seed(path, name), fields=raw)


def training_seed(path: str | Path) -> int | None:
    """The seed the checkpoint folder `path` was pretrained under: its card's "seed" (written by the
    trainer, an imported suite's claimed seed, a `random_baseline_checkpoint`'s draw), for an older card
    the pretraining run's config.resolved.json, None for neither (an imported Hugging Face model)."""
    return read_card(path).seed


def floor_seed(seed: int, trained_under: int | None) -> int:
    """The seed the random-initialisation floor of a checkpoint is drawn under, the one rule every analysis
    follows: a checkpoint pretrained under seed t (`training_seed`) and analysed with seed s gets
    `random_init_model(model, t + s)`, so each pretraining seed of a system has its own floor (the zoo's
    intervals over seeds carry the initialisation's variance) and, at s = 0, a plain MLM / CLM checkpoint's
    floor is the very network its pretraining started from; t unknown (None): s. A checkpoint pretrained
    under seed 0 keeps the floor drawn under s."""
    return seed if trained_under is None else trained_under + seed


def checkpoint_hash(path: str | Path) -> str:
    """sha256 (hex) over the bytes of config.json followed by model.safetensors (checksums.json
    is left out: the hash is the same for a folder written before it existed)."""
    path = Path(path)
    h = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(path / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
