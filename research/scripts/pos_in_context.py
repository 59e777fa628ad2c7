"""Does the POS probe change when an EWT sentence is read inside a longer input?

The recipe's POS target (docs/recipe.md) probes each EWT sentence on its own: [CLS] sentence [SEP],
about 25 tokens. The encoder trains on rows of 128 tokens cut from books, so [SEP] never comes that
early in training. If that mismatch capped the contextual layers, the probe would rise when the
same words are read in rows like the training rows. This script reads the first-subword vectors of
every word of the probe's sentences in four ways and fits the probe of `measure_variant`
(`research.ablate.probe_layers`) on each:

- `single`: [CLS] sentence [SEP], as `measure_variant` does (the same accuracies, to rounding);
- `context`: the sentence with its neighbouring EWT sentences before and after, up to 128 tokens;
- `filler`: the sentence, then unrelated Gutenberg-valid text up to 128 tokens;
- `prefill`: unrelated Gutenberg-valid text, then the sentence, up to 128 tokens.

Only the sentence's own words are probed in every mode, on the same EWT train/dev sentences.

    python -m research.scripts.pos_in_context runs/X/encoder/final [--modes single,filler] [--out F.parquet]

Prints one line per mode (accuracy per layer, gain of the best layer over layer 0) and writes a tidy
table (mode, layer, accuracy) when `--out` is given.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.training.corpus import cached_corpus
from research.ablate import probe_layers
from workbench.core.io import write_parquet_atomic
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

MODES = ("single", "context", "filler", "prefill")


def row_ids(encs, i: int, mode: str, filler: np.ndarray, rng: np.random.Generator, room: int):
    """Subword ids of row i (no specials) and the offset of sentence i's first id in it."""
    body = list(encs[i].ids)
    if mode == "single":
        return body, 0
    if mode == "context":  # grow by whole neighbouring sentences, alternating before/after
        before, after, j, k = [], [], i - 1, i + 1
        grew = True
        while grew:
            grew = False
            if j >= 0 and len(body) + len(before) + len(after) + len(encs[j].ids) <= room:
                before, j, grew = list(encs[j].ids) + before, j - 1, True
            if k < len(encs) and len(body) + len(before) + len(after) + len(encs[k].ids) <= room:
                after, k, grew = after + list(encs[k].ids), k + 1, True
        return before + body + after, len(before)
    start = int(rng.integers(0, len(filler) - room))
    fill = [int(t) for t in filler[start:start + max(0, room - len(body))]]
    return (body + fill, 0) if mode == "filler" else (fill + body, len(fill))


def vectors(model, tok, sents, mode: str, filler: np.ndarray, seq_len: int, seed: int = 0):
    """(layers of (N, D) first-subword vectors, (N,) UPOS labels) of every word of `sents` kept."""
    encs = tok.encode_words_batch([list(s.words) for s in sents], add_special=False)
    rng = np.random.default_rng(seed)
    L = int(model.config.n_layers)
    X, y = [[] for _ in range(L + 1)], []
    # a sentence alone is cut only where the store cuts it (max_positions); the longer rows at seq_len
    room = int(model.config.max_positions if mode == "single" else seq_len) - 2
    for i, s in enumerate(sents):
        ids, off = row_ids(encs, i, mode, filler, rng, room)
        ids = ids[:room]
        firsts = [1 + off + a for a, _ in encs[i].word_spans]
        keep = [f for f in firsts if f <= len(ids)]  # words cut by the row's end are not probed
        with torch.inference_mode():
            out = model(torch.tensor([[tok.cls_id, *ids, tok.sep_id]]), output_hidden_states=True)
        for layer, h in enumerate(out.hidden_states):  # fp16, as the activation store keeps them
            X[layer].append(h[0, keep].to(torch.float16).numpy())
        y.extend(list(s.upos)[: len(keep)])
    return [np.concatenate(x) for x in X], np.array(y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a saved encoder (a run's final/ or checkpoint folder)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seq-len", type=int, default=128, help="row length of the longer modes, specials included")
    ap.add_argument("--train", type=int, default=1250, help="EWT train sentences (the target check's 1,250)")
    ap.add_argument("--test", type=int, default=500, help="EWT dev sentences (the target check's 500)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the tidy table (mode, layer, accuracy) to this Parquet file")
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {bad}; known: {list(MODES)}")
    torch.set_num_threads(a.threads)
    model, tok = plmodels.load(a.model)
    if model.kind != "encoder" or tok.cls_id is None:
        ap.error(f"{a.model}: needs a WordPiece encoder (got a {model.kind})")
    model.eval()
    filler = np.zeros(0, dtype=np.int64)
    if {"filler", "prefill"} & set(modes):
        with tempfile.TemporaryDirectory() as tmp:
            filler = np.array(cached_corpus(data_root() / "gutenberg_pd", "valid", tok, tmp, progress=False))
        filler = filler[filler != tok.doc_sep_id]
    sents = {"train": ud_sentences("ewt", "train")[: a.train], "dev": ud_sentences("ewt", "dev")[: a.test]}
    rows = []
    for mode in modes:
        (X_tr, y_tr), (X_te, y_te) = (vectors(model, tok, sents[s], mode, filler, a.seq_len) for s in ("train", "dev"))
        acc = probe_layers(X_tr, y_tr, X_te, y_te)
        best = max(acc, key=acc.get)
        print(f"{mode:8s} " + " ".join(f"{100 * v:.1f}" for v in acc.values())
              + f"  gain {100 * (acc[best] - acc[0]):+.2f} (layer {best})", flush=True)
        rows += [{"mode": mode, "layer": l, "accuracy": v} for l, v in acc.items()]
    if a.out:
        write_parquet_atomic(pd.DataFrame(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
