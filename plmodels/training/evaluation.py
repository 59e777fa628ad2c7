"""Held-out evaluation during pretraining: loss, perplexity and accuracy on fixed rows with a fixed
mask, next to the unigram baseline on the same targets.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .config import PretrainConfig
from .data import Batch, make_batch
from .masking import IGNORE_INDEX, MaskingConfig, continuation_ids, step_generator


EVAL_BATCH = 64  # rows per held-out forward (does not change the targets or the mask)


class Evaluator:
    """Held-out loss on fixed rows with a fixed mask (encoder: masked-token loss and accuracy;
    decoder: loss and perplexity), plus the unigram baseline on the same targets. The rows and the
    mask depend on (seed, eval_sequences, heldout_len, eval_masking) only, not on the
    training masking, the batch size or a short first phase.

    Unigram baseline: p(w) = (count_train(w) + 1) / (N + V) (add-one), loss = mean -log p(target);
    a model that has only learnt token frequencies sits on this "unigram plateau".
    """

    def __init__(self, name: str, ds, cfg: PretrainConfig, tok, log_unigram: torch.Tensor, device):
        self.name, self.device = name, device
        n = min(cfg.eval_sequences, len(ds))
        if n == 0:
            raise ValueError(f"eval corpus {name!r} packs into no row of {ds.seq_len} tokens")
        idx = torch.linspace(0, len(ds) - 1, n).long().tolist()  # spread over the whole split
        rows = torch.from_numpy(np.stack([ds[i] for i in idx]))
        # the held-out mask is BERT's standard one unless eval_masking says otherwise, drawn once over
        # all rows: runs with other training masks or batch sizes are scored on the same targets
        masking = MaskingConfig.from_dict(cfg.eval_masking)
        cont = continuation_ids(tok.hf.get_vocab()) if masking.whole_word else None
        gen = step_generator(cfg.seed, 0, stream=1_000_003)  # the fixed eval mask
        whole = make_batch(rows, tok, masking, gen, cont, device)
        self.batches = [Batch(whole.input_ids[i: i + EVAL_BATCH], whole.labels[i: i + EVAL_BATCH])
                        for i in range(0, n, EVAL_BATCH)]
        targets = torch.cat([b.labels[b.labels != IGNORE_INDEX].cpu() for b in self.batches])
        self.unigram_loss = float(-log_unigram[targets].mean())

    @torch.no_grad()
    def __call__(self, model, autocast: bool) -> dict[str, float]:
        was_training = model.training
        model.eval()
        total, count, correct = 0.0, 0, 0
        for b in self.batches:
            with torch.autocast(b.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                sel = b.labels != IGNORE_INDEX
                if model.kind == "encoder":
                    logits = model.mlm_logits(model.masked_hidden(b.input_ids, sel))
                else:
                    logits = model(b.input_ids, attn_impl="sdpa").logits[sel]
            targets = b.labels[sel]
            total += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += int(targets.numel())
        model.train(was_training)
        loss = total / max(1, count)
        out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": correct / max(1, count),
               "unigram_loss": self.unigram_loss, "unigram_ppl": math.exp(min(self.unigram_loss, 50.0))}
        return out
