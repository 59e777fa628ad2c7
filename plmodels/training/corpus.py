"""Pretraining corpora: stream documents, tokenize once into a cached id file, pack into sequences.

Three steps, each usable alone:
1. `iter_texts(source, split)` streams documents (str) from a named corpus folder or from plain
   text / JSON-lines files a user names. Named folders are recognised by their files (registry
   `FORMATS`): gutenberg_pd (one book per JSON line, train/valid), wikitext2 (one article per
   document, valid/test), tiny_shakespeare (one document; split 90/10 at a line boundary).
2. `tokenize_to_cache(texts, tokenizer, cache_path, key)` encodes the documents in multi-threaded
   batches and writes one flat id stream (uint16 when the vocabulary fits, else uint32) atomically,
   with `tokenizer.doc_sep_id` ([SEP] or <|endoftext|>) after every document. A sidecar
   `<cache>.meta.json` records the key (source files' names, sizes and mtimes + the tokenizer
   fingerprint); a later call with the same key maps the file instead of re-tokenizing.
3. `PackedDataset` cuts the stream into fixed-length sequences across document boundaries (the
   FULL-SENTENCES packing of RoBERTa, Liu et al. 2019, and of GPT-2 style LM training) and orders
   them by a permutation drawn from (seed, epoch), so a resumed run continues at (epoch, position).

Long documents are cut into chunks only at a newline preceded by a non-space character. Both the
BERT pre-tokenizer (splits on whitespace) and the GPT-2 byte-level regex (no piece runs from a
non-space character into a newline; lookaheads only) put a boundary there, so chunking never
changes the ids; it only lets the Rust library encode a book on all cores.
"""
from __future__ import annotations

import gzip
import io
import itertools
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

import numpy as np

from plmodels.files import atomic_open
from plmodels.progress import Bar
from plmodels.progress import progress as progress_bar
from plmodels.tokenizer import Tokenizer

CHUNK_CHARS = 16_000  # target size of one encode unit
BATCH_CHARS = 2_000_000  # text handed to one encode_batch call
CACHE_VERSION = 1


# --------------------------------------------------------------------------------- sources
def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist")
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as e:
        raise OSError(f"cannot open corpus file {path}: {e}") from e


def _guarded(path: Path, lines: Iterator[str]) -> Iterator[str]:
    """Re-raise decoding/IO errors with the file name in the message."""
    try:
        yield from lines
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise ValueError(f"cannot read corpus file {path}: {e}") from e


def _read_jsonl(path: Path) -> Iterator[str]:
    with _open_text(path) as f:
        for i, line in enumerate(_guarded(path, f), start=1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: expected a JSON object with a 'text' field ({e})") from e
            if not isinstance(text, str):
                raise ValueError(f"{path}:{i}: 'text' is {type(text).__name__}, not str")
            yield text


def _read_whole(path: Path) -> Iterator[str]:
    with _open_text(path) as f:
        yield "".join(_guarded(path, f))


_WIKI_TITLE = re.compile(r"^ = [^=].* = $")


def _read_wikitext(path: Path) -> Iterator[str]:
    """One document per article; an article starts at a top-level ` = Title = ` line."""
    buf: list[str] = []
    with _open_text(path) as f:
        for line in _guarded(path, f):
            if _WIKI_TITLE.match(line.rstrip("\n")) and any(s.strip() for s in buf):
                yield "".join(buf)
                buf = []
            buf.append(line)
    if any(s.strip() for s in buf):
        yield "".join(buf)


def _shakespeare_split(path: Path, split: str) -> Iterator[str]:
    """Train = first 90% of the characters, valid = the rest, cut at a line boundary."""
    text = next(_read_whole(path))
    cut = text.rfind("\n", 0, int(0.9 * len(text))) + 1
    yield text[:cut] if split == "train" else text[cut:]


def _user_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".txt", ".jsonl", ".jsonl.gz")))
    if not files:
        raise FileNotFoundError(f"corpus folder {path} holds no .txt, .jsonl or .jsonl.gz files")
    return files


def _read_user(path: Path, split: str) -> Iterator[str]:
    for p in _user_files(path):
        if p.stat().st_size == 0:
            raise ValueError(f"corpus file {p} is empty")
        n = 0
        reader = _read_jsonl if p.name.endswith((".jsonl", ".jsonl.gz")) else _read_whole
        for doc in reader(p):
            if doc.strip():
                n += 1
            yield doc
        if n == 0:
            raise ValueError(f"corpus file {p} holds no text (only whitespace)")


@dataclass(frozen=True)
class SourceFormat:
    """How to recognise a corpus folder, which splits it has, its files and how to read them."""

    name: str
    splits: tuple[str, ...]
    detect: Callable[[Path], bool]
    files: Callable[[Path, str], list[Path]]
    read: Callable[[Path, str], Iterator[str]]


FORMATS: dict[str, SourceFormat] = {
    "gutenberg": SourceFormat(
        "gutenberg", ("train", "valid"),
        detect=lambda p: p.is_dir() and any(p.glob("gutenberg_en.*.jsonl.gz")),
        files=lambda p, s: [p / f"gutenberg_en.{s}.jsonl.gz"],
        read=lambda p, s: _read_jsonl(p / f"gutenberg_en.{s}.jsonl.gz"),
    ),
    "wikitext": SourceFormat(
        "wikitext", ("valid", "test"),
        detect=lambda p: p.is_dir() and any(p.glob("wiki.*.tokens")),
        files=lambda p, s: [p / f"wiki.{s}.tokens"],
        read=lambda p, s: _read_wikitext(p / f"wiki.{s}.tokens"),
    ),
    "tiny_shakespeare": SourceFormat(
        "tiny_shakespeare", ("train", "valid"),
        detect=lambda p: p.is_dir() and (p / "input.txt").is_file() and not any(p.glob("*.jsonl*")),
        files=lambda p, s: [p / "input.txt"],
        read=lambda p, s: _shakespeare_split(p / "input.txt", s),
    ),
    # Plain text (.txt: one document per file) or JSON lines with a "text" field; no splits.
    "text": SourceFormat(
        "text", ("train",),
        detect=lambda p: True,
        files=lambda p, s: _user_files(p),
        read=_read_user,
    ),
}


def detect_format(source: str | Path) -> SourceFormat:
    """The registered format of a corpus folder or file (FileNotFoundError if it does not exist)."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"corpus source {path} does not exist")
    return next(fmt for fmt in FORMATS.values() if fmt.detect(path))


def _check_split(fmt: SourceFormat, source: Path, split: str | None) -> str:
    split = split or fmt.splits[0]
    if split not in fmt.splits:
        extra = " (user text files have no splits: name a separate file for validation)" if fmt.name == "text" else ""
        raise ValueError(f"{source} ({fmt.name}) has splits {list(fmt.splits)}, not {split!r}{extra}")
    return split


def source_files(source: str | Path, split: str | None = None) -> list[Path]:
    """The files `iter_texts(source, split)` reads, each checked to exist."""
    fmt = detect_format(source)
    split = _check_split(fmt, Path(source), split)
    files = fmt.files(Path(source), split)
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"corpus file {f} does not exist ({fmt.name}, split {split!r})")
    return files


def iter_texts(source: str | Path, split: str | None = None) -> Iterator[str]:
    """Stream the documents of `source` (a corpus folder or a user file/folder) for `split`.

    `split=None` takes the format's first split ("train", or "valid" for WikiText). An empty or
    unreadable file raises an error naming it.
    """
    fmt = detect_format(source)
    split = _check_split(fmt, Path(source), split)
    for f in source_files(source, split):
        if f.stat().st_size == 0:
            raise ValueError(f"corpus file {f} is empty")
    return fmt.read(Path(source), split)


def source_key(source: str | Path, split: str | None = None) -> dict:
    """Cache key of a corpus: format, split and each file's resolved path, size and mtime."""
    fmt = detect_format(source)
    split = _check_split(fmt, Path(source), split)
    files = [
        {"path": str(f.resolve()), "size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns}
        for f in source_files(source, split)
    ]
    return {"format": fmt.name, "split": split, "files": files}


def approx_chars(source: str | Path, split: str | None = None) -> int | None:
    """Rough size of a split in characters (for ETA and sampling); None when unknown."""
    fmt = detect_format(source)
    split = _check_split(fmt, Path(source), split)
    manifest = Path(source) / "manifest.tsv"
    if fmt.name == "gutenberg" and manifest.is_file():
        rows = [line.rstrip("\n").split("\t") for line in manifest.open(encoding="utf-8")]
        col = rows[0].index("text_bytes")
        return sum(int(r[col]) for r in rows[1:] if r[0] == split)
    files = source_files(source, split)
    if any(f.suffix == ".gz" for f in files):
        return None
    total = sum(f.stat().st_size for f in files)
    if fmt.name == "tiny_shakespeare":
        return int(total * (0.9 if split == "train" else 0.1))
    return total


def chunk_text(text: str, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Cut `text` into pieces of about `chunk_chars`, only before a newline preceded by a non-space.

    Concatenating the pieces gives `text` back, and tokenizing them one by one gives the same ids
    as tokenizing `text` whole (see the module docstring).
    """
    start, n = 0, len(text)
    while n - start > chunk_chars:
        i = text.find("\n", start + chunk_chars)
        while i != -1 and text[i - 1].isspace():
            i = text.find("\n", i + 1)
        if i == -1:
            break
        yield text[start:i]
        start = i
    if start < n:
        yield text[start:]


def sample_texts_for_tokenizer(
    source: str | Path, max_chars: int, split: str | None = None, seed: int = 0
) -> list[str]:
    """A bounded, deterministic sample of a corpus for training a tokenizer.

    Chunks (see `chunk_text`) are kept with probability max_chars / approx_chars(source), drawn
    from a generator seeded by `seed`, so every document contributes; where the size is unknown
    the leading chunks are taken. The sample holds at most `max_chars` characters.
    """
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    total = approx_chars(source, split)
    keep = 1.0 if not total else min(1.0, max_chars / total)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    n = 0
    for doc in iter_texts(source, split):
        for chunk in chunk_text(doc, 4_000):
            if keep < 1.0 and rng.random() >= keep:
                continue
            if n + len(chunk) > max_chars:
                return out
            out.append(chunk)
            n += len(chunk)
    return out


# ------------------------------------------------------------------------------ tokenizing
def _id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _meta_path(cache_path: Path) -> Path:
    return cache_path.with_name(cache_path.name + ".meta.json")


def read_cache_meta(cache_path: str | Path) -> dict | None:
    """The sidecar of a token cache (key, dtype, n_tokens, n_docs, ...) or None if absent."""
    meta = _meta_path(Path(cache_path))
    return json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else None


def _load_cache(cache_path: Path, full_key: dict) -> np.memmap | None:
    meta = read_cache_meta(cache_path)
    if meta is None or meta.get("key") != full_key or not cache_path.is_file():
        return None
    dtype = np.dtype(meta["dtype"])
    if cache_path.stat().st_size != meta["n_tokens"] * dtype.itemsize:
        return None
    return np.memmap(cache_path, dtype=dtype, mode="r", shape=(meta["n_tokens"],))


def _batches(texts: Iterable[str], counts: dict) -> Iterator[tuple[list[str], list[bool]]]:
    """Group document chunks into batches of about BATCH_CHARS; ends[i]: chunk i closes its document."""
    batch: list[str] = []
    ends: list[bool] = []
    size = 0
    for doc in texts:
        if not doc.strip():
            counts["n_skipped"] += 1
            continue
        counts["n_docs"] += 1
        counts["n_chars"] += len(doc)
        chunks = list(chunk_text(doc))
        for j, chunk in enumerate(chunks):
            batch.append(chunk)
            ends.append(j == len(chunks) - 1)
            size += len(chunk)
            if size >= BATCH_CHARS:
                yield batch, ends
                batch, ends, size = [], [], 0
    if batch:
        yield batch, ends


def _write_ids(texts: Iterable[str], tokenizer: Tokenizer, out, dtype: np.dtype, bar: Bar) -> dict:
    """Stream `texts` as ids (doc ids, then doc_sep_id) into the binary file `out`; return counts.
    `bar` counts characters (its total is the source's size), with tokens and tok/s beside."""
    sep = tokenizer.doc_sep_id
    counts = {"n_tokens": 0, "n_docs": 0, "n_skipped": 0, "n_chars": 0}
    for batch, ends in _batches(texts, counts):
        encs = tokenizer.encode_batch(batch, add_special=False)  # multi-threaded in Rust
        parts = [[*ids, sep] if end else ids for ids, end in zip(encs, ends)]
        n = sum(len(p) for p in parts)
        np.fromiter(itertools.chain.from_iterable(parts), dtype=dtype, count=n).tofile(out)
        counts["n_tokens"] += n
        bar.update(sum(len(c) for c in batch))
        if not bar.disable:
            n_tok, seconds = counts["n_tokens"], max(bar.format_dict["elapsed"], 1e-9)
            bar.set_postfix_str(f"{n_tok:,} tokens, {n_tok / seconds:,.0f} tok/s", refresh=False)
    return counts


def tokenize_to_cache(
    texts: Iterable[str],
    tokenizer: Tokenizer,
    cache_path: str | Path,
    key: dict | None = None,
    total_chars: int | None = None,
    label: str = "",
    progress: bool = True,
) -> np.memmap:
    """Tokenize a stream of documents into a flat id file and map it read-only, shape (N,).

    Layout: doc_0 ids, sep, doc_1 ids, sep, ... where sep = `tokenizer.doc_sep_id`; no [CLS]/BOS.
    Whitespace-only documents are skipped and counted (`n_skipped` in the meta).
    `key` (e.g. `source_key(...)`) identifies the text; with the tokenizer fingerprint it forms
    the cache key. When `<cache_path>.meta.json` holds the same key the file is mapped without
    reading `texts`. With `key=None` the cache is always rebuilt. Written atomically
    (`plmodels.files.atomic_open`: a failure mid-write leaves the old cache and its sidecar); the text is streamed in batches of about BATCH_CHARS characters.
    """
    cache_path = Path(cache_path)
    full_key = None if key is None else {"version": CACHE_VERSION, "source": key, "tokenizer": tokenizer.fingerprint()}
    if full_key is not None and (hit := _load_cache(cache_path, full_key)) is not None:
        return hit
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    dtype = _id_dtype(tokenizer.vocab_size)
    t0 = time.monotonic()
    bar = progress_bar(total_chars, f"tokenize {label or cache_path.name}", "char", scale=True, disable=not progress)
    with bar, atomic_open(cache_path, "wb") as out:   # a failure before the block ends leaves the old cache
        counts = _write_ids(texts, tokenizer, out, dtype, bar)
        if counts["n_docs"] == 0:
            raise ValueError(f"no text to tokenize for {label or cache_path} ({counts['n_skipped']} empty documents)")
        # Drop the old sidecar before the rename: a stale key must never describe the new file.
        _meta_path(cache_path).unlink(missing_ok=True)
    meta = {"key": full_key, "dtype": dtype.name, **counts, "vocab_size": tokenizer.vocab_size,
            "doc_sep_id": tokenizer.doc_sep_id, "seconds": round(time.monotonic() - t0, 3)}
    with atomic_open(_meta_path(cache_path)) as f:  # fsynced, after the ids it describes
        json.dump(meta, f, indent=2)
    return np.memmap(cache_path, dtype=dtype, mode="r", shape=(counts["n_tokens"],))


def cached_corpus(
    source: str | Path, split: str | None, tokenizer: Tokenizer, cache_dir: str | Path, progress: bool = True
) -> np.memmap:
    """`tokenize_to_cache` for a corpus source, cached as `<cache_dir>/<name>.<split>.<fp12>.ids`."""
    fmt = detect_format(source)
    split = _check_split(fmt, Path(source), split)
    name = Path(source).name.removesuffix(".gz")
    path = Path(cache_dir) / f"{name}.{split}.{tokenizer.fingerprint()[:12]}.ids"
    return tokenize_to_cache(
        iter_texts(source, split), tokenizer, path, key=source_key(source, split),
        total_chars=approx_chars(source, split), label=f"{name} {split}", progress=progress,
    )


# -------------------------------------------------------------------------------- packing
Mode = Literal["mlm", "clm"]


class PackedDataset:
    """Fixed-length training sequences cut from a flat id stream, in a seeded order per epoch.

    mode "mlm" (encoder): sequence k = [CLS] + ids[k*(L-2) : (k+1)*(L-2)] + [SEP], shape (L,).
    mode "clm" (decoder): sequence k = ids[k*L : k*L + L + 1], shape (L+1,); the model reads
        seq[:-1] and predicts seq[1:]. Windows share one token at their border, so every stream
        token after the first is a target exactly once per epoch.
    Tokens past the last full sequence (`remainder` of them) are not used; they are counted.
    `order(epoch)` = permutation of range(len(self)) from numpy's PCG64 seeded by (seed, epoch):
    the same on every run, different across seeds and epochs.
    """

    def __init__(self, ids: np.ndarray, seq_len: int, seed: int = 0, mode: Mode = "clm",
                 cls_id: int | None = None, sep_id: int | None = None):
        if ids.ndim != 1:
            raise ValueError(f"ids must be a flat stream (N,), got shape {ids.shape}")
        if mode not in ("mlm", "clm"):
            raise ValueError(f"mode must be 'mlm' or 'clm', got {mode!r}")
        if mode == "mlm" and (cls_id is None or sep_id is None):
            raise ValueError("mode 'mlm' needs cls_id and sep_id")
        if seq_len < (3 if mode == "mlm" else 1):
            raise ValueError(f"seq_len too small for mode {mode!r}: {seq_len}")
        self.ids, self.seq_len, self.seed, self.mode = ids, int(seq_len), int(seed), mode
        self.cls_id, self.sep_id = cls_id, sep_id
        self.stride = seq_len - 2 if mode == "mlm" else seq_len
        width = self.stride if mode == "mlm" else seq_len + 1
        self.n = max((len(ids) - width) // self.stride + 1, 0) if len(ids) >= width else 0
        used = self.n * self.stride + (width - self.stride)
        self.remainder = len(ids) - used if self.n else len(ids)
        self._width = width

    @classmethod
    def for_tokenizer(cls, ids: np.ndarray, seq_len: int, seed: int, tokenizer: Tokenizer) -> "PackedDataset":
        """mlm with the tokenizer's [CLS]/[SEP] for WordPiece, clm for byte-level BPE."""
        if tokenizer.kind == "wordpiece":
            return cls(ids, seq_len, seed, "mlm", tokenizer.cls_id, tokenizer.sep_id)
        return cls(ids, seq_len, seed, "clm")

    def __len__(self) -> int:
        return self.n

    @property
    def item_len(self) -> int:
        """Length of one sequence: L for mlm, L + 1 for clm."""
        return self.seq_len if self.mode == "mlm" else self.seq_len + 1

    def __getitem__(self, k: int) -> np.ndarray:
        """Sequence k in stream order, int64 (item_len,)."""
        if not 0 <= k < self.n:
            raise IndexError(f"sequence {k} out of range [0, {self.n})")
        body = np.asarray(self.ids[k * self.stride: k * self.stride + self._width], dtype=np.int64)
        if self.mode == "clm":
            return body
        return np.concatenate([[self.cls_id], body, [self.sep_id]]).astype(np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation of sequence indices, (len(self),) int64."""
        return np.random.default_rng([self.seed, int(epoch)]).permutation(self.n)

    def batch(self, epoch: int, position: int, batch_size: int) -> np.ndarray:
        """Sequences order(epoch)[position : position + batch_size] stacked, (B, item_len) int64."""
        idx = self.order(epoch)[position: position + batch_size]
        if len(idx) == 0:
            raise IndexError(f"position {position} is past the end of epoch {epoch} ({self.n} sequences)")
        return np.stack([self[int(k)] for k in idx])

    def iter_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """(position, batch) pairs from `start` to the end of the epoch; the last batch may be short.

        To resume after a stop at (epoch, position), call with that epoch and `start=position`.
        """
        order = self.order(epoch)
        for pos in range(start, self.n, batch_size):
            yield pos, np.stack([self[int(k)] for k in order[pos: pos + batch_size]])
