"""Finetuning from the workbench side: read SST-2 or UD POS through the data root, then hand the
examples to `plmodels.training.finetune.finetune` (plmodels never reads data sets itself; imports go
plmodels <- workbench).

    finetune(config, out_dir, overrides=None) -> Path   # what `workbench finetune` and the pipeline call
    load_task_data(task, max_train=None, max_dev=None) -> TaskData
"""

from __future__ import annotations

import warnings
from pathlib import Path

from plmodels.training.finetune import IGNORE_INDEX, TaskData, check_base, load_finetune_config
from plmodels.training.finetune import finetune as _finetune
from workbench.core.paths import dataset_dir
from workbench.data.readers import read_conllu, read_sst2


def _cap(xs: list, n: int | None) -> list:
    return xs if n is None else xs[:n]


def load_task_data(task: str, max_train: int | None = None, max_dev: int | None = None) -> TaskData:
    """SST-2 (GLUE TSV: text, 0/1) or UD-EWT UPOS (words, label index per word), train and dev.

    POS labels are the UPOS tags seen in train; a dev word whose tag train never shows is scored as
    ignored (IGNORE_INDEX), and how many there are is reported, never silently.
    """
    if task == "sst2":
        folder = dataset_dir("glue_sst2")
        tr, dv = (read_sst2(folder / f) for f in ("train.tsv", "dev.tsv"))
        return TaskData("sentence", ["negative", "positive"], _cap([(x.text, x.label) for x in tr], max_train),
                        _cap([(x.text, x.label) for x in dv], max_dev))
    if task != "pos":
        raise ValueError(f"finetuning task {task!r} is unknown; choose 'sst2' or 'pos'")
    folder = dataset_dir("ud_english_ewt")
    tr, dv = (read_conllu(folder / f"en_ewt-ud-{s}.conllu") for s in ("train", "dev"))
    labels = sorted({t for s in tr for t in s.upos})
    index = {t: i for i, t in enumerate(labels)}
    unseen = sum(t not in index for s in dv for t in s.upos)
    if unseen:
        warnings.warn(f"UD POS: {unseen} dev words carry a tag absent from train; they are not scored")

    def conv(sents):
        return [(list(s.words), [index.get(t, IGNORE_INDEX) for t in s.upos]) for s in sents if len(s)]
    return TaskData("token", labels, _cap(conv(tr), max_train), _cap(conv(dv), max_dev))


def finetune(config, out_dir: str | Path, overrides: dict | None = None) -> Path:
    """Load the config's task data and finetune (see plmodels.training.finetune); returns the checkpoint folder."""
    cfg = load_finetune_config(config, overrides)
    # before the data is read: a bad base is one line naming it and where it was set, at once
    check_base(cfg, "--set base" if "base" in (overrides or {}) else
               f"{config}: base" if isinstance(config, (str, Path)) else "base")
    data = load_task_data(cfg.task, cfg.max_train_examples, cfg.max_dev_examples)
    return _finetune(cfg, out_dir, data=data)
