"""Pretraining objectives: what a training step computes from packed rows, one registry entry per
system (`OBJECTIVES`), so the loop (loop.py) stays the same for all of them.

| objective | systems                         | batch (from packed rows)          | loss                          | saved beside the checkpoint      |
|-----------|---------------------------------|-----------------------------------|-------------------------------|----------------------------------|
| mlm       | BERT, RoBERTa, ALBERT           | MLM 80/10/10 (+ NSP or SOP pairs) | MLM (+ pair loss)             | -                                |
| clm       | GPT-2                           | the ids shifted by one            | next-token CE                 | -                                |
| span      | SpanBERT (Joshi et al. 2020)    | span masking of whole words       | MLM + span-boundary objective | the SBO head (objective.safetensors) |
| electra   | ELECTRA (Clark et al. 2020)     | MLM 85/15 for the generator       | MLM(gen) + 50 RTD(disc)       | the generator (generator/ folder)    |
| distil    | DistilBERT (Sanh et al. 2019)   | MLM 80/10/10                      | 5 KD + 2 MLM + 1 cosine       | - (the teacher is named in the config) |
| bilm      | ELMo (Peters et al. 2018)       | the rows as they are (no masking) | (forward + backward LM NLL) / 2 | -                              |
| tbilm     | ELMo's transformer control      | the rows as they are (no masking) | (forward + backward LM NLL) / 2 | -                              |
| t5        | T5 (Raffel et al. 2020)         | span corruption, sentinels        | CE on the targets             | -                                |
| bart      | BART (Lewis et al. 2020)        | text infilling with [MASK]        | CE on the original row        | -                                |
| plm       | XLNet (Yang et al. 2019)        | factorisation order, last 1/K     | query-stream CE at the targets | -                               |

An `Objective` builds the *trained module* (the model, or the model with what only training needs:
the SBO head, the generator), names the *analysed model* inside it (what `final/` holds and every
analysis reads: the encoder, ELECTRA's discriminator, the DistilBERT student), turns packed rows
into a `Batch` and computes the loss. `objective: "auto"` is "mlm" for encoders and "clm" for
decoders, what the trainer did before objectives existed, and "bilm" / "tbilm" for ELMo's biLM and
its transformer control (the kinds of the same names); an encoder-decoder ("seq2seq") has no
default: its config names "t5" or "bart"; XLNet ("xlnet") trains "plm". Fields specific to one
objective are `PretrainConfig.objective_args`, checked by the objective's own config class.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.checkpoint import WEIGHTS_FILE, build_model, read_safetensors, save, write_checksums
from plmodels.config import Config
from plmodels.electra import ElectraConfig, ElectraPair, electra_loss, generator_state, sampling_generator
from plmodels.elmo import bilm_loss
from plmodels.files import save_safetensors
from plmodels.tokenizer import WORDPIECE_SPECIALS, Tokenizer

from .config import AUTO_OBJECTIVE, BartArgs, PLMArgs, T5Args
from .data import Batch, bart_batch, make_batch, plm_batch, t5_batch
from .distil import DistilConfig, check_teacher, distil_loss, load_teacher, student_from_teacher
from .loss import causal_lm_loss, linear_cross_entropy, masked_lm_loss
from .masking import IGNORE_INDEX, MaskingConfig, cap_predictions, masked_slots, slot_sizes, word_starts
from .spans import SpanBoundaryHead, SpanConfig, sbo_targets, span_mask

OBJECTIVE_FILE = "objective.safetensors"  # a checkpoint's training-only tensors (SBO head, generator)


@dataclass(frozen=True)
class NoArgs(Config):
    """Objectives without fields of their own take an empty `objective_args`."""


class Objective:
    """The default: BERT's masked LM (+ NSP / SOP) for encoders (`CausalLM` is GPT-2's for decoders)."""

    name: ClassVar[str] = "mlm"
    args_class: ClassVar[type] = NoArgs
    lm_head_trained: ClassVar[bool] = True  # the analysed model's LM head is trained (the card says so)

    def __init__(self, cfg, args: dict | None = None) -> None:
        self.cfg = cfg
        self.args = self.args_class.from_dict(dict(args or {}), f"objective_args ({self.name})")

    # --- what is trained, what is analysed ---------------------------------------------------
    def tokenizer_path(self) -> str | None:
        """A tokenizer the objective fixes (DistilBERT: the teacher's); None = the config's."""
        return None

    def model_config(self, fields_: dict) -> dict:
        """The analysed model's config fields from the preset-and-overrides ones."""
        return fields_

    def build(self, kind: str, model_cfg: dict) -> nn.Module:
        """The trained module, freshly initialised (the global RNG seeded by the caller)."""
        return build_model(kind, model_cfg)

    def analysed(self, module: nn.Module) -> nn.Module:
        """The model inside `module` that checkpoints hold and analyses read."""
        return module

    def mlm_model(self, module: nn.Module) -> nn.Module:
        """The model whose held-out MLM / LM loss the evaluator reports."""
        return self.analysed(module)

    def describe(self) -> str:
        """The card's `objective` line."""
        m = self.cfg.masking_config
        pair = " + NSP" if m.nsp else " + SOP" if m.sop else ""
        return f"masked LM (BERT {m.mask_frac:.0%}/{m.random_frac:.0%}/rest kept, dynamic){pair}"

    # --- extra tensors saved with a checkpoint -------------------------------------------------
    def extra_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Tensors of the trained module outside the analysed model (saved to objective.safetensors)."""
        return {}

    def load_extra_state(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise ValueError(f"objective {self.name!r} has no extra tensors, found {sorted(state)[:4]}")

    def save_extras(self, module: nn.Module, folder: Path, tok, card: dict) -> None:
        """Write what the checkpoint folder holds beside the analysed model."""
        state = self.extra_state(module)
        if state:
            save_safetensors({k: v.detach().cpu().contiguous() for k, v in state.items()}, folder / OBJECTIVE_FILE)
            # checksums.json again, after the file: a torn one is recognised like torn main weights
            write_checksums(folder, (WEIGHTS_FILE, OBJECTIVE_FILE))

    def load_extras(self, module: nn.Module, folder: Path, device) -> None:
        path = folder / OBJECTIVE_FILE
        self.load_extra_state(module, read_safetensors(path, device=str(device)) if path.is_file() else {})

    # --- a step -----------------------------------------------------------------------------
    def batch(self, rows: torch.Tensor, tok, masking: MaskingConfig, gen: torch.Generator, cont_ids,
              device) -> Batch:
        return make_batch(rows, tok, masking, gen, cont_ids, device, self.slot_sizes(rows))

    @property
    def static_shapes(self) -> bool:
        """Whether each batch of a row length has one shape whatever its random draws (the masked
        slots, XLNet's predicted set, BART's noised length): with `compile`, so that the compiled
        step compiles once per row length. Eager runs keep each batch's own sizes: no padding to
        compute (BART's costs an eager step a few percent, docs/training.md) and the same batches
        as before."""
        return bool(self.cfg.compile)

    def slot_sizes(self, rows: torch.Tensor) -> tuple[int, int] | None:
        """The `MaskedSlots` sizes (Q, M) of a batch of `rows` (B, T): with `compile`, bounds from
        the config (masking.slot_sizes at the run's highest masking rate), so every batch of a shape
        has the same slots and the compiled step compiles once; eager, None: each batch's own counts
        (fewer padding rows; known on the host where the batch is built, so no sync either way)."""
        if not self.static_shapes:
            return None
        m = self.cfg.masking_config
        return slot_sizes(rows.shape[0], rows.shape[1], max(m.rate, m.rate_final or 0.0))

    def loss(self, module: nn.Module, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor | int, dict]:
        """(loss to differentiate, number of predicted tokens, parts for metrics.jsonl). The count is a
        0-d device tensor (bilm, tbilm: an int, the batch's shape) and no step reads anything back
        to the host (tests/plmodels/test_loop.py), but for clm with the adaptive output on the CPU
        (`loss.causal_lm_loss`). The parts are
        detached 0-d tensors left on the device (the loop reads them back with the loss, every
        `log_every` steps: loop.py `_Loop._flush`), never `.item()`s, which would make each step wait."""
        loss, n = masked_lm_loss(module, batch, autocast)
        return loss, n, {}


class CausalLM(Objective):
    """GPT-2's causal LM: next-token cross-entropy at every position."""

    name = "clm"

    def describe(self) -> str:
        return "causal LM"

    def loss(self, module: nn.Module, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor | int, dict]:
        loss, n = causal_lm_loss(module, batch, autocast)
        return loss, n, {}


class SpanBERT(Objective):
    """Span masking of whole words and the span-boundary objective (spans.py); single segments."""

    name = "span"

    args_class = SpanConfig

    def build(self, kind: str, model_cfg: dict) -> nn.Module:
        if model_cfg.get("use_nsp"):
            raise ValueError("SpanBERT trains on single segments: masking.nsp and masking.sop must be false")
        enc = build_model(kind, model_cfg)
        module = nn.Module()
        module.model = enc
        c = enc.config
        module.sbo = SpanBoundaryHead(c.d_model, c.embedding_width, self.args.max_pair_targets,
                                      activation=c.activation, layer_norm_eps=c.layer_norm_eps)
        module.sbo_bias = nn.Parameter(torch.zeros(c.vocab_size))  # SBO scores: tied decoder + its own bias
        return module

    def analysed(self, module):
        return module.model

    def describe(self) -> str:
        a = self.args
        return (f"span masking (whole words, geometric p={a.p} clipped at {a.max_span}) + span-boundary "
                f"objective (SpanBERT)")

    def extra_state(self, module):
        return {**{f"sbo.{k}": v for k, v in module.sbo.state_dict().items()}, "sbo_bias": module.sbo_bias}

    def load_extra_state(self, module, state):
        state = dict(state)
        with torch.no_grad():
            module.sbo_bias.copy_(state.pop("sbo_bias"))
        module.sbo.load_state_dict({k.removeprefix("sbo."): v for k, v in state.items()}, strict=True)

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        a = self.args
        m = span_mask(rows, starts=word_starts(rows, cont_ids), mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                      special_ids=tok.special_ids, generator=gen, rate=masking.rate, p=a.p, max_span=a.max_span,
                      mask_frac=masking.mask_frac, random_frac=masking.random_frac,
                      max_pair_targets=a.max_pair_targets)
        sizes = self.slot_sizes(rows)
        if sizes is not None:
            ids, labels = cap_predictions(m.input_ids, m.labels, rows, sizes)
            m = replace(m, input_ids=ids, labels=labels, sbo=m.sbo & (labels != IGNORE_INDEX))
        sbo = sbo_targets(m)
        if sizes is not None:  # the SBO targets (a subset of the labelled positions) padded to M, -100 there
            pad = sizes[1] - sbo[0].numel()
            sbo = tuple(F.pad(t, (0, pad), value=IGNORE_INDEX if i == 4 else 0) for i, t in enumerate(sbo))
        return Batch(m.input_ids.to(device), m.labels.to(device), extras={"sbo": tuple(t.to(device) for t in sbo)},
                     slots=masked_slots(m.labels, sizes).to(device))

    def loss(self, module, batch, autocast):
        enc = module.model
        slots = batch.slots if batch.slots is not None else masked_slots(batch.labels)
        with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            hidden = enc(batch.input_ids, attn_impl="sdpa").last_hidden_state  # (B, T, D)
            weight, bias = enc.mlm_projection()
            h = hidden.flatten(0, 1).index_select(0, slots.positions)  # (M, D)
            mlm = linear_cross_entropy(enc.mlm_transform(h), weight, bias, slots.targets) / slots.count.clamp_min(1.0)
            b_idx, left, right, rel, sbo_targets_ = batch.extras["sbo"]
            z = module.sbo(hidden, left, right, rel, b_idx)  # (M', E)
            n_sbo = (sbo_targets_ != IGNORE_INDEX).sum().clamp_min(1)
            sbo = linear_cross_entropy(z, weight, module.sbo_bias, sbo_targets_) / n_sbo
        return mlm + self.args.sbo_weight * sbo, slots.count, {"mlm_loss": mlm.detach(), "sbo_loss": sbo.detach()}


class Electra(Objective):
    """Generator + discriminator (plmodels/electra.py); the discriminator is the analysed model."""

    name = "electra"
    args_class = ElectraConfig
    lm_head_trained = False  # the discriminator's MLM head is never trained (the generator's is)

    def build(self, kind: str, model_cfg: dict) -> nn.Module:
        disc = build_model(kind, {**model_cfg, "use_rtd": True})  # checks the fields as any encoder
        return ElectraPair(disc.config, self.args)

    def model_config(self, fields_: dict) -> dict:
        return {**fields_, "use_rtd": True}

    def analysed(self, module):
        return module.discriminator

    def mlm_model(self, module):
        return module.generator

    def describe(self) -> str:
        a = self.args
        return (f"replaced-token detection (ELECTRA: generator at {a.generator_frac:g} width, "
                f"loss = MLM + {a.rtd_weight:g} RTD)")

    def extra_state(self, module):
        return {f"generator.{k}": v for k, v in generator_state(module).items()}

    def load_extra_state(self, module, state):
        own = {k.removeprefix("generator."): v for k, v in state.items()}
        missing, unexpected = module.generator.load_state_dict(own, strict=False)
        shared = [k for k in missing if not k.startswith("embeddings.") or k.startswith("embeddings.project")]
        if shared or unexpected:
            raise ValueError(f"{OBJECTIVE_FILE}: generator tensors missing {shared[:4]} or unexpected {unexpected[:4]}")

    def save_extras(self, module, folder, tok, card):
        """The generator as its own checkpoint folder `generator/` (readable by every analysis),
        and its tensors in objective.safetensors for resumption."""
        super().save_extras(module, folder, tok, card)
        save(module.generator, tok, folder / "generator",
             card={**card, "name": f"{card.get('name', '')} generator", "role": "ELECTRA generator",
                   "lm_head_trained": True})

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        b = make_batch(rows, tok, masking, gen, cont_ids, device, self.slot_sizes(rows))
        # the seed of the step's sampling generator, drawn here on the host: the generator itself is
        # made on the device at the loss (`sampling_generator`), so the samples never leave it
        b.extras = {"original": rows.to(device), "sample_seed": int(torch.randint(2**62, (1,), generator=gen))}
        return b

    def loss(self, module, batch, autocast):
        gen = sampling_generator(batch.extras["sample_seed"], batch.input_ids.device)
        with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            slots = batch.slots if batch.slots is not None else masked_slots(batch.labels)
            out = electra_loss(module, batch.extras["original"], batch.input_ids, gen,
                               token_type_ids=batch.token_type_ids, slots=slots)
        acc = ((out.rtd_logits.detach() > 0).float() == out.labels).float().mean()
        return out.loss, out.n_masked, {"mlm_loss": out.mlm.detach(), "rtd_loss": out.rtd.detach(), "rtd_acc": acc,
                                        "replaced_frac": out.labels.mean()}


class Distil(Objective):
    """DistilBERT (training/distil.py): a student from every other teacher layer, taught by the
    teacher's MLM distribution and last hidden states; the teacher's tokenizer."""

    name = "distil"
    args_class = DistilConfig

    def __init__(self, cfg, args=None) -> None:
        super().__init__(cfg, args)
        self._teacher = None

    def teacher(self):
        if self._teacher is None:
            check_teacher(self.args.teacher, self.args)
            self._teacher, _ = load_teacher(self.args.teacher)
        return self._teacher

    def tokenizer_path(self) -> str:
        return str(Path(self.args.teacher).expanduser() / "tokenizer")

    def model_config(self, fields_: dict) -> dict:
        """The student's fields: the teacher's, with every `every`-th layer (the preset is not used)."""
        return student_from_teacher(self.teacher(), self.args.every).config.to_dict()

    def build(self, kind: str, model_cfg: dict) -> nn.Module:
        student = student_from_teacher(self.teacher(), self.args.every)
        if student.config.to_dict() != model_cfg:
            raise ValueError("distil: the student's config differs from the resolved one (teacher changed?)")
        return student

    def describe(self) -> str:
        a = self.args
        return (f"distillation from {a.teacher} (DistilBERT: {a.alpha_ce:g} KD at T={a.temperature:g} + "
                f"{a.alpha_mlm:g} MLM + {a.alpha_cos:g} cosine)")

    def loss(self, module, batch, autocast):
        teacher = self.teacher().to(batch.input_ids.device)
        slots = batch.slots if batch.slots is not None else masked_slots(batch.labels)
        with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, parts = distil_loss(module, teacher, batch.input_ids, batch.labels, None, self.args, slots)
        return loss, slots.count, {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in parts.items()
                                   if k != "loss"}


class BiLM(Objective):
    """ELMo's biLM (plmodels/elmo.py): a forward and a backward LM over the same rows, one shared
    softmax; the loss is the mean of the two directions' NLLs (`bilm_loss`), through the fused
    cross-entropy. The rows are read whole: WordPiece rows' [CLS] ... [SEP] play the paper's <S> ... </S>."""

    name = "bilm"

    def describe(self) -> str:
        return "bidirectional LM (ELMo: forward + backward LSTM LMs, shared embeddings and softmax)"

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        rows = rows.to(device)
        return Batch(rows, rows)  # packed rows have no padding: no attention mask

    def loss(self, module, batch, autocast):
        with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = bilm_loss(module, batch.input_ids, None, cross_entropy=linear_cross_entropy)
        return out.loss, out.n, {"fwd_loss": out.forward.detach(), "bwd_loss": out.backward.detach()}


class TBiLM(BiLM):
    """ELMo's biLM with a causal transformer per direction (plmodels/elmo.py, TransformerBiLM)."""

    name = "tbilm"

    def describe(self) -> str:
        return "bidirectional LM, transformer control (two causal transformers, shared embeddings and softmax)"


class T5(Objective):
    """T5's span corruption (data.t5_batch, denoising.py) for an encoder-decoder (plmodels/seq2seq.py):
    the decoder predicts "<extra_id_0> span 0 <extra_id_1> span 1 ... [SEP]" from the corrupted row;
    the loss is the mean cross-entropy over those targets. The run's tokenizer carries the sentinels."""

    name = "t5"
    args_class = T5Args

    def model_config(self, fields_: dict) -> dict:
        """pad and decoder start from the tokenizer's ids ([PAD]: T5 starts the decoder from pad)."""
        pad, _ = _wordpiece_ids(self.cfg)
        return {**fields_, "pad_token_id": pad, "decoder_start_token_id": pad}

    def describe(self) -> str:
        a = self.args
        return (f"span corruption (T5: noise density {a.noise_density:g}, mean span {a.mean_span_length:g}, "
                f"{a.n_sentinels} sentinels), cross-entropy on the targets")

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        return t5_batch(rows, tok, self.args, gen, device)

    def loss(self, module, batch, autocast):
        return seq2seq_loss(module, batch, autocast)


class Bart(T5):
    """BART's text infilling (data.bart_batch, denoising.py): the decoder rebuilds the original row
    from one with [MASK]ed spans; the loss is the mean cross-entropy over every token of the row."""

    name = "bart"
    args_class = BartArgs

    def model_config(self, fields_: dict) -> dict:
        """pad and decoder start from the tokenizer's ids ([SEP]: BART starts the decoder from </s>)."""
        pad, sep = _wordpiece_ids(self.cfg)
        return {**fields_, "pad_token_id": pad, "decoder_start_token_id": sep}

    def describe(self) -> str:
        a = self.args
        words = "whole-word" if a.whole_word else "subword"
        perm = ", sentence permutation" if a.permute_sentences else ""
        return (f"text infilling (BART: {a.mask_ratio:g} of the {words}s in Poisson({a.poisson_lambda:g}) spans, "
                f"one [MASK] each, {a.random_ratio:g} random{perm}), cross-entropy on the original row")

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        """The noised rows padded to the row length with `static_shapes` (data.bart_batch)."""
        return bart_batch(rows, tok, self.args, gen, cont_ids, device, rows.shape[1] if self.static_shapes else None)


def _wordpiece_ids(cfg) -> tuple[int, int]:
    """([PAD], [SEP]) ids of the run's tokenizer: the one at cfg.tokenizer_path, else a trained
    WordPiece's (its specials come first, in WORDPIECE_SPECIALS' order)."""
    if cfg.tokenizer_path:
        tok = Tokenizer.load(Path(cfg.tokenizer_path).expanduser())
        if tok.pad_id is None or tok.sep_id is None:
            raise ValueError(f"{cfg.tokenizer_path}: a seq2seq run needs a tokenizer with [PAD] and [SEP]")
        return tok.pad_id, tok.sep_id
    order = list(WORDPIECE_SPECIALS)
    return order.index("pad"), order.index("sep")


def seq2seq_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Mean cross-entropy of an encoder-decoder over the batch's targets (labels != -100), through
    the fused linear cross-entropy on the decoder's output; (loss, number of targets, {}). Every
    decoder position goes through the fused loss, the -100 ones weighing nothing (no selection by a
    mask), and the count is a 0-d device tensor: nothing is read back to the host. The decoder's
    start token is checked against the one the batch was built with (`extras["decoder_start"]`, an
    int set on the host), not read from the device."""
    start = model.config.decoder_start_token_id
    built = batch.extras.get("decoder_start", start)
    if built != start:
        raise ValueError(f"the batch's decoder inputs start from {built}, the model's decoder_start_token_id "
                         f"is {start}: the run's tokenizer and the model config disagree")
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(batch.input_ids, attention_mask=batch.extras["attention_mask"],
                    decoder_input_ids=batch.extras["decoder_input_ids"], attn_impl="sdpa", return_logits=False)
        labels = batch.labels.flatten()  # (B Td,)
        n = (labels != IGNORE_INDEX).sum()
        weight, bias = model.lm_projection()
        hidden = model.lm_transform(out.decoder_last_hidden_state.flatten(0, 1))  # (B Td, D)
        loss = linear_cross_entropy(hidden, weight, bias, labels) / n.clamp_min(1)
    return loss, n, {}


class PLM(Objective):
    """XLNet's permutation language modelling with partial prediction (data.plm_batch, plm.py) for
    plmodels/xlnet.py: each row draws a factorisation order, the query stream predicts the last
    1/partial_k of it; the loss is the mean cross-entropy of the query stream's logits at the targets."""

    name = "plm"
    args_class = PLMArgs

    def describe(self) -> str:
        return (f"permutation LM (XLNet: two-stream attention, the last 1/{self.args.partial_k} of a random "
                f"factorisation order predicted), cross-entropy at the targets")

    def batch(self, rows, tok, masking, gen, cont_ids, device):
        """The predicted set padded to `plm.prediction_slots` with `static_shapes` (data.plm_batch)."""
        return plm_batch(rows, tok, self.args, gen, device, static=self.static_shapes)

    def loss(self, module, batch, autocast):
        return plm_loss(module, batch, autocast)


def plm_loss(model, batch: Batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Mean cross-entropy of XLNet's query stream at the batch's targets (labels (B, P) != -100),
    through the fused linear cross-entropy on the tied output layer; (loss, number of targets, {}).
    Every query row goes through the fused loss, the padding rows (-100) weighing nothing, and the
    count is a 0-d device tensor; the target mapping, built by `plm_batch` on the host, is not
    checked again on the device (`check_targets=False`): nothing is read back to the host."""
    e = batch.extras
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(batch.input_ids, attention_mask=e["attention_mask"], perm_mask=e["perm_mask"],
                    target_mapping=e["target_mapping"], attn_impl="sdpa", return_logits=False, check_targets=False)
        labels = batch.labels.flatten()  # (B P,)
        n = (labels != IGNORE_INDEX).sum()
        loss = linear_cross_entropy(out.query_hidden_state.flatten(0, 1), *model.lm_projection(), labels)
        loss = loss / n.clamp_min(1)
    return loss, n, {}


OBJECTIVES: dict[str, type[Objective]] = {c.name: c for c in (Objective, CausalLM, SpanBERT, Electra, Distil, BiLM,
                                                               TBiLM, T5, Bart, PLM)}


def objective_for(cfg) -> Objective:
    """The objective of a PretrainConfig (`objective`, with "auto" = mlm / clm by kind); the config
    has already checked the name, the kind and objective_args (config.OBJECTIVE_FIELDS)."""
    name = cfg.objective if cfg.objective != "auto" else AUTO_OBJECTIVE[cfg.kind]
    return OBJECTIVES[name](cfg, cfg.objective_args)
