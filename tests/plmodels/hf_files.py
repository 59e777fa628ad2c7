"""Tokenizer folders in the transformers layouts, built here with the `tokenizers` library: a small
byte-level BPE trained on edge-case text written as GPT-2's or RoBERTa's vocab.json + merges.txt, and a
tiny Unigram saved as transformers saves ALBERT's. The tokenizer, import and analysis tests read them;
transformers (a test extra) is imported only inside `unigram_folder`."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors, trainers

EOT = "<|endoftext|>"
TEXTS = [
    "Héllo wörld, café naïve résumé Ångström Œuvre",
    "e\u0301 combining vs precomposed é; Straße, İstanbul",
    "東京は日本の首都です。中文，標點！한국어",
    "emoji 😀🎉 👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 150 + " " + "ab" * 60,
    "spaces   between    words\t\ttabs \t mixed",
    "line one\nline two\n\n\nthree\r\nfour\n",
    "   leading and trailing   ",
    "",
    " ",
    "\n\n",
    "Don't, you'll, I'm, they've: 12345 3.14159 $100 50% #tag @user",
    "zero\u200bwidth no\u00a0break ﬁ ligature",
    f"{EOT}inline{EOT} special {EOT}",
    "<s>a</s> <mask> b <pad> <unk> c<mask>d",
]
CORPUS = [t for t in TEXTS if t.strip()] * 5 + [
    "The quick brown fox jumps over the lazy dog. The dogs were barking loudly.",
    "Running, jumping and sleeping are what animals do. Unbelievably quiet zebras sleep.",
] * 20
def train_byte_bpe(special_tokens: list[str], vocab_size: int) -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(CORPUS, trainer=trainer)
    return hf


def write_gpt2_files(folder: Path, vocab_size: int = 420) -> int:
    """vocab.json + merges.txt of a small GPT-2-style BPE, <|endoftext|> last (as GPT-2's 50256);
    returns the number of ids."""
    folder.mkdir(parents=True, exist_ok=True)
    hf = train_byte_bpe([], vocab_size - 1)
    hf.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab[EOT] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return len(vocab)


def write_roberta_files(folder: Path, vocab_size: int = 420) -> int:
    """vocab.json + merges.txt with RoBERTa's <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> last."""
    folder.mkdir(parents=True, exist_ok=True)
    hf = train_byte_bpe(["<s>", "<pad>", "</s>", "<unk>"], vocab_size - 1)
    hf.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab["<mask>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return len(vocab)


ALBERT_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Héllo wörld, café! The dog sat on the mat.",
                "A cat and a dog ran home; the cats ran too.", "東京 😀 antidisestablishmentarianism",
                "naïve résumé ``quoted'' text"]

ALBERT_EDGE = ["Héllo  WORLD\t\tcafé", "東京 😀 中文 ☃", "antidisestablishmentarianismxyzzy", "  lead  and  trail  ",
        "``quote'' [MASK] x", "Ça va? Ünïcödé ﬁ Å", "a\nb\r\nc", "", "The dog."]  # hard cases for SentencePiece tokenizers


def unigram_folder(root, normalizer, pre_tokenizer):
    """A tiny Unigram trained here, wrapped in AlbertTokenizerFast and saved as transformers saves it."""
    import transformers

    hf = HFTokenizer(models.Unigram())
    hf.normalizer, hf.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.UnigramTrainer(vocab_size=90, special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
                                      unk_token="<unk>", show_progress=False)
    hf.train_from_iterator(ALBERT_TEXTS * 5, trainer=trainer)
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    transformers.AlbertTokenizerFast(tokenizer_object=hf).save_pretrained(root)
    return root
