"""Which of two sentences does a language model prefer? Sentence scores for minimal pairs, one exact
definition per model kind (docs/behaviour.md "Scoring").

A pair (good words, bad words, critical word index) is scored as (s_good, s_bad); the model prefers
the grammatical sentence when s_good > s_bad. Sentences are pre-split words, turned into subword ids
by the tokenizer's `encode_words` (the activation store's rule: specials included, [CLS] .. [SEP] for
WordPiece, a BOS for byte-level BPE, words after the first with a leading space). The *body* is the
tokens inside the word spans (no specials); log-probabilities are natural logs, summed over tokens.

| scorer | kinds | s(sentence) | paper |
|---|---|---|---|
| `clm` | decoder | sum_t log p(x_t \\| x_<t), t over the body, BOS as context | Marvin & Linzen 2018 |
| `pll` | encoder (trained MLM head) | sum_t log p(x_t \\| x_\\t), each body token masked alone | Salazar et al. 2020, "Masked Language Model Scoring" |
| `pll_word_l2r` | encoder | as `pll`, and the pieces of the same word right of t masked too | Kauf & Ivanova 2023, "A Better Way to Do Masked Language Model Scoring" |
| `masked_word` | encoder | log p(w \\| context) of the critical word alone masked, good vs bad form; single-piece contrasts only (else NaN) | Goldberg 2019, "Assessing BERT's Syntactic Abilities" |
| `rtd` | encoder with an RTD head (ELECTRA) | sum_t log sigmoid(-d_t): every body token judged original | Clark et al. 2020 (our use of the discriminator) |
| `bilm` | bilm, tbilm | forward sum_t log p(x_t \\| x_<t) + backward sum_t log p(x_t \\| x_>t), [CLS]/[SEP] as context | Peters et al. 2018 |
| `xlnet_l2r` | xlnet | sum_t log p(x_t \\| x_<t) under the left-to-right factorisation order, [CLS] and [SEP] in the context | Yang et al. 2019 |
| `t5_target` | seq2seq with sentinels | encoder reads [CLS] <extra_id_0> [SEP] (an imported T5: <extra_id_0> </s>, the tokenizer's own wrap); sum of log p of the body in the target <extra_id_0> body [SEP] (</s>) | Raffel et al. 2020 |
| `t5_sentinel` | seq2seq with sentinels | the critical word's pieces behind <extra_id_0> in the input (T5's own span corruption of that word); log p of its pieces and the closing sentinel in the target | Raffel et al. 2020 |
| `bart_target` | seq2seq without sentinels | encoder reads [CLS] [MASK] [SEP] (BART's <s> <mask> </s>; the body as one infilled span); sum of log p of the body in the target [CLS] body [SEP] | Lewis et al. 2020 |

`KIND_SCORERS` maps a model kind to its scorers; each `Scorer` also says whether it applies to a
given model and tokenizer (an RTD head, sentinels in the vocabulary), so no caller branches on a kind.
Rows are batched by equal length (no padding, hence no attention mask and exact scores), at most
`batch_tokens` tokens per forward.

The masked-LM scorers (`pll`, `pll_word_l2r`, `masked_word`) are plans of look-ups, each a masked row,
the position read and the target ids there (`MaskedPlan`); `masked_logp` runs one forward per distinct
(row, position), so look-ups that coincide share it: `score_pairs_together` pools the plans of several
scorers, where PLL and PLL-word-l2r mask the same row at every single-piece word and at a word's last
piece, and the masked-word row is PLL's row at a single-piece critical word (the same in the good and
the bad sentence).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmodels.tokenizer import Tokenizer, WordEncoding
from plmodels.training.data import sentinel_ids
from plmodels.training.denoising import t5_span_corruption
from plmodels.training.plm import permutation_batch

Pair = tuple[Sequence[str], Sequence[str], int]  # (good words, bad words, critical word index)
BATCH_TOKENS = 8192


def _body(enc: WordEncoding) -> tuple[int, int]:
    return enc.word_spans[0][0], enc.word_spans[-1][1]


def _wrap(tok: Tokenizer) -> tuple[list[int], list[int], int]:
    """(ids before, ids after, the end-of-sequence id) of a sequence as the checkpoint's tokenizer wraps
    it (`Tokenizer.special_affixes`): [CLS] .. [SEP] for the workbench's own seq2seq models, <s> .. </s>
    for an imported BART, .. </s> for an imported T5 (whose tokenizer has no [CLS] or [SEP] role)."""
    before, after = tok.special_affixes
    if not after:
        raise ValueError("seq2seq scoring needs a tokenizer that ends a sequence with a special token "
                         "([SEP] or </s>); this one adds none")
    return before, after, after[-1]


def _equal_length_batches(rows: list[list[int]], batch_tokens: int) -> list[list[int]]:
    """Indices of `rows` grouped by length, each group cut to at most batch_tokens tokens."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_len[len(r)].append(i)
    out = []
    for T, idx in sorted(by_len.items()):
        step = max(1, batch_tokens // max(T, 1))
        out += [idx[k:k + step] for k in range(0, len(idx), step)]
    return out


# ---------------------------------------------------------------- sentence scorers (one score each)
@torch.no_grad()
def clm_scores(model: nn.Module, encs: list[WordEncoding], batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """Causal LM: sum over body tokens of log p(x_t | x_<t) (the token before the body is context)."""
    out = np.zeros(len(encs))
    for idx in _equal_length_batches([e.ids for e in encs], batch_tokens):
        ids = torch.tensor([encs[i].ids for i in idx])
        logp = torch.log_softmax(model(ids).logits.float(), -1)  # (B, T, V)
        for b, i in enumerate(idx):
            s, e = _body(encs[i])
            if s == 0:
                raise ValueError("clm scoring needs a context token before the first word (a BOS); "
                                 "the tokenizer adds none")
            out[i] = float(logp[b, torch.arange(s - 1, e - 1), ids[b, s:e]].sum())
    return out


Query = tuple[tuple[int, ...], int, tuple[int, ...]]  # (ids with [MASK]s, the position read, the target ids there)


@dataclass(frozen=True)
class MaskedPlan:
    """The masked-LM look-ups a scorer needs (`queries`) and how their log-probabilities make its (N, 2)
    pair scores (`finish`: one (K,) array a query, the log p of its K target ids, in query order)."""

    queries: list[Query]
    finish: Callable[[list[np.ndarray]], np.ndarray]


def _pll_queries(encs: list[WordEncoding], mask_id: int, within_word_l2r: bool) -> tuple[list[Query], list[int]]:
    """One query per body token: (ids with that token masked [and its word's later pieces], its position,
    its id), and the sentence each belongs to."""
    queries, owner = [], []
    for i, e in enumerate(encs):
        for s, t in e.word_spans:
            for p in range(s, t):
                ids = list(e.ids)
                for q in range(p, t if within_word_l2r else p + 1):
                    ids[q] = mask_id
                queries.append((tuple(ids), p, (e.ids[p],)))
                owner.append(i)
    return queries, owner


def masked_logp(model: nn.Module, queries: Sequence[Query], batch_tokens: int = BATCH_TOKENS) -> list[np.ndarray]:
    """log p(each target id | row) at each query's position, (K,) a query: one forward per distinct
    (row, position), all the target ids asked of it read off that forward."""
    keys: dict[tuple[tuple[int, ...], int], int] = {}
    columns: list[dict[int, int]] = []  # per distinct (row, position): target id -> its column
    for row, p, targets in queries:
        k = keys.setdefault((row, p), len(keys))
        if k == len(columns):
            columns.append({})
        for t in targets:
            columns[k].setdefault(t, len(columns[k]))
    if not keys:
        return [np.zeros(len(q[2])) for q in queries]
    K = max(len(c) for c in columns)
    ids = [list(c) + [next(iter(c))] * (K - len(c)) for c in columns]  # ragged target lists padded by repeats
    logp = _mlm_logp_at(model, [list(r) for r, _ in keys], [p for _, p in keys], ids, batch_tokens)  # (D, K)
    out = []
    for row, p, targets in queries:
        k = keys[(row, p)]
        out.append(logp[k, [columns[k][t] for t in targets]])
    return out


@torch.no_grad()
def _mlm_logp_at(model: nn.Module, rows: list[list[int]], pos: list[int], targets: list[int] | list[tuple[int, ...]],
                 batch_tokens: int) -> np.ndarray:
    """log p(targets[r] at pos[r] | rows[r]) for each row, with the MLM head, exact (no padding): (N,) for
    one target id a row, (N, K) for K ids a row, all read off the same forward."""
    if not rows:
        return np.zeros(0)
    cols = np.asarray(targets, dtype=np.int64).reshape(len(rows), -1)   # (N, K)
    out = np.zeros(cols.shape)
    for idx in _equal_length_batches(rows, batch_tokens):
        ids = torch.tensor([rows[r] for r in idx])
        select = torch.zeros_like(ids, dtype=torch.bool)
        select[torch.arange(len(idx)), torch.tensor([pos[r] for r in idx])] = True
        logits = model.mlm_logits(model.masked_hidden(ids, select))  # (B, V): one selected position a row
        logp = torch.log_softmax(logits.float(), -1)                 # (B, V)
        out[idx] = logp.gather(-1, torch.from_numpy(cols[idx])).numpy()
    return out if np.ndim(targets[0]) else out[:, 0]


def _sum_by_sentence(logps: list[np.ndarray], owner: list[int], n: int) -> np.ndarray:
    weights = np.array([float(x[0]) for x in logps])
    return np.bincount(np.asarray(owner, dtype=np.int64), weights=weights, minlength=n)


def pll_scores(model: nn.Module, encs: list[WordEncoding], mask_id: int, within_word_l2r: bool = False,
               batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """Pseudo-log-likelihood (Salazar et al. 2020; `within_word_l2r`: Kauf & Ivanova 2023's PLL-word-l2r)."""
    queries, owner = _pll_queries(encs, mask_id, within_word_l2r)
    return _sum_by_sentence(masked_logp(model, queries, batch_tokens), owner, len(encs))


def _distinct_sentences(pairs: Sequence[Pair]) -> tuple[list[list[str]], Callable[[np.ndarray], np.ndarray]]:
    """The distinct sentences of the pairs, and the map from their (S,) scores to the pairs' (N, 2)."""
    sents = sorted({tuple(w) for g, b, _ in pairs for w in (g, b)})
    index = {s: i for i, s in enumerate(sents)}
    at = np.array([[index[tuple(g)], index[tuple(b)]] for g, b, _ in pairs], dtype=np.int64).reshape(-1, 2)
    return [list(s) for s in sents], lambda scores: np.asarray(scores, dtype=float)[at]


def pll_plan(tok: Tokenizer, pairs: Sequence[Pair], within_word_l2r: bool) -> MaskedPlan:
    """`pll_scores` of the pairs' distinct sentences as a plan of look-ups."""
    sents, to_pairs = _distinct_sentences(pairs)
    encs = tok.encode_words_batch(sents)
    queries, owner = _pll_queries(encs, tok.mask_id, within_word_l2r)
    return MaskedPlan(queries, lambda logps: to_pairs(_sum_by_sentence(logps, owner, len(encs))))


@torch.no_grad()
def rtd_scores(model: nn.Module, encs: list[WordEncoding], batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """ELECTRA's discriminator: sum over body tokens of log P(original) = log sigmoid(-logit)."""
    out = np.zeros(len(encs))
    for idx in _equal_length_batches([e.ids for e in encs], batch_tokens):
        ids = torch.tensor([encs[i].ids for i in idx])
        logits = model.rtd_logits(model(ids).last_hidden_state).float()  # (B, T)
        for b, i in enumerate(idx):
            s, e = _body(encs[i])
            out[i] = float(F.logsigmoid(-logits[b, s:e]).sum())
    return out


@torch.no_grad()
def bilm_scores(model: nn.Module, encs: list[WordEncoding], batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """biLM: forward LM log p(x_t | x_<t) plus backward LM log p(x_t | x_>t), summed over body tokens."""
    out = np.zeros(len(encs))
    P = model.config.d_proj
    for idx in _equal_length_batches([e.ids for e in encs], batch_tokens):
        ids = torch.tensor([encs[i].ids for i in idx])
        h = model(ids).last_hidden_state  # (B, T, 2P): [forward; backward]
        fwd = torch.log_softmax(model.lm_logits(h[..., :P]).float(), -1)  # state t predicts t+1
        bwd = torch.log_softmax(model.lm_logits(h[..., P:]).float(), -1)  # state t predicts t-1
        for b, i in enumerate(idx):
            s, e = _body(encs[i])
            if s == 0 or e == len(encs[i].ids):
                raise ValueError("bilm scoring needs a context token on both sides of the body ([CLS] .. [SEP])")
            t = torch.arange(s, e)
            out[i] = float(fwd[b, t - 1, ids[b, t]].sum() + bwd[b, t + 1, ids[b, t]].sum())
    return out


@torch.no_grad()
def xlnet_l2r_scores(model: nn.Module, encs: list[WordEncoding], batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """XLNet, left-to-right: the factorisation order is the specials, then the body left to right, and
    every body token is a target (one forward: the query stream at target t sees the content of the
    specials and of the body before t; `plmodels.training.plm.permutation_batch` builds the masks)."""
    out = np.zeros(len(encs))
    for idx in _equal_length_batches([e.ids for e in encs], batch_tokens):
        T = len(encs[idx[0]].ids)
        s, e = _body(encs[idx[0]])
        ids = torch.tensor([encs[i].ids for i in idx])
        order = torch.tensor([p for p in range(T) if not s <= p < e] + list(range(s, e)))
        predictable = torch.zeros_like(ids, dtype=torch.bool)
        predictable[:, s:e] = True
        pb = permutation_batch(ids, n_predict=e - s, order=order, predictable=predictable)
        logits = model(ids, perm_mask=pb.perm_mask, target_mapping=pb.target_mapping).logits  # (B, P, V)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, pb.labels[..., None])[..., 0]  # (B, P)
        out[idx] = logp.sum(1).numpy()
    return out


@torch.no_grad()
def _seq2seq_target_logp(model: nn.Module, inputs: list[list[int]], targets: list[list[int]], start_id: int,
                         scored: list[list[bool]], batch_tokens: int) -> np.ndarray:
    """sum of log p(target_t) over the scored target positions, teacher forcing from `start_id`.
    Rows are grouped by (input length, target length), so no padding."""
    out = np.zeros(len(inputs))
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in range(len(inputs)):
        groups[(len(inputs[i]), len(targets[i]))].append(i)
    for (Te, Td), members in sorted(groups.items()):
        step = max(1, batch_tokens // (Te + Td))
        for k in range(0, len(members), step):
            idx = members[k:k + step]
            x = torch.tensor([inputs[i] for i in idx])
            y = torch.tensor([targets[i] for i in idx])
            dec = torch.cat([torch.full((len(idx), 1), start_id), y[:, :-1]], 1)
            logp = torch.log_softmax(model(x, decoder_input_ids=dec).logits.float(), -1)
            tok = logp.gather(-1, y[..., None])[..., 0]  # (B, Td)
            mask = torch.tensor([scored[i] for i in idx])
            out[idx] = (tok * mask).sum(1).numpy()
    return out


def t5_target_scores(model: nn.Module, encs: list[WordEncoding], tok: Tokenizer,
                     batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """T5: the whole body as one noise span; log p of the body in the target <extra_id_0> body [SEP]
    (the encoder reads <extra_id_0> in the tokenizer's wrap: [CLS] .. [SEP], or T5's .. </s>)."""
    x0 = sentinel_ids(tok, 1)[0]
    before, after, end = _wrap(tok)
    inputs, targets, scored = [], [], []
    for e in encs:
        s, t = _body(e)
        body = list(e.ids[s:t])
        inputs.append(before + [x0] + after)
        targets.append([x0] + body + [end])
        scored.append([False] + [True] * len(body) + [False])
    return _seq2seq_target_logp(model, inputs, targets, tok.pad_id, scored, batch_tokens)  # t5_batch starts from [PAD]


def bart_target_scores(model: nn.Module, encs: list[WordEncoding], tok: Tokenizer,
                       batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """BART: the body infilled from one [MASK]; log p of the body in the target [CLS] body [SEP]
    (the decoder starts from [SEP], BART's </s>, as bart_batch trains it)."""
    before, after, end = _wrap(tok)
    inputs, targets, scored = [], [], []
    for e in encs:
        s, t = _body(e)
        inputs.append(before + [tok.mask_id] + after)
        targets.append(list(e.ids))
        scored.append([s <= p < t for p in range(len(e.ids))])
    return _seq2seq_target_logp(model, inputs, targets, end, scored, batch_tokens)


# ---------------------------------------------------------------- pair scorers (need both sentences)
def masked_word_plan(tok: Tokenizer, pairs: Sequence[Pair]) -> MaskedPlan:
    """Goldberg 2019: the critical word masked (one [MASK]), log p(good form) vs log p(bad form) at
    that position, both read off one forward; NaN for pairs where either form is not a single piece
    in its sentence."""
    queries, which = [], []
    for k, (g, b, c) in enumerate(pairs):
        eg, eb = tok.encode_words_batch([list(g), list(b)])
        (s, t), (s2, t2) = eg.word_spans[c], eb.word_spans[c]
        if t - s != 1 or t2 - s2 != 1:
            continue
        ids = list(eg.ids)
        ids[s] = tok.mask_id
        queries.append((tuple(ids), s, (eg.ids[s], eb.ids[s])))
        which.append(k)

    def finish(logps: list[np.ndarray]) -> np.ndarray:
        out = np.full((len(pairs), 2), np.nan)
        if which:
            out[which] = np.stack(logps)
        return out
    return MaskedPlan(queries, finish)


def masked_word_pairs(model: nn.Module, tok: Tokenizer, pairs: Sequence[Pair],
                      batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """(N, 2) `masked_word_plan` scores: one forward a single-piece pair, NaN for the others."""
    plan = masked_word_plan(tok, pairs)
    return plan.finish(masked_logp(model, plan.queries, batch_tokens))


def t5_sentinel_pairs(model: nn.Module, tok: Tokenizer, pairs: Sequence[Pair],
                      batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """T5 with the critical word behind a sentinel: T5's own span corruption of the body with the
    word's pieces as the one noise span (the encoder reads the rest, [CLS] first); log p of the
    target tokens from the word's first piece to the sentinel after it (the word and where it ends)."""
    sentinels = sentinel_ids(tok, 2)
    before, _, end = _wrap(tok)
    inputs, targets, scored = [], [], []
    for g, b, c in pairs:
        for words in (g, b):
            e = tok.encode_words(list(words))
            s, t = _body(e)
            ws, we = e.word_spans[c]
            body = torch.tensor(e.ids[s:t])
            noise = torch.zeros(len(body), dtype=torch.bool)
            noise[ws - s:we - s] = True
            cor = t5_span_corruption(body, noise_mask=noise, sentinel_ids=sentinels, eos_id=end)
            y = cor.targets.tolist()
            first = 1 if y[0] in sentinels else 0  # the sentinel that stands for the kept text before the word
            inputs.append(before + cor.inputs.tolist())
            targets.append(y)
            scored.append([first <= p <= first + (we - ws) and p < len(y) - 1 for p in range(len(y))])
    logp = _seq2seq_target_logp(model, inputs, targets, tok.pad_id, scored, batch_tokens)
    return logp.reshape(len(pairs), 2)


# ---------------------------------------------------------------- the registry
SentenceFn = Callable[[nn.Module, list[WordEncoding], Tokenizer, int], np.ndarray]


@dataclass(frozen=True)
class Scorer:
    """A scoring rule: its name, whether it applies to a model and tokenizer, and one of a sentence
    scorer (called on the distinct sentences), a pair scorer (called on the pairs) or a masked-LM plan
    of the pairs (`MaskedPlan`, whose look-ups `score_pairs_together` pools across scorers)."""

    name: str
    applies: Callable[[nn.Module, Tokenizer], bool]
    sentence: SentenceFn | None = None
    pair: Callable[[nn.Module, Tokenizer, Sequence[Pair], int], np.ndarray] | None = None
    needs_lm_head: bool = True  # False: reads no LM head (ELECTRA's RTD head)
    # a masked-LM plan of the pairs (`MaskedPlan`): its look-ups can share forwards with other scorers'
    masked: Callable[[Tokenizer, Sequence[Pair]], MaskedPlan] | None = None

    def score_pairs(self, model: nn.Module, tok: Tokenizer, pairs: Sequence[Pair],
                    batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
        """(N, 2) scores (good, bad) of the pairs; NaN where the rule does not apply to a pair."""
        if self.masked is not None:
            plan = self.masked(tok, pairs)
            return plan.finish(masked_logp(model, plan.queries, batch_tokens))
        if self.pair is not None:
            return self.pair(model, tok, pairs, batch_tokens)
        sents, to_pairs = _distinct_sentences(pairs)
        return to_pairs(self.sentence(model, tok.encode_words_batch(sents), tok, batch_tokens))


def score_pairs_together(model: nn.Module, tok: Tokenizer, pairs: Sequence[Pair], scorers: Sequence[Scorer],
                         batch_tokens: int = BATCH_TOKENS) -> dict[str, np.ndarray]:
    """{scorer name: (N, 2) scores} as each `Scorer.score_pairs` gives them, with the masked-LM scorers'
    look-ups pooled: a forward that several of them need (PLL and PLL-word-l2r at a single-piece word,
    the masked word and PLL at a single-piece critical word) runs once."""
    plans = {s.name: s.masked(tok, pairs) for s in scorers if s.masked is not None}
    out: dict[str, np.ndarray] = {}
    if len(plans) > 1:
        logps = masked_logp(model, [q for plan in plans.values() for q in plan.queries], batch_tokens)
        k = 0
        for name, plan in plans.items():
            out[name] = plan.finish(logps[k:k + len(plan.queries)])
            k += len(plan.queries)
    return {s.name: out[s.name] if s.name in out else s.score_pairs(model, tok, pairs, batch_tokens) for s in scorers}


def _has_sentinels(tok: Tokenizer) -> bool:
    return tok.hf.token_to_id("<extra_id_0>") is not None


_always = lambda model, tok: True  # noqa: E731

SCORERS: dict[str, Scorer] = {s.name: s for s in (
    Scorer("clm", _always, sentence=lambda m, e, t, bt: clm_scores(m, e, bt)),
    Scorer("pll", _always, masked=lambda t, p: pll_plan(t, p, False)),
    Scorer("pll_word_l2r", _always, masked=lambda t, p: pll_plan(t, p, True)),
    Scorer("masked_word", _always, masked=masked_word_plan),
    Scorer("rtd", lambda m, t: getattr(m, "rtd", None) is not None, sentence=lambda m, e, t, bt: rtd_scores(m, e, bt),
           needs_lm_head=False),
    Scorer("bilm", _always, sentence=lambda m, e, t, bt: bilm_scores(m, e, bt)),
    Scorer("xlnet_l2r", _always, sentence=lambda m, e, t, bt: xlnet_l2r_scores(m, e, bt)),
    Scorer("t5_target", lambda m, t: _has_sentinels(t), sentence=t5_target_scores),
    Scorer("t5_sentinel", lambda m, t: _has_sentinels(t), pair=t5_sentinel_pairs),
    Scorer("bart_target", lambda m, t: not _has_sentinels(t), sentence=bart_target_scores),
)}
KIND_SCORERS: dict[str, tuple[str, ...]] = {
    "decoder": ("clm",),
    "encoder": ("pll", "pll_word_l2r", "masked_word", "rtd"),
    "bilm": ("bilm",),
    "tbilm": ("bilm",),
    "xlnet": ("xlnet_l2r",),
    "seq2seq": ("t5_target", "t5_sentinel", "bart_target"),
}


def scorers_for(model: nn.Module, tok: Tokenizer, lm_head_trained: bool = True) -> list[Scorer]:
    """The scorers of the model's kind that apply to it (an untrained LM head drops those that read it)."""
    if model.kind not in KIND_SCORERS:
        raise ValueError(f"no minimal-pair scorer for model kind {model.kind!r}; known: {sorted(KIND_SCORERS)}")
    found = [SCORERS[n] for n in KIND_SCORERS[model.kind] if SCORERS[n].applies(model, tok)]
    return [s for s in found if lm_head_trained or not s.needs_lm_head]
