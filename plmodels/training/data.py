"""Training data: the tokenizer of a run, its token caches, and micro-batches as a pure function of
(step, micro-batch, rank), so that a resumed run reads exactly what the uninterrupted one would.

`prepare_tokenizer` trains (or loads) the tokenizer; `token_cache` tokenizes a corpus split once
(corpus.py); `Batches` reads packed rows in the (seed, epoch) order and `make_batch` turns them into
training targets (masking.py): MLM (+ NSP) for WordPiece rows, the shifted ids for BPE rows.
`Prefetcher` builds a run's micro-batches ahead on a worker thread, in the loop's order (pinned and
copied non-blocking to a CUDA device), so the step stream does not wait for the host (issue 81).
`t5_batch` and `bart_batch` make the encoder-decoder's (denoising.py): corrupted encoder inputs,
decoder targets and their shift. `plm_batch` makes XLNet's permutation-LM masks (plm.py).

Encoder-decoders (kind "seq2seq") read WordPiece rows [CLS] body [SEP], as the encoders do, so that
the encoder sees in training what extraction feeds it ([CLS] words [SEP]); so does XLNet (kind
"xlnet"), whose [CLS] and [SEP] are context and never targets (the authors' functional tokens). T5's sentinels are
<extra_id_0> ... <extra_id_{n-1}> added to the run's tokenizer as special tokens, numbered down
from the top of the vocabulary as T5's extra ids are (<extra_id_i> = V - 1 - i; `with_sentinels`).
"""
from __future__ import annotations

import itertools
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from plmodels.families import family
from plmodels.files import replace_folder, temp_folder
from plmodels.tokenizer import META_FILE, TOKENIZER_FILE, Tokenizer

from . import corpus
from .config import BartArgs, PLMArgs, PretrainConfig, T5Args, resolve_path
from .corpus import sample_texts_for_tokenizer
from .denoising import bart_text_infilling, t5_span_corruption
from .distributed import Dist, barrier
from .masking import (
    MaskedSlots,
    MaskingConfig,
    cap_predictions,
    continuation_ids,
    masked_slots,
    mask_tokens,
    nsp_pairs,
    sop_pairs,
    step_generator,
    word_starts,
)
from .plm import permutation_batch, prediction_slots
from .runtime import log


@dataclass
class Batch:
    """One micro-batch: input ids (B, T), labels (B, T) with -100 where ignored, optional sentence-pair
    labels (NSP or SOP), and what an objective needs besides (objectives.py: SpanBERT's span
    boundaries, ELECTRA's original ids and sampling generator)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    nsp_labels: torch.Tensor | None = None  # (B,) NSP (1 = NotNext) or SOP (1 = swapped) labels
    extras: dict = field(default_factory=dict)
    slots: MaskedSlots | None = None  # a masked LM's predicted positions in fixed-size slots (masking.py)


def prepare_tokenizer(cfg: PretrainConfig, out_dir: Path, d: Dist, fixed: str | None = None):
    """out_dir/tokenizer if present (resume), else `fixed` (a tokenizer the objective fixes: the
    DistilBERT teacher's), else cfg.tokenizer_path, else trained by rank 0 on a bounded sample of
    the training split (WordPiece for encoders and the biLMs, byte-level BPE for decoders).
    The folder is built aside and renamed in whole (a killed run leaves it complete or absent; a
    folder lacking one of its two files, left by an older version killed between them, is redone)."""
    tok_dir = out_dir / "tokenizer"
    if d.main and not all((tok_dir / name).is_file() for name in (TOKENIZER_FILE, META_FILE)):
        if fixed or cfg.tokenizer_path:
            tok = Tokenizer.load(Path(fixed or cfg.tokenizer_path).expanduser())
        else:
            t0 = time.monotonic()
            texts = sample_texts_for_tokenizer(resolve_path(cfg.train_source, cfg.data_dir),
                                               cfg.tokenizer_sample_chars, cfg.train_split, seed=cfg.seed)
            if family(cfg.kind).tokenizer == "wordpiece":  # BERT's WordPiece, so the layers' words align
                tok = Tokenizer.train_wordpiece(texts, cfg.vocab_size, lowercase=cfg.lowercase)
            else:
                tok = Tokenizer.train_bpe(texts, cfg.vocab_size)
            log(f"tokenizer: {tok} trained on {sum(map(len, texts)):,} chars in {time.monotonic() - t0:.1f}s")
        if cfg.objective == "t5":
            tok = with_sentinels(tok, T5Args.from_dict(cfg.objective_args).n_sentinels)
        tmp = temp_folder(tok_dir)
        try:
            tok.save(tmp)
            replace_folder(tmp, tok_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    barrier(d)
    return Tokenizer.load(tok_dir)


def token_cache(source: str, split: str | None, cfg: PretrainConfig, tok, out_dir: Path, d: Dist,
                max_texts: int | None = None):
    """The flat id stream of a corpus split, tokenized once by rank 0 into out_dir/cache."""

    src = resolve_path(source, cfg.data_dir)
    name = f"{src.name.removesuffix('.gz')}.{split}.{max_texts or 'all'}.{tok.fingerprint()[:12]}.ids"
    key = {**corpus.source_key(src, split), "max_texts": max_texts}
    texts = lambda: itertools.islice(corpus.iter_texts(src, split), max_texts)  # noqa: E731
    if d.main:
        corpus.tokenize_to_cache(texts(), tok, out_dir / "cache" / name, key=key, label=f"{src.name} {split}")
    barrier(d)
    return corpus.tokenize_to_cache(texts(), tok, out_dir / "cache" / name, key=key, progress=False)


class _Rows:
    """One packing of the train stream read as a pure function of (step, micro, rank): the global
    batch of step s is order(epoch)[pos : pos + B*A*W] with epoch = s // steps_per_epoch, and rank
    r's micro-batch a is its slice (a*W + r)*B ... + B."""

    def __init__(self, ds, rows_per_micro: int, cfg: PretrainConfig, d: Dist):
        self.ds, self.B, self.d = ds, rows_per_micro, d
        self.global_batch = rows_per_micro * cfg.grad_accum * d.world
        self.steps_per_epoch = len(ds) // self.global_batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"the corpus packs into {len(ds)} rows of {ds.seq_len} tokens, fewer than one "
                             f"global batch ({self.global_batch}); use more text or a smaller batch_size")
        self._orders: dict[int, torch.Tensor] = {}

    def position(self, step: int) -> tuple[int, int]:
        return step // self.steps_per_epoch, (step % self.steps_per_epoch) * self.global_batch

    def rows(self, step: int, micro: int) -> torch.Tensor:
        epoch, pos = self.position(step)
        if epoch not in self._orders:
            self._orders = {epoch: self.ds.order(epoch)}
        start = pos + (micro * self.d.world + self.d.rank) * self.B
        idx = self._orders[epoch][start: start + self.B]
        return torch.from_numpy(np.stack([self.ds[int(k)] for k in idx]))


class Batches:
    """Micro-batches as a pure function of (step, micro, rank, schedule position): disjoint shards
    per rank, and nothing to store for resumption but the step. With `short_seq_len`, a step whose
    schedule position is under `short_frac` reads `short_ds` (the same stream packed into short
    rows, batch_size * seq_len / short_seq_len of them: the same tokens per step) at the same step
    index; later steps read `ds`."""

    def __init__(self, ds, cfg: PretrainConfig, d: Dist, tok, short_ds=None, objective=None):
        self.cfg, self.d, self.tok, self.objective = cfg, d, tok, objective
        self.long = _Rows(ds, cfg.batch_size, cfg, d)
        self.short = None if short_ds is None else _Rows(short_ds, cfg.batch_size * cfg.seq_len // cfg.short_seq_len,
                                                          cfg, d)
        self.masking = cfg.masking_config
        name = getattr(objective, "name", "")
        needs_words = (self.masking.whole_word or name == "span"
                       or (name == "bart" and BartArgs.from_dict(cfg.objective_args).whole_word))
        self.cont_ids = continuation_ids(tok.hf.get_vocab()) if needs_words else None

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, row position in the epoch) where step `step` starts in the seq_len packing."""
        return self.long.position(step)

    def rows(self, step: int, micro: int, progress: float = 1.0) -> torch.Tensor:
        short = self.short is not None and progress < self.cfg.short_frac
        return (self.short if short else self.long).rows(step, micro)

    def get(self, step: int, micro: int, device: torch.device, progress: float = 0.0) -> Batch:
        """The micro-batch of (step, micro) on this rank; `progress` in [0, 1] (the schedule's
        position) picks the row length (`short_frac`) and sets the masking rate when it decays
        (`MaskingConfig.rate_final`)."""
        rows = self.rows(step, micro, progress)
        gen = step_generator(self.cfg.seed, step, stream=micro * self.d.world + self.d.rank)
        masking = self.masking
        if masking.rate_final is not None:
            masking = replace(masking, rate=masking.rate_at(progress), rate_final=None)
        if self.objective is not None:
            return self.objective.batch(rows, self.tok, masking, gen, self.cont_ids, device)
        return make_batch(rows, self.tok, masking, gen, self.cont_ids, device)


def batch_to(batch: Batch, device: torch.device, pin: bool = False) -> Batch:
    """`batch` with every tensor (fields, extras, tuples in extras) moved to `device`, copied
    non-blocking; `pin` first puts the host tensors in page-locked memory, so that the copy to a
    CUDA device is asynchronous. On the CPU (the tensors' own device) it is the batch as it was.
    Other extras (ELECTRA's torch.Generator) are passed as they are."""
    def mv(x):
        if isinstance(x, torch.Tensor):
            return (x.pin_memory() if pin else x).to(device, non_blocking=True)
        if isinstance(x, tuple):
            return tuple(mv(t) for t in x)
        return x
    return Batch(mv(batch.input_ids), mv(batch.labels), mv(batch.token_type_ids), mv(batch.nsp_labels),
                 {k: mv(v) for k, v in batch.extras.items()},
                 None if batch.slots is None else batch.slots.to(device, pin))


class Prefetcher:
    """The micro-batches of steps `start` ... `stop - 1` (each of `grad_accum` micro-batches), built
    ahead on a worker thread (`Batches.get`: rows, masking, span sampling, padding) while the model
    trains, at most `depth` ahead; `get(step, micro)` hands them over in order, on `device`. They are
    the batches `batches.get` gives in line, in the same order: a batch is a pure function of
    (step, micro, rank) and of the schedule position, which with the step clock is step / max_steps
    (`schedule.schedule_step`; a time-clock run depends on the time elapsed, so the loop builds its
    batches in line). On a CUDA device the worker pins them and the copy is non-blocking; on the CPU
    a batch is used where it was built. An error in the worker is raised by the `get` that waits for
    its batch; `close()` stops the worker."""

    def __init__(self, batches: Batches, device: torch.device, start: int, stop: int, grad_accum: int,
                 max_steps: int, depth: int = 2):
        self.batches, self.device, self.grad_accum, self.max_steps = batches, device, grad_accum, max_steps
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(start, stop), name="batch-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, start: int, stop: int) -> None:
        pin = self.device.type == "cuda"
        try:
            for step in range(start, stop):
                for micro in range(self.grad_accum):
                    batch = self.batches.get(step, micro, torch.device("cpu"), step / self.max_steps)
                    if not self._put(((step, micro), batch_to(batch, torch.device("cpu"), pin) if pin else batch)):
                        return
        except BaseException as e:  # handed to the main thread, raised there
            self._put((None, e))

    def get(self, step: int, micro: int) -> Batch:
        while True:
            try:
                key, item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the batch prefetcher ended before step {step}, micro-batch {micro}") from None
        if isinstance(item, BaseException):
            raise item
        if key != (step, micro):
            raise RuntimeError(f"prefetched batch {key} asked for as {(step, micro)}: the loop and its "
                               "prefetcher disagree on the step order")
        return batch_to(item, self.device)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def make_batch(rows: torch.Tensor, tok, masking: MaskingConfig, gen: torch.Generator, cont_ids, device,
               sizes: tuple[int, int] | None = None) -> Batch:
    """Training targets for packed rows: MLM (+ NSP or SOP pairs) for WordPiece rows (B, L), with their
    `MaskedSlots` of `sizes` (Q, M) (masking.slot_sizes; None: the batch's own counts; a selection
    over them is capped, masking.cap_predictions), or the shift for BPE rows (B, L+1)."""
    if tok.kind != "wordpiece":
        return Batch(rows[:, :-1].contiguous().to(device), rows[:, 1:].contiguous().to(device))
    types = nsp = None
    if masking.nsp or masking.sop:
        pairs = nsp_pairs if masking.nsp else sop_pairs
        rows, types, nsp = pairs(rows[:, 1:-2], cls_id=tok.cls_id, sep_id=tok.sep_id, generator=gen)
    starts = word_starts(rows, cont_ids) if masking.whole_word else None
    ids, labels = mask_tokens(rows, mask_id=tok.mask_id, vocab_size=tok.vocab_size, special_ids=tok.special_ids,
                              generator=gen, cfg=masking, starts=starts)
    if sizes is not None:
        ids, labels = cap_predictions(ids, labels, rows, sizes)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return Batch(ids.to(device), labels.to(device), mv(types), mv(nsp), slots=masked_slots(labels, sizes).to(device))


# ------------------------------------------------------------------------ encoder-decoders


def sentinel_token(i: int) -> str:
    return f"<extra_id_{i}>"


def with_sentinels(tok: Tokenizer, n: int) -> Tokenizer:
    """`tok` with T5's sentinels <extra_id_0..n-1> as special tokens at the top of the vocabulary
    (<extra_id_i> = V - 1 - i, T5's extra ids; added in the order n-1, ..., 0). A tokenizer that has
    them already (a resumed run, a T5 run's tokenizer) is returned as it is."""
    if tok.hf.token_to_id(sentinel_token(0)) is not None:
        sentinel_ids(tok, n)  # checks they are all there
        return tok
    hf = HFTokenizer.from_str(tok.hf.to_str())  # a copy: the caller's tokenizer is left as it was
    hf.add_special_tokens([AddedToken(sentinel_token(i), special=True, normalized=False) for i in reversed(range(n))])
    return Tokenizer(hf, tok.kind, tok.specials, lowercase=tok.lowercase, affixes=tok.affixes)


def sentinel_ids(tok: Tokenizer, n: int) -> list[int]:
    """The ids of <extra_id_0..n-1>; a ValueError when the tokenizer lacks one."""
    ids = [tok.hf.token_to_id(sentinel_token(i)) for i in range(n)]
    if None in ids:
        raise ValueError(f"the tokenizer lacks T5's sentinel {sentinel_token(ids.index(None))} (n_sentinels={n}); "
                         "a t5 run adds them to the tokenizer it trains or loads (data.with_sentinels)")
    return ids  # type: ignore[return-value]


def _check_seq2seq_tokenizer(tok: Tokenizer) -> None:
    missing = [r for r in ("pad", "cls", "sep", "mask") if getattr(tok, f"{r}_id") is None]
    if tok.kind != "wordpiece" or missing:
        raise ValueError(f"seq2seq runs read WordPiece rows [CLS] ... [SEP] and need [PAD] [CLS] [SEP] [MASK]; "
                         f"got a {tok.kind} tokenizer lacking {missing}")


def _pad_right(seqs: list[torch.Tensor], value: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of any lengths -> (B, T) right-padded with `value`, T = the longest or `length`
    (at least the longest), and the (B, T) mask."""
    T = max(len(x) for x in seqs)
    if length is not None:
        if length < T:
            raise ValueError(f"a sequence of {T} tokens does not fit length={length}")
        T = length
    out = torch.full((len(seqs), T), value, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, x in enumerate(seqs):
        out[b, : len(x)] = x
        mask[b, : len(x)] = 1
    return out, mask


def _seq2seq_batch(inputs: list[torch.Tensor], targets: list[torch.Tensor], scored: list[torch.Tensor] | None,
                   tok: Tokenizer, start_id: int, device, length: int | None = None) -> Batch:
    """input_ids (B, Te) right-padded with [PAD] (extras["attention_mask"] when any padding); labels
    (B, Td) padded with -100; extras["decoder_input_ids"] = [start, labels[:, :-1]] with -100 -> [PAD]
    (teacher forcing, `Seq2Seq.shift_right`); extras["decoder_start"] the start id (an int, which the
    loss checks against the model's without reading the device); extras["scored"] (B, Td) bool: the
    targets the encoder did not see (T5: the noise tokens; BART: the masked ones), or None. With
    `length`, Te = length and the attention mask is always there: one shape and one signature for
    every batch (a compiled step's)."""
    ids, mask = _pad_right(inputs, tok.pad_id, length)
    labels, _ = _pad_right(targets, -100)
    dec = torch.cat([torch.full((len(targets), 1), start_id, dtype=torch.long), labels[:, :-1]], dim=1)
    dec = dec.masked_fill(dec == -100, tok.pad_id)
    no_mask = length is None and bool(mask.all())
    extras = {"attention_mask": None if no_mask else mask.to(device), "decoder_input_ids": dec.to(device),
              "decoder_start": start_id,
              "scored": None if scored is None else _pad_right([s.long() for s in scored], 0)[0].bool().to(device)}
    return Batch(ids.to(device), labels.to(device), extras=extras)


def t5_batch(rows: torch.Tensor, tok: Tokenizer, args: T5Args, gen: torch.Generator, device) -> Batch:
    """T5's span corruption of WordPiece rows (B, L) = [CLS] body [SEP]: each body is corrupted
    (`t5_span_corruption`, [SEP] as T5's EOS); the encoder reads [CLS] + inputs (kept tokens, one
    sentinel per noise span, [SEP]); the targets are "<extra_id_0> span 0 <extra_id_1> ... [SEP]";
    the decoder starts from [PAD] (T5's decoder_start_token_id is its pad id)."""
    _check_seq2seq_tokenizer(tok)
    sentinels = sentinel_ids(tok, args.n_sentinels)
    inputs, targets, scored = [], [], []
    cls = torch.tensor([tok.cls_id])
    sentinel_set = torch.tensor(sentinels + [tok.sep_id])
    for row in rows:
        c = t5_span_corruption(row[1:-1], noise_density=args.noise_density, mean_span_length=args.mean_span_length,
                               sentinel_ids=sentinels, eos_id=tok.sep_id, generator=gen)
        inputs.append(torch.cat([cls, c.inputs]))
        targets.append(c.targets)
        scored.append(~torch.isin(c.targets, sentinel_set))
    return _seq2seq_batch(inputs, targets, scored, tok, tok.pad_id, device)


def bart_batch(rows: torch.Tensor, tok: Tokenizer, args: BartArgs, gen: torch.Generator, cont_ids, device,
               length: int | None = None) -> Batch:
    """BART's text infilling of WordPiece rows (B, L) = [CLS] body [SEP] ([CLS], [SEP] as BART's <s>,
    </s>, never noised; `bart_text_infilling` with [MASK], whole words when `args.whole_word`); the
    targets are the rows themselves, the decoder reads them shifted right after [SEP] (BART's
    decoder_start_token_id is its </s>). Sentences (permute_sentences) end at "." and [SEP].
    The encoder input is as long as the batch's longest noised row, or with `length` (a compiled
    run: the row length L) padded to `length` for every batch, its attention mask hiding the
    padding: the same loss and gradients, one shape. The decoder side is (B, L) either way. A noised
    row longer than `length` (more zero-length spans, each an inserted token, than tokens its spans
    deleted; at mask_ratio 0.3 and lambda 3 the longest of 32 noised 128-token rows of random ids has
    107-112 tokens) keeps its first length - 1 tokens and its last, [SEP]."""
    _check_seq2seq_tokenizer(tok)
    starts = word_starts(rows, cont_ids) if args.whole_word else None
    stop = tok.hf.token_to_id(".")
    inputs, scored = [], []
    for b, row in enumerate(rows):
        ends = (row == tok.sep_id) | (row == (stop if stop is not None else -1))
        noised = bart_text_infilling(row, mask_ratio=args.mask_ratio, poisson_lambda=args.poisson_lambda,
                                     mask_id=tok.mask_id, generator=gen, permute_sentences=args.permute_sentences,
                                     sentence_ends=ends, random_ratio=args.random_ratio, vocab_size=tok.vocab_size,
                                     word_starts=None if starts is None else starts[b])
        x = noised.inputs
        if length is not None and len(x) > length:  # cut, as cap_predictions caps a mask over its slots
            x = torch.cat([x[: length - 1], x[-1:]])
        inputs.append(x)
        scored.append(noised.masked)  # over the permuted row: the targets' positions only without permutation
    return _seq2seq_batch(inputs, list(rows), None if args.permute_sentences else scored, tok, tok.sep_id, device,
                          length)


def seq2seq_batch(cfg: PretrainConfig, rows: torch.Tensor, tok: Tokenizer, gen: torch.Generator, cont_ids,
                  device) -> Batch:
    """The batch of a seq2seq run's objective ("t5" or "bart") from packed rows (for the evaluator)."""
    if cfg.objective == "t5":
        return t5_batch(rows, tok, T5Args.from_dict(cfg.objective_args), gen, device)
    return bart_batch(rows, tok, BartArgs.from_dict(cfg.objective_args), gen, cont_ids, device)


# ------------------------------------------------------------------------ XLNet


def plm_batch(rows: torch.Tensor, tok: Tokenizer, args: PLMArgs, gen: torch.Generator, device,
              static: bool = False) -> Batch:
    """XLNet's permutation-LM batch (plm.py) of WordPiece rows (B, T): a random factorisation order
    per row drawn from `gen`, targets the last 1/partial_k of it among the non-special tokens.
    input_ids = the rows (the query stream hides the targets' own tokens), labels (B, P) the target
    tokens (-100: padding rows of target_mapping); extras perm_mask (B, T, T), target_mapping
    (B, P, T) and attention_mask (B, T) or None (packed rows have no [PAD]). P is the batch's largest
    target count, or with `static` (a compiled run) `prediction_slots(T, partial_k)` for every batch,
    the rows past a row's targets zero in target_mapping and -100 in labels: the same loss and
    gradients, one shape per row length."""
    if tok.kind != "wordpiece":
        raise ValueError(f"xlnet runs read WordPiece rows [CLS] ... [SEP]; got a {tok.kind} tokenizer")
    mask = None
    if tok.pad_id is not None and bool((rows == tok.pad_id).any()):
        mask = (rows != tok.pad_id).long()
    predictable = ~torch.isin(rows, torch.tensor(sorted(tok.special_ids), dtype=rows.dtype))
    pb = permutation_batch(rows, partial_k=args.partial_k, attention_mask=mask, generator=gen, predictable=predictable,
                           n_slots=prediction_slots(rows.shape[1], args.partial_k) if static else None)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return Batch(rows.to(device), pb.labels.to(device),
                 extras={"perm_mask": pb.perm_mask.to(device), "target_mapping": pb.target_mapping.to(device),
                         "attention_mask": mv(mask)})
