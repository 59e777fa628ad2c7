"""The bad-input corpus of issue 75, part 2: the readers' malformed data files (workbench/data/readers.py)
reached through the CLI as a user reaches them, through the data root (WORKBENCH_DATA). Each case ends
in one stderr line `workbench <cmd>: error: <file>:<line>: <what is wrong>`, exit 1, with no output
folder made; the same command on the repaired file then succeeds in the same place.

The data root is the repository's small fixtures (tests/fixtures: mini.conllu, mini.iob2, mini.ptb,
sst2_*.tsv) laid out as the shared data folder lays out UD EWT, UNER, GUM and GLUE SST-2; one file of
it is replaced by the damaged one. The readers' own tests (tests/workbench/data/test_readers.py) check
the same errors on the reader functions; these check that the CLI shows them as they are.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from plmodels import save
from plmodels.tokenizer import Tokenizer

from ..plmodels.tiny import tiny_encoder
from .cli_runs import refused, succeeds

FIX = Path(__file__).resolve().parents[1] / "fixtures"
EWT_DEV = "ud_english_ewt/en_ewt-ud-dev.conllu"
UNER_DEV = "uner_english_ewt/en_ewt-ud-dev.iob2"
GUM_PTB_DEV = "ud_english_gum/const/dev.ptb"
SST2_TRAIN = "glue_sst2/train.tsv"


def _rows(*words: tuple) -> str:
    """CoNLL-U lines for (id, form, head) words."""
    return "".join(f"{i}\t{form}\t_\tX\tX\t_\t{head}\tdep\t_\t_\n" for i, form, head in words)


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A data root of the fixtures: EWT, UNER, GUM (with const/) and SST-2, every split."""
    root = tmp_path / "data"
    for split in ("train", "dev", "test"):
        for folder, name in (("ud_english_ewt", "en_ewt-ud"), ("ud_english_gum", "en_gum-ud")):
            (root / folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(FIX / "mini.conllu", root / folder / f"{name}-{split}.conllu")
        (root / "ud_english_gum" / "const").mkdir(exist_ok=True)
        shutil.copy(FIX / "mini.ptb", root / "ud_english_gum" / "const" / f"{split}.ptb")
        (root / "glue_sst2").mkdir(exist_ok=True)
        shutil.copy(FIX / ("sst2_test.tsv" if split == "test" else "sst2_train.tsv"), root / "glue_sst2" / f"{split}.tsv")
    (root / "uner_english_ewt").mkdir()
    for split in ("dev", "test"):
        shutil.copy(FIX / "mini.iob2", root / "uner_english_ewt" / f"en_ewt-ud-{split}.iob2")
    monkeypatch.setenv("WORKBENCH_DATA", str(root))
    return root


def _latin1(fixture: str, word: bytes) -> tuple[bytes, int]:
    """The fixture with `word` replaced by Latin-1 "café", and the line it is on."""
    data = (FIX / fixture).read_bytes().replace(word, b"caf\xe9", 1)
    return data, data[:data.index(b"caf\xe9")].count(b"\n") + 1


CONLLU_LATIN1, CONLLU_LATIN1_LINE = _latin1("mini.conllu", b"Paris")
UTF16 = (FIX / "mini.conllu").read_text(encoding="utf-8").encode("utf-16")

# (file replaced, its damaged bytes, the error after `<file>:`)
CASES = {
    "conllu-cycle": (EWT_DEV, _rows((1, "a", 2), (2, "b", 1), (3, "c", 0)).encode(),
                     r"1: dependency cycle 1 -> 2 -> 1 \(word -> its HEAD\): word 1 has no path to the root$"),
    "conllu-two-roots": (EWT_DEV, _rows((1, "a", 0), (2, "b", 0)).encode(),
                         r"2: sentence has 2 roots: words 1, 2 have HEAD 0 \(UD allows exactly one\)$"),
    "conllu-no-root": (EWT_DEV, _rows((1, "a", 2), (2, "b", 1)).encode(),
                       r"1: sentence has no root: no word has HEAD 0 \(UD needs exactly one\)$"),
    "conllu-head-out-of-range": (EWT_DEV, _rows((1, "a", 0), (2, "b", 3)).encode(), r"2: HEAD 3 out of range 0\.\.2$"),
    "conllu-head-not-an-integer": (EWT_DEV, _rows((1, "a", 0), (2, "b", "1_0")).encode(),
                                   r"2: HEAD '1_0' is not an integer$"),
    "conllu-nine-columns": (EWT_DEV, b"1\tHi\t_\tX\tX\t_\t0\tdep\t_\n", r"1: .*10 tab-separated columns, found 9"),
    "conllu-empty": (EWT_DEV, b"", r"1: no sentences: the file is empty$"),
    "conllu-blank-lines": (EWT_DEV, b"\n\n\n", r"1: no sentences: its 3 line\(s\) hold only blank lines or comments$"),
    "conllu-latin1": (EWT_DEV, CONLLU_LATIN1,
                      rf"{CONLLU_LATIN1_LINE}: not UTF-8: byte 0xe9 at byte \d+ of the line .*caf\\xe9.*; if it is "
                      r"Latin-1, convert it: `iconv -f latin1 -t utf-8 en_ewt-ud-dev\.conllu > en_ewt-ud-dev\.conllu\.utf8`$"),
    "conllu-utf16": (EWT_DEV, UTF16, r"1: not UTF-8: byte 0xff .*it looks like UTF-16: `iconv -f utf-16 -t utf-8 "),
    "conllu-carriage-return": (EWT_DEV, b"1\tHi\r\t_\tX\tX\t_\t0\tdep\t_\t_\n", r"1: carriage return \(\\r\) inside the line"),
    "iob2-unknown-tag": (UNER_DEV, (FIX / "mini.iob2").read_bytes().replace(b"B-PER", b"B-XYZ", 1),
                         r"\d+: tag 'B-XYZ' is not O or B-/I- of PER/ORG/LOC$"),
    "ptb-extra-bracket": (GUM_PTB_DEV, b"(ROOT (S (NP (NNP Kim))) (VP (VBD ran)))) \n",
                          r"1: '\)' after the end of the tree \(unbalanced brackets\)$"),
    "ptb-unclosed": (GUM_PTB_DEV, b"(ROOT (S (NP (NNP Kim)) (VP (VBD ran))\n", r"1: 2 bracket\(s\) not closed$"),
    "sst2-bad-label": (SST2_TRAIN, b"sentence\tlabel\nit is fine\t2\n", r"2: label '2' is not 0 or 1$"),
}
COMMAND = {"ud_english_ewt": ["data", "tasks", "--tasks", "pos"], "uner_english_ewt": ["data", "tasks", "--tasks", "ner"],
           "ud_english_gum": ["data", "tasks", "--tasks", "const"]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny encoder whose positions cover the SST-2 fixture's sentences (the finetuning cases' base)."""
    texts = [line.split("\t")[0] for line in (FIX / "sst2_train.tsv").read_text().splitlines()[1:]]
    tok = Tokenizer.train_wordpiece(texts, vocab_size=120)
    return save(tiny_encoder(vocab_size=tok.vocab_size, max_positions=64), tok,
                tmp_path_factory.mktemp("ckpt") / "model")


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_data_file_is_one_line_naming_file_and_line_and_the_fix_runs(tmp_path, capsys, root, checkpoint,
                                                                                case):
    name, damaged, expected = CASES[case]
    path = root / name
    good = path.read_bytes()
    path.write_bytes(damaged)
    out = tmp_path / "out"
    dataset = name.split("/")[0]
    argv = COMMAND.get(dataset) or ["finetune", "sst2-frozen", "--set", f"base={checkpoint}", "--set", "seq_len=64",
                                    "--set", "epochs=1", "--set", "eval_every=1"]
    argv = [*argv, "--out", out]
    refused(capsys, argv, "^workbench [a-z ]+: error: " + re.escape(str(path)) + ":" + expected, absent=out)
    path.write_bytes(good)
    succeeds(capsys, argv)
    assert out.is_dir()
