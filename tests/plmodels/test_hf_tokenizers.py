"""Byte-level BPE tokenizers read from a checkpoint folder (GPT-2, RoBERTa) give transformers' ids.

The tokenizer files are built here with the `tokenizers` library (a small byte-level BPE trained on
edge-case text) in the transformers layouts: vocab.json + merges.txt as the original releases ship
them, tokenizer.json + tokenizer_config.json as transformers' `save_pretrained` writes them, and
both. The reference is transformers' fast tokenizer (GPT2TokenizerFast / RobertaTokenizerFast)
loaded from the same folder; transformers is used here only as that reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plmodels.tokenizer import GPT2_SPECIALS, ROBERTA_SPECIALS, Tokenizer

from .hf_files import CORPUS, EOT, TEXTS, train_byte_bpe, write_gpt2_files, write_roberta_files

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

SENTENCES = [
    ["The", "quick", "fox", "jumps", "."],
    ["Héllo", "wörld", ",", "東京", "😀", "antidisestablishmentarianism", "don't"],
    ["Ångström", "naïve", "12345"],
]


REF = {"gpt2": transformers.GPT2TokenizerFast, "roberta": transformers.RobertaTokenizerFast}
WRITE = {"gpt2": write_gpt2_files, "roberta": write_roberta_files}


def make_folder(root: Path, family: str, layout: str) -> Path:
    """A tokenizer folder in one layout: "files" (vocab.json + merges.txt), "tokenizer.json"
    (what transformers' save_pretrained writes, vocab.json / merges.txt removed), "both"."""
    files = root / f"{family}-files"
    if not files.is_dir():
        WRITE[family](files)
    if layout == "files":
        return files
    out = root / f"{family}-{layout}"
    if not out.is_dir():
        REF[family].from_pretrained(str(files)).save_pretrained(str(out))
        assert (out / "tokenizer.json").is_file()
        for name in ("vocab.json", "merges.txt"):
            if layout == "tokenizer.json":
                (out / name).unlink(missing_ok=True)
            else:
                shutil.copy(files / name, out / name)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_tokenizers")


LAYOUTS = ["files", "tokenizer.json", "both"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpt2_ids_equal_transformers(root, layout):
    folder = make_folder(root, "gpt2", layout)
    ours, ref = Tokenizer.from_hf_folder(folder), REF["gpt2"].from_pretrained(str(folder))
    eot = ref.convert_tokens_to_ids(EOT)
    assert ours.kind == "bpe" and ours.specials == GPT2_SPECIALS
    assert ours.bos_id == ours.eos_id == ours.unk_id == ref.bos_token_id == ref.eos_token_id == eot
    assert ours.pad_id is None and ref.pad_token_id is None  # GPT-2 has no padding token
    assert ours.cls_id is None and ours.sep_id is None and ours.mask_id is None
    assert ours.special_affixes == ([eot], [])
    assert ours.vocab_size == len(ref)
    with_bos = REF["gpt2"].from_pretrained(str(folder), add_bos_token=True) if transformers.__version__ >= "5" else None
    for text in TEXTS:
        want = ref(text)["input_ids"]
        assert want == ref(text, add_special_tokens=False)["input_ids"]  # GPT-2 adds nothing by default
        assert ours.encode(text, add_special=False) == want, text
        assert ours.encode(text) == [eot, *want], text  # our decoder convention: BOS first
        if with_bos is not None:
            assert ours.encode(text) == with_bos(text)["input_ids"], text
        assert ours.decode(want) == ref.decode(want, clean_up_tokenization_spaces=False) == text  # byte-level: lossless
    assert ours.encode_batch(TEXTS, add_special=False) == [ref(t)["input_ids"] for t in TEXTS]
    assert ours.encode(f"a{EOT}b", add_special=False).count(eot) == 1  # the special is kept whole


@pytest.mark.parametrize("layout", LAYOUTS)
def test_roberta_ids_equal_transformers(root, layout):
    folder = make_folder(root, "roberta", layout)
    ours, ref = Tokenizer.from_hf_folder(folder), REF["roberta"].from_pretrained(str(folder))
    assert ours.kind == "bpe" and ours.specials == ROBERTA_SPECIALS
    for role in ROBERTA_SPECIALS:
        assert getattr(ours, f"{role}_id") == getattr(ref, f"{role}_token_id"), role
    assert (ours.bos_id, ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2, 3)
    assert ours.mask_id == ours.vocab_size - 1 == len(ref) - 1
    assert ours.special_affixes == ([0], [2])  # <s> X </s>
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        bare = ref(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text, add_special=False) == bare, text
        assert ours.decode(bare) == ref.decode(bare, clean_up_tokenization_spaces=False)
    assert ours.encode_batch(TEXTS) == [ref(t)["input_ids"] for t in TEXTS]


@pytest.mark.parametrize("family", ["gpt2", "roberta"])
def test_word_alignment_marks_word_starts_with_a_space(root, family):
    ours = Tokenizer.from_hf_folder(make_folder(root, family, "files"))
    before, after = ours.special_affixes
    for words in SENTENCES:
        enc = ours.encode_words(words)
        assert enc.ids == ours.encode(" ".join(words)) and enc.n_empty == 0
        assert enc.ids[:len(before)] == before and enc.ids[len(enc.ids) - len(after):] == after
        assert enc.word_spans[0][0] == len(before) and enc.word_spans[-1][1] == len(enc.ids) - len(after)
        for i, (w, (s, e)) in enumerate(zip(words, enc.word_spans)):
            assert s < e and (i == 0 or enc.word_spans[i - 1][1] == s)
            assert ours.decode(enc.ids[s:e]) == (w if i == 0 else " " + w)
        bare = ours.encode_words(words, add_special=False)
        assert bare.ids == ours.encode(" ".join(words), add_special=False)
    batch = ours.encode_words_batch(SENTENCES + [[]])
    assert batch[:-1] == [ours.encode_words(ws) for ws in SENTENCES]
    assert batch[-1].ids == before + after and batch[-1].word_spans == []
    # an empty first word has no bytes at all (a later one is its leading space): it gets the unknown id
    empty = ours.encode_words(["", "b", ""])
    assert empty.n_empty == 1 and empty.ids[empty.word_spans[0][0]] == ours.unk_id
    assert ours.decode(empty.ids[slice(*empty.word_spans[2])]) == " "


@pytest.mark.parametrize("family", ["gpt2", "roberta"])
def test_save_load_keeps_roles_and_wrapping(root, family, tmp_path):
    ours = Tokenizer.from_hf_folder(make_folder(root, family, "both"))
    back = Tokenizer.load(ours.save(tmp_path / "tok"))
    assert back.fingerprint() == ours.fingerprint() and back.specials == ours.specials
    assert back.special_affixes == ours.special_affixes
    for text in TEXTS:
        assert back.encode(text) == ours.encode(text)
    for words in SENTENCES:
        assert back.encode_words(words) == ours.encode_words(words)


def test_special_tokens_map_and_config_override_the_defaults(root, tmp_path):
    folder = tmp_path / "gpt2-pad"
    shutil.copytree(make_folder(root, "gpt2", "files"), folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": {"content": EOT, "lstrip": False}}))
    ours, ref = Tokenizer.from_hf_folder(folder), REF["gpt2"].from_pretrained(str(folder))
    assert ours.pad_id == ref.pad_token_id == ours.eos_id
    # a RoBERTa folder whose <mask> swallows the space before it (lstrip), declared in tokenizer_config.json
    folder = tmp_path / "roberta-lstrip"
    shutil.copytree(make_folder(root, "roberta", "files"), folder)
    mask_id = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))["<mask>"]
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "RobertaTokenizer",
        "added_tokens_decoder": {str(mask_id): {"content": "<mask>", "lstrip": True, "rstrip": False,
                                                "normalized": False, "single_word": False, "special": True}},
    }))
    ours, ref = Tokenizer.from_hf_folder(folder), REF["roberta"].from_pretrained(str(folder))
    for text in ("a <mask> b", "x   <mask>", "<mask>"):
        assert ours.encode(text) == ref(text)["input_ids"], text
    assert ours.encode("a <mask>") == ours.encode("a<mask>")


def test_tokenizer_json_alone_is_recognised(root):
    for family, specials in (("roberta", ROBERTA_SPECIALS),):
        tok = Tokenizer.from_hf_tokenizer_json(make_folder(root, family, "tokenizer.json") / "tokenizer.json")
        assert tok.kind == "bpe" and tok.specials == specials


def test_folders_that_are_not_byte_level_bpe_are_refused(root, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither tokenizer.json nor vocab.json"):
        Tokenizer.from_hf_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_hf_folder(tmp_path / "absent")
    wp = Tokenizer.train_wordpiece(CORPUS, vocab_size=120)
    (tmp_path / "wp").mkdir()
    (tmp_path / "wp" / "tokenizer.json").write_text(wp.hf.to_str())
    with pytest.raises(ValueError, match="not a byte-level BPE"):
        Tokenizer.from_hf_folder(tmp_path / "wp")
    bare = tmp_path / "no-specials"
    bare.mkdir()
    train_byte_bpe([], 300).model.save(str(bare))
    with pytest.raises(ValueError, match="cannot tell the special tokens"):
        Tokenizer.from_hf_folder(bare)
    (bare / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))  # a role token not in the vocab
    tok = Tokenizer.from_hf_folder(bare)
    assert tok.eos_id == tok.vocab_size - 1 and tok.special_affixes == ([], [])
    assert tok.encode("x<eos>", add_special=False)[-1] == tok.eos_id
