"""Held-out evaluation during pretraining: loss, perplexity and accuracy on fixed rows with a fixed
mask, next to the unigram baseline on the same targets.

ELMo's biLM (kinds "bilm" and "tbilm") is scored on every token in both directions (no mask): loss = the mean of
the forward and backward mean NLLs (the training loss), ppl = the mean of the two directions'
perplexities (what Peters et al. 2018 report), acc = the mean of their top-1 accuracies, and the
per-direction values as fwd_* / bwd_*; the unigram baseline is averaged over the two directions'
targets the same way.

An encoder-decoder (kind "seq2seq", objectives "t5" and "bart") is scored on its denoising targets
(data.t5_batch / bart_batch, drawn once with the fixed eval generator): loss, ppl and acc over
every target token (T5: the sentinels, the noise spans and the final [SEP]; BART: the whole original
row, most of which the encoder saw), and `noise_loss` / `noise_ppl` over the targets the encoder did
not see (T5's noise tokens; BART's masked tokens, not reported with sentence permutation), each
beside the unigram baseline on the same targets (`unigram_loss`, `noise_unigram_loss`). T5's
sentinels never occur in the corpus, so its all-targets unigram baseline is weak (add-one
probability for them); `noise_unigram_loss` is the fair one.

XLNet (kind "xlnet", objective "plm") is scored as it trains: each held-out row's factorisation
order and targets (data.plm_batch) are drawn once with the fixed eval generator, and loss, ppl and
acc are those of the query stream at the targets, beside the unigram baseline on the same targets.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from plmodels.elmo import bilm_targets
from plmodels.families import family, family_of

from .config import PLMArgs, PretrainConfig
from .data import Batch, make_batch, plm_batch, seq2seq_batch
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
        self.noise_unigram_loss: float | None = None
        self.unigram_parts: tuple[float, float] | None = None
        HELD_OUT_ROWS[family(cfg.kind).lm_inputs](self, rows, n, cfg, tok, log_unigram, device)

    def bidirectional_rows(self, rows, n, cfg, tok, log_unigram, device) -> None:
        """A biLM: every token, both directions: the rows as they are."""
        rows = rows.to(device)
        self.batches = [Batch(rows[i: i + EVAL_BATCH], rows[i: i + EVAL_BATCH]) for i in range(0, n, EVAL_BATCH)]
        nll = -log_unigram[rows.cpu()]  # (n, T)
        self.unigram_parts = (float(nll[:, 1:].mean()), float(nll[:, :-1].mean()))  # forward, backward targets
        self.unigram_loss = sum(self.unigram_parts) / 2

    def denoising_rows(self, rows, n, cfg, tok, log_unigram, device) -> None:
        """An encoder-decoder: the objective's own corruption, drawn once with the fixed eval generator."""
        gen = step_generator(cfg.seed, 0, stream=1_000_003)
        cont = continuation_ids(tok.hf.get_vocab())
        self.batches = [seq2seq_batch(cfg, rows[i: i + EVAL_BATCH], tok, gen, cont, device)
                        for i in range(0, n, EVAL_BATCH)]
        targets = torch.cat([b.labels[b.labels != IGNORE_INDEX].cpu() for b in self.batches])
        self.unigram_loss = float(-log_unigram[targets].mean())
        if self.batches[0].extras["scored"] is not None:
            noise = torch.cat([b.labels[b.extras["scored"]].cpu() for b in self.batches])
            self.noise_unigram_loss = float(-log_unigram[noise].mean())

    def permutation_rows(self, rows, n, cfg, tok, log_unigram, device) -> None:
        """XLNet: the permutation targets, drawn once with the fixed eval generator."""
        gen = step_generator(cfg.seed, 0, stream=1_000_003)
        args = PLMArgs.from_dict(cfg.objective_args)
        self.batches = [plm_batch(rows[i: i + EVAL_BATCH], tok, args, gen, device) for i in range(0, n, EVAL_BATCH)]
        targets = torch.cat([b.labels[b.labels != IGNORE_INDEX].cpu() for b in self.batches])
        self.unigram_loss = float(-log_unigram[targets].mean())

    def token_rows(self, rows, n, cfg, tok, log_unigram, device) -> None:
        """A masked or causal LM: data.make_batch's targets (a mask for WordPiece rows, the shift for BPE)."""
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
        return HELD_OUT_SCORES[family_of(model).lm_inputs](self, model, autocast)

    @torch.no_grad()
    def tokens(self, model, autocast: bool) -> dict[str, float]:
        """Loss, perplexity and accuracy at the labelled positions, through the family's held-out
        logits (`Family.lm_logits`: an encoder's masked positions, a decoder's next tokens, XLNet's
        query stream at its targets)."""
        logits_at = family_of(model).lm_logits
        was_training = model.training
        model.eval()
        total, count, correct = 0.0, 0, 0
        for b in self.batches:
            with torch.autocast(b.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                sel = b.labels != IGNORE_INDEX
                logits = logits_at(model, b, sel)
            targets = b.labels[sel]
            total += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += int(targets.numel())
        model.train(was_training)
        loss = total / max(1, count)
        out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": correct / max(1, count),
               "unigram_loss": self.unigram_loss, "unigram_ppl": math.exp(min(self.unigram_loss, 50.0))}
        return out

    @torch.no_grad()
    def bilm(self, model, autocast: bool) -> dict[str, float]:
        """Both directions of an ELMo biLM on the held-out rows (module docstring)."""
        was_training = model.training
        model.eval()
        total, correct, count = [0.0, 0.0], [0, 0], 0
        for b in self.batches:
            with torch.autocast(b.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                hidden = model(b.input_ids).last_hidden_state  # (B, T, 2 P)
                h_fwd, y_fwd, h_bwd, y_bwd = bilm_targets(hidden, b.input_ids, None, model.config.d_proj)
                for k, (h, y) in enumerate(((h_fwd, y_fwd), (h_bwd, y_bwd))):
                    logits = model.lm_logits(h).float()  # (N, V)
                    total[k] += float(F.cross_entropy(logits, y, reduction="sum"))
                    correct[k] += int((logits.argmax(-1) == y).sum())
            count += int(y_fwd.numel())
        model.train(was_training)
        fwd, bwd = (t / max(1, count) for t in total)
        ppl = lambda x: math.exp(min(x, 50.0))  # noqa: E731
        uf, ub = self.unigram_parts
        return {"loss": (fwd + bwd) / 2, "ppl": (ppl(fwd) + ppl(bwd)) / 2, "acc": sum(correct) / max(1, 2 * count),
                "fwd_loss": fwd, "bwd_loss": bwd, "fwd_ppl": ppl(fwd), "bwd_ppl": ppl(bwd),
                "unigram_loss": self.unigram_loss, "unigram_ppl": (ppl(uf) + ppl(ub)) / 2}

    @torch.no_grad()
    def seq2seq(self, model, autocast: bool) -> dict[str, float]:
        """An encoder-decoder on its held-out denoising targets (module docstring)."""
        was_training = model.training
        model.eval()
        total, count, correct, noise_total, noise_count = 0.0, 0, 0, 0.0, 0
        for b in self.batches:
            with torch.autocast(b.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(b.input_ids, attention_mask=b.extras["attention_mask"],
                               decoder_input_ids=b.extras["decoder_input_ids"], attn_impl="sdpa").logits
            sel = b.labels != IGNORE_INDEX
            nll = F.cross_entropy(logits[sel].float(), b.labels[sel], reduction="none")  # (N,)
            total += float(nll.sum())
            correct += int((logits[sel].argmax(-1) == b.labels[sel]).sum())
            count += int(nll.numel())
            if b.extras["scored"] is not None:
                noise = b.extras["scored"][sel]
                noise_total += float(nll[noise].sum())
                noise_count += int(noise.sum())
        model.train(was_training)
        ppl = lambda x: math.exp(min(x, 50.0))  # noqa: E731
        loss = total / max(1, count)
        out = {"loss": loss, "ppl": ppl(loss), "acc": correct / max(1, count),
               "unigram_loss": self.unigram_loss, "unigram_ppl": ppl(self.unigram_loss)}
        if self.noise_unigram_loss is not None:
            noise_loss = noise_total / max(1, noise_count)
            out.update(noise_loss=noise_loss, noise_ppl=ppl(noise_loss), noise_unigram_loss=self.noise_unigram_loss)
        return out


# Held-out rows and their scoring per LM batch form (plmodels.families.Family.lm_inputs)
HELD_OUT_ROWS = {"bidirectional": Evaluator.bidirectional_rows, "denoising": Evaluator.denoising_rows,
                 "permutation": Evaluator.permutation_rows, "masked": Evaluator.token_rows, "causal": Evaluator.token_rows}
HELD_OUT_SCORES = {"bidirectional": Evaluator.bilm, "denoising": Evaluator.seq2seq, "permutation": Evaluator.tokens,
                   "masked": Evaluator.tokens, "causal": Evaluator.tokens}
