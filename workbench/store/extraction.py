"""Extraction: run a model over sentences once and write every layer's word vectors (and, on
request, word-level attention) into a store; and `extract_cli`, the `workbench extract` command.

Extraction streams length-sorted, token-budgeted batches (`batching`) through the model (SDPA
unless attention is requested), pools with index_select / index_add over a flat token -> word map
(`pooling`), converts attention to word level (`word_attention`, Clark et al. 2019) and `pwrite`s
each sentence's rows at their global offsets, so RAM is bounded by one batch whatever the dataset
size. The linear layers run on oneDNN (`plmodels.components.cpu_linear`). It estimates the bytes
first and refuses an extraction over budget (`budget`). It builds into a temporary sibling folder
and renames it when complete: a killed extraction leaves no store, only a temp folder that the
next run deletes (restart, not resume). The folder's name is its key (`keys`), its layout that of
`store`.

`attention_weighting="norm"` stores Kobayashi et al. 2020's norm-weighted attention instead of the
probabilities ("Attention is Not Only a Weight: Analyzing Transformers with Vector Norms"): the
token map alpha_ij ||f_h(x_j)||, with ||f_h(x_j)|| read from the value vectors during the same
forward pass (`plmodels.components.norms.record_value_norms`), converted to words like raw
attention and renormalised per word row (`extract` says why and how).
"""
from __future__ import annotations

import os
import shutil
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

import plmodels
from plmodels.components.cpu_linear import onednn_linear
from plmodels.components.norms import record_value_norms
from plmodels.families import family_of
from plmodels.progress import progress as progress_bar
from workbench.core.io import atomic_dir, atomic_write_json, clean_stale_tmp, file_lock
from workbench.core.memory import HeapTrimmer
from workbench.data import tasks
from workbench.data.align import align_sentences
from workbench.store.batching import Batch, build_batch, make_batches, row_runs
from workbench.store.budget import DEFAULT_MAX_RAM, BudgetError, estimate_bytes
from workbench.store.keys import data_hash, model_fingerprint, store_dir, store_key
from workbench.store.pooling import POOLINGS
from workbench.store.store import ATTN_BYTES, ATTN_FILE, INDEX_FILE, SPECIAL_FILE, STORE_VERSION, Store
from workbench.store.word_attention import apply_word_maps, renormalised_word_maps, special_token_columns, word_maps

PRECISIONS = ("fp32", "bf16")
ATTENTION_WEIGHTINGS = ("raw", "norm")  # probabilities alpha_ij | Kobayashi et al.'s alpha_ij ||f_h(x_j)||


def forward_layers(model, ids, mask, attentions: bool, precision: str = "fp32"):
    """The model's forward for extraction: every layer's hidden states (B, T, D), and its attention
    probabilities (B, H_l, T, T) when `attentions` (the eager path; SDPA otherwise). ids, mask:
    (B, T). precision "bf16" runs it under bf16 autocast (matmuls and softmax in bfloat16, as
    `plmodels.training` trains), "fp32" in full precision. Its linear layers run on oneDNN
    (`plmodels.components.cpu_linear.onednn_linear`: about 2x MKL's fp32 GEMM on AMD CPUs)."""
    kw = dict(attention_mask=mask, output_hidden_states=True, output_attentions=attentions,
              attn_impl="eager" if attentions else "sdpa", unpad=True)  # padding rows are never read
    kw.update(family_of(model).analysis_kwargs)  # e.g. no LM logits where the forward computes them by default
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"), onednn_linear():
        return model(ids, **kw)


def _write_batch(batch: Batch, out: np.ndarray, fds: list[int], bytes_per_row: int) -> None:
    """pwrite every run of consecutive global rows of `out` (L+1, W, D) float16 into the layer files."""
    for a, b in row_runs(batch.dest_rows):
        off = int(batch.dest_rows[a]) * bytes_per_row
        for l, fd in enumerate(fds):
            os.pwrite(fd, out[l, a:b].data, off)   # a row slice is contiguous: written without a copy


def _write_attention(batch: Batch, atts, tokenizer_slots: dict[int, int], n_special: int, n_heads: int,
                     attn_fd: int, special_fd: int, attn_offsets: np.ndarray, sent_offsets: np.ndarray,
                     norms=None) -> None:
    """Convert a batch's token attentions (L tensors (B, H_l, T, T)) to word level and write them.
    With `norms` (L entries (B, H_l, T) of ||f_h(x_j)||, None for a layer without heads), the maps
    are the norm-weighted alpha_ij ||f_h(x_j)||, renormalised per word row."""
    L = len(atts)
    B, T = batch.ids.shape
    tok_word = np.full((B, T), -1, dtype=np.int64)  # numpy: tiny per-row ops, no OpenMP round trips
    for b, p in enumerate(batch.pieces):
        tok_word[b, : len(p.ids)] = p.tok_word
    ids, real = batch.ids.numpy(), batch.mask.numpy().astype(bool)
    slot = np.full((B, T), -1, dtype=np.int64)
    for tid, k in tokenizer_slots.items():
        slot[(ids == tid) & (tok_word < 0) & real] = k
    n_max = int(tok_word.max(initial=-1)) + 1
    tok_word, slot = torch.from_numpy(tok_word), torch.from_numpy(slot)
    alloc = np.empty if all(a.shape[1] == n_heads for a in atts) else partial(np.full, fill_value=np.nan)
    word = alloc((L, B, n_heads, n_max, n_max), dtype=np.float32)
    special = alloc((L, B, n_heads, n_max, n_special), dtype=np.float32)
    maps = word_maps(tok_word, slot, n_max, n_special)  # once per batch, shared by every layer
    for l, a in enumerate(atts):  # layer by layer (no stacked copy); pruned layers' missing heads stay NaN
        if norms is None or a.shape[1] == 0:
            w, sp = apply_word_maps(a.float(), maps)  # (B, H_l, n, n), (B, H_l, n, K)
        else:  # Kobayashi et al. 2020: alpha_ij ||f_h(x_j)||, norms broadcast over the attending rows i
            w, sp = renormalised_word_maps(a.float() * norms[l][:, :, None, :], a.float(), maps)
        word[l, :, : a.shape[1]] = w.numpy()
        special[l, :, : a.shape[1]] = sp.numpy()
    for b, p in enumerate(batch.pieces):
        n = len(p.own_words)
        s = p.sent
        os.pwrite(attn_fd, np.ascontiguousarray(word[:, b, :, :n, :n]).data, int(attn_offsets[s]) * ATTN_BYTES)
        rows = np.ascontiguousarray(special[:, b, :, :n].transpose(2, 0, 1, 3))  # (n, L, H, K)
        os.pwrite(special_fd, rows.data, int(sent_offsets[s]) * L * n_heads * n_special * ATTN_BYTES)


def extract(model, tokenizer, sentences: Sequence[Sequence[str]], store_root: str | os.PathLike, *,
            key_extra: str = "", model_id: str | None = None, pooling: str = "first",
            attentions: bool = False, policy: str = "truncate", batch_tokens: int = 8192,
            max_bytes_disk: int | None = None, max_bytes_ram: int | None = DEFAULT_MAX_RAM,
            precision: str = "fp32", attention_weighting: str = "raw", progress: bool = True) -> Store:
    """Extract every layer's pooled word vectors (and, on request, word-level attention) to a store.

    sentences: S lists of words. model_id: the checkpoint hash when known (else the weights are
    fingerprinted). Returns the existing store when one with the same key exists (a store built
    with attentions also serves requests without). Raises BudgetError when the estimate exceeds
    `max_bytes_disk` (default: the free space) or `max_bytes_ram`; ValueError on a bad pooling,
    policy, precision, or attentions with policy="window".

    precision: "fp32" (default, exact) or "bf16": the forward under bf16 autocast, about 2x faster
    on CPUs with AVX512-BF16/AMX and on GPUs. Its vectors and attention maps differ from fp32 by
    bf16 rounding (docs/benchmarks.md measures how much); it is part of the store key.

    attention_weighting (with attentions=True): "raw" (default) stores the attention probabilities;
    "norm" stores Kobayashi et al. 2020's norm-weighted attention. The token map is
    alpha_ij ||f_h(x_j)||, f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h (the value vector times head h's
    slice of the output projection; the output bias is in no head's f), with alpha the
    probabilities the model returns (after the head mask). It goes through the same subword -> word
    maps (sum over attended subwords, mean over attending ones, special columns), and then, unlike
    the paper, which reads the unnormalised norms, each word row (words plus special columns) is
    divided by its sum: the head statistics (`probes.heads`) need distributions, and their shares
    then read "the part of the head's output norm mass at word i that comes from word j". A row with
    no mass (every attended vector zero) keeps the raw attention row instead of dividing 0 by 0
    (`word_attention.renormalised_word_maps`). The weighting is part of the store key (a "norm"
    store never serves a "raw" request) and recorded in index.json as `attention_weighting`.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; known: {sorted(POOLINGS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {list(PRECISIONS)}")
    if attentions and policy != "truncate":
        raise ValueError("attentions need policy='truncate' (word attention needs one sequence per sentence)")
    if attention_weighting not in ATTENTION_WEIGHTINGS:
        raise ValueError(f"unknown attention_weighting {attention_weighting!r}; known: {list(ATTENTION_WEIGHTINGS)}")
    if attention_weighting != "raw" and not attentions:
        raise ValueError(f"attention_weighting={attention_weighting!r} needs attentions=True")
    root = Path(store_root)
    tok_fp = tokenizer.fingerprint()
    mid = model_id or model_fingerprint(model)
    dhash = data_hash(sentences)
    extra = key_extra if precision == "fp32" else f"{key_extra};precision={precision}"
    if attention_weighting != "raw":  # raw keys stay as they were: existing stores keep serving
        extra = f"{extra};attention_weighting={attention_weighting}"
    key = store_key(mid, dhash, pooling, tok_fp, policy, extra)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / key):   # two steps running at once may ask for one store: one builds, one reads
        return _open_or_build(model, tokenizer, sentences, root, key, mid, dhash, tok_fp, key_extra, pooling,
                              attentions, policy, batch_tokens, max_bytes_disk, max_bytes_ram, precision,
                              attention_weighting, progress)


def _open_or_build(model, tokenizer, sentences: Sequence[Sequence[str]], root: Path, key: str, mid: str,
                   dhash: str, tok_fp: str, key_extra: str, pooling: str, attentions: bool, policy: str,
                   batch_tokens: int, max_bytes_disk: int | None, max_bytes_ram: int | None, precision: str,
                   attention_weighting: str, progress: bool) -> Store:
    """`extract` once the store's key is known and its lock held: the existing store, else a new one."""
    for with_attn in ([True] if attentions else [True, False]):
        d = store_dir(root, key, pooling, with_attn)
        if (d / INDEX_FILE).is_file():
            store = Store(d)
            store.check_tokenizer(tokenizer)
            return store
    target = store_dir(root, key, pooling, attentions)
    clean_stale_tmp(root, target.name)

    cfg = model.config
    L, D = int(cfg.n_layers), int(cfg.d_model)
    heads = list(getattr(model, "n_heads_per_layer", [cfg.n_heads] * L))
    H = max(heads) if heads else 0
    align = align_sentences(tokenizer, [list(ws) for ws in sentences], int(cfg.max_positions), policy)
    sent_offsets = np.r_[0, np.cumsum(align.n_kept)].astype(np.int64)
    names, slots = special_token_columns(tokenizer)
    K = len(names)
    batches = make_batches(align.pieces, batch_tokens, None)
    shapes = [(len(b), max(len(align.pieces[i].ids) for i in b)) for b in batches]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    est = estimate_bytes(L, D, H, align.n_kept, shapes, attentions, K, params)
    disk_budget = max_bytes_disk if max_bytes_disk is not None else shutil.disk_usage(root).free   # made by extract
    if est.disk > disk_budget:
        raise BudgetError(f"extraction needs {est}: over the disk budget of {disk_budget / 2**20:.1f} MiB")
    if max_bytes_ram is not None and est.ram > max_bytes_ram:
        raise BudgetError(f"extraction needs {est}: over the RAM budget of {max_bytes_ram / 2**20:.1f} MiB "
                          f"(lower batch_tokens={batch_tokens})")

    device = next(model.parameters()).device
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    N = int(sent_offsets[-1])
    attn_offsets = np.r_[0, np.cumsum(align.n_kept.astype(np.int64) ** 2 * L * H)].astype(np.int64)
    was_training = model.training
    model.eval()
    try:
        with atomic_dir(target) as tmp, torch.inference_mode():
            fds = []
            try:
                for l in range(L + 1):
                    fd = os.open(tmp / f"layer_{l}.f16", os.O_RDWR | os.O_CREAT, 0o644)
                    fds.append(fd)
                    os.ftruncate(fd, N * D * 2)
                attn_fd = special_fd = -1
                if attentions:
                    attn_fd = os.open(tmp / ATTN_FILE, os.O_RDWR | os.O_CREAT, 0o644)
                    os.ftruncate(attn_fd, int(attn_offsets[-1]) * ATTN_BYTES)
                    special_fd = os.open(tmp / SPECIAL_FILE, os.O_RDWR | os.O_CREAT, 0o644)
                    os.ftruncate(special_fd, N * L * H * K * ATTN_BYTES)
                total = sum(len(p.ids) for p in align.pieces)
                pool = POOLINGS[pooling]
                trim = HeapTrimmer()  # batches of ever-different shapes: keep the resident set flat
                with progress_bar(total, "extract", "tok", scale=True, disable=not progress) as bar:
                    for idx in batches:
                        batch = build_batch([align.pieces[i] for i in idx], sent_offsets, pad_id)
                        recorder = record_value_norms(model) if attention_weighting == "norm" else nullcontext(None)
                        with recorder as norms:
                            out = forward_layers(model, batch.ids.to(device), batch.mask.to(device), attentions,
                                                 precision)
                        B, T = batch.ids.shape
                        pooled = np.empty((L + 1, len(batch.dest_rows), D), dtype=np.float16)
                        for l, h in enumerate(out.hidden_states):
                            pooled[l] = pool(h.reshape(B * T, D).float().cpu(), batch.plan).to(torch.float16).numpy()
                        _write_batch(batch, pooled, fds, D * 2)
                        if attentions:
                            _write_attention(batch, [a.cpu() for a in out.attentions], slots, K, H,
                                             attn_fd, special_fd, attn_offsets, sent_offsets,
                                             None if norms is None else [None if n is None else n.cpu()
                                                                         for n in norms])
                        del out, pooled, norms
                        trim()
                        bar.update(int(batch.mask.sum()))
            finally:
                for fd in fds + ([attn_fd, special_fd] if attentions else []):
                    if fd >= 0:
                        os.close(fd)
            np.save(tmp / "sent_offsets.npy", sent_offsets)
            index = {
                "version": STORE_VERSION, "key": key, "model_id": mid,
                "model_kind": getattr(model, "kind", None), "n_layers": L + 1, "d_model": D,
                "n_words": N, "n_sentences": len(sentences), "pooling": pooling,
                "tokenizer_fingerprint": tok_fp, "dtype": "float16", "attn_dtype": "float32",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data_hash": dhash,
                "key_extra": key_extra, "attentions": attentions, "alignment": align.report(),
                "precision": precision,
                "estimate": {"disk": est.disk, "ram": est.ram},
            }
            if attentions:
                np.save(tmp / "attn_offsets.npy", attn_offsets)
                index.update(n_attn_layers=L, n_heads=H, heads_per_layer=heads, special_tokens=list(names),
                             attention_weighting=attention_weighting)
            atomic_write_json(tmp / INDEX_FILE, index)
    finally:
        model.train(was_training)
    return Store(target)


# ------------------------------------------------------------------------------------ the CLI
def load_sentences(data: str, limit: int | None = None) -> list[list[str]]:
    """Sentences named by `data`: "ewt:dev" / "gum:train" (UD treebank:split) or a task
    "pos" / "pos:dev" (records' words; split defaults to dev). `limit` keeps the first sentences."""

    name, _, split = data.partition(":")
    split = split or "dev"
    if name in tasks.UD_TREEBANKS:
        sents = [list(s.words) for s in tasks.ud_sentences(name, split)]
    elif name in tasks.TASKS:
        sents = [list(r["words"]) for r in tasks.load_task(name, split)]
    else:
        raise ValueError(f"unknown data {data!r}: use treebank:split ({sorted(tasks.UD_TREEBANKS)}) "
                         f"or task[:split] ({sorted(tasks.TASKS)})")
    return sents if limit is None else sents[:limit]


def extract_cli(model_path: str | os.PathLike, data: str, out_root: str | os.PathLike,
                pooling: str = "first", attentions: bool = False, policy: str = "truncate",
                limit: int | None = None, batch_tokens: int = 8192, precision: str = "fp32") -> Store:
    """`workbench extract`: load a checkpoint, read `data` (see load_sentences), extract to a store
    under `out_root` keyed by the checkpoint hash. Returns the store (existing or new)."""

    model, tokenizer = plmodels.load(model_path)
    sents = load_sentences(data, limit)
    return extract(model, tokenizer, sents, out_root, model_id=plmodels.checkpoint_hash(model_path),
                   key_extra=f"data={data};limit={limit}", pooling=pooling, attentions=attentions,
                   policy=policy, batch_tokens=batch_tokens, precision=precision)
