"""The toy pretraining runs the plmodels tests share: a toy language a small model can learn, a
PretrainConfig of the `tiny` preset over it (seconds a run), and a fixed WordPiece for it."""
import random

from plmodels.training import PretrainConfig


def toy_corpus(path, n, seed):
    """A toy language with structure a small model can learn: agreement and fixed phrases."""
    rng = random.Random(seed)
    nouns = {"sg": ["the cat", "a dog", "the king", "my friend", "the old man"],
             "pl": ["the cats", "two dogs", "the kings", "my friends", "the old men"]}
    verbs = {"sg": ["sees", "likes", "follows", "calls"], "pl": ["see", "like", "follow", "call"]}
    objs = ["the river", "a small house", "the green hill", "her brother", "the night sky"]
    lines = []
    for _ in range(n):
        num = rng.choice(["sg", "pl"])
        lines.append(f"{rng.choice(nouns[num])} {rng.choice(verbs[num])} {rng.choice(objs)} .")
    path.write_text("\n".join(lines) + "\n")
    return path


def toy_config(data, kind="encoder", **kw):
    train, valid = data
    base = dict(kind=kind, train_source=str(train), train_split=None, eval_source=str(valid), eval_split=None,
                preset="tiny", vocab_size=200, tokenizer_sample_chars=100_000, seq_len=32, batch_size=8,
                lr=3e-3, warmup_steps=5, max_steps=8, eval_every=0, eval_sequences=32, log_every=1000,
                ckpt_log_spaced=True, bf16="off", seed=3, num_threads=1)
    return PretrainConfig.from_dict({**base, **kw})


def fixed_wordpiece(train, out):
    """A WordPiece of the toy corpus's characters and words, numbered in sorted order after BERT's
    five specials: the same ids in every process, unlike a trained one (plmodels.tokenizer,
    "Reproducibility")."""
    from plmodels.tokenizer import WORDPIECE_SPECIALS, Tokenizer

    words = sorted({w for line in train.read_text().splitlines() for w in line.split()})
    chars = sorted({c for w in words for c in w})  # and the alphabet, as a trained one has
    pieces = [*WORDPIECE_SPECIALS.values(), *chars, *(f"##{c}" for c in chars), *(w for w in words if len(w) > 1)]
    (out / "vocab").mkdir(parents=True)
    (out / "vocab" / "vocab.txt").write_text("\n".join(pieces) + "\n")
    Tokenizer.from_bert_vocab(out / "vocab" / "vocab.txt", lowercase=False).save(out / "tokenizer")
    return out / "tokenizer"
