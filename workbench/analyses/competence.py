"""How far did each model get? Its held-out LM loss beside a unigram and a bigram model's loss on the
same held-out targets: the competence line that opens every section of the report (issue 74: a score
is read against what the model can do at all).

`competence_table(run_folder, model)` scores the final checkpoint of one pretraining run on the run's
own held-out rows with its fixed mask (`workbench.analyses.emergence.HeldOutEval`, the trainer's
`Evaluator`: masked-token targets for an encoder, next-token targets for a decoder) and sets beside it

- the unigram loss on the same targets (add-one counts of the training tokens; Evaluator's own), the
  "unigram plateau" a model first sits on;
- the bigram loss on the same targets (`emergence.bigram_baseline`: a Dirichlet-smoothed bigram of the
  training tokens, its prior strength chosen on held-out training text). Its context is the token
  before the target in the original text (`BIGRAM_CONTEXT`, per model kind): a decoder's input at the
  target's position, an encoder's original token left of the masked one. An MLM also sees the right
  context, so for an encoder the bigram is a floor, not a matched model. Kinds whose targets have no
  single preceding token in `BIGRAM_CONTEXT` (seq2seq spans, XLNet's permutations, the biLMs' two
  directions) get no bigram row.

A checkpoint whose card says its LM head is untrained (ELECTRA's discriminator: `Card.lm_head_trained`)
gets no lm_loss or lm_acc row, only the floors: its head's loss would be noise, not how far it got.

The tidy `competence` table: model, split ("eval"), metric ("lm_loss" | "lm_acc" | "unigram_loss" |
"bigram_loss", nats per target), value, n_targets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

import plmodels
from plmodels.checkpoint import read_card
from plmodels.training.masking import IGNORE_INDEX
from workbench.analyses.emergence import HeldOutEval, bigram_baseline

COLUMNS = ["model", "split", "metric", "value", "n_targets"]


def _decoder_context(input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A decoder row's target at t is the token after input t: the context is the input at t."""
    sel = labels != IGNORE_INDEX
    return input_ids[sel].cpu().numpy(), labels[sel].cpu().numpy()


def _encoder_context(input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A masked token's context is the original token left of it (masked or not in the input)."""
    original = torch.where(labels != IGNORE_INDEX, labels, input_ids)
    sel = labels != IGNORE_INDEX
    sel[:, 0] = False  # the first position has no left neighbour (it is [CLS] and never a target)
    prev = torch.roll(original, shifts=1, dims=1)
    return prev[sel].cpu().numpy(), labels[sel].cpu().numpy()


# model kind -> (input_ids, labels) of an eval batch -> (context token, target) per target
BIGRAM_CONTEXT: dict[str, Callable[[torch.Tensor, torch.Tensor], tuple[np.ndarray, np.ndarray]]] = {
    "decoder": _decoder_context, "encoder": _encoder_context,
}


def competence_table(run_folder: str | Path, model: str, eval_sequences: int | None = None) -> pd.DataFrame:
    """The `competence` rows of one pretraining run's final checkpoint (module docstring)."""
    run = Path(run_folder)
    ev = HeldOutEval(run, eval_sequences)
    if not ev.ok:
        raise ValueError(f"{run}: the run has no held-out set (eval_source) to score its competence on")
    folder = run / "final" if (run / "final" / "config.json").is_file() else run
    net, _ = plmodels.load(folder)
    scores = ev.evaluator(net.eval(), autocast=False)
    kept = ("lm_loss", "lm_acc", "unigram_loss") if read_card(folder).lm_head_trained else ("unigram_loss",)
    rows = [(k, scores[m]) for k, m in (("lm_loss", "loss"), ("lm_acc", "acc"), ("unigram_loss", "unigram_loss"))
            if m in scores and k in kept]
    n = int(sum(int((b.labels != IGNORE_INDEX).sum()) for b in ev.evaluator.batches))
    context = BIGRAM_CONTEXT.get(ev.kind)
    if context is not None:
        pairs = [context(b.input_ids, b.labels) for b in ev.evaluator.batches]
        prev, targets = (np.concatenate(x) for x in zip(*pairs))
        rows.append(("bigram_loss", bigram_baseline(np.asarray(ev.train_ids), prev, targets,
                                                    ev.tokenizer.vocab_size)["bigram_loss"]))
    return pd.DataFrame([(model, "eval", m, float(v), n) for m, v in rows], columns=COLUMNS)
