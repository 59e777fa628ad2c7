"""A tiny pretraining run on a toy subject-verb-object corpus (seconds), shared by the emergence and
competence tests: `pretrain_run(tmp, kind, steps, **overrides)` -> the run folder."""

from __future__ import annotations

import random


def svo_corpus(path, n, seed):
    rng = random.Random(seed)
    nouns = ["the cat", "a dog", "the king", "my friend", "the old man", "the cats", "two dogs"]
    verbs = ["sees", "likes", "follows", "calls", "see", "like"]
    objs = ["the river", "a small house", "the green hill", "her brother", "the night sky"]
    path.write_text("\n".join(f"{rng.choice(nouns)} {rng.choice(verbs)} {rng.choice(objs)} ." for _ in range(n)) + "\n")
    return path


def pretrain_run(tmp, kind, steps, **kw):
    from plmodels.training import pretrain

    train, valid = svo_corpus(tmp / "train.txt", 2000, 0), svo_corpus(tmp / "valid.txt", 200, 1)
    cfg = {**dict(kind=kind, train_source=str(train), train_split=None, eval_source=str(valid), eval_split=None,
               preset="tiny", vocab_size=200, tokenizer_sample_chars=100_000, seq_len=32, batch_size=8,
               lr=5e-3, warmup_steps=2, max_steps=steps, eval_every=0, eval_sequences=16, log_every=1000,
               ckpt_log_spaced=True, bf16="off", seed=3, num_threads=1), **kw}
    pretrain(cfg_obj(cfg), tmp / "run")
    return tmp / "run"


def cfg_obj(d):
    from plmodels.training import PretrainConfig

    return PretrainConfig.from_dict(d)
