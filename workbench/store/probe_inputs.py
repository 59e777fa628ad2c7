"""Probe inputs: a task's targets as global word rows of its activation store.

What the probes read (docs/design.md "Probe inputs"): the store's per-layer (N_words, D) arrays,
and per target its span(s) as *global* word rows (end exclusive) with its label, in the layout of
the edge probing tasks of Tenney et al. 2019. Targets touching a word that truncation dropped are
skipped and counted. `extract_task` is `extract` on the records' sentences followed by this.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from workbench.store.extraction import extract
from workbench.store.store import Store


@dataclass
class TaskArrays:
    """What the probes need for one task split (docs/design.md "Probe inputs").

    store: the activation store of the records' sentences (sentence s = record s).
    span1 / span2: (N_targets, 2) int64 *global* word rows (sent_offsets[s] + word index), end
    exclusive; span2 is None for single-span tasks. labels: (N_targets,) str.
    sent_index: (N_targets,) record/sentence index of each target.
    n_skipped: targets dropped because a span touches a word removed by truncation.
    """

    store: Store
    span1: np.ndarray
    span2: np.ndarray | None
    labels: np.ndarray
    sent_index: np.ndarray
    n_skipped: int


def task_arrays(store: Store, task_records: Sequence[dict]) -> TaskArrays:
    """Map the records' targets to global word rows of `store` (built from these records' words)."""
    if len(task_records) != store.n_sentences:
        raise ValueError(f"{len(task_records)} records but the store has {store.n_sentences} sentences")
    kept = store.n_kept()
    has2 = None
    s1, s2, labels, sents, skipped = [], [], [], [], 0
    for r, rec in enumerate(task_records):
        n = len(rec["words"])
        for t, tgt in enumerate(rec["targets"]):
            spans = [tgt["span1"]] + ([tgt["span2"]] if "span2" in tgt else [])
            if has2 is None:
                has2 = len(spans) == 2
            elif has2 != (len(spans) == 2):
                raise ValueError(f"record {rec.get('id', r)!r} target {t}: span2 present in some targets only")
            for a, b in spans:
                if not 0 <= a < b <= n:
                    raise ValueError(f"record {rec.get('id', r)!r} target {t}: span [{a}, {b}) outside 0..{n}")
            if max(b for _, b in spans) > kept[r]:
                skipped += 1
                continue
            off = int(store.sent_offsets[r])
            s1.append((off + spans[0][0], off + spans[0][1]))
            if has2:
                s2.append((off + spans[1][0], off + spans[1][1]))
            labels.append(str(tgt["label"]))
            sents.append(r)
    return TaskArrays(
        store=store,
        span1=np.asarray(s1, dtype=np.int64).reshape(-1, 2),
        span2=np.asarray(s2, dtype=np.int64).reshape(-1, 2) if has2 else None,
        labels=np.asarray(labels, dtype=object).astype(str),
        sent_index=np.asarray(sents, dtype=np.int64),
        n_skipped=skipped,
    )


def extract_task(model, tokenizer, task_records: Sequence[dict], store_root: str | os.PathLike,
                 **kwargs) -> TaskArrays:
    """`extract` on the records' sentences (one per record), then `task_arrays`. kwargs go to extract."""
    for r, rec in enumerate(task_records):
        if "words" not in rec or "targets" not in rec:
            raise ValueError(f"record {r} ({rec.get('id', '?')!r}) lacks 'words' or 'targets'")
    store = extract(model, tokenizer, [rec["words"] for rec in task_records], store_root, **kwargs)
    return task_arrays(store, task_records)
