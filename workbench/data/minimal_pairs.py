"""Minimal-pair suites for targeted syntactic evaluation: two sentences that differ in one word, one
grammatical and one not (docs/behaviour.md has the rules and the counts).

Two sources, one record format (`PairRecord`: good and bad word lists, the critical word's index,
phenomenon, condition, variant, source line or template id and seed):

- **UD** (Gulordava, Bojanowski, Grave, Linzen & Baroni 2018, "Colorless green recurrent networks
  dream hierarchically", NAACL, Sec. 3; Linzen, Dupoux & Goldberg 2016's attractors). From every
  sentence of UD English EWT and GUM (all splits):
  * `subject_verb_agreement`: a NOUN/PROPN subject (`nsubj`, `nsubj:pass`) with a Number feature
    and, after it, the finite word that agrees with it (the head when finite, else its first finite
    `aux`/`aux:pass`/`cop` dependent, which must carry the subject's Number). The verb is swapped for
    its other-number form, the most frequent form the treebanks themselves give the triple (lemma,
    Tense, other Number) with VerbForm=Fin (is/are, was/were, has/have, -s/bare); no such form or the
    same form (ran/ran) skips the item. `distance` = verb index - subject index; `attractors` =
    NOUN/PROPN words strictly between them whose Number differs from the subject's; the condition
    is `attractors:0`, `attractors:1`, `attractors:2+`.
  * `determiner_noun_agreement`: this/that/these/those (`det` of a NOUN with a matching Number)
    swapped for the other number (this <-> these, that <-> those); conditions `adjacent` and
    `across_modifier`.
  * `reflexive`: himself/herself/itself <-> themselves, whose clause's `nsubj` (a NOUN/PROPN with
    Number) agrees with it; a plural subject's bad form is `himself`.
  Each UD item also has a **nonce** variant (Gulordava's "colorless green" control): every NOUN,
  VERB, ADJ and ADV other than the critical word, the controller's number kept, is replaced by a
  random lower-case form seen at least twice in the treebanks with the same UPOS and features,
  drawn with `random.Random(f"{seed}:{item id}")`. The bad sentence gets the same replacements.
- **Templates** (Marvin & Linzen 2018; `workbench/data/pair_templates.py`): agreement across a PP,
  an object relative clause and in a sentential complement, reflexives (simple and across an object
  RC), NPI licensing (simple and across an object RC); `n_per_template` distinct pairs each, drawn
  with `random.Random(f"{seed}:{template}:{k}")`.

Skipped UD candidates are counted by reason (`Skips`): nothing is dropped without a count.
`SUITE_VERSION` changes whenever a rule here changes; scores are cached under it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from workbench.core.io import atomic_write_text
from workbench.data.pair_templates import TEMPLATES
from workbench.data.readers import Sentence, Skips
from workbench.data.tasks import UD_TREEBANKS, _conllu

SUITE_VERSION = "1"
SPLITS = ("train", "dev", "test")
MAX_WORDS = 40  # longer UD sentences are skipped (`too_long`): the scorers' cost grows with length
NONCE_UPOS = ("NOUN", "VERB", "ADJ", "ADV")
NOMINAL = ("NOUN", "PROPN")
AGREE_RELS = ("aux", "aux:pass", "cop")
DET_SWAP = {"this": "these", "these": "this", "that": "those", "those": "that"}
DET_NUMBER = {"this": "Sing", "that": "Sing", "these": "Plur", "those": "Plur"}
REFL_NUMBER = {"himself": "Sing", "herself": "Sing", "itself": "Sing", "themselves": "Plur"}
REFL_BAD = {"Sing": "themselves", "Plur": "himself"}


@dataclass(frozen=True)
class PairRecord:
    """One minimal pair. `good` and `bad` are word lists equal except at `critical`."""

    id: str
    suite: str  # "ud" | "templates"
    phenomenon: str
    condition: str
    variant: str  # "original" | "nonce" (UD); "template"
    good: tuple[str, ...]
    bad: tuple[str, ...]
    critical: int
    distance: int  # controller -> critical word, in words
    attractors: int  # other-number nouns between them
    source: str  # "file:line" of the UD sentence, or the template id
    seed: int  # the suite seed the nonce words or the template fill were drawn with (-1: none)

    @property
    def good_word(self) -> str:
        return self.good[self.critical]

    @property
    def bad_word(self) -> str:
        return self.bad[self.critical]

    def to_dict(self) -> dict:
        return {**asdict(self), "good": list(self.good), "bad": list(self.bad)}

    @classmethod
    def from_dict(cls, d: dict) -> "PairRecord":
        return cls(**{**d, "good": tuple(d["good"]), "bad": tuple(d["bad"])})


def feats(s: str) -> dict[str, str]:
    """'A=1|B=2' -> {'A': '1', 'B': '2'} ('_' -> {})."""
    return {} if s in ("_", "") else dict(kv.split("=", 1) for kv in s.split("|") if "=" in kv)


def _in_multiword(s: Sentence, i: int) -> bool:
    return any(a <= i < b for a, b, _ in s.multiword)


def _match_case(form: str, like: str) -> str:
    return form[:1].upper() + form[1:] if like[:1].isupper() else form


@dataclass
class Lexicon:
    """What the treebanks say about forms: finite verb forms by (lemma, Tense, Number), and the forms
    of each (UPOS, FEATS) class for the nonce words."""

    verbs: dict[tuple[str, str, str], Counter]
    classes: dict[tuple[str, str], list[str]]

    @classmethod
    def build(cls, sentences: Iterable[Sentence], min_count: int = 2) -> "Lexicon":
        verbs: dict[tuple[str, str, str], Counter] = defaultdict(Counter)
        counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
        for s in sentences:
            for i, (w, lem, up, ft) in enumerate(zip(s.words, s.lemmas, s.upos, s.feats)):
                f = feats(ft)
                if f.get("VerbForm") == "Fin" and "Number" in f and w.isalpha() and not _in_multiword(s, i):
                    verbs[(lem.lower(), f.get("Tense", ""), f["Number"])][w.lower()] += 1
                if up in NONCE_UPOS and w.isalpha() and w.islower():
                    counts[(up, ft)][w] += 1
        classes = {k: sorted(f for f, n in c.items() if n >= min_count) for k, c in counts.items()}
        return cls(dict(verbs), {k: v for k, v in classes.items() if v})

    def other_number(self, lemma: str, tense: str, number: str) -> str | None:
        forms = self.verbs.get((lemma.lower(), tense, "Plur" if number == "Sing" else "Sing"))
        return forms.most_common(1)[0][0] if forms else None


def _agreeing_word(s: Sentence, subj: int) -> int | None:
    """The finite word that agrees with subject `subj`: its head when finite with Number, else the
    head's first finite aux/cop dependent with Number; None when there is none."""
    head = s.heads[subj] - 1
    if head < 0:
        return None
    cands = [head] + [j for j in range(len(s)) if s.heads[j] - 1 == head and s.deprels[j] in AGREE_RELS]
    finite = [j for j in sorted(cands) if feats(s.feats[j]).get("VerbForm") == "Fin" and "Number" in feats(s.feats[j])]
    return finite[0] if finite else None


def _attractors(s: Sentence, a: int, b: int, number: str) -> int:
    return sum(1 for k in range(a + 1, b) if s.upos[k] in NOMINAL and feats(s.feats[k]).get("Number") not in
               (None, number))


def _bin(k: int) -> str:
    return f"attractors:{k}" if k < 2 else "attractors:2+"


def sv_agreement(s: Sentence, lex: Lexicon, skips: Skips) -> list[tuple[int, int, str, str, int]]:
    """(subject, verb, bad form, condition, attractors) for each agreement item of sentence `s`."""
    out = []
    for i, rel in enumerate(s.deprels):
        if rel not in ("nsubj", "nsubj:pass"):
            continue
        number = feats(s.feats[i]).get("Number")
        if s.upos[i] not in NOMINAL or number is None:
            skips["sv_subject_not_noun_with_number"] += 1
            continue
        if any(s.heads[j] - 1 == i and s.deprels[j] == "conj" for j in range(len(s))):
            skips["sv_coordinated_subject"] += 1
            continue
        v = _agreeing_word(s, i)
        if v is None:
            skips["sv_no_finite_verb"] += 1
            continue
        fv = feats(s.feats[v])
        if v < i:
            skips["sv_verb_before_subject"] += 1
            continue
        if fv["Number"] != number:
            skips["sv_treebank_disagrees"] += 1
            continue
        if _in_multiword(s, v) or not s.words[v].isalpha():
            skips["sv_verb_in_contraction"] += 1
            continue
        bad = lex.other_number(s.lemmas[v], fv.get("Tense", ""), number)
        if bad is None or bad == s.words[v].lower():
            skips["sv_no_other_form"] += 1
            continue
        k = _attractors(s, i, v, number)
        out.append((i, v, _match_case(bad, s.words[v]), _bin(k), k))
    return out


def det_agreement(s: Sentence, skips: Skips) -> list[tuple[int, int, str, str, int]]:
    """(noun, determiner, bad form, condition, attractors) for this/these/that/those + noun."""
    out = []
    for i, w in enumerate(s.words):
        low = w.lower()
        if low not in DET_SWAP or s.deprels[i] != "det":
            continue
        h = s.heads[i] - 1
        if h < 0 or s.upos[h] != "NOUN" or feats(s.feats[h]).get("Number") != DET_NUMBER[low] or h < i:
            skips["det_head_not_matching_noun"] += 1
            continue
        cond = "adjacent" if h == i + 1 else "across_modifier"
        out.append((h, i, _match_case(DET_SWAP[low], w), cond, 0))
    return out


def reflexives(s: Sentence, skips: Skips) -> list[tuple[int, int, str, str, int]]:
    """(subject, reflexive, bad form, condition, attractors) for a reflexive bound by its clause's subject."""
    out = []
    for i, w in enumerate(s.words):
        number = REFL_NUMBER.get(w.lower())
        if number is None:
            continue
        h = s.heads[i] - 1
        subj = [j for j in range(len(s)) if s.heads[j] - 1 == h and s.deprels[j] in ("nsubj", "nsubj:pass")
                and s.upos[j] in NOMINAL and j < i]
        if not subj or feats(s.feats[subj[0]]).get("Number") != number:
            skips["refl_no_agreeing_noun_subject"] += 1
            continue
        k = _attractors(s, subj[0], i, number)
        out.append((subj[0], i, _match_case(REFL_BAD[number], w), _bin(k), k))
    return out


def nonce_words(s: Sentence, keep: set[int], lex: Lexicon, rng: random.Random) -> tuple[str, ...]:
    """The words of `s` with every NOUN/VERB/ADJ/ADV outside `keep` (and outside contractions) replaced
    by a random form of the same (UPOS, FEATS) class."""
    words = list(s.words)
    for j, (w, up, ft) in enumerate(zip(s.words, s.upos, s.feats)):
        pool = lex.classes.get((up, ft))
        if j in keep or up not in NONCE_UPOS or not pool or not w.isalpha() or _in_multiword(s, j):
            continue
        words[j] = _match_case(rng.choice(pool), w)
    return tuple(words)


PHENOMENA = {"subject_verb_agreement": lambda s, lex, sk: sv_agreement(s, lex, sk),
             "determiner_noun_agreement": lambda s, lex, sk: det_agreement(s, sk),
             "reflexive": lambda s, lex, sk: reflexives(s, sk)}


def ud_pairs(treebanks: Iterable[str] = ("ewt", "gum"), seed: int = 0) -> tuple[list[PairRecord], Skips]:
    """The UD suite (module docstring): original and nonce variants of every item, with skip counts."""
    files = [(UD_TREEBANKS[tb](sp), tb) for tb in treebanks for sp in SPLITS]
    sents = [(s, path) for path, _ in files for s in _conllu(path)]
    lex = Lexicon.build(s for s, _ in sents)
    skips = Skips()
    out: list[PairRecord] = []
    for s, path in sents:
        if len(s) > MAX_WORDS:
            skips["too_long"] += 1
            continue
        for phen, find in PHENOMENA.items():
            for ctrl, crit, bad, cond, k in find(s, lex, skips):
                item = f"ud:{path.stem}:{s.line}:{crit}:{phen}"
                good = tuple(s.words)
                common = dict(suite="ud", phenomenon=phen, condition=cond, critical=crit, distance=crit - ctrl,
                              attractors=k, source=f"{path.name}:{s.line}")
                out.append(PairRecord(id=item, variant="original", good=good, bad=_swap(good, crit, bad), seed=-1,
                                      **common))
                nonce = nonce_words(s, {crit, ctrl}, lex, random.Random(f"{seed}:{item}"))
                out.append(PairRecord(id=item + ":nonce", variant="nonce", good=nonce, bad=_swap(nonce, crit, bad),
                                      seed=seed, **common))
    return out, skips


def _swap(words: tuple[str, ...], i: int, w: str) -> tuple[str, ...]:
    return words[:i] + (w,) + words[i + 1:]


def template_pairs(n_per_template: int = 300, seed: int = 0) -> list[PairRecord]:
    """`n_per_template` distinct pairs from each template (fewer only if the lexicon runs out)."""
    out = []
    for t in TEMPLATES:
        seen: set[tuple[str, ...]] = set()
        k = 0
        while len(seen) < n_per_template and k < 50 * n_per_template:
            f = t.fill(random.Random(f"{seed}:{t.template}:{k}"))
            k += 1
            if f.good in seen:
                continue
            seen.add(f.good)
            out.append(PairRecord(id=f"tpl:{t.template}:{k - 1}", suite="templates", phenomenon=t.phenomenon,
                                  condition=f.condition, variant="template", good=f.good,
                                  bad=_swap(f.good, f.critical, f.bad_word), critical=f.critical, distance=f.distance,
                                  attractors=f.attractors, source=t.template, seed=seed))
    return out


@functools.lru_cache(maxsize=4)
def build_suites(seed: int = 0, n_per_template: int = 300) -> tuple[tuple[PairRecord, ...], dict[str, int]]:
    """Every pair of both suites (memoised) and the UD skip counts."""
    ud, skips = ud_pairs(seed=seed)
    return tuple(ud + template_pairs(n_per_template, seed)), skips.as_dict()


def cached_suites(cache_dir: str | Path | None, seed: int = 0, n_per_template: int = 300) -> list[PairRecord]:
    """`build_suites` through a JSON-lines file in `cache_dir`, keyed by the suite version, the seed, the
    template count and the treebank files' sizes and mtimes (reading the treebanks takes ~30 s)."""
    if cache_dir is None:
        return list(build_suites(seed, n_per_template)[0])
    files = [UD_TREEBANKS[tb](sp) for tb in ("ewt", "gum") for sp in SPLITS]
    stamp = ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    key = hashlib.sha256(f"{SUITE_VERSION}|{seed}|{n_per_template}|{stamp}".encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"pairs-v{SUITE_VERSION}-{key}.jsonl"
    if path.is_file():
        return [PairRecord.from_dict(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]
    records = list(build_suites(seed, n_per_template)[0])
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return records


def suite_counts(records: Iterable[PairRecord]) -> pd.DataFrame:
    """Pairs per suite, phenomenon, condition and variant (the table in docs/behaviour.md)."""
    c = Counter((r.suite, r.phenomenon, r.condition, r.variant) for r in records)
    rows = [(*k, n) for k, n in sorted(c.items())]
    return pd.DataFrame(rows, columns=["suite", "phenomenon", "condition", "variant", "pairs"])


def write_suites(out_dir: str | Path, seed: int = 0, n_per_template: int = 300) -> Path:
    """`out_dir/pairs.jsonl` (one PairRecord per line), `counts.csv` and `skips.json`; returns the jsonl."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, skips = build_suites(seed, n_per_template)
    atomic_write_text(out / "pairs.jsonl", "".join(json.dumps(r.to_dict()) + "\n" for r in records))
    atomic_write_text(out / "counts.csv", suite_counts(records).to_csv(index=False))
    atomic_write_text(out / "skips.json", json.dumps({"version": SUITE_VERSION, "skips": skips}, indent=1))
    return out / "pairs.jsonl"
