"""What the heads analysis tests share: UD-EWT sentences (cached), a small HeadRunConfig and a WordPiece
whose vocabulary holds every piece of the test sentences (one token per word)."""
import functools

from tokenizers import pre_tokenizers

from plmodels.tokenizer import Tokenizer
from workbench.analyses.heads import HeadRunConfig
from workbench.data.tasks import ud_sentences as _ud_sentences


@functools.lru_cache(maxsize=None)
def ud_sentences(treebank, split):
    return _ud_sentences(treebank, split)


N_SENT, MAX_POS = 30, 40
MAX_TREE_POS = 128
RUN = HeadRunConfig(max_sentences=N_SENT, freq_source="ewt:dev", n_boot=50, similarity_max_words=200,
                    induction_sequences=2, induction_length=8)


def word_vocab_tokenizer(tmp_path, n_sentences: int = N_SENT):
    """WordPiece whose vocabulary holds every (BERT-pre-tokenized) piece of the test sentences, so
    nearly every word is one token and token offsets equal word offsets."""
    pre = pre_tokenizers.BertPreTokenizer()
    pieces = set()
    for split in ("dev", "test"):
        for s in ud_sentences("ewt", split)[:n_sentences]:
            for w in s.words:
                pieces.update(p for p, _ in pre.pre_tokenize_str(w))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(pieces)]) + "\n")
    return Tokenizer.from_bert_vocab(vocab, lowercase=False)
