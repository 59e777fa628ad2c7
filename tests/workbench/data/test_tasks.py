"""Edge-probing task builders give the hand-computed records on the fixtures; build_all_tasks caches."""
import json
import shutil
from pathlib import Path

import pytest

from workbench.data import tasks
from workbench.core.paths import data_root
from workbench.data.readers import Skips, read_conllu, read_iob2, read_ptb

FIX = Path(__file__).resolve().parents[3] / "tests" / "fixtures"


@pytest.fixture()
def mini():
    return read_conllu(FIX / "mini.conllu")


@pytest.fixture()
def fixture_root(tmp_path, monkeypatch):
    """A data root shaped like shared/data, every split holding the same tiny fixture."""
    root = tmp_path / "data"
    for sp in tasks.SPLITS:
        for folder, name, src in [("ud_english_ewt", f"en_ewt-ud-{sp}.conllu", "mini.conllu"),
                                  ("ud_english_gum", f"en_gum-ud-{sp}.conllu", "mini.conllu"),
                                  ("ud_english_gum/const", f"{sp}.ptb", "mini.ptb"),
                                  ("uner_english_ewt", f"en_ewt-ud-{sp}.iob2", "mini.iob2")]:
            (root / folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(FIX / src, root / folder / name)
    monkeypatch.setenv("WORKBENCH_DATA", str(root))
    return root


def _spans(records):
    return [[(t["span1"], t.get("span2"), t["label"]) for t in r["targets"]] for r in records]


def test_pos_every_word(mini):
    skips = Skips()
    recs = tasks.pos_records(mini, skips)
    assert [r["id"] for r in recs] == ["doc_a-1", "doc_a-2", "doc_b-1"]
    assert recs[0]["words"] == ["Kim", "'s", "friends", "visited", "Paris", "."]
    assert _spans(recs)[2] == [([0, 1], None, "INTJ"), ([1, 2], None, "NOUN"), ([2, 3], None, "PUNCT")]
    assert sum(len(r["targets"]) for r in recs) == 16


def test_deps_arcs_are_words_minus_roots(mini):
    skips = Skips()
    recs = tasks.deps_records(mini, skips)
    assert sum(len(r["targets"]) for r in recs) == 16 - 3 and skips["root_arc"] == 3
    # Kim -nmod:poss-> friends ; 's -case-> Kim ; friends -nsubj-> visited
    assert _spans(recs)[0][:3] == [([0, 1], [2, 3], "nmod:poss"), ([1, 2], [0, 1], "case"),
                                   ([2, 3], [3, 4], "nsubj")]
    assert ([3, 4], [4, 5], "punct") in _spans(recs)[1]        # "," attaches to "they" (word 5)


def test_arcs_every_word_with_its_head_and_the_root_on_itself(mini):
    skips = Skips()
    recs = tasks.arcs_records(mini, skips)
    assert sum(len(r["targets"]) for r in recs) == 16 and not skips["root_arc"]
    # "visited" (word 4) is the root of the first sentence: it attaches to itself
    assert _spans(recs)[0][:4] == [([0, 1], [2, 3], "nmod:poss"), ([1, 2], [0, 1], "case"),
                                   ([2, 3], [3, 4], "nsubj"), ([3, 4], [3, 4], "root")]


def test_const_topmost_of_unary_chains_and_leaf_mismatch(mini):
    skips = Skips()
    recs = tasks.const_records(mini, read_ptb(FIX / "mini.ptb"), skips, "mini.ptb")
    assert [r["id"] for r in recs] == ["doc_a-1", "doc_a-2"]        # tree 3 says "earth", not "world"
    assert _spans(recs)[0] == [([0, 6], None, "S"), ([0, 3], None, "NP"), ([0, 2], None, "NP"),
                               ([3, 5], None, "VP"), ([4, 5], None, "NP")]
    assert _spans(recs)[1] == [([0, 7], None, "S"), ([0, 1], None, "NP"), ([1, 3], None, "VP"),
                               ([2, 3], None, "NP"), ([4, 6], None, "FRAG"), ([4, 5], None, "NP"),
                               ([5, 6], None, "ADVP")]
    assert skips.as_dict() == {"const_leaf_mismatch": 1, "const_root": 2, "const_unary_inner": 1,
                               "no_targets": 0}


def test_const_tree_count_must_match(mini):
    with pytest.raises(ValueError, match="2 trees for 3 sentences"):
        tasks.const_records(mini, read_ptb(FIX / "mini.ptb")[:2], Skips())


def test_ner_join_by_sent_id(mini):
    ner, _ = read_iob2(FIX / "mini.iob2")
    skips = Skips()
    recs = tasks.ner_records(ner, mini, skips)
    assert [r["id"] for r in recs] == ["doc_a-1", "doc_a-2"]
    assert _spans(recs) == [[([0, 1], None, "PER"), ([4, 5], None, "LOC")], [([0, 1], None, "PER")]]
    # doc_b-1 writes "World" where EWT has "world"; doc_c-1 is not in EWT
    assert skips.as_dict() == {"ner_sent_id_not_in_ewt": 1, "ner_tokens_differ": 1, "no_targets": 0}


def test_ner_document_split_is_deterministic_and_by_document():
    assert tasks.ner_document("weblog-juancole.com_x_20051126-0001") == "weblog-juancole.com_x_20051126"
    assert tasks.ner_document("odd_id") == "odd_id"
    docs = [f"email-doc{i}" for i in range(400)]
    side = [tasks.ner_in_train(d + "-0001") for d in docs]
    assert side == [tasks.ner_in_train(d + "-0042") for d in docs]          # sentences follow their doc
    assert 0.72 < sum(side) / len(side) < 0.88


def test_entities_one_target_per_mention(mini):
    skips = Skips()
    recs = tasks.entity_records(mini, skips)
    assert _spans(recs)[0] == [([0, 3], None, "person"), ([0, 1], None, "person"), ([4, 5], None, "place")]
    assert _spans(recs)[2] == [([1, 2], None, "abstract")]


def test_coref_pairs_by_hand(mini):
    skips = Skips()
    recs = tasks.coref_records(mini, skips, window=3, neg_ratio=100.0)
    (rec,) = recs                          # doc_b has a singleton only -> no pairs
    assert rec["id"] == "doc_a:0" and len(rec["words"]) == 6 + 7
    pairs = {(tuple(t["span1"]), tuple(t["span2"])): t["label"] for t in rec["targets"]}
    # mentions: e2 [0,3] e1 [0,1] e3 [4,5] | e1 [6,7] e3 [8,9] e2 [10,11]: 15 ordered pairs
    assert len(pairs) == 15
    assert {k for k, v in pairs.items() if v == "1"} == {((6, 7), (0, 1)), ((8, 9), (4, 5)), ((10, 11), (0, 3))}
    assert skips.as_dict() == {"coref_negative_unsampled": 0, "coref_singleton_mention": 1, "no_targets": 1}


def test_coref_negative_sampling_ratio_and_seed(mini):
    skips = Skips()
    (rec,) = tasks.coref_records(mini, skips, window=3, neg_ratio=1.0, seed=0)
    labels = [t["label"] for t in rec["targets"]]
    assert labels.count("1") == 3 and labels.count("0") == 3 and skips["coref_negative_unsampled"] == 9
    assert tasks.coref_records(mini, Skips(), window=3, neg_ratio=1.0, seed=0) == [rec]
    # one-sentence windows hold no coreferent pair here, so nothing is kept (and all is counted)
    skips = Skips()
    assert tasks.coref_records(mini, skips, window=1) == []
    assert skips["no_targets"] == 3 and skips["coref_negative_unsampled"] == 6


def test_build_all_tasks_writes_caches_and_rebuilds_on_change(fixture_root, tmp_path, monkeypatch):
    out = tmp_path / "tasks"
    stats = tasks.build_all_tasks(out)
    assert set(stats["task"]) == set(tasks.TASKS) and len(stats) == 3 * len(tasks.TASKS)
    row = stats[(stats.task == "deps") & (stats.split == "dev")].iloc[0]
    assert (row.records, row.targets, row.words) == (3, 13, 16)
    assert json.loads(row.skips) == {"no_targets": 0, "root_arc": 3}
    assert json.loads(row.label_counts)["punct"] == 4
    assert tasks.load_task("deps", "dev", out) == tasks.build_task("deps", "dev")
    assert len(tasks.load_task("pos", "test", out, limit=2)) == 2
    # NER: UNER dev documents are split between train and dev, never both
    ner_ids = {sp: {r["id"] for r in tasks.load_task("ner", sp, out)} for sp in ("train", "dev")}
    assert ner_ids["train"] | ner_ids["dev"] == {"doc_a-1", "doc_a-2"} and not ner_ids["train"] & ner_ids["dev"]

    def boom(*_):
        raise AssertionError("rebuilt although inputs are unchanged")
    monkeypatch.setitem(tasks.TASKS, "pos", tasks.TaskSpec(boom, tasks.TASKS["pos"].inputs, "x"))
    again = tasks.build_all_tasks(out)                       # cached: the builder is not called
    assert again.sort_values(["task", "split"]).reset_index(drop=True).equals(
        stats.sort_values(["task", "split"]).reset_index(drop=True))
    monkeypatch.undo()
    monkeypatch.setenv("WORKBENCH_DATA", str(fixture_root))
    # a changed input file changes the key: pos is rebuilt from the new data
    ewt = fixture_root / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
    ewt.write_text(ewt.read_text().replace("\tHello\thello\tINTJ", "\tHello\thello\tNOUN"))
    tasks.build_all_tasks(out, tasks=["pos"])
    assert tasks.load_task("pos", "dev", out)[2]["targets"][0]["label"] == "NOUN"
    assert not list(out.rglob("*.tmp"))


def test_task_stats_and_ud_sentences(fixture_root):
    df = tasks.task_stats("entities")
    assert list(df.split) == ["train", "dev", "test"] and list(df.targets) == [7, 7, 7]
    assert set(df.n_labels) == {3}
    (s1, s2, s3) = tasks.ud_sentences("ewt", "dev")
    assert s1.heads == (2, 0, 3, -1, 3, 3) and s1.deprels[3] == "root" and s3.upos[0] == "INTJ"


def test_unknown_names_are_errors():
    with pytest.raises(ValueError, match="unknown task 'srl'"):
        tasks.build_task("srl", "dev")
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        tasks.load_task("pos", "valid")
    with pytest.raises(ValueError, match="unknown treebank"):
        tasks.ud_sentences("ptb", "dev")


# Known corpus counts (shared/data SOURCE.md files, checked against UD stats.xml).
EWT_WORDS = {"train": (12544, 204577), "dev": (2001, 25147), "test": (2077, 25094)}
GUM_SENTS = {"train": 10224, "dev": 1575, "test": 1464}
UNER_SPANS = {"dev": 966, "test": 1088}


@pytest.mark.slow
def test_real_data_every_task(tmp_path):
    if not (data_root() / "ud_english_ewt").is_dir():
        pytest.skip(f"shared data not found under {data_root()}")
    stats = tasks.build_all_tasks(tmp_path).set_index(["task", "split"])
    for sp, (n_sent, n_words) in EWT_WORDS.items():
        pos, deps = stats.loc[("pos", sp)], stats.loc[("deps", sp)]
        assert (pos.records, pos.targets, pos.n_labels) == (n_sent, n_words, 17)
        assert deps.targets == n_words - n_sent                 # one root per sentence
        assert json.loads(deps.skips)["root_arc"] == n_sent
    for sp, n in GUM_SENTS.items():
        const = json.loads(stats.loc[("const", sp)].skips)
        assert const["const_root"] + const.get("const_leaf_mismatch", 0) == n
        assert stats.loc[("const", sp)].records + const["no_targets"] == n - const.get("const_leaf_mismatch", 0)
        assert stats.loc[("entities", sp)].n_labels == 10
        coref = json.loads(stats.loc[("coref", sp)].label_counts)
        assert 0 <= coref["1"] - coref["0"] < 0.05 * coref["1"]   # 1 negative per positive, fewer where short
    ner = {sp: stats.loc[("ner", sp)] for sp in tasks.SPLITS}
    assert ner["train"].targets + ner["dev"].targets <= UNER_SPANS["dev"]
    assert ner["test"].targets <= UNER_SPANS["test"]
    for sp in tasks.SPLITS:                                  # 3 sentences per UNER split differ from EWT
        assert json.loads(ner[sp].skips).get("ner_tokens_differ", 0) <= 3
    assert json.loads(ner["test"].skips)["ner_tokens_differ"] == 3


def test_a_failed_task_write_keeps_the_old_file_and_leaves_no_temporaries(tmp_path):
    path = tmp_path / "pos" / "train.jsonl"
    tasks._write_jsonl(path, [{"words": ["old"]}])

    def records_fail_midway():
        yield {"words": ["new"]}
        raise OSError("reader failed")

    with pytest.raises(OSError, match="reader failed"):
        tasks._write_jsonl(path, records_fail_midway())
    assert path.read_text(encoding="utf-8") == '{"words": ["old"]}\n'
    assert [p.name for p in path.parent.iterdir()] == ["train.jsonl"]
