"""Readers for the probing corpora: CoNLL-U (with GUM `Entity=` coreference), UNER IOB2, PTB trees, SST-2.

Every reader is a plain function `read_*(path, ...)` that returns frozen records and raises
`DataFormatError(file, line, message)` on malformed input, so a bad line is found by its number.
Formats followed:
- CoNLL-U (Universal Dependencies, https://universaldependencies.org/format.html): 10 tab-separated
  columns; `3-4` lines are multiword tokens (surface only) and `5.1` lines are empty nodes, both kept
  beside the syntactic words but never counted as words.
- GUM / CorefUD `Entity=` (CoNLL-2012-style brackets): `(ID-etype-...` opens a mention on a word,
  `ID)` closes the most recent open mention of entity ID, `(ID-etype-...)` is a one-word mention;
  the field order comes from the `# global.Entity = GRP-etype-infstat-...` comment.
- UNER v1 IOB2 (Mayhew et al. 2024): `ID FORM TAG - ANNOTATOR`, tags O and B-/I-{PER,ORG,LOC}.
- PTB brackets, one tree per line (GUM `const/`): constituents are the non-terminal nodes; the
  preterminals (POS tags) are kept apart, as in Tenney et al. (2019), whose constituent task labels
  non-terminal spans only.
- GLUE SST-2 TSV (Wang et al. 2018): header `sentence<TAB>label`; the test file is unlabeled.
All files are read as UTF-8 (a byte-order mark opening the file is skipped), with lines numbered as
`grep -n` numbers them; bytes that are not UTF-8 and a file without any sentence are errors too.
"""
from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class DataFormatError(ValueError):
    """A malformed line in a data file; `str(err)` reads `file:line: message`."""

    def __init__(self, file: str | Path, line: int, message: str):
        self.file, self.line, self.message = str(file), int(line), message
        super().__init__(f"{self.file}:{self.line}: {message}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file. A line ends at "\\n" and a "\\r" before it is
    dropped (CRLF files); a byte-order mark opening the file is skipped. Bytes that are not UTF-8, or a
    "\\r" anywhere else, are a DataFormatError on their line."""
    try:
        with open(path, encoding="utf-8-sig", newline="\n") as fh:
            for ln, raw in enumerate(fh, start=1):
                line = raw.rstrip("\n")                         # at most one: lines end at \n
                if "\r" in line:
                    if line.find("\r") != len(line) - 1:
                        raise DataFormatError(path, ln, "carriage return (\\r) inside the line; only \\n and "
                                              "\\r\\n line ends are read (old Mac file? `tr '\\r' '\\n'`)")
                    line = line[:-1]
                yield ln, line
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _not_utf8(path: Path) -> DataFormatError:
    """The error for a file that is not UTF-8, naming its first bad line and how to convert it."""
    with open(path, "rb") as fh:
        for ln, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                near = raw[max(0, e.start - 12):e.start + 12].rstrip(b"\r\n")
                if ln == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
                    how = f"it looks like UTF-16: `iconv -f utf-16 -t utf-8 {path.name} > {path.name}.utf8`"
                else:
                    how = f"if it is Latin-1, convert it: `iconv -f latin1 -t utf-8 {path.name} > {path.name}.utf8`"
                return DataFormatError(path, ln, f"not UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start + 1} of "
                                       f"the line ({e.reason}) in {near!r}; {how}")
    return DataFormatError(path, 1, "not UTF-8")       # only if the file changed while being read


def _no_sentences(path: Path, n_lines: int, rest: str = "blank lines or comments") -> DataFormatError:
    """The error for a file that holds no sentence at all (an empty or cut-off download, a wrong path)."""
    why = "the file is empty" if n_lines == 0 else f"its {n_lines} line(s) hold only {rest}"
    return DataFormatError(path, 1, f"no sentences: {why}")


class Skips(collections.Counter):
    """Counts of records or targets left out, by reason: nothing is dropped without a count."""

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.items())}


# --------------------------------------------------------------------------------------- CoNLL-U
@dataclass(frozen=True)
class Mention:
    """One entity mention over words `start:end` (0-based, end exclusive) of its sentence.

    `entity` is the GRP id as written (unique within one document only); `attrs` holds the other
    `global.Entity` fields, e.g. (("infstat", "new"), ("salience", "nnnnn"), ...).
    """

    entity: str
    etype: str
    start: int
    end: int
    attrs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Sentence:
    """One CoNLL-U sentence. Word-level tuples all have length n = number of syntactic words.

    heads are UD's 1-based ids (0 = root). `multiword` holds (start, end, form) over word indices
    (0-based, end exclusive); `empty_nodes` holds the raw 10 columns of each `N.M` line, which UD
    leaves out of the basic tree.
    """

    sent_id: str
    text: str
    doc_id: str
    words: tuple[str, ...]
    lemmas: tuple[str, ...]
    upos: tuple[str, ...]
    xpos: tuple[str, ...]
    feats: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    misc: tuple[str, ...]
    multiword: tuple[tuple[int, int, str], ...] = ()
    empty_nodes: tuple[tuple[str, ...], ...] = ()
    mentions: tuple[Mention, ...] = ()
    line: int = 0          # line number of the first token line

    def __len__(self) -> int:
        return len(self.words)


_ENTITY_PART = re.compile(r"\(([^()]*)\)?|([^()]+)\)")
_DEFAULT_ENTITY_FIELDS = ("GRP", "etype", "infstat", "salience", "centering", "minspan", "link", "identity")


def _misc_value(misc: str, key: str) -> str | None:
    if misc == "_" or key + "=" not in misc:
        return None
    for item in misc.split("|"):
        if item.startswith(key + "="):
            return item[len(key) + 1:]
    return None


class _MentionTracker:
    """Opens and closes `Entity=` brackets word by word within one sentence."""

    def __init__(self, path: Path, fields: tuple[str, ...]):
        self.path, self.fields = path, fields
        self.open: list[tuple[str, str, int, tuple, int]] = []   # entity, etype, start, attrs, line
        self.done: list[Mention] = []

    def feed(self, value: str, word: int, line: int) -> None:
        pos = 0
        for m in _ENTITY_PART.finditer(value):
            if m.start() != pos:
                raise DataFormatError(self.path, line, f"bad Entity value {value!r}")
            pos = m.end()
            if m.group(2) is not None:                     # "ID)" closes
                self._close(m.group(2), word, line)
                continue
            parts = m.group(1).split("-", len(self.fields) - 1)
            if len(parts) < 2 or not parts[0] or not parts[1]:
                raise DataFormatError(self.path, line, f"Entity bracket {m.group(0)!r} lacks id or type")
            attrs = tuple(zip(self.fields[2:], parts[2:]))
            self.open.append((parts[0], parts[1], word, attrs, line))
            if m.group(0).endswith(")"):                   # "(ID-...)" single word
                self._close(parts[0], word, line)
        if pos != len(value):
            raise DataFormatError(self.path, line, f"bad Entity value {value!r}")

    def _close(self, entity: str, word: int, line: int) -> None:
        for k in range(len(self.open) - 1, -1, -1):
            if self.open[k][0] == entity:
                ent, etype, start, attrs, _ = self.open.pop(k)
                self.done.append(Mention(ent, etype, start, word + 1, attrs))
                return
        raise DataFormatError(self.path, line, f"Entity closes {entity!r}, which is not open")

    def finish(self, line: int) -> tuple[Mention, ...]:
        if self.open:
            ent, _, _, _, opened = self.open[-1]
            raise DataFormatError(self.path, opened, f"Entity {ent!r} opened here is not closed by "
                                  f"the end of its sentence (line {line})")
        return tuple(sorted(self.done, key=lambda m: (m.start, -m.end)))


def _int(text: str, path: Path, line: int, what: str) -> int:
    """An integer field: ASCII digits, maybe after "-" (int() alone would also take " 1", "1_0", "+1")."""
    if text.isascii() and (text.isdigit() or text[:1] == "-" and text[1:].isdigit()):
        try:
            return int(text)
        except ValueError:                                   # more digits than int() converts
            pass
    raise DataFormatError(path, line, f"{what} {text!r} is not an integer")


def _columns_message(line: str, cols: list[str], expected: str) -> str:
    """Why a token line has the wrong number of columns, saying so when it only holds spaces."""
    if not line.strip():
        return "line has only spaces or tabs; a sentence ends at an empty line"
    return f"expected {expected} tab-separated columns, found {len(cols)}"


def _check_tree(heads: list[int], lines: list[int], path: Path) -> None:
    """UD basic dependencies form one tree: exactly one word has HEAD 0, and every other word reaches
    it by following HEADs (no cycle). `heads` are 1-based ids already in 0..n; `lines` per word."""
    if heads.count(0) != 1:
        roots = [i + 1 for i, h in enumerate(heads) if h == 0]
        if not roots:
            raise DataFormatError(path, lines[0], "sentence has no root: no word has HEAD 0 (UD needs exactly one)")
        raise DataFormatError(path, lines[roots[1] - 1], f"sentence has {len(roots)} roots: words "
                              f"{', '.join(map(str, roots))} have HEAD 0 (UD allows exactly one)")
    reached = [False] * (len(heads) + 1)                     # word id -> known to reach the root
    reached[0] = True
    walk = [0] * (len(heads) + 1)                            # word id -> last walk that passed it
    for i in range(1, len(heads) + 1):
        j = i
        while not reached[j]:
            if walk[j] == i:                                 # back on this walk: a cycle through j
                cycle, k = [j], heads[j - 1]
                while k != j:
                    cycle.append(k)
                    k = heads[k - 1]
                first = min(cycle)
                raise DataFormatError(path, lines[first - 1], "dependency cycle " + " -> ".join(
                    map(str, cycle + [j])) + f" (word -> its HEAD): word {first} has no path to the root")
            walk[j] = i
            j = heads[j - 1]
        j = i
        while not reached[j]:
            reached[j] = True
            j = heads[j - 1]


class _SentenceBuilder:
    """Collects the token lines of one CoNLL-U sentence and checks them when it ends."""

    def __init__(self, path: Path, fields: tuple[str, ...]):
        self.path = path
        self.rows: list[list[str]] = []
        self.lines: list[int] = []                       # line number of each word
        self.mwt: list[tuple[int, int, str, int]] = []   # start, end, form, line
        self.empty: list[tuple[str, ...]] = []
        self.comments: dict[str, str] = {}
        self.first_line = 0
        self.tracker = _MentionTracker(path, fields)

    def __bool__(self) -> bool:
        return bool(self.rows or self.comments or self.empty or self.mwt)

    def add(self, cols: list[str], ln: int) -> None:
        path, n = self.path, len(self.rows)
        if not (self.rows or self.mwt or self.empty):
            self.first_line = ln
        tok_id = cols[0]
        if "-" in tok_id:                                    # multiword token: surface only
            a, _, b = tok_id.partition("-")
            s, e = _int(a, path, ln, "ID"), _int(b, path, ln, "ID")
            if s != n + 1 or e < s:
                raise DataFormatError(path, ln, f"multiword range {tok_id} does not start at word {n + 1}")
            self.mwt.append((s - 1, e, cols[1], ln))
        elif "." in tok_id:                                  # empty node: not a word in UD's basic tree
            a, _, b = tok_id.partition(".")
            if _int(a, path, ln, "ID") != n:
                raise DataFormatError(path, ln, f"empty node {tok_id} does not follow word {a}")
            _int(b, path, ln, "ID")
            self.empty.append(tuple(cols))
        else:
            if _int(tok_id, path, ln, "ID") != n + 1:
                raise DataFormatError(path, ln, f"word id {tok_id} out of order, expected {n + 1}")
            self.rows.append(cols)
            self.lines.append(ln)
            value = _misc_value(cols[9], "Entity")
            if value is not None:
                self.tracker.feed(value, n, ln)

    def build(self, end_line: int, doc_id: str) -> Sentence:
        path, rows, n = self.path, self.rows, len(self.rows)
        if not rows:
            raise DataFormatError(path, end_line, "sentence has comments or empty nodes but no words")
        heads = []
        for r, ln in zip(rows, self.lines):
            h = _int(r[6], path, ln, "HEAD")
            if not 0 <= h <= n:
                raise DataFormatError(path, ln, f"HEAD {h} out of range 0..{n}")
            heads.append(h)
        for s, e, _, ln in self.mwt:
            if e > n:
                raise DataFormatError(path, ln, f"multiword token {s + 1}-{e} ends past the last word {n}")
        _check_tree(heads, self.lines, path)
        col = lambda k: tuple(r[k] for r in rows)  # noqa: E731
        return Sentence(
            sent_id=self.comments.get("sent_id", f"{path.name}:{self.first_line}"),
            text=self.comments.get("text", ""), doc_id=doc_id, words=col(1), lemmas=col(2),
            upos=col(3), xpos=col(4), feats=col(5), heads=tuple(heads), deprels=col(7), misc=col(9),
            multiword=tuple((s, e, f) for s, e, f, _ in self.mwt), empty_nodes=tuple(self.empty),
            mentions=self.tracker.finish(end_line), line=self.first_line)


def read_conllu(path: str | Path) -> list[Sentence]:
    """All sentences of a CoNLL-U file, checked: 10 columns, ids 1..n in order, heads in 0..n forming
    one tree (one root, no cycle), multiword ranges inside the sentence, every `Entity=` bracket closed
    within its sentence, and at least one sentence in the file."""
    path = Path(path)
    sentences: list[Sentence] = []
    fields, doc_id = _DEFAULT_ENTITY_FIELDS, ""
    cur = _SentenceBuilder(path, fields)
    ln = 0
    for ln, line in _lines(path):
        if not line:
            if cur:
                sentences.append(cur.build(ln, doc_id))
                cur = _SentenceBuilder(path, fields)
        elif line.startswith("#"):
            if cur.rows:
                raise DataFormatError(path, ln, "comment line inside a sentence")
            key, sep, val = line[1:].partition("=")
            key, val = key.strip(), val.strip()
            if sep:
                cur.comments[key] = val
            if key.startswith("newdoc"):
                doc_id = val if sep else ""
            elif key == "global.Entity" and sep:
                fields = tuple(val.split("-"))
                cur.tracker = _MentionTracker(path, fields)
        else:
            cols = line.split("\t")
            if len(cols) != 10:
                raise DataFormatError(path, ln, _columns_message(line, cols, "10"))
            cur.add(cols, ln)
    if cur:
        sentences.append(cur.build(ln + 1, doc_id))
    if not sentences:
        raise _no_sentences(path, ln)
    return sentences


# ------------------------------------------------------------------------------------------ IOB2
@dataclass(frozen=True)
class NerSentence:
    """One IOB2 sentence: words, raw tags, entity spans (label, start, end exclusive), and the
    number of invalid I- runs left out of `spans`."""

    sent_id: str
    words: tuple[str, ...]
    tags: tuple[str, ...]
    spans: tuple[tuple[str, int, int], ...]
    line: int = 0
    invalid_spans: int = 0


def iob2_spans(tags: list[str] | tuple[str, ...], skips: Skips | None = None,
               where: tuple[Path, list[int]] | None = None) -> list[tuple[str, int, int]]:
    """Entity spans from IOB2 tags. An I-X that does not continue a B-X/I-X run is invalid: with
    `skips` given its run is left out and counted under "invalid_iob2_span", else DataFormatError
    (naming file and line when `where` = (path, line number of each tag) is given)."""
    spans: list[tuple[str, int, int]] = []
    cur: list | None = None            # [label, start] of the open span, or None
    bad = False                        # inside an invalid I- run
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, label = tag[:2], tag[2:]
        if tag == "O" or prefix == "B-":
            if cur is not None:
                spans.append((cur[0], cur[1], i))
            cur, bad = ([label, i] if prefix == "B-" else None), False
        elif prefix == "I-":
            if cur is not None and cur[0] == label:
                continue
            if bad and label == bad:
                continue
            if skips is None:
                path, lines = where if where else ("<tags>", list(range(1, len(tags) + 1)))
                raise DataFormatError(path, lines[i], f"tag {tag} does not continue a B-{label} span")
            if cur is not None:
                spans.append((cur[0], cur[1], i))
            skips["invalid_iob2_span"] += 1
            cur, bad = None, label
        else:
            path, lines = where if where else ("<tags>", list(range(1, len(tags) + 1)))
            raise DataFormatError(path, lines[i], f"tag {tag!r} is not O, B-X or I-X")
    return spans


def read_iob2(path: str | Path, labels: tuple[str, ...] = ("PER", "ORG", "LOC"),
              skip_invalid: bool = True) -> tuple[list[NerSentence], Skips]:
    """UNER IOB2 sentences (`ID FORM TAG - ANNOTATOR`, `# sent_id` comments, blank-line separated);
    a file without any sentence is an error.

    A tag whose type is not in `labels` is an error. Invalid I- runs are counted in the returned
    Skips (skip_invalid=True) or raise DataFormatError naming the file and line.
    """
    path = Path(path)
    out: list[NerSentence] = []
    skips = Skips()
    sent_id, words, tags, lines = "", [], [], []

    def flush() -> None:
        nonlocal sent_id, words, tags, lines
        own = Skips()
        spans = iob2_spans(tags, own if skip_invalid else None, (path, lines))
        skips.update(own)
        out.append(NerSentence(sent_id or f"{path.name}:{lines[0]}", tuple(words), tuple(tags),
                               tuple(spans), lines[0], own["invalid_iob2_span"]))
        sent_id, words, tags, lines = "", [], [], []

    ln = 0
    for ln, line in _lines(path):
        if not line:
            if words:
                flush()
            continue
        if line.startswith("#"):
            key, sep, val = line[1:].partition("=")
            if sep and key.strip() == "sent_id":
                if words:
                    raise DataFormatError(path, ln, "sent_id comment inside a sentence")
                sent_id = val.strip()
            continue
        cols = line.split("\t")
        if len(cols) < 3:
            raise DataFormatError(path, ln, _columns_message(line, cols, ">= 3"))
        if _int(cols[0], path, ln, "ID") != len(words) + 1:
            raise DataFormatError(path, ln, f"token id {cols[0]} out of order, expected {len(words) + 1}")
        tag = cols[2]
        if tag != "O" and (tag[:2] not in ("B-", "I-") or tag[2:] not in labels):
            raise DataFormatError(path, ln, f"tag {tag!r} is not O or B-/I- of {'/'.join(labels)}")
        words.append(cols[1])
        tags.append(tag)
        lines.append(ln)
    if words:
        flush()
    if not out:
        raise _no_sentences(path, ln)
    return out, skips


# ------------------------------------------------------------------------------------------- PTB
@dataclass(frozen=True)
class Constituent:
    """A non-terminal node over leaves `start:end` (end exclusive); `label` has function tags and
    indices stripped (NP-SBJ-1 -> NP), `raw_label` is as written; `depth` 0 = the tree's top node."""

    label: str
    raw_label: str
    start: int
    end: int
    depth: int


@dataclass(frozen=True)
class Tree:
    """One PTB tree: its leaves, their preterminal (POS) tags, and its non-terminal constituents
    (pre-order). A wrapper node labelled ROOT/TOP or empty is kept as constituent depth 0 too."""

    leaves: tuple[str, ...]
    tags: tuple[str, ...]
    constituents: tuple[Constituent, ...]
    line: int = 0


_PTB_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_BRACKETS = frozenset("()[]{}")
PTB_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def strip_function_tags(label: str) -> str:
    """PTB label without function tags or co-indices: NP-SBJ -> NP, PP-DIR=2 -> PP; -NONE- stays."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


def parse_ptb(text: str, path: str | Path = "<string>", line: int = 0) -> Tree:
    """Parse one bracketed tree. A node whose only child is a word is a preterminal (POS)."""
    toks = _PTB_TOKEN.findall(text)
    leaves: list[str] = []
    tags: list[str] = []
    cons: list[Constituent] = []
    stack: list[list] = []        # [label, start, has_word, has_node, cons_index]
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "(":
            label = toks[i + 1] if i + 1 < len(toks) and toks[i + 1] not in "()" else ""
            i += 2 if label else 1
            if stack:
                stack[-1][3] = True
            stack.append([label, len(leaves), False, False, len(cons)])
            cons.append(None)   # placeholder, filled at ")" (keeps pre-order)
            continue
        if t == ")":
            if not stack:
                raise DataFormatError(path, line, "unbalanced ')'")
            label, start, has_word, has_node, k = stack.pop()
            if has_word and has_node:
                raise DataFormatError(path, line, f"node {label!r} mixes words and sub-trees")
            if has_word:
                cons[k] = "pre"
            elif not has_node:
                raise DataFormatError(path, line, f"node {label!r} is empty")
            else:
                cons[k] = Constituent(strip_function_tags(label), label, start, len(leaves), len(stack))
            i += 1
            if not stack and i < len(toks):
                raise DataFormatError(path, line, f"{toks[i]!r} after the end of the tree (unbalanced brackets)")
            continue
        if not stack:
            raise DataFormatError(path, line, f"word {t!r} outside any bracket")
        if stack[-1][2]:
            raise DataFormatError(path, line, f"preterminal {stack[-1][0]!r} has two words")
        stack[-1][2] = True
        leaves.append(t)
        tags.append(stack[-1][0])
        i += 1
    if stack:
        raise DataFormatError(path, line, f"{len(stack)} bracket(s) not closed")
    if not leaves:
        raise DataFormatError(path, line, "tree has no words")
    return Tree(tuple(leaves), tuple(tags), tuple(c for c in cons if c != "pre"), line)


def read_ptb(path: str | Path) -> list[Tree]:
    """One tree per non-empty line; line numbers are kept so trees align to CoNLL-U sentences.
    A file without any tree is an error."""
    path = Path(path)
    trees = []
    ln = 0
    for ln, line in _lines(path):
        if line.strip():
            trees.append(parse_ptb(line, path, ln))
    if not trees:
        raise _no_sentences(path, ln, "blank lines")
    return trees


_ESCAPE_RE = re.compile("|".join(map(re.escape, PTB_ESCAPES)))


def ptb_unescape(leaf: str) -> str:
    """Leaf text with PTB bracket escapes undone, also inside words: -LRB-a-RRB- -> (a)."""
    return _ESCAPE_RE.sub(lambda m: PTB_ESCAPES[m.group(0)], leaf) if "-" in leaf else leaf


def ptb_leaf_matches(leaf: str, word: str) -> bool:
    """Does a PTB leaf spell a CoNLL-U word? Escapes count as their bracket, and a leaf that is one
    bracket escape matches any bracket word (parsers write -LRB- for '[' too)."""
    return leaf == word or ptb_unescape(leaf) == word or (leaf in PTB_ESCAPES and word in _BRACKETS)


# ----------------------------------------------------------------------------------------- SST-2
@dataclass(frozen=True)
class LabeledText:
    """One SST-2 row: the sentence (surrounding whitespace stripped) and its label (None in test)."""

    text: str
    label: int | None
    line: int = 0


def read_sst2(path: str | Path) -> list[LabeledText]:
    """GLUE SST-2 TSV: `sentence<TAB>label` (label 0/1), or `index<TAB>sentence` for the test file.
    Fields are split at tabs with no quoting (as GLUE writes them); a file without any row is an error."""
    path = Path(path)
    out = []
    labeled, ln = True, 0
    for ln, line in _lines(path):
        row = line.split("\t")
        if ln == 1:
            if row not in (["sentence", "label"], ["index", "sentence"]):
                raise DataFormatError(path, 1, f"header {row!r} is not sentence/label or index/sentence")
            labeled = row[0] == "sentence"
            continue
        if len(row) != 2:
            raise DataFormatError(path, ln, f"expected 2 tab-separated fields, found {len(row)}")
        if labeled:
            if row[1] not in ("0", "1"):
                raise DataFormatError(path, ln, f"label {row[1]!r} is not 0 or 1")
            out.append(LabeledText(row[0].strip(), int(row[1]), ln))
        else:
            _int(row[0], path, ln, "index")
            out.append(LabeledText(row[1].strip(), None, ln))
    if not out:
        raise _no_sentences(path, ln, "the header")
    return out
