"""Attention-head roles over a corpus of word-level attention maps.

Follows Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Voita et al. 2019 ("Analyzing
Multi-Head Self-Attention", section 4) and Olsson et al. 2022 ("In-context Learning and Induction
Heads"). Pure array code: the activation store feeds one sentence at a time to the streaming
accumulator `HeadStats` (``update(sentence)`` then ``finalize(model)``); nothing holds all maps.

Input per sentence (see `Sentence`): ``attn`` (L, H, n, n) word-level attention, row i = attention
*from* word i (Clark et al. 2019: attention to a multi-subword word is the sum over its subwords,
attention from it is the mean over its subwords), and ``special`` (L, H, n, k): the shares of row i
that go to the k special tokens ([CLS], [SEP]; BOS for decoders), which are removed from the word
grid. Each row of attn + special sums to 1 (checked; ValueError names sentence, layer, head, word).

Decisions (documented once, here):
- **Argmax over words only.** Every "the head points at word j" statistic (positional, syntactic,
  rare-token) takes the argmax over the n words; special tokens do not compete. Voita et al. take it
  over tokens; we follow Clark et al. 2019 sec. 4.2, who predict a *word*. Heads that park their
  mass on [CLS]/[SEP] are flagged separately by the sink scores. Ties go to the lowest word index
  (numpy argmax), so a perfectly uniform head points at word 0.
- **Positional share** at offset d is #(argmax_i == i + d) / #(words i with 0 <= i + d < n), so a
  head that always looks at i-1 scores 1.0 even though word 0 has no left neighbour. A head is
  positional at d if that share >= config ``positional`` (Voita: 90%).
- **Relations** use the UD deprel's base before ':' (``obl:tmod`` -> ``obl``) except the subtypes in
  ``keep_subtypes`` (``nmod:poss`` is its own relation and is *not* counted as ``nmod``). As in Clark
  et al.'s own code (`attn_head_predictor`, which zeroes the diagonal before the argmax), a word
  attaches to the most-attended-to *other* word: the syntactic argmax excludes the word itself
  (``syntactic_exclude_self``; a word that picks itself is always wrong, so including it only biases
  accuracies low). Both directions score each dependent d of relation r against its UD head:
  dep2head (Clark's "normal" mode) is correct if d's own argmax is head(d); head2dep (Clark's
  "transpose" mode) is correct if the word that attends most to d, argmax_j A[j, d] over j != d, is
  head(d). Baseline: "always predict the word at offset k" from the dependent, best k in
  [-baseline_max_offset, +baseline_max_offset] on the same data (Clark; the same baseline for both
  directions, which predict the same thing). A head is syntactic:<r> if, in either direction,
  acc - baseline >= ``syntactic_margin`` over >= ``syntactic_min_count`` cases. Clark's code also
  clamps offsets that leave the sentence to its ends; here they are simply wrong.
- **Rare-token** (Voita): share of words whose argmax is the least frequent word of the sentence.
  Ties: when k words share the minimum frequency, pointing at one of them earns 1/k, so a head
  whose argmax is random over the n words scores 1/n per sentence whatever the ties (crediting each
  tied word fully would give it k/n); a sentence where all words tie is skipped (counted). Words
  missing from a frequency dict get frequency 0.
- **Floors** (`floor_sources`, `combine_floors`, `HeadStats.floor_check`): a head gets a role only
  if its role score beats what a head with no mechanism scores *on the same sentences*: a uniform
  head (the subword-uniform row converted to words as real maps are, so long words draw more
  attention), a head whose argmax is random over the words, and the heads of the same architecture
  at random initialisation (their maximum). The floor is the largest of these (for the syntactic
  margins also 0, the offset baseline the margin is measured against). The check: point score >=
  floor + ``floor_margin`` and the lower end of a percentile bootstrap interval over sentences
  (``floor_ci``, `bootstrap_ratio`) > floor, on top of the absolute threshold of the role. A uniform
  head scores exactly its own floor, so it is never rare-token (or any other floor-checked role) at
  any vocabulary size. "broad" is exempt: it is the role of heads that attend like the uniform one
  (its floor is stored, not enforced). Without floors (``finalize(floor_sources=None)``) roles use
  the thresholds alone.
- **Induction** (Olsson et al. 2022) on the word level: for word i with earlier occurrences j <= i-2
  of the same word (form or id), the score is the attention from i to the set {j+1}, averaged over
  such words. A synthetic repeated random sequence is just a `Sentence` whose ``words`` repeat.
- **Entropy** (Clark sec. 3, "broad" heads) in nats of the full row (words + specials), averaged
  over words; ``entropy_normalized`` divides each row's entropy by log(#nonzero entries), so causal
  (decoder) rows are compared with their own uniform. **Confidence** (Voita et al. 2019, sec. 4:
  "the average of its maximum attention weight excluding the end of sentence symbol") = mean over
  words of the largest weight on a *word* ([CLS]/[SEP]/BOS excluded, so a head that parks its mass
  on a special token is not confident); ``confidence_full_row`` keeps the max over the full row.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from plmodels.config import Config

DIRECTIONS = ("dep2head", "head2dep")
_TINY = np.float32(1e-30)  # log(max(p, tiny)) makes 0 log 0 = 0 without a branch
ROLE_FAMILIES_ALL = ("syntactic", "induction", "rare_token", "positional", "previous_token", "sink",
                     "broad")


@dataclass(frozen=True)
class HeadConfig(Config):
    """Thresholds for head classes. These defaults are the canonical values (configs/heads.json is a
    copy of them to edit and pass to `workbench heads`; a test keeps the two equal)."""

    row_tolerance: float = 2e-3          # |sum(attn row) + sum(special row) - 1| allowed (float16 store)
    positional_window: int = 2           # offsets -w..+w are tracked (0 = self)
    positional: float = 0.9              # share at one offset to be positional (Voita et al. 2019)
    relations: tuple[str, ...] = ("nsubj", "obj", "iobj", "det", "amod", "advmod", "aux", "case",
                                  "mark", "cop", "nmod", "nmod:poss", "obl", "compound", "conj",
                                  "cc", "nummod", "acl", "advcl", "xcomp", "ccomp")
    keep_subtypes: tuple[str, ...] = ("nmod:poss",)  # deprels kept whole instead of cut at ':'
    baseline_max_offset: int = 20        # fixed-offset baseline searches k in [-m, m] \ {0}
    syntactic_margin: float = 0.1        # acc - baseline to be syntactic (Voita: 10 points)
    syntactic_min_count: int = 20        # fewer cases of a relation -> no role claimed
    rare_token: float = 0.5              # share of argmax on the rarest word
    sink: float = 0.5                    # mean attention to [CLS]/[SEP]/BOS/punctuation
    broad: float = 0.8                   # mean normalized entropy (Clark et al. 2019 broad heads)
    previous_token: float = 0.5          # mean attention to word i-1
    induction: float = 0.4               # mean attention to the token after an earlier copy
    precedence: tuple[str, ...] = ("syntactic", "induction", "rare_token", "positional",
                                   "previous_token", "sink", "broad")  # primary-role order
    syntactic_exclude_self: bool = True  # Clark et al.'s code: a word attaches to another word
    floor_margin: float = 0.05           # role score - floor needed (point estimate), floors given
    floor_ci: float = 0.95               # the bootstrap interval's low end must lie above the floor

    def __post_init__(self) -> None:
        for name in ("row_tolerance", "positional", "rare_token", "sink", "broad",
                     "previous_token", "induction", "floor_margin"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"HeadConfig.{name} must be in [0, 1], got {v}")
        if not 0.0 < self.floor_ci < 1.0:
            raise ValueError(f"HeadConfig.floor_ci must be in (0, 1), got {self.floor_ci}")
        if not 0 <= self.syntactic_margin <= 1:
            raise ValueError(f"HeadConfig.syntactic_margin must be in [0, 1], got {self.syntactic_margin}")
        for name in ("positional_window", "baseline_max_offset", "syntactic_min_count"):
            if getattr(self, name) < (1 if name != "syntactic_min_count" else 0):
                raise ValueError(f"HeadConfig.{name} too small: {getattr(self, name)}")
        if len(set(self.relations)) != len(self.relations) or not self.relations:
            raise ValueError(f"HeadConfig.relations must be non-empty and unique: {self.relations}")
        unknown = set(self.precedence) - set(ROLE_FAMILIES_ALL)
        if unknown or len(set(self.precedence)) != len(self.precedence):
            raise ValueError(f"HeadConfig.precedence: unknown or repeated families {sorted(unknown)}; "
                             f"valid: {ROLE_FAMILIES_ALL}")



@dataclass(frozen=True, eq=False)
class Sentence:
    """One sentence's word-level attention plus its annotation (all optional but ``attn``)."""

    attn: np.ndarray                       # (L, H, n, n): row i = attention from word i to words
    special: np.ndarray | None = None      # (L, H, n, k) or (L, H, n): shares on special tokens
    heads: np.ndarray | None = None        # (n,) 0-based UD head index, -1 for the root
    deprels: Sequence[str] | None = None   # (n,) UD relations
    upos: Sequence[str] | None = None      # (n,) punctuation = "PUNCT" (used if punct is None)
    punct: np.ndarray | None = None        # (n,) bool punctuation flags
    freqs: np.ndarray | None = None        # (n,) corpus frequency of each word
    words: Sequence | None = None          # (n,) forms or ids: induction, frequency-dict lookup
    sid: str | None = None                 # sentence id, used in error messages


def relation_base(deprel: str, keep: Iterable[str] = ("nmod:poss",)) -> str:
    """UD relation used for head analysis: the part before ':' unless the full label is kept."""
    return deprel if deprel in set(keep) else deprel.split(":")[0]


def _as_float(a, name: str, where: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{where}: {name} must be numeric, got dtype {a.dtype}")
    return a.astype(np.float32, copy=False)


def check_rows(rows: np.ndarray, tol: float, where: str) -> None:
    """Raise ValueError unless every row of ``rows`` = [attn | special] (L, H, n, n + k) is a
    distribution: non-negative, finite, summing to 1 within tol. Names the first bad layer/head/word."""
    tot = rows.sum(-1, dtype=np.float64)  # (L, H, n); NaN/inf propagate into the sum
    bad = ~(np.abs(tot - 1.0) <= tol)
    if bad.any():
        l, h, i = np.argwhere(bad)[0]
        raise ValueError(f"{where}: row of word {i} in layer {l}, head {h} sums to {tot[l, h, i]:.5f}"
                         f" (words + special tokens), not 1 within tolerance {tol}")
    if rows.size and rows.min() < 0:
        l, h, i = np.argwhere((rows < 0).any(-1))[0]
        raise ValueError(f"{where}: row of word {i} in layer {l}, head {h} has negative weights")


def _without_diagonal(A: np.ndarray) -> np.ndarray:
    """A copy of the (L, H, n, n) maps with the diagonal at -inf, so that an argmax over a row (or,
    transposed, a column) picks the best *other* word, as Clark et al.'s code zeroes the diagonal;
    ties go to the lowest index."""
    n = A.shape[-1]
    B = A.copy()
    B[..., np.arange(n), np.arange(n)] = -np.inf
    return B


def _onehot(idx: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((idx.size, size), dtype=np.float32)
    out[np.arange(idx.size), idx] = 1.0
    return out


class HeadStats:
    """Streaming per-head statistics over a corpus; vectorised over layers and heads.

    ``HeadStats(config, special_names=("cls", "sep"), freq=None).update(sentence)`` for each
    sentence, then ``score_arrays()`` -> {score name: (L, H)}, ``roles()`` and ``finalize(model)``
    -> `HeadReport` with the ``heads`` and ``heads_classes`` tables of docs/design.md.
    ``freq`` maps word -> corpus count for rare-token heads when sentences carry ``words`` but not
    ``freqs``. ``keep_per_sentence=True`` also keeps per-sentence syntactic hits (for the bootstrap in
    `best_heads_per_relation`) and each sentence's part of the other role scores (for `floor_check`,
    which ``finalize(floor_sources=...)`` runs on every role).
    """

    def __init__(self, config: HeadConfig | None = None, special_names: Sequence[str] = ("cls", "sep"),
                 freq: Mapping | None = None, keep_per_sentence: bool = False) -> None:
        self.config = config if config is not None else HeadConfig()
        self.special_names = tuple(special_names)
        self.freq = freq
        self.keep_per_sentence = keep_per_sentence
        self.n_sentences_ = 0
        self.skipped_: Counter = Counter()
        self.shape_: tuple[int, int] | None = None
        cfg = self.config
        self._rel_index = {r: i for i, r in enumerate(cfg.relations)}
        self._offsets = np.arange(-cfg.positional_window, cfg.positional_window + 1)
        self._keep = set(cfg.keep_subtypes)
        self._rel_cache: dict[str, int] = {}  # deprel -> relation index (-1: not analysed)
        self.per_sentence_: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.role_parts_: list[tuple[np.ndarray, np.ndarray]] = []  # per sentence: (Q, L, H) num, (Q,) den

    # ---------------------------------------------------------------- accumulation
    def _allocate(self, L: int, H: int) -> None:
        R, K, k = len(self.config.relations), self.config.baseline_max_offset, len(self.special_names)
        z = lambda *s: np.zeros(s, dtype=np.float64)  # noqa: E731
        self.shape_ = (L, H)
        self.n_words_ = 0
        self.pos_hits_, self.pos_den_, self.pos_other_ = z(L, H, self._offsets.size), z(self._offsets.size), z(L, H)
        self.self_sum_, self.prev_sum_, self.n_prev_ = z(L, H), z(L, H), 0
        self.entropy_sum_, self.entropy_norm_sum_, self.n_entropy_norm_ = z(L, H), z(L, H), z(L, H)
        self.conf_sum_, self.conf_full_sum_ = z(L, H), z(L, H)
        self.special_sum_ = z(L, H, k)
        self.punct_sum_, self.n_punct_words_ = z(L, H), 0
        self.rare_hits_, self.n_rare_ = z(L, H), 0
        self.ind_sum_, self.n_ind_ = z(L, H), 0
        self.syn_hits_, self.syn_count_ = z(L, H, 2, R), z(2, R)
        self.base_hits_ = z(2, R, 2 * K + 1)

    def update(self, s: Sentence) -> "HeadStats":
        """Add one sentence. Raises ValueError (naming sentence, layer, head) on malformed maps."""
        idx = self.n_sentences_
        where = f"sentence {idx}" + (f" ({s.sid})" if s.sid is not None else "")
        A = _as_float(s.attn, "attn", where)
        if A.ndim != 4 or A.shape[-1] != A.shape[-2]:
            raise ValueError(f"{where}: attn must be (L, H, n, n), got {A.shape}")
        L, H, n, _ = A.shape
        k = len(self.special_names)
        S = np.zeros((L, H, n, k), np.float32) if s.special is None else _as_float(s.special, "special", where)
        if S.ndim == 3:
            S = S[..., None]
        if S.shape != (L, H, n, k):
            raise ValueError(f"{where}: special must be (L, H, n, k={k}) for {self.special_names}, got {S.shape}")
        P = np.concatenate([A, S], axis=-1)  # (L, H, n, n + k) full rows
        check_rows(P, self.config.row_tolerance, where)
        if self.shape_ is None:
            self._allocate(L, H)
        elif self.shape_ != (L, H):
            raise ValueError(f"{where}: (layers, heads) = {(L, H)} differs from earlier {self.shape_}")
        self.n_sentences_ += 1
        if n == 0:
            self.skipped_["empty_sentence"] += 1
            return self
        before = self._role_totals() if self.keep_per_sentence else None
        am = A.argmax(-1)  # (L, H, n) most-attended word, specials excluded
        self._update_generic(A, P, am)
        self._update_punct(s, A, n, where)
        self._update_rare(s, am, n, where)
        self._update_induction(s, A, n, where)
        if self.config.syntactic_exclude_self and n > 1:
            B = _without_diagonal(A)
            self._update_syntactic(s, B.argmax(-1), np.swapaxes(B, -1, -2).argmax(-1), n, where)
        else:
            self._update_syntactic(s, am, np.swapaxes(A, -1, -2).argmax(-1), n, where)
        if before is not None:  # this sentence's share of each role score, for the bootstrap
            after = self._role_totals()
            self.role_parts_.append((np.stack([after[k][0] - before[k][0] for k in after]).astype(np.float32),
                                     np.array([after[k][1] - before[k][1] for k in after], dtype=np.float64)))
        return self

    def _role_totals(self) -> dict[str, tuple[np.ndarray, float]]:
        """{role score: (numerator (L, H) copy, denominator)} of the ratio scores that roles are
        checked against floors with (syntactic margins come from `per_sentence_`)."""
        t = {f"positional_share:{_offset_name(d)}": (self.pos_hits_[..., j].copy(), float(self.pos_den_[j]))
             for j, d in enumerate(self._offsets)}
        t["previous_token"] = (self.prev_sum_.copy(), float(self.n_prev_))
        for j, name in enumerate(self.special_names):
            t[f"attn_to_{name}"] = (self.special_sum_[..., j].copy(), float(self.n_words_))
        t["attn_to_punct"] = (self.punct_sum_.copy(), float(self.n_punct_words_))
        t["rare_token"] = (self.rare_hits_.copy(), float(self.n_rare_))
        t["induction"] = (self.ind_sum_.copy(), float(self.n_ind_))
        return t

    def _update_generic(self, A: np.ndarray, P: np.ndarray, am: np.ndarray) -> None:
        L, H, n, _ = A.shape
        ar = np.arange(n)
        self.n_words_ += n
        W = self.config.positional_window
        # histogram of argmax offsets per head; bins 0 and 2W+2 collect |offset| > W
        off = np.clip(am - ar, -W - 1, W + 1) + W + 1  # (L, H, n) in [0, 2W+2]
        nb = 2 * W + 3
        hist = np.bincount((off + nb * np.arange(L * H).reshape(L, H, 1)).ravel(), minlength=nb * L * H)
        hist = hist.reshape(L, H, nb)
        self.pos_hits_ += hist[..., 1:-1]
        self.pos_den_ += np.maximum(n - np.abs(self._offsets), 0)
        self.pos_other_ += hist[..., 0] + hist[..., -1]
        self.self_sum_ += A[..., ar, ar].sum(-1)
        if n > 1:
            self.prev_sum_ += A[..., ar[1:], ar[:-1]].sum(-1)
            self.n_prev_ += n - 1
        ent = -(P * np.log(np.maximum(P, _TINY))).sum(-1)  # (L, H, n) row entropy, nats; 0 log 0 = 0
        self.entropy_sum_ += ent.sum(-1)
        support = np.count_nonzero(P, axis=-1)  # (L, H, n)
        ok = support > 1
        self.entropy_norm_sum_ += np.where(ok, ent / np.log(np.maximum(support, 2)), 0.0).sum(-1)
        self.n_entropy_norm_ += ok.sum(-1)
        mx = np.take_along_axis(A, am[..., None], -1)[..., 0]  # (L, H, n) max over words
        self.conf_sum_ += mx.sum(-1)
        if P.shape[-1] > n:
            mx = np.maximum(mx, P[..., n:].max(-1))
            self.special_sum_ += P[..., n:].sum(2)
        self.conf_full_sum_ += mx.sum(-1)

    def _update_punct(self, s: Sentence, A: np.ndarray, n: int, where: str) -> None:
        if s.punct is not None:
            p = np.asarray(s.punct, dtype=bool)
        elif s.upos is not None:
            p = np.asarray([u == "PUNCT" for u in s.upos], dtype=bool)
        else:
            self.skipped_["punct:no_annotation"] += 1
            return
        if p.shape != (n,):
            raise ValueError(f"{where}: punct/upos must have length n={n}, got {p.shape}")
        self.punct_sum_ += A[..., p].sum((-1, -2))
        self.n_punct_words_ += n

    def _update_rare(self, s: Sentence, am: np.ndarray, n: int, where: str) -> None:
        if s.freqs is not None:
            f = np.asarray(s.freqs, dtype=np.float64)
        elif self.freq is not None and s.words is not None:
            f = np.asarray([self.freq.get(w, 0) for w in s.words], dtype=np.float64)
        else:
            self.skipped_["rare_token:no_frequencies"] += 1
            return
        if f.shape != (n,):
            raise ValueError(f"{where}: freqs must have length n={n}, got {f.shape}")
        target = f == f.min()
        if target.all():
            self.skipped_["rare_token:all_tied"] += 1
            return
        self.rare_hits_ += target[am].sum(-1) / target.sum()  # 1/k for each of k tied rarest words
        self.n_rare_ += n

    def _update_induction(self, s: Sentence, A: np.ndarray, n: int, where: str) -> None:
        if s.words is None:
            self.skipped_["induction:no_words"] += 1
            return
        if len(s.words) != n:
            raise ValueError(f"{where}: words must have length n={n}, got {len(s.words)}")
        _, code = np.unique(np.asarray(s.words, dtype=object).astype(str), return_inverse=True)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        earlier = (code[:, None] == code[None, :]) & (j <= i - 2)  # (n, n): j an earlier copy of i
        target = np.zeros((n, n), dtype=bool)
        target[:, 1:] = earlier[:, :-1]  # attend to the word after the copy
        rows = target.any(1)
        if not rows.any():
            self.skipped_["induction:no_repeats"] += 1
            return
        self.ind_sum_ += (A[..., rows, :] * target[rows]).sum((-1, -2))
        self.n_ind_ += int(rows.sum())

    def _update_syntactic(self, s: Sentence, am: np.ndarray, am_in: np.ndarray, n: int, where: str) -> None:
        """am (L, H, n): the word each word attends to most; am_in (L, H, n): the word that attends
        most to each word (argmax of the transposed map)."""
        if s.heads is None or s.deprels is None:
            self.skipped_["syntactic:no_annotation"] += 1
            return
        heads = np.asarray(s.heads)
        if heads.shape != (n,) or len(s.deprels) != n:
            raise ValueError(f"{where}: heads and deprels must have length n={n}, "
                             f"got {heads.shape} and {len(s.deprels)}")
        if heads.dtype.kind not in "iu" or ((heads < -1) | (heads >= n)).any() or (heads == np.arange(n)).any():
            raise ValueError(f"{where}: heads must be ints in [-1, n) and not the word itself, got {heads.tolist()}")
        L, H = self.shape_
        R, K = len(self.config.relations), self.config.baseline_max_offset
        cache = self._rel_cache
        rel = np.array([cache[d] if d in cache else cache.setdefault(d, self._rel_index.get(relation_base(d, self._keep), -1))
                        for d in s.deprels], dtype=np.int64)
        m = (rel >= 0) & (heads >= 0)
        hits = np.zeros((L, H, 2, R), np.float32)
        cnt = np.zeros((2, R))
        base = np.zeros((2, R, 2 * K + 1))
        if m.any():
            dep, hd, r = np.arange(n)[m], heads[m], rel[m]
            onehot = _onehot(r, R)
            # dependent -> head (Clark's "normal"): the dependent's own argmax is its head
            hits[:, :, 0] = (am[..., dep] == hd).astype(np.float32) @ onehot
            # head <- dependent (Clark's "transpose"): the word attending most to the dependent is its head
            hits[:, :, 1] = (am_in[..., dep] == hd).astype(np.float32) @ onehot
            cnt[:] = np.bincount(r, minlength=R)
            k = hd - dep
            ok = np.abs(k) <= K
            np.add.at(base[0], (r[ok], k[ok] + K), 1)
            base[1] = base[0]
        self.syn_hits_ += hits
        self.syn_count_ += cnt
        self.base_hits_ += base
        if self.keep_per_sentence:
            self.per_sentence_.append((hits.astype(np.int16), cnt.astype(np.int32), base.astype(np.int32)))

    # ---------------------------------------------------------------- results
    def _require(self) -> tuple[int, int]:
        if self.shape_ is None:
            raise ValueError("HeadStats: no sentences were added (call update first)")
        return self.shape_

    def baseline(self) -> tuple[np.ndarray, np.ndarray]:
        """Best fixed offset per (direction, relation) and its accuracy, both (2, R) (Clark 2019)."""
        self._require()
        K = self.config.baseline_max_offset
        best = self.base_hits_.argmax(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = np.take_along_axis(self.base_hits_, best[..., None], -1)[..., 0] / self.syn_count_
        return best - K, acc

    def score_arrays(self) -> dict[str, np.ndarray]:
        """All scores as {name: (L, H) float array}; NaN where nothing was counted."""
        L, H = self._require()
        div = lambda a, b: np.divide(a, b, out=np.full(np.shape(a), np.nan), where=np.asarray(b) > 0)  # noqa: E731
        out: dict[str, np.ndarray] = {}
        pos = div(self.pos_hits_, self.pos_den_)
        for j, d in enumerate(self._offsets):
            out[f"positional_share:{_offset_name(d)}"] = pos[..., j]
        out["positional_other"] = div(self.pos_other_, self.n_words_)
        out["attn_to_self"] = div(self.self_sum_, self.n_words_)
        out["previous_token"] = div(self.prev_sum_, self.n_prev_)
        out["entropy"] = div(self.entropy_sum_, self.n_words_)
        out["entropy_normalized"] = div(self.entropy_norm_sum_, self.n_entropy_norm_)
        out["confidence"] = div(self.conf_sum_, self.n_words_)
        out["confidence_full_row"] = div(self.conf_full_sum_, self.n_words_)
        for j, name in enumerate(self.special_names):
            out[f"attn_to_{name}"] = div(self.special_sum_[..., j], self.n_words_)
        out["attn_to_punct"] = div(self.punct_sum_, self.n_punct_words_)
        out["rare_token"] = div(self.rare_hits_, self.n_rare_)
        out["induction"] = div(self.ind_sum_, self.n_ind_)
        _, base_acc = self.baseline()
        for di, dname in enumerate(DIRECTIONS):
            for ri, rel in enumerate(self.config.relations):
                acc = div(self.syn_hits_[:, :, di, ri], np.full((L, H), self.syn_count_[di, ri]))
                out[f"syntactic_acc:{rel}:{dname}"] = acc
                out[f"syntactic_margin:{rel}:{dname}"] = acc - base_acc[di, ri]
        return out

    def _parts(self, score: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-sentence (numerator (S, L, H), denominator (S, 1, 1)) of one role score, whose ratio of
        sums is the score; a syntactic margin's numerator is the head's hits minus the hits of the
        best fixed offset (picked on all sentences, as in `baseline`)."""
        if score.startswith("syntactic_margin:"):
            rel, dname = score[len("syntactic_margin:"):].rsplit(":", 1)
            di, ri = DIRECTIONS.index(dname), self.config.relations.index(rel)
            if not self.per_sentence_:
                return np.zeros((0, *self.shape_)), np.zeros((0, 1, 1))
            best = self.base_hits_[di, ri].argmax()
            hits = np.stack([h[:, :, di, ri] for h, _, _ in self.per_sentence_]).astype(np.float64)
            base = np.array([b[di, ri, best] for _, _, b in self.per_sentence_], dtype=np.float64)
            cnt = np.array([c[di, ri] for _, c, _ in self.per_sentence_], dtype=np.float64)
            return hits - base[:, None, None], cnt[:, None, None]
        names = list(self._role_totals())
        if score not in names:
            raise ValueError(f"HeadStats: no floor check for score {score!r}; checked scores: {names}")
        q = names.index(score)
        if not self.role_parts_:
            return np.zeros((0, *self.shape_)), np.zeros((0, 1, 1))
        num = np.stack([nm[q] for nm, _ in self.role_parts_]).astype(np.float64)
        den = np.array([d[q] for _, d in self.role_parts_], dtype=np.float64)
        return num, den[:, None, None]

    def floor_check(self, score: str, candidates: np.ndarray, floor: float, n_boot: int = 1000,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(passes, ci_low, ci_high), each (L, H): does a head's `score` beat `floor`?

        passes = candidates & (score >= floor + floor_margin) & (ci_low > floor), the interval a
        percentile bootstrap over sentences (`bootstrap_ratio`, level ``floor_ci``, `seed`) of the
        ratio of summed per-sentence parts, computed only for the candidates that pass the point
        margin (NaN elsewhere). A NaN floor passes nothing. Needs ``keep_per_sentence=True``.
        ``n_boot=0`` skips the interval and keeps the point check only (for fast screens such as
        `workbench compare`'s role changes; intervals stay NaN).
        """
        L, H = self._require()
        if not self.keep_per_sentence:
            raise ValueError("HeadStats.floor_check needs keep_per_sentence=True (the bootstrap resamples sentences)")
        point = self.score_arrays()[score]
        low, high = np.full((L, H), np.nan), np.full((L, H), np.nan)
        if not np.isfinite(floor):
            return np.zeros((L, H), bool), low, high
        todo = np.asarray(candidates, bool) & (np.nan_to_num(point, nan=-np.inf) >= floor + self.config.floor_margin)
        if n_boot == 0:
            return todo, low, high
        if todo.any():
            num, den = self._parts(score)
            if len(num):
                flat = np.flatnonzero(todo)
                lo, hi = bootstrap_ratio(num.reshape(len(num), -1)[:, flat],
                                         np.broadcast_to(den.reshape(len(den), 1), (len(den), flat.size)),
                                         n_boot=n_boot, seed=seed, ci=self.config.floor_ci)
                low.flat[flat], high.flat[flat] = lo, hi
        return todo & (np.nan_to_num(low, nan=-np.inf) > floor), low, high

    def roles(self, floors: Mapping[str, float] | None = None, n_boot: int = 1000,
              seed: int = 0) -> tuple[list[list[str]], list[str]]:
        """(roles[l*H+h] sorted list, primary[l*H+h]) from the config thresholds and precedence;
        with `floors` ({score: floor}, `combine_floors`) each role also needs `floor_check` on the
        score it was found with (every family but the exempt "broad")."""
        roles, primary, _ = self._roles(floors, n_boot, seed)
        return roles, primary

    def _roles(self, floors: Mapping[str, float] | None, n_boot: int, seed: int):
        L, H = self._require()
        scores = self.score_arrays()
        intervals: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        found = {}
        for fam, family in ROLE_FAMILIES.items():
            found[fam] = []
            for role, items, strength in family(scores, self):
                mask = np.zeros((L, H), bool)
                for score, m in items:
                    if floors is not None and fam not in FLOOR_EXEMPT:
                        m, lo, hi = self.floor_check(score, m, floors.get(score, np.nan), n_boot, seed)
                        intervals[score] = (lo, hi)
                    mask |= m
                found[fam].append((role, mask, strength))
        roles: list[list[str]] = [[] for _ in range(L * H)]
        primary = ["none"] * (L * H)
        for fam in ROLE_FAMILIES:
            for role, mask, _ in found[fam]:
                for flat in np.flatnonzero(mask):
                    roles[flat].append(role)
        for flat in range(L * H):
            for fam in self.config.precedence:
                cands = [(strength.flat[flat], role) for role, mask, strength in found[fam] if mask.flat[flat]]
                if cands:
                    primary[flat] = max(cands)[1]
                    break
        return [sorted(r) for r in roles], primary, intervals

    def finalize(self, model: str = "model", floor_sources: Mapping[str, Mapping[str, float]] | None = None,
                 n_boot: int = 1000, seed: int = 0) -> "HeadReport":
        """Tables: ``heads`` (model, layer, head, score, value, floor, floor_<source> for each of
        FLOOR_SOURCES, ci_low, ci_high) and ``heads_classes`` (model, layer, head, role, primary); a
        head without a role gets the single row role="none". `floor_sources` ({source: {score:
        value}}, see `floor_scores`) turns the floor check on; the floors are NaN without it, and
        ci_low / ci_high are filled only where `floor_check` computed them."""
        L, H = self._require()
        layer, head = np.divmod(np.arange(L * H), H)
        floors = None if floor_sources is None else combine_floors(floor_sources)
        roles, primary, intervals = self._roles(floors, n_boot, seed)
        nan = np.full(L * H, np.nan)
        frames = []
        for name, arr in self.score_arrays().items():
            lo, hi = intervals.get(name, (nan, nan))
            cols = {"model": model, "layer": layer, "head": head, "score": name, "value": arr.reshape(-1),
                    "floor": (floors or {}).get(name, np.nan)}
            for src in FLOOR_SOURCES:
                cols[f"floor_{src}"] = (floor_sources or {}).get(src, {}).get(name, np.nan)
            frames.append(pd.DataFrame({**cols, "ci_low": np.reshape(lo, -1), "ci_high": np.reshape(hi, -1)}))
        rows = [(model, int(layer[f]), int(head[f]), role, role == primary[f])
                for f in range(L * H) for role in (roles[f] or ["none"])]
        self._warn_missing_relations()
        return HeadReport(pd.concat(frames, ignore_index=True),
                          pd.DataFrame(rows, columns=["model", "layer", "head", "role", "primary"]),
                          dict(self.skipped_))

    def _warn_missing_relations(self) -> None:
        if self.skipped_["syntactic:no_annotation"] == self.n_sentences_:
            return
        missing = [r for ri, r in enumerate(self.config.relations) if self.syn_count_[0, ri] == 0]
        if missing:
            warnings.warn(f"HeadStats: relations absent from the corpus (count 0): {missing}", stacklevel=3)


# ---------------------------------------------------------------- attention weightings
# The head tables of `workbench heads` carry a column `weighting`: "raw" (attention probabilities) or
# "norm" (Kobayashi et al. 2020's alpha_ij ||f_h(x_j)||, renormalised per row; workbench.store.extraction).
# Tables written before the column, and rows upserted beside newer ones, are raw.
WEIGHTING_COLUMN, DEFAULT_WEIGHTING = "weighting", "raw"


def with_weighting(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with a `weighting` column: tables written before norm-weighted attention have none, and
    rows upserted beside newer ones have None there; both are "raw"."""
    if WEIGHTING_COLUMN not in df.columns:
        return df.assign(**{WEIGHTING_COLUMN: DEFAULT_WEIGHTING})
    if df[WEIGHTING_COLUMN].isna().any():
        return df.assign(**{WEIGHTING_COLUMN: df[WEIGHTING_COLUMN].fillna(DEFAULT_WEIGHTING)})
    return df


def weighting_rows(df: pd.DataFrame, weighting: str = DEFAULT_WEIGHTING) -> pd.DataFrame:
    """The rows of one attention weighting of a head table (heads, heads_classes, relations,
    head_similarity); a table without the column is all "raw"."""
    df = with_weighting(df)
    return df[df[WEIGHTING_COLUMN] == weighting]


def table_weightings(df: pd.DataFrame | None) -> list[str]:
    """The weightings present in a head table, "raw" first; ["raw"] for a table without the column."""
    if df is None or not len(df):
        return []
    present = set(with_weighting(df)[WEIGHTING_COLUMN])
    return [w for w in (DEFAULT_WEIGHTING,) if w in present] + sorted(present - {DEFAULT_WEIGHTING})


@dataclass(frozen=True)
class HeadReport:
    heads: pd.DataFrame        # model, layer, head, score, value
    classes: pd.DataFrame      # model, layer, head, role, primary
    skipped: dict = field(default_factory=dict)


def _offset_name(d: int) -> str:
    return "self" if d == 0 else f"{d:+d}"


# ---------------------------------------------------------------- floors
# Heads with no mechanism, scored on the same sentences as the model (module docstring, "Floors"):
FLOOR_SOURCES = ("uniform", "random_argmax", "random_init")
HEAD_COLUMNS = ["model", "layer", "head", "score", "value", "floor", *(f"floor_{s}" for s in FLOOR_SOURCES),
                "ci_low", "ci_high"]  # the `heads` table (docs/design.md)
FLOOR_EXEMPT = ("broad",)  # the role of heads that attend like the uniform one: floor stored, not enforced


def is_role_score(score: str) -> bool:
    """Whether a role is found on this `heads` score (and so checked against its floor; broad's
    entropy_normalized is stored beside its floor but exempt): positional shares on words,
    previous_token, attention to a special token or punctuation, rare_token, induction (also the
    synthetic ``induction:repeated_random``), entropy_normalized and the syntactic margins."""
    if score.startswith("positional_share:"):
        return not score.endswith(":tokens")
    if score.startswith("attn_to_"):
        return score != "attn_to_self"
    return score.startswith("syntactic_margin:") or score in (
        "previous_token", "rare_token", "induction", "induction:repeated_random", "entropy_normalized")


def null_heads(pieces: Sequence[int], special_pieces: Sequence[int], draws: int = 8, seed: int = 0,
               **annotation) -> Sentence:
    """A `Sentence` of n = len(pieces) words whose attention is 1 + `draws` heads with no mechanism,
    (1, 1 + draws, n, n), with the given `annotation` (heads, deprels, upos, punct, freqs, words, sid).

    Head 0 is **uniform over the sentence's tokens**: a token row of 1/T over all T tokens (the
    words' subword pieces, ``pieces`` (n,), and the special tokens, ``special_pieces`` (k,) per
    special kind) converted to words as the store converts real maps (Clark et al. 2019: attention to
    a word sums over its pieces, from a word averages over them), i.e. row i = pieces / T, special
    shares special_pieces / T. Its argmax is the word with the most pieces (ties to the lowest
    index), which is why long, rare words win without any mechanism. Heads 1.. are **random-argmax**
    heads: rows uniform over the words times (1 + 1e-3 u), u ~ U(0, 1) (seeded), so each row's argmax
    is uniform over the words, no specials. With the model's sentences' annotation these heads are
    scored exactly as the model's are.
    """
    c = np.asarray(pieces, dtype=np.float64)
    n = c.size
    sp = np.asarray(special_pieces, dtype=np.float64).reshape(-1)
    if c.ndim != 1 or (c < 1).any() or (sp < 0).any():
        raise ValueError(f"null_heads: pieces must be (n={n},) counts >= 1 and special_pieces >= 0, "
                         f"got {c.tolist()} and {sp.tolist()}")
    T = c.sum() + sp.sum()
    attn = np.zeros((1, 1 + draws, n, n), np.float32)
    special = np.zeros((1, 1 + draws, n, sp.size), np.float32)
    attn[0, 0] = c / T
    special[0, 0] = sp / T
    u = 1.0 + 1e-3 * np.random.default_rng(seed).random((draws, n, n))
    attn[0, 1:] = u / u.sum(-1, keepdims=True)
    return Sentence(attn, special, **annotation)


def floor_scores(stats: HeadStats, heads: np.ndarray | None = None, how: str = "mean") -> dict[str, float]:
    """{score: floor} from the null heads of `stats`: of the (L, H) heads selected by the bool mask
    `heads` (all if None), the mean score (``how="mean"``: a sample of random-argmax heads) or the
    largest (``how="max"``: the heads of a random-initialisation model). NaN where none counted."""
    reduce = {"mean": np.nanmean, "max": np.nanmax}
    if how not in reduce:
        raise ValueError(f"floor_scores: how={how!r}, use one of {sorted(reduce)}")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN scores
        for name, arr in stats.score_arrays().items():
            vals = arr if heads is None else arr[np.asarray(heads, bool)]
            out[name] = float(reduce[how](vals)) if np.size(vals) else float("nan")
    return out


def combine_floors(sources: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{score: the largest floor over the sources (NaNs ignored)}; a syntactic margin's floor is at
    least 0, the fixed-offset baseline it is measured against. Sources must be from FLOOR_SOURCES."""
    unknown = set(sources) - set(FLOOR_SOURCES)
    if unknown:
        raise ValueError(f"combine_floors: unknown floor sources {sorted(unknown)}; valid: {FLOOR_SOURCES}")
    out: dict[str, float] = {}
    for vals in sources.values():
        for name, v in vals.items():
            if np.isfinite(v):
                out[name] = max(out.get(name, -np.inf), float(v))
    for name in list(out) + [k for vals in sources.values() for k in vals]:
        if name.startswith("syntactic_margin:"):
            out[name] = max(out.get(name, 0.0), 0.0)
    return out


# ---------------------------------------------------------------- role registry
# Each family maps (scores, stats) -> [(role, [(score, mask (L, H) bool)], strength (L, H))]: a head
# has the role if it passes the threshold on any of the listed scores (and, with floors, that
# score's floor check); strength orders roles of one family when choosing the primary role.
def _ge(a: np.ndarray, t: float) -> np.ndarray:
    return np.nan_to_num(a, nan=-np.inf) >= t


def _syntactic_roles(scores: dict, st: HeadStats) -> list:
    cfg, out = st.config, []
    for ri, rel in enumerate(cfg.relations):
        names = [f"syntactic_margin:{rel}:{d}" for d in DIRECTIONS]
        margins = [np.where(st.syn_count_[di, ri] >= max(cfg.syntactic_min_count, 1),
                            np.nan_to_num(scores[name], nan=-np.inf), -np.inf) for di, name in enumerate(names)]
        out.append((f"syntactic:{rel}", [(name, m >= cfg.syntactic_margin) for name, m in zip(names, margins)],
                    np.maximum(*margins)))
    return out


def _positional_roles(scores: dict, st: HeadStats) -> list:
    out = []
    for d in st._offsets:
        name = f"positional_share:{_offset_name(d)}"
        out.append((f"positional:{_offset_name(d)}", [(name, _ge(scores[name], st.config.positional))], scores[name]))
    return out


def _sink_roles(scores: dict, st: HeadStats) -> list:
    return [(f"{name}_sink", [(f"attn_to_{name}", _ge(scores[f"attn_to_{name}"], st.config.sink))],
             scores[f"attn_to_{name}"]) for name in (*st.special_names, "punct")]


def _single(score: str, threshold: str, role: str | None = None) -> Callable:
    def family(scores: dict, st: HeadStats) -> list:
        return [(role or score, [(score, _ge(scores[score], getattr(st.config, threshold)))], scores[score])]
    return family


ROLE_FAMILIES: dict[str, Callable] = {
    "syntactic": _syntactic_roles,
    "induction": _single("induction", "induction"),
    "rare_token": _single("rare_token", "rare_token"),
    "positional": _positional_roles,
    "previous_token": _single("previous_token", "previous_token"),
    "sink": _sink_roles,
    "broad": _single("entropy_normalized", "broad", "broad"),
}


# ---------------------------------------------------------------- honest relation statistics
RELATION_COLUMNS = ["model", "relation", "direction", "best_layer", "best_head", "dev_acc", "test_acc",
                    "ci_low", "ci_high", "baseline_offset", "baseline_acc", "n_dev", "n_test"]


def _stats_of(sentences, config: HeadConfig, special_names, keep: bool) -> HeadStats:
    if isinstance(sentences, HeadStats):
        if keep and not sentences.keep_per_sentence:
            raise ValueError("test HeadStats must be built with keep_per_sentence=True for the bootstrap")
        return sentences
    st = HeadStats(config, special_names=special_names, keep_per_sentence=keep)
    for s in sentences:
        st.update(s)
    return st


def bootstrap_ratio(hits: np.ndarray, counts: np.ndarray, n_boot: int = 1000, seed: int = 0,
                    ci: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of sum(hits) / sum(counts), resampling sentences with replacement.

    hits, counts: (S, Q) per-sentence numerators and denominators for Q quantities at once.
    Returns (low, high), each (Q,); NaN where a quantity was never counted.
    """
    S = hits.shape[0]
    rng = np.random.default_rng(seed)
    w = rng.multinomial(S, np.full(S, 1.0 / S), size=n_boot).astype(np.float64)  # (B, S) draw counts
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = (w @ hits) / (w @ counts)  # (B, Q)
    alpha = (1 - ci) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        return np.nanquantile(acc, alpha, axis=0), np.nanquantile(acc, 1 - alpha, axis=0)


def best_heads_per_relation(dev_sentences, test_sentences, model: str = "model",
                            config: HeadConfig | None = None, special_names: Sequence[str] = ("cls", "sep"),
                            n_boot: int = 1000, seed: int = 0, ci: float = 0.95) -> pd.DataFrame:
    """Best head per (relation, direction) picked on dev, scored on test (the ``relations`` table).

    Clark et al. 2019 sec. 4.2 report the best head's accuracy on the data it was chosen on; here the
    head *and* the fixed-offset baseline k are chosen on dev only, and both are reported on test, with
    a percentile bootstrap CI over test sentences (seeded). Inputs are iterables of `Sentence` (or a
    `HeadStats`; the test one built with keep_per_sentence=True). Relations absent from dev or test
    get count 0, NaN accuracies, best_layer = best_head = baseline_offset = -1 and a warning.
    """
    config = config if config is not None else HeadConfig()
    dev = _stats_of(dev_sentences, config, special_names, keep=False)
    test = _stats_of(test_sentences, config, special_names, keep=True)
    L, H = dev._require()
    if test._require() != (L, H):
        raise ValueError(f"dev has (layers, heads) {(L, H)} but test has {test.shape_}")
    R, K = len(config.relations), config.baseline_max_offset
    with np.errstate(invalid="ignore", divide="ignore"):
        dev_acc = dev.syn_hits_ / dev.syn_count_  # (L, H, 2, R)
    flat = np.nan_to_num(dev_acc, nan=-1.0).reshape(L * H, 2, R).argmax(0)  # (2, R) first best head
    base_off = dev.base_hits_.argmax(-1)  # (2, R) index into -K..K
    kept = test.per_sentence_
    if kept:
        hits_s = np.stack([h for h, _, _ in kept])  # (S, L, H, 2, R) int16
        cnt_s = np.stack([c for _, c, _ in kept]).astype(np.float64)   # (S, 2, R)
        base_s = np.stack([b for _, _, b in kept]).astype(np.float64)  # (S, 2, R, 2K+1)
    else:
        hits_s, cnt_s, base_s = np.zeros((0, L, H, 2, R)), np.zeros((0, 2, R)), np.zeros((0, 2, R, 2 * K + 1))
    li, hi = np.divmod(flat, H)
    d_idx, r_idx = np.meshgrid(np.arange(2), np.arange(R), indexing="ij")
    picked = hits_s[:, li, hi, d_idx, r_idx].reshape(len(kept), 2 * R).astype(np.float64)  # (S, 2R) chosen head
    counts = cnt_s.reshape(len(kept), 2 * R)
    if len(kept):
        low, high = bootstrap_ratio(picked, counts, n_boot=n_boot, seed=seed, ci=ci)
    else:
        low = high = np.full(2 * R, np.nan)
    base_test = base_s[:, d_idx, r_idx, base_off].sum(0)  # (2, R)
    rows, missing = [], []
    for di, dname in enumerate(DIRECTIONS):
        for ri, rel in enumerate(config.relations):
            nd, nt, q = int(dev.syn_count_[di, ri]), int(test.syn_count_[di, ri]), di * R + ri
            if nd == 0 or nt == 0:
                missing.append(f"{rel}:{dname}")
            have = nd > 0
            rows.append([model, rel, dname, int(li[di, ri]) if have else -1, int(hi[di, ri]) if have else -1,
                         float(dev_acc[li[di, ri], hi[di, ri], di, ri]) if have else np.nan,
                         picked[:, q].sum() / nt if have and nt else np.nan,
                         float(low[q]) if have and nt else np.nan, float(high[q]) if have and nt else np.nan,
                         int(base_off[di, ri] - K) if have else -1,
                         base_test[di, ri] / nt if have and nt else np.nan, nd, nt])
    if missing:
        warnings.warn(f"best_heads_per_relation: no dev or test cases for {missing}; reported with count 0",
                      stacklevel=2)
    return pd.DataFrame(rows, columns=RELATION_COLUMNS)
