"""Cross-attention heads of a T5 / BART checkpoint: where does each target position look in the source?

The model calls and data plumbing around `probes.cross_attention` (alignment heads, after Voita et
al. 2019, "Analyzing Multi-Head Self-Attention", sec. 6; the noising is the model's own, Raffel et
al. 2020 / Lewis et al. 2020 as plmodels/training/denoising.py implements them).

1. The first `n_sentences` sentences of UD EWT test (held out: the models pretrain on other text)
   are tokenized as the trainer's rows are, [CLS] words [SEP] with the checkpoint's WordPiece
   tokenizer (`Tokenizer.encode` of the words joined by spaces). Rows longer than the model's
   positions (before or after noising), or with fewer than two tokens between [CLS] and [SEP], are
   left out and counted in the record.
2. Each row is noised with the checkpoint's own objective (its card's `objective_name`; the
   objective's arguments from the run's config.resolved.json beside the checkpoint, else the
   defaults) under `seed`, exactly as `data.t5_batch` / `data.bart_batch` build a training example,
   with `return_alignment=True`:
   - BART: encoder input = the corrupted row, target = the row; each target token that survived
     unmasked is aligned to its copy in the input (`denoising.infilling_alignment`);
   - T5: encoder input = [CLS] + the kept tokens with one sentinel per noise span + [SEP]; target =
     "<extra_id_0> span 0 <extra_id_1> ... [SEP]"; each target sentinel is aligned to the input's
     same sentinel (`denoising.t5_sentinel_alignment`), the span tokens to none; those positions are
     the `sentinel` ones, so `sentinel_acc` = `align_acc` for T5.
3. Teacher forcing as in training (decoder input = `Seq2Seq.shift_right(target)`), eager attention;
   row t of a cross-attention map is the decoder position that predicts target token t.
   `CrossAttentionStats` -> the ``cross_heads`` table (model, layer, head, score, value), written
   with `write_analysis_outputs` (and a record `cross_heads_run.json`) when `out_dir` is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from plmodels.checkpoint import CONFIG_FILE, load, read_card, read_json_file
from plmodels.config import Config
from plmodels.families import FAMILIES, family
from plmodels.seq2seq import Seq2Seq
from plmodels.tokenizer import Tokenizer
from plmodels.training.config import BartArgs, T5Args
from plmodels.training.data import sentinel_ids
from plmodels.training.denoising import bart_text_infilling, t5_span_corruption
from plmodels.training.masking import continuation_ids, word_starts
from probes.cross_attention import CrossAttentionStats, CrossSentence
from workbench.analyses.probing import default_model_name
from workbench.core.results import write_analysis_outputs
from workbench.data.tasks import ud_sentences

OBJECTIVE_ARGS = {"t5": T5Args, "bart": BartArgs}  # the seq2seq objectives this analysis can replay


@dataclass(frozen=True)
class NoisedExample:
    """One noised sentence: encoder input (Te,), target (Td,), alignment (Td,) long (input position
    each target token copies, -1 none) and sentinel (Td,) bool (True on aligned T5 sentinels)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    alignment: torch.Tensor
    sentinel: torch.Tensor | None = None


def denoising_objective(model_path: Path) -> tuple[str, T5Args | BartArgs, str]:
    """(objective name, its arguments, where the arguments came from: "card", the run config an older
    card's were read from, or "defaults") of an encoder-decoder checkpoint, from its card."""
    kind = read_json_file(model_path / CONFIG_FILE).get("kind")
    if kind not in FAMILIES or not family(kind).cross_attention:
        with_cross = " or ".join(repr(k) for k, f in FAMILIES.items() if f.cross_attention)
        raise ValueError(f"{model_path}: replaying a denoising objective needs an encoder-decoder (kind {with_cross}: "
                         f"a family with cross-attention), got kind {kind!r}")
    card = read_card(model_path)
    name = card.objective_name
    if name not in OBJECTIVE_ARGS:
        raise ValueError(f"{model_path}: card.json's objective_name is {name!r}; the analyses replay one of "
                         f"{sorted(OBJECTIVE_ARGS)}")
    return name, OBJECTIVE_ARGS[name].from_dict(dict(card.objective_args)), card.objective_args_source


def noise_rows(rows: list[torch.Tensor], tok: Tokenizer, objective: str, args: T5Args | BartArgs,
               generator: torch.Generator) -> list[NoisedExample]:
    """Training examples of rows [CLS] body [SEP] (each (T,) long) as data.t5_batch / bart_batch make
    them, with their alignments (module docstring, step 2)."""
    out = []
    if objective == "t5":
        sentinels = sentinel_ids(tok, args.n_sentinels)
        cls = torch.tensor([tok.cls_id])
        for row in rows:
            c = t5_span_corruption(row[1:-1], noise_density=args.noise_density, mean_span_length=args.mean_span_length,
                                   sentinel_ids=sentinels, eos_id=tok.sep_id, generator=generator,
                                   return_alignment=True)
            align = torch.where(c.alignment >= 0, c.alignment + 1, c.alignment)  # + 1: the [CLS] in front
            out.append(NoisedExample(torch.cat([cls, c.inputs]), c.targets, align, align >= 0))
        return out
    cont = continuation_ids(tok.hf.get_vocab()) if args.whole_word else None
    stop = tok.hf.token_to_id(".")
    for row in rows:
        ends = (row == tok.sep_id) | (row == (stop if stop is not None else -1))
        noised = bart_text_infilling(row, mask_ratio=args.mask_ratio, poisson_lambda=args.poisson_lambda,
                                     mask_id=tok.mask_id, generator=generator, permute_sentences=args.permute_sentences,
                                     sentence_ends=ends, random_ratio=args.random_ratio, vocab_size=tok.vocab_size,
                                     word_starts=None if cont is None else word_starts(row[None], cont)[0],
                                     return_alignment=True)
        out.append(NoisedExample(noised.inputs, noised.targets, noised.alignment))
    return out


def _pad(seqs: list[torch.Tensor], value: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = s
    return out  # (B, T_max)


@torch.no_grad()
def cross_head_table(model: Seq2Seq, examples: list[NoisedExample], model_name: str = "model", pad_id: int = 0,
                     batch_size: int = 16, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The ``cross_heads`` table of `model` on noised examples: teacher-forced forward passes
    (decoder input = shift_right(target)), each sentence's cross-attentions (L, H, Td, Te) cut to its
    real lengths, streamed into `probes.cross_attention.CrossAttentionStats`."""
    stats = CrossAttentionStats(n_boot=n_boot, seed=seed)
    device = next(model.parameters()).device
    model.eval()
    for i in range(0, len(examples), batch_size):
        batch = examples[i: i + batch_size]
        ids = _pad([e.inputs for e in batch], pad_id)
        mask = _pad([torch.ones_like(e.inputs) for e in batch], 0)
        dec = model.shift_right(_pad([e.targets for e in batch], -100))
        out = model(ids.to(device), attention_mask=mask.to(device), decoder_input_ids=dec.to(device),
                    output_attentions=True, attn_impl="eager", return_logits=False)
        cross = torch.stack(out.cross_attentions, 1).float().cpu()  # (B, L, H, Td, Te)
        for b, e in enumerate(batch):
            A = cross[b, :, :, : len(e.targets), : len(e.inputs)].numpy()
            sentinel = None if e.sentinel is None else e.sentinel.numpy()
            stats.update(CrossSentence(A, e.alignment.numpy(), sentinel, sent_id=str(i + b)))
    return stats.finalize(model_name)


@dataclass(frozen=True)
class CrossHeadsConfig(Config):
    """The run config of `analyse_cross_heads` (`workbench cross-heads`, the `cross_heads` step)."""

    n_sentences: int = 200   # EWT test sentences to noise and read
    seed: int = 0            # the noising seed (and the bootstrap's)
    n_boot: int = 1000       # bootstrap resamples over sentences for align_acc's interval
    batch_size: int = 16     # sentences per teacher-forced forward

    def __post_init__(self) -> None:
        for name in ("n_sentences", "n_boot", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"CrossHeadsConfig.{name} must be >= 1, got {getattr(self, name)}")


def analyse_cross_heads(model_path: str | Path, out_dir: str | Path | None = None, n_sentences: int = 200,
                        seed: int = 0, model_name: str | None = None, n_boot: int = 1000,
                        batch_size: int = 16) -> dict[str, pd.DataFrame]:
    """Cross-attention head scores of a seq2seq checkpoint on its own noising of EWT test sentences
    (module docstring) -> {"cross_heads": table}; written under `out_dir` when given."""
    model_path = Path(model_path)
    objective, args, args_source = denoising_objective(model_path)
    model, tok = load(model_path)
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer")
    limit = model.config.max_positions
    rows, skipped = [], {"too_long": 0, "too_short": 0}
    for s in ud_sentences("ewt", "test")[:n_sentences]:
        row = torch.tensor(tok.encode(" ".join(s.words)), dtype=torch.long)
        if len(row) > limit:
            skipped["too_long"] += 1
        elif len(row) < 4:
            skipped["too_short"] += 1
        else:
            rows.append(row)
    if not rows:
        raise ValueError(f"no usable sentences among the first {n_sentences} of EWT test ({skipped})")
    examples = noise_rows(rows, tok, objective, args, torch.Generator().manual_seed(seed))
    skipped["too_long_noised"] = sum(len(e.inputs) > limit for e in examples)  # BART's insertions lengthen a row
    examples = [e for e in examples if len(e.inputs) <= limit]
    name = model_name or default_model_name(model_path)
    table = cross_head_table(model, examples, name, pad_id=tok.pad_id, batch_size=batch_size, n_boot=n_boot, seed=seed)
    tables = {"cross_heads": table}
    record = {"model": name, "model_path": str(model_path), "objective": objective, "objective_args": args.to_dict(),
              "objective_args_source": args_source, "treebank": "ewt:test", "n_sentences": len(examples),
              "skipped": skipped, "seed": seed, "n_boot": n_boot}
    write_analysis_outputs(tables, out_dir, None, record, "cross_heads_run.json")
    return tables
