"""The lexicon and templates of the template-built minimal-pair suites (Marvin & Linzen 2018, "Targeted
Syntactic Evaluation of Language Models", EMNLP, Sec. 3; their templates/terminals.py is the model).

A template is a sequence of slots, each filled from the lexicon; the *critical* slot is the one word
where the grammatical and the ungrammatical sentence differ. Every template here is written so that
a pair differs in exactly that one word (M&L's NPI pair "The authors that no guards like have
ever ..." differs in two words and is left out; its one-word variants below are kept).

| template id | phenomenon | sentence | critical word |
|---|---|---|---|
| `agr_pp` | agreement across a prepositional phrase | The author near the guards laughs . | the verb |
| `agr_obj_rel` | agreement across an object relative clause | The author that the guards like laughs . | the matrix verb |
| `agr_sent_comp` | agreement in a sentential complement | The mechanic said the author laughs . | the embedded verb |
| `refl_simple` | reflexive anaphora | The author hurt himself . | the reflexive |
| `refl_obj_rel` | reflexive anaphora across an object relative clause | The author that the guards like hurt himself . | the reflexive |
| `npi_simple` | NPI licensing (ever) | No authors have ever been famous . / *The authors ... | the determiner |
| `npi_obj_rel` | NPI licensing across an object relative clause | No authors that the guards like have ever been famous . | the determiner |

Conditions: agreement and reflexives by the head noun's number and whether the other noun
(attractor) matches it (`sing_match`, `sing_mismatch`, `plur_match`, `plur_mismatch`); NPIs by the
head noun's number (`sing`, `plur`).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# (singular, plural) of animate nouns: subjects (M&L's "the author", "the pilot", ...)
NOUNS: tuple[tuple[str, str], ...] = (
    ("author", "authors"), ("pilot", "pilots"), ("surgeon", "surgeons"), ("farmer", "farmers"),
    ("manager", "managers"), ("customer", "customers"), ("officer", "officers"), ("teacher", "teachers"),
    ("senator", "senators"), ("dancer", "dancers"), ("lawyer", "lawyers"), ("doctor", "doctors"),
)
# (singular, plural) of the nouns inside the PP or the relative clause (the attractors)
OTHER_NOUNS: tuple[tuple[str, str], ...] = (
    ("guard", "guards"), ("chef", "chefs"), ("architect", "architects"), ("skater", "skaters"),
    ("minister", "ministers"), ("student", "students"), ("parent", "parents"), ("soldier", "soldiers"),
)
PREPOSITIONS: tuple[str, ...] = ("near", "behind", "beside", "with")
# (3rd singular, plural) present forms
INTRANSITIVE: tuple[tuple[str, str], ...] = (
    ("laughs", "laugh"), ("swims", "swim"), ("smiles", "smile"), ("sleeps", "sleep"),
    ("waits", "wait"), ("sings", "sing"), ("talks", "talk"), ("works", "work"),
)
TRANSITIVE: tuple[tuple[str, str], ...] = (
    ("likes", "like"), ("admires", "admire"), ("hates", "hate"), ("loves", "love"), ("knows", "know"),
)
SAY_VERBS: tuple[str, ...] = ("said", "knew", "thought", "hoped", "claimed")  # matrix verbs of a complement
PAST_TRANSITIVE: tuple[str, ...] = ("hurt", "blamed", "admired", "hated", "injured", "embarrassed", "praised",
                                    "doubted", "trusted", "criticized")
# (singular, plural) reflexive: M&L use himself / themselves
REFLEXIVE: tuple[str, str] = ("himself", "themselves")
HAVE: tuple[str, str] = ("has", "have")
NPI_PREDICATES: tuple[str, ...] = ("been famous", "been popular", "seen a ghost", "been to Paris", "lied",
                                   "been happy", "won a prize", "said a word")
NPI_LICENSOR, NPI_NON_LICENSOR = "No", "The"


NUMBERS = ("sing", "plur")


@dataclass(frozen=True)
class Filled:
    """One filled template: the grammatical words, the ungrammatical word at `critical`, the condition,
    the number of attractors (other-number nouns between the controller and the critical word) and
    the distance in words from the controller to the critical word."""

    good: tuple[str, ...]
    bad_word: str
    critical: int
    condition: str
    attractors: int
    distance: int


def _numbers(rng: random.Random) -> tuple[int, int]:
    """(head noun number, other noun number) as 0 = singular, 1 = plural."""
    return rng.randrange(2), rng.randrange(2)


def _condition(n: int, m: int) -> str:
    return f"{NUMBERS[n]}_{'match' if n == m else 'mismatch'}"


def _np(rng: random.Random, nouns: tuple[tuple[str, str], ...], n: int) -> str:
    return rng.choice(nouns)[n]


def agr_pp(rng: random.Random) -> Filled:
    n, m = _numbers(rng)
    verb = rng.choice(INTRANSITIVE)
    words = ("The", _np(rng, NOUNS, n), rng.choice(PREPOSITIONS), "the", _np(rng, OTHER_NOUNS, m), verb[n], ".")
    return Filled(words, verb[1 - n], 5, _condition(n, m), int(n != m), 4)


def agr_obj_rel(rng: random.Random) -> Filled:
    n, m = _numbers(rng)
    verb, tverb = rng.choice(INTRANSITIVE), rng.choice(TRANSITIVE)
    words = ("The", _np(rng, NOUNS, n), "that", "the", _np(rng, OTHER_NOUNS, m), tverb[m], verb[n], ".")
    return Filled(words, verb[1 - n], 6, _condition(n, m), int(n != m), 5)


def agr_sent_comp(rng: random.Random) -> Filled:
    n, m = _numbers(rng)  # n: the embedded subject (the controller), m: the matrix subject
    verb = rng.choice(INTRANSITIVE)
    words = ("The", _np(rng, OTHER_NOUNS, m), rng.choice(SAY_VERBS), "the", _np(rng, NOUNS, n), verb[n], ".")
    return Filled(words, verb[1 - n], 5, _condition(n, m), 0, 1)


def refl_simple(rng: random.Random) -> Filled:
    n = rng.randrange(2)
    words = ("The", _np(rng, NOUNS + OTHER_NOUNS, n), rng.choice(PAST_TRANSITIVE), REFLEXIVE[n], ".")
    return Filled(words, REFLEXIVE[1 - n], 3, NUMBERS[n], 0, 2)


def refl_obj_rel(rng: random.Random) -> Filled:
    n, m = _numbers(rng)
    tverb = rng.choice(TRANSITIVE)
    words = ("The", _np(rng, NOUNS, n), "that", "the", _np(rng, OTHER_NOUNS, m), tverb[m],
             rng.choice(PAST_TRANSITIVE), REFLEXIVE[n], ".")
    return Filled(words, REFLEXIVE[1 - n], 7, _condition(n, m), int(n != m), 6)


def npi_simple(rng: random.Random) -> Filled:
    n = rng.randrange(2)
    words = (NPI_LICENSOR, _np(rng, NOUNS + OTHER_NOUNS, n), HAVE[n], "ever", *rng.choice(NPI_PREDICATES).split(), ".")
    return Filled(words, NPI_NON_LICENSOR, 0, NUMBERS[n], 0, 3)


def npi_obj_rel(rng: random.Random) -> Filled:
    n, m = _numbers(rng)
    tverb = rng.choice(TRANSITIVE)
    words = (NPI_LICENSOR, _np(rng, NOUNS, n), "that", "the", _np(rng, OTHER_NOUNS, m), tverb[m], HAVE[n],
             "ever", *rng.choice(NPI_PREDICATES).split(), ".")
    return Filled(words, NPI_NON_LICENSOR, 0, NUMBERS[n], 0, 7)


@dataclass(frozen=True)
class Template:
    """A template id, the phenomenon it tests and the function that fills it from a seeded rng."""

    template: str
    phenomenon: str
    fill: Callable[[random.Random], Filled]


TEMPLATES: tuple[Template, ...] = (
    Template("agr_pp", "agreement_pp", agr_pp),
    Template("agr_obj_rel", "agreement_obj_rel", agr_obj_rel),
    Template("agr_sent_comp", "agreement_sent_comp", agr_sent_comp),
    Template("refl_simple", "reflexive", refl_simple),
    Template("refl_obj_rel", "reflexive_obj_rel", refl_obj_rel),
    Template("npi_simple", "npi", npi_simple),
    Template("npi_obj_rel", "npi_obj_rel", npi_obj_rel),
)
