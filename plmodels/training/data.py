"""Training data: the tokenizer of a run, its token caches, and micro-batches as a pure function of
(step, micro-batch, rank), so that a resumed run reads exactly what the uninterrupted one would.

`prepare_tokenizer` trains (or loads) the tokenizer; `token_cache` tokenizes a corpus split once
(corpus.py); `Batches` reads packed rows in the (seed, epoch) order and `make_batch` turns them into
training targets (masking.py): MLM (+ NSP) for WordPiece rows, the shifted ids for BPE rows.
"""
from __future__ import annotations

import itertools
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from plmodels.elmo import BILM_KINDS
from plmodels.files import replace_folder, temp_folder
from plmodels.tokenizer import META_FILE, TOKENIZER_FILE, Tokenizer

from . import corpus
from .config import PretrainConfig, resolve_path
from .corpus import sample_texts_for_tokenizer
from .distributed import Dist, barrier
from .masking import (
    MaskingConfig,
    continuation_ids,
    mask_tokens,
    nsp_pairs,
    sop_pairs,
    step_generator,
    word_starts,
)
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
            if cfg.kind in ("encoder", *BILM_KINDS):  # the biLMs read BERT's WordPiece: their layers align with BERT's
                tok = Tokenizer.train_wordpiece(texts, cfg.vocab_size, lowercase=cfg.lowercase)
            else:
                tok = Tokenizer.train_bpe(texts, cfg.vocab_size)
            log(f"tokenizer: {tok} trained on {sum(map(len, texts)):,} chars in {time.monotonic() - t0:.1f}s")
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
        needs_words = self.masking.whole_word or getattr(objective, "name", "") == "span"
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


def make_batch(rows: torch.Tensor, tok, masking: MaskingConfig, gen: torch.Generator, cont_ids, device) -> Batch:
    """Training targets for packed rows: MLM (+ NSP or SOP pairs) for WordPiece rows (B, L), the shift
    for BPE rows (B, L+1)."""
    if tok.kind != "wordpiece":
        return Batch(rows[:, :-1].contiguous().to(device), rows[:, 1:].contiguous().to(device))
    types = nsp = None
    if masking.nsp or masking.sop:
        pairs = nsp_pairs if masking.nsp else sop_pairs
        rows, types, nsp = pairs(rows[:, 1:-2], cls_id=tok.cls_id, sep_id=tok.sep_id, generator=gen)
    starts = word_starts(rows, cont_ids) if masking.whole_word else None
    ids, labels = mask_tokens(rows, mask_id=tok.mask_id, vocab_size=tok.vocab_size, special_ids=tok.special_ids,
                              generator=gen, cfg=masking, starts=starts)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return Batch(ids.to(device), labels.to(device), mv(types), mv(nsp))
