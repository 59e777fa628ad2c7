"""The shipped training recipes, as package data: `pretrain/<name>.json` (PretrainConfig) and
`finetune/<name>.json` (FinetuneConfig), found by name wherever the package is installed.

    workbench pretrain encoder-mini-cram --out runs/enc     # a recipe by name
    workbench pretrain my-config.json --out runs/enc        # or a file of your own, which may
                                                            # "extends": "encoder-mini-cram"

docs/recipe.md says what each pretraining recipe is for; docs/training.md, every field.
"""
from __future__ import annotations

from pathlib import Path

RECIPES = Path(__file__).resolve().parent
KINDS = ("pretrain", "finetune")


def names(kind: str) -> list[str]:
    """The recipe names of `kind` ("pretrain" | "finetune"), sorted."""
    if kind not in KINDS:
        raise ValueError(f"unknown recipe kind {kind!r}; known: {KINDS}")
    return sorted(p.stem for p in (RECIPES / kind).glob("*.json"))


def find(kind: str, config: str | Path, relative_to: Path | None = None) -> Path:
    """The file of a config: a path (relative to `relative_to` when given, else to the working
    directory) that exists, or the name of a shipped recipe of `kind`. A path to a recipe's old
    place in a checkout (configs/pretrain/NAME.json, configs/finetune/NAME.json) still finds it.
    A missing one is a FileNotFoundError listing the recipes."""
    path = Path(config) if relative_to is None else relative_to / config
    if path.is_file():
        return path
    named = RECIPES / kind / f"{config}.json"
    if named.is_file():
        return named
    if path.suffix == ".json" and path.parent.name == kind and path.stem in names(kind):
        return RECIPES / kind / path.name
    raise FileNotFoundError(f"no config file {path} and no {kind} recipe named {str(config)!r}; "
                            f"known: {names(kind)}")
