"""A tiny sentence classifier with a planted answer, for the flow suite's classifier target: sentences
of filler words with one cue word ("good" or "bad") at a random position, labelled by the cue; a tiny
encoder plus the finetuning head (`plmodels.training.finetune.Classifier`) trained on them until it
reads the cue. The attribution of its decision has a known answer: the cue."""
from __future__ import annotations

import numpy as np
import torch

from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from plmodels.training.finetune import Classifier

FILLER = ("the a this that movie film plot story actor scene music script ending was is seemed felt quite "
          "very rather and but so of in on with").split()
CUES = ("bad", "good")  # label 0, label 1


def planted_sentences(n: int, seed: int) -> list[tuple[list[str], int, int]]:
    """n (words, label, index of the cue word) with 5..9 words."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = list(rng.choice(FILLER, size=int(rng.integers(5, 10))))
        at, label = int(rng.integers(0, len(words) + 1)), int(rng.integers(0, 2))
        out.append((words[:at] + [CUES[label]] + words[at:], label, at))
    return out


def planted_classifier(steps: int = 150, seed: int = 0) -> tuple[Classifier, Tokenizer]:
    """The trained classifier (eval mode, `.tokenizer`, `.info` as `load_classifier` gives) and its tokenizer."""
    tok = Tokenizer.train_wordpiece([" ".join(w) for w, _, _ in planted_sentences(500, seed + 1)], 200, min_frequency=1)
    torch.manual_seed(seed)
    fields = {**preset("encoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, "position": "rope"}
    clf = Classifier(build_model("encoder", fields), 2, "sentence", dropout=0.0)
    opt = torch.optim.Adam(clf.parameters(), lr=3e-3)
    data = planted_sentences(32 * steps, seed + 2)
    for s in range(steps):
        chunk = data[32 * s: 32 * (s + 1)]
        encs = [tok.encode(" ".join(w)) for w, _, _ in chunk]
        T = max(map(len, encs))
        ids = torch.full((len(encs), T), tok.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, e in enumerate(encs):
            ids[b, : len(e)], mask[b, : len(e)] = torch.tensor(e), 1
        loss = torch.nn.functional.cross_entropy(clf(ids, mask), torch.tensor([y for _, y, _ in chunk]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    clf.pad_id, clf.tokenizer = tok.pad_id, tok
    clf.info = {"task": "planted", "kind": "sentence", "labels": ["negative", "positive"], "head_dropout": 0.0}
    return clf.eval().requires_grad_(False), tok
