"""Targeted syntactic evaluation of one checkpoint on the minimal-pair suites (docs/behaviour.md):
does the model prefer the grammatical sentence of each pair (Linzen et al. 2016; Marvin & Linzen
2018; Warstadt et al. 2020), and by how much more than its floors?

`score_pairs_model(path, out_dir, config)` scores every suite with each scorer of the model's kind
(`probes.sentence_scores.scorers_for`; an encoder whose MLM head was not trained, an imported
sentence encoder or an ELECTRA discriminator, keeps only the scorers that read no LM head; the
config's `scorers` keeps a subset of them) and writes two tidy tables:

- `minimal_pairs`: model, suite, phenomenon, condition ("all" = the phenomenon's pooled items),
  variant, scorer, metric ("accuracy"), value, ci_low, ci_high (percentile bootstrap over items),
  n_items, seed. The floors are rows with scorer `floor:chance` (0.5; the interval is the 2.5-97.5 %
  range of a fair coin's accuracy over the same n items), `floor:frequency` (choose the form more
  frequent in the pretraining corpus), `floor:bigram` (`probes.ngram.BigramLM` on the pretraining
  corpus, in the model's own tokens) and `floor:random_init:<scorer>` (the same architecture,
  freshly initialised under `plmodels.checkpoint.floor_seed(seed, t)`: seed t + `seed` for a checkpoint
  pretrained under seed t, `seed` when t is unknown, scored the same way). A scorer that leaves pairs unscored (below)
  also gets the chance, frequency and bigram floors on exactly the items it scored, as rows
  `floor:<floor>:<scorer>` (`floor:chance:masked_word`); the pooled `floor:<floor>` rows stand on every
  item and are the floors of the scorers that score every item.
- `minimal_pair_items`: model, id, suite, phenomenon, condition, variant, scorer, good, bad (the two
  scores), correct (1, 0, or 0.5 for a tie: a model that cannot tell the sentences apart sits at
  chance); the zoo's multi-bootstrap over seeds x items reads it (`workbench.analyses.zoo`).

A pair is won when s(good) > s(bad). Pairs a scorer does not apply to (the masked-word comparison
of a multi-piece contrast) are left out of its rows (n_items says how many count). Items are
sampled per (suite, phenomenon, condition) with `max_pairs_per_condition`, the same items for the
original and the nonce variant. Scores are cached per (checkpoint hash, suite version, scorer,
sampled items, seed) under `out_dir/cache/minimal_pairs/`, beside the built suites; the random-init
floor's by what it is built from (`random_init_key`: kind, config, the seed drawn, tokenizer), so the
checkpoints of one run (one architecture, tokenizer and pretraining seed) share it. The scorers not in
the cache are computed together (`probes.sentence_scores.score_pairs_together`: an encoder's masked-LM
scorers share the forwards their look-ups have in common), once for the model and once for its
random-init copy; the run record times each of the two and names the seed the copy was drawn under.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as _st

import plmodels
from plmodels.checkpoint import floor_seed, random_init_model, read_card, training_seed
from plmodels.config import Config
from plmodels.files import atomic_open
from plmodels.progress import progress as progress_bar
from plmodels.training.config import resolve_path
from plmodels.training.corpus import iter_texts
from probes.ngram import BigramLM
from probes.sentence_scores import BATCH_TOKENS, SCORERS, score_pairs_together, scorers_for
from probes.stats import bootstrap_ci
from workbench.analyses.probing import default_model_name
from workbench.core.io import atomic_write_json
from workbench.core.results import write_tables
from workbench.data.minimal_pairs import SUITE_VERSION, PairRecord, cached_suites

COLUMNS = ["model", "suite", "phenomenon", "condition", "variant", "scorer", "metric", "value", "ci_low", "ci_high",
           "n_items", "seed"]
ITEM_COLUMNS = ["model", "id", "suite", "phenomenon", "condition", "variant", "scorer", "good", "bad", "correct"]
FLOORS = ("chance", "frequency", "bigram", "random_init")
CORPUS_FLOORS = ("chance", "frequency", "bigram")   # score no model: pooled, and per subset scorer
WORD = re.compile(r"\w+|[^\w\s]")
# Pre-tokenizers under which a newline between two non-space characters is a token boundary of its own
# (byte-level BPE without a prefix space: the newline is one pre-token; BERT's: whitespace splits), so
# a long document cut right after such a newline encodes to the same ids as whole
# (tests/workbench/analyses/test_minimal_pairs.py). Any other tokenizer encodes each document whole.
CUT_SAFE = ("ByteLevel", "BertPreTokenizer", "Whitespace", "WhitespaceSplit")
CUT = re.compile(r"(?<=\S\n)(?=\S)")
CHUNK_CHARS = 1 << 16   # a long document is encoded in pieces of about this many characters, in one batch


@dataclass(frozen=True)
class PairsRunConfig(Config):
    """A minimal-pairs run (defaults: what configs would hold)."""

    suites: tuple[str, ...] = ("ud", "templates")  # which suites to score
    # which of the model kind's scorers to run (probes.sentence_scores.SCORERS names; None: every one that
    # applies); a name that does not apply to a model's kind is passed over for that model
    scorers: tuple[str, ...] | None = None
    max_pairs_per_condition: int = 200  # items per (suite, phenomenon, condition), seeded sample
    n_per_template: int = 300  # distinct pairs drawn per template
    floors: tuple[str, ...] = FLOORS  # chance | frequency | bigram | random_init
    corpus: str | None = None  # corpus for the frequency and bigram floors (None: the card's train source)
    corpus_split: str | None = None  # its split (None: the card's train split)
    corpus_chars: int = 20_000_000  # the floors count the first this many characters of the corpus
    batch_tokens: int = BATCH_TOKENS  # tokens per forward
    n_boot: int = 1000  # bootstrap resamples over items
    seed: int = 0  # item sample, nonce words, templates, bootstrap, the random-init model (+ pretraining seed)

    def __post_init__(self) -> None:
        bad = [f for f in self.floors if f not in FLOORS]
        if bad:
            raise ValueError(f"PairsRunConfig.floors: {bad} unknown; choose from {FLOORS}")
        if self.scorers is not None:
            object.__setattr__(self, "scorers", tuple(self.scorers))
            bad = [s for s in self.scorers if s not in SCORERS]
            if bad or not self.scorers:
                raise ValueError(f"PairsRunConfig.scorers: {bad or '[]'}; choose from {sorted(SCORERS)} (or null: all)")
        bad = [s for s in self.suites if s not in ("ud", "templates")]
        if bad or not self.suites:
            raise ValueError(f"PairsRunConfig.suites: {bad or '[]'}; choose from ('ud', 'templates')")
        for name in ("max_pairs_per_condition", "n_per_template", "corpus_chars", "batch_tokens", "n_boot"):
            if getattr(self, name) < 1:
                raise ValueError(f"PairsRunConfig.{name} must be >= 1, got {getattr(self, name)}")


def select_pairs(cfg: PairsRunConfig, cache_dir: str | Path | None = None) -> list[PairRecord]:
    """The scored items: per (suite, phenomenon, condition) at most max_pairs_per_condition base items
    (seeded), each with all its variants; the suites are kept in `cache_dir` when given."""
    records = cached_suites(cache_dir, cfg.seed, cfg.n_per_template)
    base = lambda r: r.id.removesuffix(":nonce")  # noqa: E731
    cells: dict[tuple, list[str]] = {}
    for r in records:
        if r.suite in cfg.suites:
            ids = cells.setdefault((r.suite, r.phenomenon, r.condition), [])
            if not ids or ids[-1] != base(r):
                ids.append(base(r))
    keep = set()
    for key, ids in sorted(cells.items()):
        ids = sorted(set(ids))
        keep.update(ids if len(ids) <= cfg.max_pairs_per_condition else
                    random.Random(f"{cfg.seed}:{key}").sample(ids, cfg.max_pairs_per_condition))
    return [r for r in records if r.suite in cfg.suites and base(r) in keep]


def correct(scores: np.ndarray) -> np.ndarray:
    """(N, 2) (good, bad) scores -> (N,) 1 when good wins, 0 when bad wins, 0.5 on a tie, NaN if unscored."""
    g, b = scores[:, 0], scores[:, 1]
    out = np.where(g > b, 1.0, np.where(g < b, 0.0, 0.5))
    return np.where(np.isfinite(g) & np.isfinite(b), out, np.nan)


def accuracy_rows(items: pd.DataFrame, pairs: list[PairRecord], model: str, cfg: PairsRunConfig) -> pd.DataFrame:
    """The tidy accuracy rows of an items table (one scorer or floor per `scorer`), per condition and
    pooled per phenomenon ("all"), each with a bootstrap interval over items; a subset scorer's corpus
    floors also on its own items (`subset_floor_items`)."""
    meta = pd.DataFrame([(r.id, r.suite, r.phenomenon, r.condition, r.variant) for r in pairs],
                        columns=["id", "suite", "phenomenon", "condition", "variant"])
    df = items[["model", "id", "scorer", "good", "bad", "correct"]].merge(meta, on="id").dropna(subset=["correct"])
    df = pd.concat([df, *subset_floor_items(df, items)], ignore_index=True)
    pooled = df.assign(condition="all")
    rows = []
    for keys, g in pd.concat([df, pooled]).groupby(["suite", "phenomenon", "condition", "variant", "scorer"]):
        x = g["correct"].to_numpy(float)
        if _pair_floor(keys[4]) == "chance":  # a fair coin over the same n items
            lo, hi = _st.binom.ppf([0.025, 0.975], len(x), 0.5) / len(x)
            value = 0.5
        else:
            value, lo, hi = bootstrap_ci(x, np.mean, n_boot=cfg.n_boot, seed=cfg.seed)
        rows.append((model, *keys[:4], keys[4], "accuracy", float(value), float(lo), float(hi), len(x), cfg.seed))
    return pd.DataFrame(rows, columns=COLUMNS)


def _pair_floor(scorer: str) -> str | None:
    """The floor a `scorer` label names ("chance" for "floor:chance" and "floor:chance:masked_word"), None
    for a model's scorer."""
    return scorer.split(":")[1] if scorer.startswith("floor:") else None


def subset_floor_items(df: pd.DataFrame, items: pd.DataFrame) -> list[pd.DataFrame]:
    """The chance, frequency and bigram floor items of `df` (scored items only) restricted to the items
    each subset scorer scored, relabelled "floor:<floor>:<scorer>": a subset scorer is a model scorer that
    left some pair of `items` unscored (masked_word on a multi-piece contrast), so its floors stand on
    exactly its items. The random-init floor is already scored by the scorer itself."""
    subset = [s for s, g in items.groupby("scorer") if _pair_floor(s) is None and g["correct"].isna().any()]
    corpus = df[df["scorer"].map(lambda s: _pair_floor(s) in CORPUS_FLOORS and s.count(":") == 1)]
    return [corpus[corpus["id"].isin(df.loc[df["scorer"] == s, "id"])].assign(scorer=corpus["scorer"] + ":" + s)
            for s in subset]


def _as_pairs(pairs: list[PairRecord]) -> list[tuple]:
    return [(r.good, r.bad, r.critical) for r in pairs]


def _items(model: str, pairs: list[PairRecord], scorer: str, scores: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"model": model, "id": [r.id for r in pairs], "suite": [r.suite for r in pairs],
                         "phenomenon": [r.phenomenon for r in pairs], "condition": [r.condition for r in pairs],
                         "variant": [r.variant for r in pairs], "scorer": scorer, "good": scores[:, 0],
                         "bad": scores[:, 1], "correct": correct(scores)}, columns=ITEM_COLUMNS)


def _path(cache: Path, key: str) -> Path:
    return cache / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npy"


def _load(cache: Path | None, key: str) -> np.ndarray | None:
    """The (N, 2) scores kept as cache/<hash of key>.npy, or None."""
    if cache is None or not _path(cache, key).is_file():
        return None
    return np.load(_path(cache, key))


def _save(cache: Path | None, key: str, scores: np.ndarray) -> None:
    """Keep the scores under the key (`plmodels.files.atomic_open`); nothing without a cache folder."""
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    with atomic_open(_path(cache, key), "wb") as f:
        np.save(f, scores)


def lm_head_trained(model_path: str | Path) -> bool:
    """False for an imported encoder whose MLM head was freshly initialised and for an objective whose
    analysed model's MLM head is never trained (ELECTRA's discriminator)."""
    return read_card(model_path).lm_head_trained


def corpus_of(model_path: str | Path, cfg: PairsRunConfig) -> tuple[Path, str | None]:
    """The pretraining corpus of a checkpoint (its card's data.train) unless the config names one."""
    if cfg.corpus is not None:
        return resolve_path(cfg.corpus, "${WORKBENCH_DATA}"), cfg.corpus_split
    card = read_card(model_path)
    train = (card.train_source, card.train_split) if card.train_source else None
    if not train:
        raise ValueError(f"{Path(model_path) / 'card'}: no data.train in the card to count the frequency and bigram floors on; "
                         "set corpus=<folder> (--set corpus=gutenberg_pd)")
    return resolve_path(train[0], "${WORKBENCH_DATA}"), cfg.corpus_split or train[1]


def corpus_counts(source: Path, split: str | None, tok, max_chars: int) -> tuple[Counter, np.ndarray]:
    """(word-form counts, token id stream) of the first max_chars characters of a corpus: words by a
    \\w+ | punctuation split (lower-cased when the tokenizer lower-cases), ids by the tokenizer, each
    document followed by its separator id (`doc_sep_id`), as the pretraining corpus cache."""
    words, ids, n = Counter(), [], 0
    for text in iter_texts(source, split):
        text = text[: max_chars - n]
        n += len(text)
        words.update(WORD.findall(text.lower() if tok.lowercase else text))
        ids.extend(encode_long(tok, text))
        ids.append(tok.doc_sep_id)
        if n >= max_chars:
            break
    return words, np.asarray(ids, dtype=np.int64)


def encode_long(tok, text: str, chunk_chars: int = CHUNK_CHARS) -> list[int]:
    """`tok.encode(text, add_special=False)`, the same ids, faster on a long text: cut after newlines
    between non-space characters into pieces of about chunk_chars, encoded in one multi-threaded batch
    (a 2M-character book: 2.7x less CPU time). Only for the CUT_SAFE pre-tokenizers; else whole."""
    pre = tok.hf.pre_tokenizer
    if (len(text) <= chunk_chars or type(pre).__name__ not in CUT_SAFE or getattr(pre, "add_prefix_space", False)
            or not getattr(pre, "use_regex", True)):
        return tok.encode(text, add_special=False)
    pieces, start = [], 0
    for m in CUT.finditer(text, chunk_chars):
        if m.start() - start >= chunk_chars:
            pieces.append(text[start:m.start()])
            start = m.start()
    pieces.append(text[start:])
    return [i for piece in tok.encode_batch(pieces, add_special=False) for i in piece]


def frequency_scores(pairs: list[PairRecord], words: Counter, lowercase: bool) -> np.ndarray:
    """(N, 2): the corpus counts of the good and the bad form of the critical word."""
    f = (lambda w: w.lower()) if lowercase else (lambda w: w)
    return np.array([[words[f(r.good_word)], words[f(r.bad_word)]] for r in pairs], dtype=float).reshape(-1, 2)


def bigram_scores(pairs: list[PairRecord], lm: BigramLM, tok) -> np.ndarray:
    """(N, 2): the bigram LM's log-probability of each sentence's body, the separator as context."""
    def one(words):
        e = tok.encode_words(list(words))
        s, t = e.word_spans[0][0], e.word_spans[-1][1]
        return float(lm.logprob([tok.doc_sep_id] + list(e.ids[s:t])).sum())
    return np.array([[one(r.good), one(r.bad)] for r in pairs]).reshape(-1, 2)


def score_pairs_model(model_path: str | Path, out_dir: str | Path | None = None,
                      config: PairsRunConfig | Mapping | str | Path | None = None, model_name: str | None = None,
                      progress: bool = True, cache_dir: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """Score every suite on one checkpoint -> {"minimal_pairs", "minimal_pair_items"} (module
    docstring); with out_dir, the tables are upserted into out_dir/tables and the run's config and
    timings go to out_dir/minimal_pairs_run.json. `cache_dir` (default out_dir/cache/minimal_pairs)
    holds the built suites and the scores: a study's models share one (`workbench run`)."""
    cfg = PairsRunConfig.resolve(config)
    model, tok = plmodels.load(model_path)
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; minimal pairs need one")
    name = model_name or default_model_name(model_path)
    scorers = scorers_for(model, tok, lm_head_trained=lm_head_trained(model_path))
    if not scorers:
        raise ValueError(f"{model_path}: no minimal-pair scorer applies (its LM head is untrained and it has "
                         "no replaced-token-detection head)")
    if cfg.scorers is not None:
        chosen = [s for s in scorers if s.name in cfg.scorers]
        if not chosen:
            raise ValueError(f"{model_path}: none of scorers={list(cfg.scorers)} applies to this {model.kind}; "
                             f"its scorers are {[s.name for s in scorers]}")
        scorers = chosen
    cache = (Path(cache_dir) if cache_dir is not None else
             None if out_dir is None else Path(out_dir) / "cache" / "minimal_pairs")
    pairs = select_pairs(cfg, cache)
    too_long = [r.id for r in pairs if len(tok.encode_words(list(r.good)).ids) + 4 > _max_positions(model)]
    pairs = [r for r in pairs if r.id not in set(too_long)]
    ckpt = plmodels.checkpoint_hash(model_path)
    # the random-init floor reads no trained weight: keyed by what it is built from (its seed: the analysis
    # seed offset by the pretraining seed, `floor_seed`), so the checkpoints of one run score it once
    fresh_seed = floor_seed(cfg.seed, training_seed(model_path))
    init = "init:" + random_init_key(model, Path(model_path) / "tokenizer", fresh_seed)
    item_key = hashlib.sha256("\n".join(r.id for r in pairs).encode()).hexdigest()[:16]
    frames, seconds, cpu = [], {}, {}
    copies = [("model", model)] + ([("random_init", random_init_model(model, fresh_seed))]
                                   if "random_init" in cfg.floors else [])
    with progress_bar(len(copies) * len(scorers), f"minimal pairs {name}", "scorer", disable=not progress) as bar:
        for which, m in copies:
            t0, c0 = time.perf_counter(), time.process_time()
            label = {s.name: s.name if which == "model" else f"floor:random_init:{s.name}" for s in scorers}
            key = {n: f"{ckpt if which == 'model' else init}:{SUITE_VERSION}:{label[n]}:{item_key}:{cfg.seed}"
                   for n in label}
            scores = {n: _load(cache, key[n]) for n in label}
            todo = [s for s in scorers if scores[s.name] is None]
            if todo:  # the scorers not cached, together: the masked-LM ones share their forwards
                with torch.inference_mode():
                    fresh = score_pairs_together(m, tok, _as_pairs(pairs), todo, cfg.batch_tokens)
                for n, arr in fresh.items():
                    _save(cache, key[n], arr)
                    scores[n] = arr
            frames += [_items(name, pairs, label[s.name], scores[s.name]) for s in scorers]
            part = ("" if which == "model" else "floor:random_init:") + ("+".join(s.name for s in todo) or "cached")
            seconds[part] = round(time.perf_counter() - t0, 1)
            cpu[part] = round(time.process_time() - c0, 1)  # CPU seconds, all threads: wall time on a shared machine
            bar.update(len(scorers))
    frames += _corpus_floors(model_path, pairs, tok, cfg, name, seconds)
    items = pd.concat(frames, ignore_index=True)
    table = accuracy_rows(items, pairs, name, cfg)
    tables = {"minimal_pairs": table, "minimal_pair_items": items}
    if out_dir is not None:
        write_tables(out_dir, tables)
        atomic_write_json(Path(out_dir) / "minimal_pairs_run.json",
                          {"config": cfg.to_dict(), "suite_version": SUITE_VERSION, "model": name,
                           "checkpoint_hash": ckpt, "random_init_seed": fresh_seed, "n_pairs": len(pairs),
                           "skipped_too_long": len(too_long),
                           "seconds": seconds, "cpu_seconds": cpu})
    return tables


def random_init_key(model, tokenizer_dir: Path, seed: int) -> str:
    """What `random_init_model(model, seed)`'s scores depend on: the kind, the model config, the seed and
    the tokenizer's files (not the trained weights), hashed."""
    h = hashlib.sha256(json.dumps({"kind": model.kind, "config": model.config.to_dict(), "seed": seed},
                                  sort_keys=True, default=str).encode())
    for f in sorted(p for p in tokenizer_dir.rglob("*") if p.is_file()):
        h.update(f.relative_to(tokenizer_dir).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:20]


def _max_positions(model) -> int:
    return int(getattr(model.config, "max_positions", 1 << 30))


def _corpus_floors(model_path, pairs, tok, cfg, name, seconds) -> list[pd.DataFrame]:
    """Items of the chance, frequency and bigram floors asked for in cfg.floors."""
    out = []
    if "chance" in cfg.floors:
        out.append(_items(name, pairs, "floor:chance", np.zeros((len(pairs), 2))))
    if not {"frequency", "bigram"} & set(cfg.floors):
        return out
    t0 = time.perf_counter()
    source, split = corpus_of(model_path, cfg)
    words, ids = corpus_counts(source, split, tok, cfg.corpus_chars)
    if "frequency" in cfg.floors:
        out.append(_items(name, pairs, "floor:frequency", frequency_scores(pairs, words, tok.lowercase)))
    if "bigram" in cfg.floors:
        out.append(_items(name, pairs, "floor:bigram", bigram_scores(pairs, BigramLM(tok.vocab_size).fit(ids), tok)))
    seconds["corpus_floors"] = round(time.perf_counter() - t0, 1)
    return out

