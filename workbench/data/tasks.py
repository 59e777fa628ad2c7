"""Edge-probing tasks built from the shared corpora, in the record format of Tenney et al. (2019).

A record is `{"id", "words", "targets": [{"span1": [s, e], "span2": [s, e] (optional), "label"}]}`
(word indices, end exclusive; docs/design.md "Data records"). Tasks and the rules used to build them:

- `pos` (UD English EWT): one target per word, span1 = [i, i+1], label = UPOS.
- `deps` (EWT): one target per basic dependency arc, span1 = dependent, span2 = head, label = the
  full deprel (with subtypes, e.g. `nmod:poss`). Root arcs have no head word and are left out
  (counted as `root_arc`), so a sentence gives n_words - n_roots targets.
- `arcs` (EWT): dependency arc prediction (Hewitt & Liang 2019): one target per word, span1 = the
  word, span2 = its head word, the root attached to itself; label = the deprel, used only to leave
  punctuation (`punct`) out of the score. Probed by `probes.arcs` (which word of the sentence is
  the head?), not by the edge probe's classifier.
- `const` (GUM `const/*.ptb`, line i = sentence i of the GUM CoNLL-U): Tenney's constituent
  labelling, one target per non-terminal node, label = the node label without function tags
  (NP-SBJ -> NP). Preterminals (POS tags) are not targets. The artificial wrapper (ROOT) is left out
  (`const_root`). In a unary chain several nodes share one span (S -> VP, NP -> NP); a single-label
  probe cannot learn two labels for one span, so only the topmost node of each span is kept and the
  others are counted (`const_unary_inner`). Trees whose leaves do not spell their CoNLL-U sentence
  are skipped and counted (`const_leaf_mismatch`).
- `ner` (UNER v1 on EWT, PER/ORG/LOC): UNER has no train file, so UNER *dev* is split by document:
  the document of a sentence is its sent_id without the final `-NNNN` number, and a document goes to
  train when `int(sha256(doc)[:8], 16) % 100 < 80` (about 80 %), else to dev; test = UNER test.
  Words come from EWT, joined by sent_id; a sentence whose UNER tokens differ from EWT is skipped
  (`ner_tokens_differ`, 3 per split in the data README).
- `entities` (GUM `Entity=`): one target per mention, label = entity type (10 types).
- `coref` (GUM): Tenney et al. label pairs of gold mentions as coreferent or not (OntoNotes). Here a
  record is a *document window*: the words of up to COREF_WINDOW = 3 consecutive sentences of one
  document (non-overlapping windows). Mentions of singleton entities (one mention in the whole
  document) are left out, as OntoNotes annotates no singletons (`coref_singleton_mention`). For
  each mention (span1) and each mention before it in the same window (span2, ordered by start, then
  longer first), the label is "1" if both belong to the same entity, else "0". Every positive pair
  is kept; negatives are sampled without replacement to at most COREF_NEG_RATIO (1.0) per positive
  in the window, with `random.Random(f"{seed}:{record id}")` (seed 0), so classes are balanced and
  the sample does not depend on build order. Unsampled negatives are counted
  (`coref_negative_unsampled`); pairs across windows are never formed.

Records with no targets are left out and counted (`no_targets`). Every skip is returned in a Skips
counter, logged, and written to `stats.parquet` by `build_all_tasks`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from workbench.core.io import atomic_file
from workbench.core.paths import dataset_dir
from workbench.data.readers import (
    NerSentence,
    Sentence,
    Skips,
    Tree,
    ptb_leaf_matches,
    read_conllu,
    read_iob2,
    read_ptb,
)

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
COREF_WINDOW = 3          # sentences per coref record
COREF_NEG_RATIO = 1.0     # sampled negatives per positive pair, per window
COREF_SEED = 0
NER_TRAIN_PERCENT = 80    # share of UNER dev documents that become the ner train split
BUILD_VERSION = "1"       # bump when a builder's output changes: invalidates build_all_tasks caches


# ------------------------------------------------------------------------------ record builders
def pos_records(sentences: Iterable[Sentence], skips: Skips) -> list[dict]:
    """POS: span1 = [i, i+1], label = UPOS, for every syntactic word."""
    out = [{"id": s.sent_id, "words": list(s.words),
            "targets": [{"span1": [i, i + 1], "label": u} for i, u in enumerate(s.upos)]}
           for s in sentences]
    return _drop_empty(out, skips)


def deps_records(sentences: Iterable[Sentence], skips: Skips) -> list[dict]:
    """Dependency labelling: span1 = dependent [i, i+1], span2 = head [h-1, h], label = deprel."""
    out = []
    for s in sentences:
        targets = []
        for i, (h, rel) in enumerate(zip(s.heads, s.deprels)):
            if h == 0:
                skips["root_arc"] += 1
                continue
            targets.append({"span1": [i, i + 1], "span2": [h - 1, h], "label": rel})
        out.append({"id": s.sent_id, "words": list(s.words), "targets": targets})
    return _drop_empty(out, skips)


def arcs_records(sentences: Iterable[Sentence], skips: Skips) -> list[dict]:
    """Dependency arcs (head attachment): span1 = every word [i, i+1], span2 = its head [h-1, h], the
    root attached to itself [i, i+1] (Hewitt & Liang 2019); label = deprel (`punct` marks the words
    left out of the score)."""
    out = [{"id": s.sent_id, "words": list(s.words),
            "targets": [{"span1": [i, i + 1], "span2": [h - 1, h] if h > 0 else [i, i + 1], "label": rel}
                        for i, (h, rel) in enumerate(zip(s.heads, s.deprels))]}
           for s in sentences]
    return _drop_empty(out, skips)


def const_records(sentences: list[Sentence], trees: list[Tree], skips: Skips,
                  source: str = "<trees>") -> list[dict]:
    """Constituent labelling over aligned (sentence i, tree i) pairs; see the module docstring."""
    if len(sentences) != len(trees):
        raise ValueError(f"{source}: {len(trees)} trees for {len(sentences)} sentences; "
                         "line i must be sentence i")
    out = []
    for s, t in zip(sentences, trees):
        if len(t.leaves) != len(s.words) or not all(map(ptb_leaf_matches, t.leaves, s.words)):
            skips["const_leaf_mismatch"] += 1
            log.warning("%s:%d: tree leaves do not spell sentence %s; skipped", source, t.line, s.sent_id)
            continue
        seen: set[tuple[int, int]] = set()
        targets = []
        for c in t.constituents:         # pre-order: the topmost node of a span comes first
            if c.depth == 0 and c.label in ("ROOT", "TOP", ""):
                skips["const_root"] += 1
            elif (c.start, c.end) in seen:
                skips["const_unary_inner"] += 1
            else:
                seen.add((c.start, c.end))
                targets.append({"span1": [c.start, c.end], "label": c.label})
        out.append({"id": s.sent_id, "words": list(s.words), "targets": targets})
    return _drop_empty(out, skips)


def ner_document(sent_id: str) -> str:
    """EWT document of a sent_id: the id without its final `-NNNN` sentence number."""
    doc, sep, num = sent_id.rpartition("-")
    return doc if sep and num.isdigit() else sent_id


def ner_in_train(sent_id: str) -> bool:
    """Deterministic document split of UNER dev: about NER_TRAIN_PERCENT % of documents -> train."""
    digest = hashlib.sha256(ner_document(sent_id).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % 100 < NER_TRAIN_PERCENT


def ner_records(ner: Iterable[NerSentence], ewt: Iterable[Sentence], skips: Skips) -> list[dict]:
    """NER spans (PER/ORG/LOC) on EWT words, joined by sent_id; tokenisation mismatches skipped."""
    by_id = {s.sent_id: s for s in ewt}
    out = []
    for n in ner:
        s = by_id.get(n.sent_id)
        if s is None:
            skips["ner_sent_id_not_in_ewt"] += 1
            continue
        if s.words != n.words:
            skips["ner_tokens_differ"] += 1
            continue
        out.append({"id": s.sent_id, "words": list(s.words),
                    "targets": [{"span1": [a, b], "label": lab} for lab, a, b in n.spans]})
    return _drop_empty(out, skips)


def entity_records(sentences: Iterable[Sentence], skips: Skips) -> list[dict]:
    """Entity typing: one target per GUM mention, label = its entity type."""
    out = [{"id": s.sent_id, "words": list(s.words),
            "targets": [{"span1": [m.start, m.end], "label": m.etype} for m in s.mentions]}
           for s in sentences]
    return _drop_empty(out, skips)


def coref_records(sentences: list[Sentence], skips: Skips, window: int = COREF_WINDOW,
                  neg_ratio: float = COREF_NEG_RATIO, seed: int = COREF_SEED) -> list[dict]:
    """Coreference pairs in document windows of `window` sentences; see the module docstring."""
    docs: dict[str, list[Sentence]] = defaultdict(list)
    for s in sentences:
        docs[s.doc_id].append(s)
    out = []
    for doc_id, sents in docs.items():
        sizes = Counter(m.entity for s in sents for m in s.mentions)
        for w0 in range(0, len(sents), window):
            chunk = sents[w0:w0 + window]
            words: list[str] = []
            mentions = []                          # (start, end, entity) in window word indices
            for s in chunk:
                for m in s.mentions:
                    if sizes[m.entity] < 2:
                        skips["coref_singleton_mention"] += 1
                    else:
                        mentions.append((len(words) + m.start, len(words) + m.end, m.entity))
                words.extend(s.words)
            mentions.sort(key=lambda m: (m[0], -m[1]))
            rid = f"{doc_id}:{w0 // window}"
            out.append({"id": rid, "words": words,
                        "targets": _coref_pairs(mentions, skips, neg_ratio, f"{seed}:{rid}")})
    return _drop_empty(out, skips)


def _coref_pairs(mentions: list[tuple[int, int, str]], skips: Skips, neg_ratio: float,
                 seed: str) -> list[dict]:
    pos, neg = [], []
    for j, (s2, e2, ent2) in enumerate(mentions):
        for s1, e1, ent1 in mentions[:j]:
            if (s1, e1) == (s2, e2):
                skips["coref_same_span"] += 1
                continue
            t = {"span1": [s2, e2], "span2": [s1, e1], "label": "1" if ent1 == ent2 else "0"}
            (pos if ent1 == ent2 else neg).append(t)
    k = min(len(neg), int(round(neg_ratio * len(pos))))
    skips["coref_negative_unsampled"] += len(neg) - k
    keep = sorted(random.Random(seed).sample(range(len(neg)), k))
    targets = pos + [neg[i] for i in keep]
    return sorted(targets, key=lambda t: (t["span1"], t["span2"]))


def _drop_empty(records: list[dict], skips: Skips) -> list[dict]:
    kept = [r for r in records if r["targets"]]
    skips["no_targets"] += len(records) - len(kept)
    return kept


# ------------------------------------------------------------------------------ corpus files
@functools.lru_cache(maxsize=6)
def _conllu_cached(path: Path, mtime_ns: int, size: int) -> tuple[Sentence, ...]:
    return tuple(read_conllu(path))


def _conllu(path: Path) -> list[Sentence]:
    """read_conllu, memoised on (path, mtime, size): pos and deps (or entities, coref and const)
    read the same file, and the records are built from frozen sentences, so sharing is safe."""
    st = path.stat()
    return list(_conllu_cached(path, st.st_mtime_ns, st.st_size))


def _ewt(split: str) -> Path:
    return dataset_dir("ud_english_ewt") / f"en_ewt-ud-{split}.conllu"


def _gum(split: str) -> Path:
    return dataset_dir("ud_english_gum") / f"en_gum-ud-{split}.conllu"


def _gum_ptb(split: str) -> Path:
    return dataset_dir("ud_english_gum") / "const" / f"{split}.ptb"


def _uner(split: str) -> Path:
    return dataset_dir("uner_english_ewt") / f"en_ewt-ud-{'test' if split == 'test' else 'dev'}.iob2"


def _ewt_for_ner(split: str) -> Path:
    return _ewt("test" if split == "test" else "dev")


def _build_ner(split: str, skips: Skips) -> list[dict]:
    ner, _ = read_iob2(_uner(split), skip_invalid=True)
    if split != "test":
        ner = [n for n in ner if ner_in_train(n.sent_id) == (split == "train")]
    skips["invalid_iob2_span"] += sum(n.invalid_spans for n in ner)
    return ner_records(ner, _conllu(_ewt_for_ner(split)), skips)


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: its builder `(split, skips) -> records` and its input files per split."""

    build: Callable[[str, Skips], list[dict]]
    inputs: Callable[[str], list[Path]]
    source: str


TASKS: dict[str, TaskSpec] = {
    "pos": TaskSpec(lambda sp, sk: pos_records(_conllu(_ewt(sp)), sk),
                    lambda sp: [_ewt(sp)], "UD English EWT"),
    "deps": TaskSpec(lambda sp, sk: deps_records(_conllu(_ewt(sp)), sk),
                     lambda sp: [_ewt(sp)], "UD English EWT"),
    "arcs": TaskSpec(lambda sp, sk: arcs_records(_conllu(_ewt(sp)), sk),
                     lambda sp: [_ewt(sp)], "UD English EWT"),
    "const": TaskSpec(lambda sp, sk: const_records(_conllu(_gum(sp)), read_ptb(_gum_ptb(sp)), sk,
                                                   str(_gum_ptb(sp))),
                      lambda sp: [_gum(sp), _gum_ptb(sp)], "GUM const/*.ptb"),
    "ner": TaskSpec(_build_ner, lambda sp: [_uner(sp), _ewt_for_ner(sp)], "UNER English EWT"),
    "entities": TaskSpec(lambda sp, sk: entity_records(_conllu(_gum(sp)), sk),
                         lambda sp: [_gum(sp)], "GUM Entity="),
    "coref": TaskSpec(lambda sp, sk: coref_records(_conllu(_gum(sp)), sk),
                      lambda sp: [_gum(sp)], "GUM Entity="),
}


def _spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {list(SPLITS)}")


def build_task_with_skips(name: str, split: str) -> tuple[list[dict], Skips]:
    """Records of one task split from the shared data, with the counts of everything left out."""
    _check_split(split)
    skips = Skips()
    records = _spec(name).build(split, skips)
    log.info("task %s/%s: %d records, skipped %s", name, split, len(records), skips.as_dict())
    return records, skips


def build_task(name: str, split: str) -> list[dict]:
    """Records of one task split (skips are logged; use build_task_with_skips to get them)."""
    return build_task_with_skips(name, split)[0]


# ------------------------------------------------------------------------------ stats and cache
def split_stats(name: str, split: str, records: list[dict], skips: Skips) -> dict:
    """One stats row: records, words, targets, number of labels, label counts and skips as JSON."""
    labels = Counter(t["label"] for r in records for t in r["targets"])
    return {"task": name, "split": split, "records": len(records),
            "words": sum(len(r["words"]) for r in records), "targets": sum(labels.values()),
            "n_labels": len(labels), "label_counts": json.dumps(dict(sorted(labels.items()))),
            "skips": json.dumps(skips.as_dict())}


def task_stats(name: str, out_dir: str | Path | None = None) -> pd.DataFrame:
    """Per-split stats of a task: from `out_dir/stats.parquet` when built there, else computed."""
    _spec(name)
    if out_dir is not None and (Path(out_dir) / "stats.parquet").is_file():
        df = pd.read_parquet(Path(out_dir) / "stats.parquet")
        if (df["task"] == name).any():
            return df[df["task"] == name].reset_index(drop=True)
    rows = [split_stats(name, sp, *build_task_with_skips(name, sp)) for sp in SPLITS]
    return pd.DataFrame(rows)


def _sha256(path: Path, cache: dict[Path, str]) -> str:
    if path not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        cache[path] = h.hexdigest()
    return cache[path]


def _task_key(name: str, hashes: dict[Path, str]) -> str:
    spec = _spec(name)
    files = sorted({p for sp in SPLITS for p in spec.inputs(sp)})
    params = [BUILD_VERSION, name, COREF_WINDOW, COREF_NEG_RATIO, COREF_SEED, NER_TRAIN_PERCENT]
    payload = json.dumps([params, [[p.name, _sha256(p, hashes)] for p in files]])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _write_atomic(path: Path, write: Callable[[object], None], mode: str = "w") -> None:
    """`write(fh)` into a temporary sibling of `path`, renamed over it when `write` returns
    (`workbench.core.io.atomic_file`): an exception mid-write leaves the old file and no temporary."""
    with atomic_file(path, mode) as fh:
        write(fh)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    _write_atomic(path, lambda fh: fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def build_all_tasks(out_dir: str | Path, tasks: Iterable[str] | None = None,
                    force: bool = False) -> pd.DataFrame:
    """Write `out_dir/{task}/{split}.jsonl` and `out_dir/stats.parquet`; returns the stats table.

    A task is rebuilt only when its key (sha256 of the input files' checksums, the build
    parameters and BUILD_VERSION, kept in `out_dir/manifest.json`) changed, a file is missing, or
    `force`. Every file is written atomically (`workbench.core.io.atomic_file`).
    """
    out = Path(out_dir)
    names = list(TASKS) if tasks is None else list(tasks)
    for n in names:
        _spec(n)
    manifest_path, stats_path = out / "manifest.json", out / "stats.parquet"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    old = pd.read_parquet(stats_path) if stats_path.is_file() else pd.DataFrame(columns=["task"])
    hashes: dict[Path, str] = {}
    frames, built = {}, {}
    for name in names:
        key = _task_key(name, hashes)
        cached = old[old["task"] == name]
        complete = all((out / name / f"{sp}.jsonl").is_file() for sp in SPLITS) and len(cached) == len(SPLITS)
        if not force and manifest.get(name) == key and complete:
            log.info("task %s: cached in %s", name, out)
            frames[name] = cached
            continue
        # every split of every task is read before anything is written: a malformed data file is one
        # error naming its line, with no half-built task folder left behind
        built[name] = key, {sp: build_task_with_skips(name, sp) for sp in SPLITS}
    for name, (key, splits) in built.items():
        rows = []
        for sp, (records, skips) in splits.items():
            _write_jsonl(out / name / f"{sp}.jsonl", records)
            rows.append(split_stats(name, sp, records, skips))
        frames[name] = pd.DataFrame(rows)
        manifest[name] = key
        _write_atomic(manifest_path, lambda fh: json.dump(manifest, fh, indent=1, sort_keys=True))
    kept = old[~old["task"].isin(names)] if len(old) else old
    ordered = [frames[n] for n in names]   # the tasks in the order asked, cached or built
    stats = pd.concat([kept, *ordered], ignore_index=True) if len(kept) else pd.concat(ordered, ignore_index=True)
    _write_atomic(stats_path, lambda fh: stats.to_parquet(fh, index=False), mode="wb")
    _conllu_cached.cache_clear()
    return stats


def load_task(name: str, split: str, out_dir: str | Path | None = None,
              limit: int | None = None) -> list[dict]:
    """Records of a task split: read from `out_dir/{name}/{split}.jsonl` (written by
    build_all_tasks) when `out_dir` is given, else built from the shared data. `limit` keeps the
    first `limit` records."""
    _spec(name)
    _check_split(split)
    if out_dir is None:
        records = build_task(name, split)
        return records if limit is None else records[:limit]
    path = Path(out_dir) / name / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run workbench.data.tasks.build_all_tasks({str(out_dir)!r})")
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if limit is not None and len(records) >= limit:
                break
            records.append(json.loads(line))
    return records


# ------------------------------------------------------------------------------ head analysis
@dataclass(frozen=True)
class DepSentence:
    """A sentence for head analysis: heads are 0-based word indices, -1 for the root."""

    sent_id: str
    words: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    upos: tuple[str, ...]


UD_TREEBANKS: dict[str, Callable[[str], Path]] = {"ewt": _ewt, "gum": _gum}


def ud_sentences(treebank: str = "ewt", split: str = "train") -> list[DepSentence]:
    """Sentences of a UD treebank ("ewt" or "gum") with 0-based heads (-1 = root)."""
    if treebank not in UD_TREEBANKS:
        raise ValueError(f"unknown treebank {treebank!r}; known: {sorted(UD_TREEBANKS)}")
    _check_split(split)
    return [DepSentence(s.sent_id, s.words, tuple(h - 1 for h in s.heads), s.deprels, s.upos)
            for s in read_conllu(UD_TREEBANKS[treebank](split))]
