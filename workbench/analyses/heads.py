"""Attention-head analysis of one checkpoint: the model calls and data plumbing around
`probes.heads` (Clark et al. 2019, "What Does BERT Look At?"; Voita et al. 2019, "Analyzing
Multi-Head Self-Attention"; Olsson et al. 2022, "In-context Learning and Induction Heads").

1. UD sentences (default EWT dev for the head scores and for *picking* the best head per relation,
   EWT test for *reporting* it) go through the activation store with word-level attention (the
   store's Clark-style subword -> word conversion). Sentences longer than the model's positions
   are left out before extraction and counted (`skipped["too_long:<split>"]`).
2. `probes.heads.HeadStats` streams the maps with each word's UD head, relation, UPOS and corpus
   frequency -> `heads` / `heads_classes`; `best_heads_per_relation(dev, test)` -> `relations`.
3. `probes.head_similarity`: mean Jensen-Shannon distance between heads on dev words -> metric MDS
   -> `head_similarity` (model, layer, head, x, y).
4. Decoders also get token-level previous-token and induction scores on repeated random token
   sequences (Olsson et al. 2022: a random sequence of T tokens, then the same T tokens again; an
   induction head at token i of the repeat attends to the token after i's earlier copy). These rows
   are named `previous_token:repeated_random` and `induction:repeated_random` in `heads`, and a head
   whose synthetic induction score reaches the `induction` threshold gets the role "induction".
5. Positional heads on tokens as well as on words: `token_positional_shares` adds rows
   ``positional_share:-1:tokens`` / ``:+1:tokens`` (Voita et al. 2019's unit: the share of tokens
   whose largest attention weight is on the token at that offset) to `heads`, and
   `positional_ceiling` records in heads_run.json what an ideal token-level -1 / +1 head scores on
   the word level on the same sentences. It is below 1 wherever the tokenizer splits words, so a
   word-level share compares with the 90% threshold only beside it.

Norm-weighted attention (Kobayashi et al. 2020, "Attention is Not Only a Weight"): with
`weightings=("raw", "norm")` every table is computed twice, once on the attention probabilities
alpha_ij and once on alpha_ij ||f_h(x_j)|| (the value vector times head h's slice of the output
projection), converted to words and renormalised per word row by the store
(`workbench.store.extraction.extract`, `attention_weighting`), and the tables carry a column
`weighting` ("raw" | "norm"). Token-level scores are weighted the same way (the argmax of
alpha_ij ||f_h(x_j)|| for the token positional shares; renormalised token rows for the synthetic
induction sequences); the positional ceiling is a property of the tokenizer and is computed once.
Tables written before the option have no `weighting` column: `probes.heads.weighting_rows` (imported
here too) reads them as "raw", and so do all readers of these tables.

Word frequencies for rare-token heads (Voita et al. 2019 use the training-corpus frequency):
`freq_source="auto"` counts the lower-cased tokens of the model's pretraining corpus when its card
names one that exists under the shared data folder (first `freq_max_chars` characters), else falls
back to the words of UD EWT train. "ewt:train", "gum:train" or a corpus folder "gutenberg_pd:train"
name a source explicitly. A corpus is cut into tokens the way the treebank is (`ud_tokens`: clitics
's n't 're split off, runs of one mark like ... or -- kept whole, initialisms like u.s. kept), so UD
words are looked up as they are counted. The source used, and the share of dev words it has no
count for (`frequency_unknown_share`), are recorded in heads_run.json.

Floors (`probes.heads`, "Floors"): beside every head score the `heads` table carries what heads with
no mechanism score on the same dev sentences — `floor_uniform` (a head uniform over the sentence's
tokens, converted to words as the store converts real maps: `probes.heads.null_heads` with each
word's subword count from the tokenizer), `floor_random_argmax` (the mean of `floor_draws` heads
whose argmax is random over the words) and `floor_random_init` (the largest score of the same
architecture's heads at random initialisation, drawn under `plmodels.checkpoint.floor_seed(seed, t)`:
seed t + `seed` for a checkpoint pretrained under seed t, `seed` when t is unknown, through the same
store) — their maximum
`floor`, and for the heads checked against it a bootstrap interval (ci_low, ci_high). A head gets a
role only if it beats its floor (`HeadStats.floor_check`). Decoders' synthetic induction role is
checked the same way against a uniform causal head and the random-initialisation model on the same
repeated random sequences.
"""
from __future__ import annotations

import functools
import re
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.components.norms import record_value_norms
from plmodels.config import Config, merge, read_json_object
from plmodels.progress import progress as progress_bar
from plmodels.progress import write
from plmodels.training.corpus import iter_texts
from probes.head_similarity import HeadSimilarity, mds_embedding
from plmodels.checkpoint import floor_seed, random_init_model, read_card, training_seed
from plmodels.families import family_of
from probes.heads import (WEIGHTING_COLUMN, HeadConfig, HeadStats, Sentence, best_heads_per_relation, combine_floors,
                          floor_scores, null_heads, weighting_rows)
from workbench.analyses.probing import default_model_name
from workbench.core.paths import data_root
from workbench.core.results import write_analysis_outputs
from workbench.data.tasks import UD_TREEBANKS, ud_sentences
from workbench.store import Store, extract, forward_layers, special_token_columns, word_attention_maps
from workbench.store.extraction import ATTENTION_WEIGHTINGS

SIMILARITY_COLUMNS = ["model", "layer", "head", "x", "y"]
HEAD_TABLES = ("heads", "heads_classes", "relations", "head_similarity")
# Treebank-style tokens of lower-cased text (UD EWT's tokenisation, which follows the PTB's): the
# alternatives are tried in order at each position.
_UD_TOKEN_RE = re.compile(r"""
    (?:[a-z]\.){2,}(?![a-z])          # initialisms keep their periods: u.s., e.g.
  | ([^\w\s'’])\1+                   # a run of one mark: ... -- !! ??
  | n['’]t(?!\w)                      # do|n't, ca|n't
  | ['’](?:s|re|ve|ll|d|m)(?!\w)      # clitics: 's 're 've 'll 'd 'm
  | \w+(?=n['’]t(?!\w))               # the host before n't
  | \w+(?:[.,:@&]\w+)*                # words and numbers: 1,000.5  10:30  alt.animals.cat
  | [^\w\s]                          # any other mark alone
""", re.X)


@dataclass(frozen=True)
class HeadRunConfig(Config):
    """A head-analysis run. Class thresholds are not here: they are `probes.heads.HeadConfig`, whose
    defaults are the canonical values (configs/heads.json is a copy of them); `heads_config` names a
    JSON file of thresholds to use instead."""

    heads_config: str | None = None           # thresholds file (None: HeadConfig's defaults)
    dev: str = "ewt:dev"                      # treebank:split for head scores and for picking
    test: str = "ewt:test"                    # treebank:split for reporting the picked heads
    max_sentences: int | None = None          # first N sentences of each split (None = all)
    freq_source: str = "auto"                 # auto | ewt:train | gum:train | <corpus folder>:<split>
    freq_max_chars: int = 20_000_000          # cap on corpus characters counted for frequencies
    similarity_max_words: int = 3000          # dev words used for the JS distances between heads
    mds_seed: int = 0
    n_boot: int = 1000                        # bootstrap resamples: relations CI, floor check (0: point check only)
    seed: int = 0                             # bootstrap seed and synthetic-sequence seed
    induction_sequences: int = 8              # decoders: repeated random sequences
    induction_length: int = 50                # tokens per half (capped by the model's positions)
    batch_tokens: int = 4096
    weightings: tuple[str, ...] = ("raw",)    # attention read as: raw (probabilities) | norm (Kobayashi 2020)
    floor_draws: int = 8                      # random-argmax heads averaged for that floor
    floor_random_init: bool = True            # score the same architecture at random init as a floor

    def __post_init__(self) -> None:
        for split_name in ("dev", "test"):
            tb, _, split = getattr(self, split_name).partition(":")
            if not tb or split not in ("train", "dev", "test"):
                raise ValueError(f"HeadRunConfig.{split_name}={getattr(self, split_name)!r}: use treebank:split, "
                                 f"e.g. 'ewt:dev'")
        if self.max_sentences is not None and self.max_sentences < 1:
            raise ValueError(f"HeadRunConfig.max_sentences must be >= 1 or null, got {self.max_sentences}")
        for name in ("freq_max_chars", "similarity_max_words", "induction_sequences", "induction_length",
                     "batch_tokens", "floor_draws"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"HeadRunConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.n_boot < 0:
            raise ValueError(f"HeadRunConfig.n_boot must be >= 0, got {self.n_boot}")
        bad = [w for w in self.weightings if w not in ATTENTION_WEIGHTINGS]
        if not self.weightings or bad or len(set(self.weightings)) != len(self.weightings):
            raise ValueError(f"HeadRunConfig.weightings={list(self.weightings)!r}: a non-empty list of distinct "
                             f"values from {list(ATTENTION_WEIGHTINGS)}")

    @classmethod
    def load(cls, path: str | Path, overrides: dict | None = None) -> "HeadRunConfig":
        """A JSON file of HeadRunConfig fields. A file of HeadConfig thresholds (like configs/heads.json)
        is accepted too and becomes `heads_config`: a file with more threshold keys than run keys is
        one, checked as thresholds at once (so a misspelt threshold is the error, not every other key)."""
        d = read_json_object(path)
        threshold_keys = {f.name for f in fields(HeadConfig)}
        if d and len(set(d) & threshold_keys) > len(set(d) - threshold_keys):
            HeadConfig.load(path)
            d = {"heads_config": str(path)}
        return cls.from_dict(merge(d, overrides), str(path))

    def thresholds(self) -> HeadConfig:
        return HeadConfig() if self.heads_config is None else HeadConfig.load(self.heads_config)


# ------------------------------------------------------------------------------ frequencies
def ud_tokens(text: str) -> list[str]:
    """The lower-cased tokens of `text` cut as UD English treebanks cut them (`_UD_TOKEN_RE`):
    "I don't know U.S. policy..." -> i, do, n't, know, u.s., policy, ... On the raw text of EWT dev
    this recovers 98 % of the gold tokens (a plain \\w+|[^\\w\\s] split: 96 %)."""
    return [m.group(0) for m in _UD_TOKEN_RE.finditer(text.lower())]


def count_words(texts: Iterator[str], max_chars: int) -> Counter:
    """Counts of the treebank-style tokens (`ud_tokens`) of the first `max_chars` characters of `texts`."""
    c: Counter = Counter()
    seen = 0
    for t in texts:
        if seen >= max_chars:
            break
        t = t[: max_chars - seen]
        seen += len(t)
        c.update(ud_tokens(t))
    return c


def _card_corpus(model_path: Path) -> tuple[Path, str] | None:
    """(corpus folder, split) named by the checkpoint card's data.train, if it exists on disk."""
    try:
        card = read_card(model_path).fields
    except (OSError, ValueError):
        return None
    data = card.get("data")
    train = data.get("train") if isinstance(data, dict) else None
    if not isinstance(train, (list, tuple)) or len(train) != 2 or not isinstance(train[0], str):
        return None
    src = Path(train[0].replace("${WORKBENCH_DATA}", str(data_root())))
    src = src if src.is_absolute() else data_root() / src
    return (src, train[1]) if src.exists() else None


def word_frequencies(source: str, model_path: Path | None, max_chars: int) -> tuple[Counter, str]:
    """(lower-cased word counts, description of the source) — see the module docstring."""

    if source == "auto":
        found = _card_corpus(model_path) if model_path is not None else None
        if found is None:
            source = "ewt:train"
        else:
            src, split = found
            return count_words(iter_texts(src, split), max_chars), f"pretraining corpus {src}:{split}"
    name, _, split = source.partition(":")
    if name in UD_TREEBANKS:
        sents = ud_sentences(name, split or "train")
        return Counter(w.lower() for s in sents for w in s.words), f"UD {name}:{split or 'train'} words"

    folder = Path(name) if Path(name).is_absolute() else data_root() / name
    return count_words(iter_texts(folder, split or None), max_chars), f"corpus {folder}:{split}"


# ------------------------------------------------------------------------------ attention data
def fits(tokenizer, words: Sequence[str], max_positions: int) -> bool:
    return len(tokenizer.encode_words(list(words)).ids) <= max_positions


def positional_ceiling(tokenizer, sentences: Sequence[Sequence[str]], config: HeadConfig | None = None) -> dict[str, float]:
    """Word-level positional shares of ideal token-level heads on these sentences: {"-1", "+1"}.

    The ideal heads put all of every token's attention on token t-1 (or t+1; the first / last
    token on itself). Their maps go through the same subword -> word conversion and `HeadStats` as
    a model's, so the result is the highest ``positional_share:-1`` / ``:+1`` that a purely
    token-positional head can score here. It is below 1 because a word's row is the mean over its
    subwords: for a word of c subwords the -1 head gives 1/c to the previous word and (c-1)/c to
    the word itself, so the argmax (ties to the lower index) is the previous word only for c <= 2;
    the +1 head's is the next word only for c = 1. Voita et al. 2019's 90% threshold is set on
    tokens; Clark et al. 2019's word-level view makes it depend on how often the tokenizer splits
    words, which this number shows.
    """

    names, slots = special_token_columns(tokenizer)
    stats = HeadStats(config or HeadConfig(), special_names=names)
    counted = 0
    for i, (words, enc) in enumerate(zip(sentences, tokenizer.encode_words_batch([list(w) for w in sentences]))):
        n, T = len(enc.word_spans), len(enc.ids)
        if n == 0:
            continue
        tok_word = np.full(T, -1)
        for w, (a, b) in enumerate(enc.word_spans):
            tok_word[a:b] = w
        slot = np.array([slots.get(t, -1) for t in enc.ids])
        slot[tok_word >= 0] = -1
        t = torch.arange(T)
        att = torch.zeros(1, 1, 2, T, T)  # (layer, batch, head, T, T): head 0 looks at t-1, head 1 at t+1
        att[0, 0, 0, t, (t - 1).clamp(min=0)] = 1.0
        att[0, 0, 1, t, (t + 1).clamp(max=T - 1)] = 1.0
        word, special = word_attention_maps(att, torch.from_numpy(tok_word)[None], torch.from_numpy(slot)[None], n,
                                            len(names))
        stats.update(Sentence(attn=word[:, 0].numpy(), special=special[:, 0].numpy(), words=list(words), sid=str(i)))
        counted += 1
    if not counted:
        return {"-1": float("nan"), "+1": float("nan")}
    scores = stats.score_arrays()
    return {"-1": float(scores["positional_share:-1"][0, 0]), "+1": float(scores["positional_share:+1"][0, 1])}


@torch.inference_mode()
def token_positional_shares(model, tokenizer, sentences: Sequence[Sequence[str]], offsets: Sequence[int] = (-1, 1),
                            batch_size: int = 32, weighting: str = "raw") -> dict[int, np.ndarray]:
    """Voita et al. 2019's positional share on tokens: {d: (L, H) array}, per head the share of
    tokens t whose largest attention weight is on token t + d, over the tokens whose t + d is in the
    sentence. As in the word-level measure (`probes.heads`), special tokens ([CLS], [SEP], BOS) are
    neither rows nor candidates of the argmax (ties go to the lower index), so an ideal token-level
    head scores 1.0 here while its word-level share is capped by `positional_ceiling`. Heads that a
    pruned layer no longer has are NaN. weighting="norm" takes the argmax of Kobayashi et al.'s
    alpha_ij ||f_h(x_j)|| instead of alpha_ij.
    """

    L = int(model.config.n_layers)
    per_layer = list(getattr(model, "n_heads_per_layer", [model.config.n_heads] * L))
    H = max(per_layer)
    hits = {d: torch.zeros(L, H, dtype=torch.float64) for d in offsets}
    den = dict.fromkeys(offsets, 0)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    encs = tokenizer.encode_words_batch([list(w) for w in sentences])
    for i in range(0, len(encs), batch_size):
        chunk = encs[i:i + batch_size]
        B, T = len(chunk), max(len(e.ids) for e in chunk)
        ids = torch.full((B, T), pad, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        real = torch.zeros(B, T, dtype=torch.bool)  # tokens of words: not special, not padding
        for b, e in enumerate(chunk):
            ids[b, :len(e.ids)] = torch.tensor(e.ids)
            mask[b, :len(e.ids)] = 1
            for a, z in e.word_spans:
                real[b, a:z] = True
        with record_value_norms(model) if weighting == "norm" else nullcontext(None) as norms:
            atts = forward_layers(model, ids, mask, attentions=True).attentions
        if norms is not None:  # alpha_ij ||f_h(x_j)||: (B, H_l, T, T) * (B, H_l, 1, T)
            atts = [a if n is None else a.float() * n[:, :, None, :] for a, n in zip(atts, norms)]
        argmaxes = [a.float().masked_fill(~real[:, None, None, :], -1.0).argmax(-1) for a in atts]  # (B, H_l, T)
        t = torch.arange(T)
        for d in offsets:
            target = t + d
            valid = real & ((target >= 0) & (target < T)) & real[:, target.clamp(0, T - 1)]  # t and t + d: word tokens
            den[d] += int(valid.sum())
            for layer, am in enumerate(argmaxes):
                hits[d][layer, :am.shape[1]] += ((am == target) & valid[:, None, :]).sum((0, 2)).double()
    out = {}
    for d in offsets:
        share = (hits[d] / den[d]).numpy() if den[d] else np.full((L, H), np.nan)
        for layer, h in enumerate(per_layer):
            share[layer, h:] = np.nan
        out[d] = share
    return out


def _special_names(store: Store) -> tuple[str, ...]:
    return tuple(n.strip("[]").lower() for n in store.index["special_tokens"])


def ud_store(model, tokenizer, data: str, store_root: Path, model_id: str | None, max_sentences: int | None,
             batch_tokens: int, progress: bool, weighting: str = "raw") -> tuple[Store, list, int]:
    """(store with attentions, the DepSentences in it, number skipped as too long) for 'tb:split';
    `weighting` is the store's attention_weighting ("raw" or "norm")."""

    tb, _, split = data.partition(":")
    sents = ud_sentences(tb, split)
    if max_sentences is not None:
        sents = sents[:max_sentences]
    limit = int(model.config.max_positions)
    kept = [s for s in sents if fits(tokenizer, s.words, limit)]
    if not kept:
        raise ValueError(f"{data}: no sentence fits the model's {limit} positions")
    store = extract(model, tokenizer, [list(s.words) for s in kept], store_root, model_id=model_id,
                    key_extra=f"heads:{data}:{max_sentences}", attentions=True, batch_tokens=batch_tokens,
                    attention_weighting=weighting, progress=progress)
    store.check_tokenizer(tokenizer)
    return store, kept, len(sents) - len(kept)


def sentences_from_store(store: Store, sents: Sequence, freq: Mapping | None) -> Iterator[Sentence]:
    """probes.heads.Sentence per stored sentence, with UD annotation and word frequencies."""
    for s, (_, attn, special) in enumerate(store.iter_sentence_attention()):
        d = sents[s]
        n = attn.shape[-1]
        if n != len(d.words):  # cannot happen for sentences that fit; guards the pairing
            raise ValueError(f"{d.sent_id}: store has {n} words, the sentence {len(d.words)}")
        yield Sentence(attn=attn, special=special, **_annotation(d, freq))


def _annotation(d, freq: Mapping | None) -> dict:
    """The `Sentence` fields of a DepSentence: UD head, relation, UPOS, words and their frequencies."""
    freqs = None if freq is None else np.array([freq.get(w.lower(), 0) for w in d.words], dtype=np.float64)
    return dict(heads=np.asarray(d.heads, dtype=np.int64), deprels=d.deprels, upos=d.upos, freqs=freqs,
                words=list(d.words), sid=d.sent_id)


@dataclass(frozen=True)
class _Words:
    words: Sequence[str]


def unknown_share(sents: Sequence, freq: Mapping | None) -> float:
    """Share of the words of `sents` with no count in `freq` (their frequency is 0: all tie as rarest)."""
    words = [w.lower() for d in sents for w in d.words]
    return float(np.mean([freq.get(w, 0) == 0 for w in words])) if freq is not None and words else float("nan")


# ------------------------------------------------------------------------------ floors
def sentence_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sentence (subword pieces per word (n,), tokens per special column (K,)) as the store's
    word maps see them (`special_token_columns`: tokens outside every word that are special)."""
    names, slots = special_token_columns(tokenizer)
    out = []
    for enc in tokenizer.encode_words_batch([list(w) for w in sentences]):
        in_word = np.zeros(len(enc.ids), bool)
        for a, b in enc.word_spans:
            in_word[a:b] = True
        cols = [slots[t] for t, w in zip(enc.ids, in_word) if not w and t in slots]
        out.append((np.array([b - a for a, b in enc.word_spans], dtype=np.int64),
                    np.bincount(np.asarray(cols, dtype=np.int64), minlength=len(names))))
    return out


def null_head_floors(tokenizer, sents: Sequence, freq: Mapping | None, thresholds: HeadConfig,
                     names: tuple[str, ...], draws: int, seed: int) -> dict[str, dict[str, float]]:
    """{"uniform": {score: value}, "random_argmax": {score: mean over `draws` heads}} of
    `probes.heads.null_heads` on these UD sentences (DepSentence), annotated as the model's are."""
    stats = HeadStats(thresholds, special_names=names)
    for i, (d, (pieces, special)) in enumerate(zip(sents, sentence_pieces(tokenizer, [s.words for s in sents]))):
        stats.update(null_heads(pieces, special, draws=draws, seed=seed + i, **_annotation(d, freq)))
    uniform = np.zeros((1, 1 + draws), bool)
    uniform[0, 0] = True
    return {"uniform": floor_scores(stats, uniform), "random_argmax": floor_scores(stats, ~uniform, "mean")}


def uniform_causal_sentences(sentences: Sequence[Sentence]) -> list[Sentence]:
    """One-head copies of token-level synthetic sentences (BOS in the special column) whose token t
    attends uniformly to BOS and tokens 0..t: the induction floor of a causal head with no mechanism."""
    out = []
    for s in sentences:
        n = s.attn.shape[-1]
        tri = np.tril(np.ones((n, n), np.float32)) / (np.arange(n, dtype=np.float32)[:, None] + 2)
        out.append(Sentence(tri[None, None], (1.0 / (np.arange(n, dtype=np.float32) + 2))[None, None, :, None],
                            words=s.words, sid=s.sid))
    return out


# ------------------------------------------------------------------------------ synthetic (decoders)
def _norm_weighted_rows(probs: torch.Tensor, norms: torch.Tensor | None) -> torch.Tensor:
    """Token rows of alpha_ij ||f_h(x_j)|| divided by their sums, as the store does on words
    (`word_attention.renormalised_word_maps`): probs (B, H, T, T), norms (B, H, T) or None (a layer
    without heads); a row with no mass keeps its raw probabilities."""
    if norms is None or probs.shape[1] == 0:
        return probs
    w = probs.float() * norms[:, :, None, :]
    mass = w.sum(-1, keepdim=True)
    return torch.where(mass > 0, w / torch.where(mass > 0, mass, torch.ones_like(mass)), probs.float())


@torch.no_grad()
def repeated_random_sentences(model, tokenizer, n_sequences: int, length: int, seed: int,
                              weighting: str = "raw") -> list[Sentence]:
    """Token-level `Sentence`s for Olsson et al. 2022's induction test: BOS + r + r, r random tokens.

    attn = the (L, H, 2T, 2T) token attention without the BOS column, special = attention to BOS
    (L, H, 2T, 1); `words` are the token ids, so HeadStats finds the earlier copies itself.
    weighting="norm": rows of alpha_ij ||f_h(x_j)||, renormalised (`_norm_weighted_rows`).
    """
    bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id
    T = min(length, (int(model.config.max_positions) - 1) // 2)
    if T < 2:
        raise ValueError(f"the model's {model.config.max_positions} positions leave no room for a repeated sequence")
    pool = np.array(sorted(set(range(tokenizer.vocab_size)) - set(tokenizer.special_ids)))
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_sequences):
        r = rng.choice(pool, size=T, replace=False if len(pool) >= T else True)
        ids = torch.tensor([[bos, *r.tolist(), *r.tolist()]])
        with record_value_norms(model) if weighting == "norm" else nullcontext(None) as norms:
            o = model(ids, output_attentions=True, attn_impl="eager", **family_of(model).analysis_kwargs)
        atts = o.attentions if norms is None else [_norm_weighted_rows(a, n) for a, n in zip(o.attentions, norms)]
        A = torch.stack([a[0].float() for a in atts]).numpy()  # (L, H, 2T+1, 2T+1)
        out.append(Sentence(attn=A[:, :, 1:, 1:], special=A[:, :, 1:, :1], words=[*r.tolist(), *r.tolist()],
                            sid=f"repeated_random_{k}"))
    return out


def _score_rows(values: np.ndarray, score: str, model_name: str) -> pd.DataFrame:
    """(L, H) scores as rows of the `heads` table."""
    L, H = values.shape
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"model": model_name, "layer": layer, "head": head, "score": score, "value": values.reshape(-1)})


def _add_synthetic(report_heads: pd.DataFrame, classes: pd.DataFrame, stats: HeadStats, cfg: HeadConfig,
                   model_name: str, floor_sources: dict[str, dict[str, float]], n_boot: int,
                   seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Append the synthetic scores to `heads` and the induction role to `heads_classes`: a head is
    "induction" if its synthetic score reaches the threshold and beats the floor of the same
    sequences (`HeadStats.floor_check`; `stats` kept per sentence)."""
    scores = stats.score_arrays()
    _, H = stats.shape_
    floor = combine_floors(floor_sources).get("induction", np.nan)
    passed, lo, hi = stats.floor_check("induction", np.nan_to_num(scores["induction"], nan=-np.inf) >= cfg.induction,
                                       floor, n_boot, seed)
    extra = [_score_rows(scores[name], f"{name}:repeated_random", model_name) for name in ("previous_token", "induction")]
    extra[1] = extra[1].assign(floor=floor, **{f"floor_{k}": v.get("induction", np.nan) for k, v in floor_sources.items()},
                               ci_low=lo.reshape(-1), ci_high=hi.reshape(-1))
    ind = passed.reshape(-1)
    rank = {f: i for i, f in enumerate(cfg.precedence)}
    rows = []
    for (lh), g in classes.groupby(["layer", "head"], sort=True):
        f = lh[0] * H + lh[1]
        roles = [r for r in g["role"] if r != "none"]
        primary = g.loc[g["primary"], "role"]
        primary = primary.iloc[0] if len(primary) else "none"
        if ind[f] and "induction" not in roles:
            roles.append("induction")
            if primary == "none" or rank["induction"] < rank.get(role_family(primary), len(rank)):
                primary = "induction"
        rows += [(model_name, lh[0], lh[1], r, r == primary) for r in sorted(roles or ["none"])]
    return (pd.concat([report_heads, *extra], ignore_index=True),
            pd.DataFrame(rows, columns=["model", "layer", "head", "role", "primary"]))


def role_family(role: str) -> str:
    """The family of a head role: "sink" for *_sink, "broad", else the part before ":" (syntactic:nsubj -> syntactic)."""
    if role.endswith("_sink"):
        return "sink"
    return {"broad": "broad"}.get(role, role.split(":")[0])


# ------------------------------------------------------------------------------ the analysis
_RECORDED_FLOORS = ("previous_token", "rare_token", "induction", "entropy_normalized")


@dataclass
class _WeightingResult:
    """One weighting's tables and what heads_run.json records of it."""

    tables: dict[str, pd.DataFrame]
    skipped: dict[str, int]
    sentences: dict[str, int]
    stores: dict[str, str]
    similarity_words: int
    dev_words: list
    names: tuple[str, ...]
    floors: dict[str, dict[str, float]]   # {source: {role score: floor}} (syntactic margins: in `heads`)


def _analyse_weighting(model, tokenizer, cfg: HeadRunConfig, weighting: str, store_root: Path,
                       model_id: str | None, model_name: str, freq, progress: bool,
                       fresh=None, fresh_seed: int | None = None) -> _WeightingResult:
    """Every head table of one attention weighting ("raw" | "norm"), each with a `weighting` column;
    `fresh`: the random-initialisation model scored as a floor (None: no such floor), drawn under
    `fresh_seed`."""
    thresholds = cfg.thresholds()
    skipped: dict[str, int] = {}
    stores = {}
    for role, data in (("dev", cfg.dev), ("test", cfg.test)):
        store, sents, n_long = ud_store(model, tokenizer, data, store_root, model_id, cfg.max_sentences,
                                        cfg.batch_tokens, progress, weighting)
        stores[role] = (store, sents)
        skipped[f"too_long:{data}"] = n_long
    names = _special_names(stores["dev"][0])
    dev_stats = HeadStats(thresholds, special_names=names, freq=None, keep_per_sentence=True)
    floor_sources = null_head_floors(tokenizer, stores["dev"][1], freq, thresholds, names, cfg.floor_draws, cfg.seed)
    if fresh is not None:
        floor_sources["random_init"] = _random_init_floor(fresh, fresh_seed, tokenizer, cfg, weighting, store_root,
                                                          model_id, freq, thresholds, names)
    similarity = HeadSimilarity(max_words=cfg.similarity_max_words, tol=thresholds.row_tolerance)
    n_synthetic = cfg.induction_sequences if family_of(model).lm_inputs == "causal" else 0  # induction: a causal LM
    label = model_name if weighting == "raw" else f"{model_name} ({weighting})"
    bar = progress_bar(len(stores["dev"][1]) + len(stores["test"][1]) + n_synthetic, f"heads {label}", "sent",
                       disable=not progress)  # sentences scored (the stores have their own bars)
    with bar:
        for s in sentences_from_store(stores["dev"][0], stores["dev"][1], freq):
            dev_stats.update(s)
            similarity.update(s)
            bar.update(1)
        test_stats = HeadStats(thresholds, special_names=names, keep_per_sentence=True)
        for s in sentences_from_store(stores["test"][0], stores["test"][1], freq):
            test_stats.update(s)
            bar.update(1)
        report = dev_stats.finalize(model_name, floor_sources, n_boot=cfg.n_boot, seed=cfg.seed)
        heads, classes = report.heads, report.classes
        skipped.update({f"{k}:{cfg.dev}": v for k, v in report.skipped.items()})
        if n_synthetic:
            synth = HeadStats(thresholds, special_names=("bos",), keep_per_sentence=True)
            seqs = repeated_random_sentences(model, tokenizer, n_synthetic, cfg.induction_length, cfg.seed, weighting)
            for s in seqs:
                synth.update(s)
                bar.update(1)
            heads, classes = _add_synthetic(heads, classes, synth, thresholds, model_name,
                                            _synthetic_floors(seqs, fresh, tokenizer, cfg, thresholds, weighting),
                                            cfg.n_boot, cfg.seed)
    dev_words = [s.words for s in stores["dev"][1]]
    shares = token_positional_shares(model, tokenizer, dev_words, weighting=weighting)
    heads = pd.concat([heads, *(_score_rows(share, f"positional_share:{d:+d}:tokens", model_name)
                                for d, share in shares.items())], ignore_index=True)
    relations = best_heads_per_relation(dev_stats, test_stats, model=model_name, config=thresholds,
                                        special_names=names, n_boot=cfg.n_boot, seed=cfg.seed)
    dist = similarity.finalize()
    xy = mds_embedding(dist.distance, seed=cfg.mds_seed)
    L, H = dist.shape
    layer, head = np.divmod(np.arange(L * H), H)
    sim = pd.DataFrame({"model": model_name, "layer": layer, "head": head, "x": xy[:, 0], "y": xy[:, 1]})
    tables = {"heads": heads, "heads_classes": classes, "relations": relations, "head_similarity": sim}
    return _WeightingResult(
        {k: df.assign(**{WEIGHTING_COLUMN: weighting}) for k, df in tables.items()}, skipped,
        {"dev": len(stores["dev"][1]), "test": len(stores["test"][1])},
        {k: str(v[0].path) for k, v in stores.items()}, dist.n_words, dev_words, names,
        {src: {k: v for k, v in vals.items() if k in _RECORDED_FLOORS or k.startswith(("positional_share", "attn_to"))}
         for src, vals in floor_sources.items()})


def _random_init_floor(fresh, fresh_seed: int | None, tokenizer, cfg: HeadRunConfig, weighting: str,
                       store_root: Path, model_id: str | None, freq, thresholds: HeadConfig,
                       names: tuple[str, ...]) -> dict[str, float]:
    """{score: the largest over the random-initialisation model's heads} on the same dev sentences;
    its store's id names the seed `fresh` was drawn under."""
    fresh_id = f"{model_id}:random_init:{fresh_seed}" if model_id else None
    store, sents, _ = ud_store(fresh, tokenizer, cfg.dev, store_root / "random_init", fresh_id, cfg.max_sentences,
                               cfg.batch_tokens, False, weighting)
    stats = HeadStats(thresholds, special_names=names)
    for s in sentences_from_store(store, sents, freq):
        stats.update(s)
    return floor_scores(stats, how="max")


def _synthetic_floors(seqs: list[Sentence], fresh, tokenizer, cfg: HeadRunConfig, thresholds: HeadConfig,
                      weighting: str) -> dict[str, dict[str, float]]:
    """Floors of the synthetic induction score: a uniform causal head on the same sequences and the
    largest score of the random-initialisation model's heads on them (same seed, same tokens)."""
    uniform = HeadStats(thresholds, special_names=("bos",))
    for s in uniform_causal_sentences(seqs):
        uniform.update(s)
    out = {"uniform": floor_scores(uniform)}
    if fresh is not None:
        rnd = HeadStats(thresholds, special_names=("bos",))
        for s in repeated_random_sentences(fresh, tokenizer, len(seqs), cfg.induction_length, cfg.seed, weighting):
            rnd.update(s)
        out["random_init"] = floor_scores(rnd, how="max")
    return out


def analyse_loaded(model, tokenizer, out_dir: str | Path | None = None, config=None, model_name: str = "model",
                   run_dir: str | Path | None = None, store_root: str | Path | None = None,
                   model_id: str | None = None, model_path: str | Path | None = None,
                   progress: bool = True, trained_under: int | None = None) -> dict[str, pd.DataFrame]:
    """`analyse_heads` on a model already in memory (hooks registered on it stay active). `trained_under`:
    the checkpoint's pretraining seed (`plmodels.checkpoint.training_seed`; None: unknown), which with
    `seed` gives the random-init floor's seed (`plmodels.checkpoint.floor_seed`)."""
    cfg = HeadRunConfig.resolve(config)
    thresholds = cfg.thresholds()
    t0 = time.perf_counter()
    if store_root is None:
        if out_dir is None and run_dir is None:
            raise ValueError("analyse_heads: give out_dir, run_dir or store_root (where the attention stores go)")
        store_root = Path(run_dir) / "attention" / model_name if run_dir is not None else Path(out_dir) / "store"
    store_root = Path(store_root)
    freq, freq_desc = word_frequencies(cfg.freq_source, Path(model_path) if model_path else None, cfg.freq_max_chars)
    fresh_seed = floor_seed(cfg.seed, trained_under) if cfg.floor_random_init else None
    fresh = random_init_model(model, fresh_seed) if fresh_seed is not None else None
    runs = {w: _analyse_weighting(model, tokenizer, cfg, w, store_root, model_id, model_name, freq, progress, fresh,
                                  fresh_seed)
            for w in cfg.weightings}
    first = runs[cfg.weightings[0]]  # skips, sentences and words do not depend on the weighting
    tables = {name: pd.concat([r.tables[name] for r in runs.values()], ignore_index=True) for name in HEAD_TABLES}
    ceiling = positional_ceiling(tokenizer, first.dev_words, thresholds)
    L, H = tables["head_similarity"]["layer"].max() + 1, tables["head_similarity"]["head"].max() + 1
    record = {"model": model_name, "model_path": str(model_path) if model_path else None, "model_id": model_id,
              "kind": model.kind, "config": cfg.to_dict(), "thresholds": thresholds.to_dict(),
              "frequency_source": freq_desc, "frequency_tokens": "ud_tokens (treebank-style) for corpora",
              "frequency_unknown_share": unknown_share([_Words(w) for w in first.dev_words], freq),
              "floors": {w: r.floors for w, r in runs.items()}, "random_init_seed": fresh_seed,
              "skipped": first.skipped, "special_tokens": list(first.names),
              "sentences": first.sentences, "positional_ceiling": ceiling,
              "similarity_words": first.similarity_words, "stores": first.stores,
              "weightings": {w: {"stores": r.stores} for w, r in runs.items()},
              "seconds": round(time.perf_counter() - t0, 1)}
    _write_outputs(tables, out_dir, run_dir, record)
    if progress:
        write(f"heads {model_name}: {L}x{H} heads, dev {record['sentences']['dev']} / test "
              f"{record['sentences']['test']} sentences, weightings {list(cfg.weightings)}, skipped "
              f"{first.skipped}, {record['seconds']} s")
    return tables


def analyse_heads(model_path: str | Path, out_dir: str | Path | None = None, config=None,
                  model_name: str | None = None, run_dir: str | Path | None = None,
                  store_root: str | Path | None = None, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Head roles of a checkpoint -> {"heads", "heads_classes", "relations", "head_similarity"}.

    config: None (HeadRunConfig and HeadConfig defaults), a HeadRunConfig, a dict or a JSON
    path. Tables are upserted into run_dir/tables (default out_dir/tables); heads_run.json (config,
    thresholds, frequency source, skip counts) goes to out_dir (`workbench heads` also draws the
    figures: `workbench.presentation.analysis_figures`).
    """


    model, tokenizer = plmodels.load(model_path)
    if not getattr(model.config, "n_heads", 0):
        raise ValueError(f"{model_path}: a {model.kind} model has no attention heads to analyse")
    if tokenizer is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; head analysis needs one")
    return analyse_loaded(model, tokenizer, out_dir, config, model_name or default_model_name(model_path), run_dir,
                          store_root, plmodels.checkpoint_hash(model_path), model_path, progress,
                          training_seed(model_path))


def _write_outputs(tables: dict[str, pd.DataFrame], out_dir, run_dir, record: dict) -> None:
    write_analysis_outputs(tables, out_dir, run_dir, record, "heads_run.json")


# ------------------------------------------------------------------------------ one sentence (app)
@functools.lru_cache(maxsize=2)
def _load_cached(path: str, stamp: float):
    return plmodels.load(path)


def sentence_attention(model_path: str | Path, words: Sequence[str],
                       weighting: str = "raw") -> tuple[np.ndarray, np.ndarray]:
    """Word-level attention of one sentence for the app: (attn (L, H, n, n), special (L, H, n, K)).

    Runs the sentence through the activation store's extraction (a temporary store), so the
    subword -> word conversion is exactly the store's (Clark et al. 2019). Special columns follow
    the store's `special_tokens` ([CLS], [SEP] or BOS). weighting="norm" gives Kobayashi et al.'s
    norm-weighted maps, renormalised per row as the store keeps them. ValueError if the sentence is
    empty or too long for the model, or on an unknown weighting.
    """
    words = [str(w) for w in words]
    if not words:
        raise ValueError("sentence_attention: no words given")
    p = Path(model_path)
    model, tokenizer = _load_cached(str(p.resolve()), (p / "model.safetensors").stat().st_mtime)
    if not fits(tokenizer, words, int(model.config.max_positions)):
        raise ValueError(f"sentence_attention: {len(words)} words are more than the model's "
                         f"{model.config.max_positions} positions hold")
    with tempfile.TemporaryDirectory() as tmp:
        store = extract(model, tokenizer, [words], tmp, model_id="sentence", attentions=True,
                        attention_weighting=weighting, progress=False)
        return np.asarray(store.sentence_attention(0), dtype=np.float32), \
            np.asarray(store.sentence_special(0), dtype=np.float32)


def summarise_heads(heads: pd.DataFrame, relations: pd.DataFrame) -> dict[str, float]:
    """The head scores that summarise one model in a line: "det_margin" and "case_margin" (the best
    head's test accuracy minus the best fixed-offset baseline, the larger over both directions; Clark
    et al. 2019, sec. 4.2), and the largest share of one head's argmax at offset -1 or +1, on words
    ("positional_max") and on tokens ("positional_max_tokens"; Voita et al. 2019 call >= 0.9 a
    positional head), from the `heads` and `relations` tables (their raw-attention rows)."""
    heads, relations = weighting_rows(heads), weighting_rows(relations)
    out = {}
    for rel in ("det", "case"):
        r = relations[relations["relation"] == rel]
        margin = (r["test_acc"] - r["baseline_acc"]).max() if len(r) else float("nan")
        out[f"{rel}_margin"] = float(margin)
    for key, suffix in (("positional_max", ""), ("positional_max_tokens", ":tokens")):
        pos = heads[heads["score"].isin([f"positional_share:-1{suffix}", f"positional_share:+1{suffix}"])]["value"]
        out[key] = float(pos.max()) if pos.notna().any() else float("nan")
    return out
