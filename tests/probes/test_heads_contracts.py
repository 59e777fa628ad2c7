"""probes/heads.py's smaller contracts, each with a known answer by hand: the relations a default
HeadConfig scores and its checks, the out-of-window positional count, the fixed-offset baseline's
reach (Voita et al. 2019's +-20 words in the default), which scores are role scores checked against a
floor, and the `weighting` column every head table carries. Written against the survivors of
scripts/mutation_sample.py (docs/testing.md)."""
import numpy as np
import pandas as pd
import pytest

from probes.heads import HeadConfig, HeadStats, Sentence, is_role_score, with_weighting

# the UD relations docs/heads.md lists as scored by default, spelled out (not read from HeadConfig)
UD_RELATIONS = ("nsubj", "obj", "iobj", "det", "amod", "advmod", "aux", "case", "mark", "cop", "nmod",
                "nmod:poss", "obl", "compound", "conj", "cc", "nummod", "acl", "advcl", "xcomp", "ccomp")


def _onehot(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """targets (H, n): the word each row attends to -> attn (1, H, n, n) one-hot, special (1, H, n, 2) zeros."""
    H, n = targets.shape
    attn = np.zeros((1, H, n, n))
    attn[0, np.arange(H)[:, None], np.arange(n)[None, :], targets] = 1.0
    return attn, np.zeros((1, H, n, 2))


def test_every_default_relation_is_scored_on_a_head_that_finds_it():
    n = len(UD_RELATIONS) + 1            # word 0 the root, word i attaches to it as relation i - 1
    heads = np.array([-1] + [0] * (n - 1))
    to_head = np.zeros((1, n), int)      # every word attends to word 0 (the root attends to word 1)
    to_head[0, 0] = 1
    st = HeadStats(HeadConfig(syntactic_min_count=1))
    st.update(Sentence(*_onehot(to_head), heads=heads, deprels=["root", *UD_RELATIONS]))
    scores = st.score_arrays()
    for rel in UD_RELATIONS:
        assert scores[f"syntactic_acc:{rel}:dep2head"][0, 0] == 1.0, rel


@pytest.mark.parametrize("relations", [("nsubj", "obj", "nsubj"), ()])
def test_relations_must_be_unique_and_non_empty(relations):
    with pytest.raises(ValueError, match="relations must be non-empty and unique"):
        HeadConfig(relations=relations)


def test_positional_other_counts_argmax_beyond_the_window_on_both_sides():
    n, W = 8, HeadConfig().positional_window          # W = 2: offsets -2..+2 are tracked
    i = np.arange(n)
    far = np.where(i < n // 2, i + 4, i - 4)          # |offset| 4 > W: half right, half left
    left2 = np.where(i >= W, i - W, i)                # offset -W where it exists, else itself
    st = HeadStats(HeadConfig())
    st.update(Sentence(*_onehot(np.stack([far, i, left2]))))
    other = st.score_arrays()["positional_other"][0]
    assert other.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("offset,config,acc", [
    (20, HeadConfig(syntactic_min_count=1), 1.0),        # the default reaches 20 words ...
    (21, HeadConfig(syntactic_min_count=1), 0.0),        # ... and no further
    (21, HeadConfig(syntactic_min_count=1, baseline_max_offset=21), 1.0),
])
def test_the_fixed_offset_baseline_reaches_max_offset_words_and_no_further(offset, config, acc):
    n = offset + 2
    heads = np.full(n, offset)           # word `offset` is the root; every other word attaches to it
    heads[offset] = -1
    deprels = ["dep"] * n                # not scored ...
    deprels[0] = "nsubj"                 # ... but word 0, whose head is `offset` words to its right
    st = HeadStats(config)
    st.update(Sentence(*_onehot(np.arange(n)[None, :] * 0 + offset), heads=heads, deprels=deprels))
    best, base_acc = st.baseline()
    r = config.relations.index("nsubj")
    assert base_acc[0, r] == acc
    if acc:
        assert best[0, r] == offset


@pytest.mark.parametrize("score,role", [
    ("syntactic_margin:nsubj:dep2head", True), ("syntactic_acc:nsubj:dep2head", False),
    ("positional_share:-1", True), ("positional_share:-1:tokens", False),
    ("attn_to_cls", True), ("attn_to_punct", True), ("attn_to_self", False),
    ("previous_token", True), ("rare_token", True), ("induction", True), ("induction:repeated_random", True),
    ("entropy_normalized", True), ("entropy", False), ("confidence", False), ("positional_other", False),
])
def test_role_scores_are_the_ones_checked_against_a_floor(score, role):
    assert is_role_score(score) is role


def test_a_head_table_without_weighting_reads_as_raw_attention():
    old = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "value": [0.5, 0.7]})
    assert with_weighting(old)["weighting"].tolist() == ["raw", "raw"]
    mixed = pd.DataFrame({"layer": [0, 1], "weighting": ["norm", None]})
    assert with_weighting(mixed)["weighting"].tolist() == ["norm", "raw"]
