"""Where the shared data lives, and which files each known dataset folder must hold.

Code in `workbench` reads real data only through `data_root()` (environment variable
WORKBENCH_DATA, default `../shared/data` next to the repository; `plmodels.paths` says where it
points from an installed wheel) and `dataset_dir(name, expected)`, which fails early and clearly
when a folder or a file is missing.
"""
from __future__ import annotations

from pathlib import Path

from plmodels.paths import ENV_VAR, data_root

# Known dataset folders under data_root() and the files each must contain (see shared/data/README.md).
DATASETS: dict[str, list[str]] = {
    "ud_english_ewt": [
        "en_ewt-ud-train.conllu",
        "en_ewt-ud-dev.conllu",
        "en_ewt-ud-test.conllu",
    ],
    "ud_english_gum": [
        "en_gum-ud-train.conllu",
        "en_gum-ud-dev.conllu",
        "en_gum-ud-test.conllu",
        "const/train.ptb",
        "const/dev.ptb",
        "const/test.ptb",
    ],
    "uner_english_ewt": ["en_ewt-ud-dev.iob2", "en_ewt-ud-test.iob2"],
    "gutenberg_pd": [
        "gutenberg_en.train.jsonl.gz",
        "gutenberg_en.valid.jsonl.gz",
        "manifest.tsv",
    ],
    "wikitext2": ["wiki.valid.tokens", "wiki.test.tokens"],
    "tiny_shakespeare": ["input.txt"],
    "glue_sst2": ["train.tsv", "dev.tsv", "test.tsv"],
}


def dataset_dir(name: str, expected: list[str] | None = None) -> Path:
    """The folder `data_root()/name`, checked to hold every file in `expected`.

    `expected` defaults to the registry entry `DATASETS[name]` (an unknown name with no
    `expected` is a ValueError listing the known ones). A missing folder or file raises
    FileNotFoundError naming the folder, the missing files and the files expected.
    """
    if expected is None:
        if name not in DATASETS:
            raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)} (or pass `expected`)")
        expected = DATASETS[name]
    folder = data_root() / name
    if not folder.is_dir():
        raise FileNotFoundError(
            f"dataset folder {folder} does not exist (expected files: {', '.join(expected)}); "
            f"set {ENV_VAR} to the shared data folder"
        )
    missing = [f for f in expected if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"dataset folder {folder} lacks {', '.join(missing)} "
            f"(expected files: {', '.join(expected)})"
        )
    return folder
