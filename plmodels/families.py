"""Model families: one record per checkpoint kind, the one place where what differs per family lives.

The pattern is litgpt's `Config` table and Hugging Face's `AutoModel` mappings: a checkpoint's
`config.json` names its `kind`, `FAMILIES[kind]` says how to build it and what an analysis may
expect of it, and probes, analyses and the trainer ask the record instead of branching on the kind
string (docs/design.md, "Model families"; the count of such branches is kept by
tests/test_family_branches.py).

A record holds:
- `model_class`, `config_class`: what `plmodels.checkpoint` builds (its `MODEL_KINDS` is read off these records);
- `default_objective`: what `objective: "auto"` trains (None: the config must name one);
- `preset`: preset name -> model-config fields (plmodels/presets.py's tables);
- `tokenizer`: what a run trains when it is given none ("wordpiece" keeps the layers' words
  aligned with BERT's; "bpe" is GPT-2's byte-level BPE);
- `segments`: the model reads `token_type_ids` and has the pad / NSP fields a trainer fills in;
- `head_mask`: its forward takes an (L, H) head mask (ELMo's LSTM has no heads);
- `cross_attention`: it has decoder-to-encoder attention (T5 / BART);
- `lm_inputs`: the form of its LM batch ("masked": BERT's corrupted input and labels at the masked
  positions; "causal": the ids, next-token targets; "bidirectional": the ids, both directions'
  next-token targets; "permutation": XLNet's perm_mask / target_mapping / labels (B, P);
  "denoising": corrupted input, decoder_input_ids and labels);
- `lm_metric`: the name of its LM metric in `probes.pruning.METRICS` and the pruning tables;
- `lm_stat(model, batch, head_mask, **forward_kw) -> (summed loss, count)`: the family's LM loss on
  one batch (a mapping of tensors, the keys of `lm_inputs`) under a head mask, differentiable;
  what head importance, pruning and amnesic probing measure;
- `lm_logits(model, batch, select) -> (N, V)`: the held-out evaluator's logits at the labelled
  positions `select` of a training `Batch` (None: the family has its own evaluator, bilm / seq2seq);
- `forward_batch(model, batch, head_mask, **kw)`: the model run on an analysis batch (the inputs its
  forward accepts; a seq2seq model teacher-forced, its head mask split over its three attentions);
- `analysis_kwargs`: keywords an analysis adds to a hidden-states forward (skip unneeded logits);
- `sentence_features(model, out, attention_mask) -> (B, D)`: one vector per sequence for a classifier
  ([CLS]'s pooled vector, the last real token, or a biLM's two directions' ends);
- `summary_token`: the token whose hidden state stands for the sequence without a pooler ("first":
  BERT's [CLS]; "last": the last real token);
- `heads_per_layer(model)`: the rows of its head grid (a seq2seq model: every attention's layers);
- `flow_stacks(model) -> {suffix: model}`: the stacks whose layers the flow suite reads (docs/flow.md):
  the model itself ("") and, for an encoder-decoder, its decoder teacher-forced (";decoder",
  `TeacherForcedDecoder`), for a biLM each direction alone (";forward", ";backward", `BiLMDirection`),
  for XLNet its query stream (";query", `XLNetQueryStream`);
  a further stack's record (its `kind`) says how it is read, and `flow_views` which token it predicts
  when that is not its record's (`lm_inputs`: the backward LM's "previous" token);
  `flow_predict_mi` lists the stacks whose token to predict also gets an MI curve beside the lens.

`AnalysedModel` is the typing.Protocol an analysis may rely on.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .decoder import Decoder, DecoderConfig
from .elmo import BiLMDirection, ElmoBiLM, ElmoConfig, TransformerBiLM, TransformerBiLMConfig, bilm_loss
from .encoder import Encoder, EncoderConfig
from .presets import bilm_preset, decoder_preset, encoder_preset, seq2seq_preset, tbilm_preset, xlnet_preset
from .seq2seq import Seq2Seq, Seq2SeqConfig, TeacherForcedDecoder
from .xlnet import XLNet, XLNetConfig, XLNetQueryStream

Batch = Mapping[str, Tensor]
BatchStat = Callable[..., "tuple[Tensor, Tensor]"]  # (model, batch, head_mask, **forward_kw) -> (total, count)
LMInputs = Literal["masked", "causal", "bidirectional", "permutation", "denoising"]
IGNORE = -100  # label of a position that is not predicted (BERT / HF convention)


@runtime_checkable
class AnalysedModel(Protocol):
    """What an analysis may expect of a model (every family's model class satisfies it).

    forward(input_ids (B, T), attention_mask=None, head_mask=None (L, H), output_hidden_states=False,
    output_attentions=False, attn_impl="auto", ...) -> an output dataclass with `last_hidden_state`
    (B, T, D), `hidden_states` (L + 1 of (B, T, D)) and `attentions` (L of (B, H, T, T));
    `hooks(fwd=[(site, fn)])` is the context manager of the hook sites (docs/design.md, "Hook sites");
    `n_heads_per_layer` lists each layer's heads (after pruning)."""

    kind: str
    config: Any

    @property
    def n_heads_per_layer(self) -> list[int]: ...

    def __call__(self, input_ids: Tensor, *args: Any, **kwargs: Any) -> Any: ...

    def hooks(self, fwd: Any = ..., **kwargs: Any) -> Any: ...


# --------------------------------------------------------------------------- analysis forwards
def _attention_inputs(batch: Batch) -> dict[str, Any]:
    if "input_ids" not in batch:
        raise ValueError(f"a batch needs 'input_ids'; got keys {sorted(batch)}")
    return {"attention_mask": batch.get("attention_mask")}


def plain_forward(model: nn.Module, batch: Batch, head_mask: Tensor | None = None, **kwargs: Any):
    """model(input_ids, attention_mask, head_mask): decoders, biLMs."""
    return model(batch["input_ids"], head_mask=head_mask, **_attention_inputs(batch), **kwargs)


def segment_forward(model: nn.Module, batch: Batch, head_mask: Tensor | None = None, **kwargs: Any):
    """An encoder: also the batch's token_type_ids when it has them."""
    inputs = _attention_inputs(batch)
    if batch.get("token_type_ids") is not None:
        inputs["token_type_ids"] = batch["token_type_ids"]
    return model(batch["input_ids"], head_mask=head_mask, **inputs, **kwargs)


def permutation_forward(model: nn.Module, batch: Batch, head_mask: Tensor | None = None, **kwargs: Any):
    """XLNet: a permutation batch's perm_mask and target_mapping when given (the query stream at its
    targets), else the content stream alone."""
    inputs = _attention_inputs(batch)
    inputs.update({k: batch[k] for k in ("perm_mask", "target_mapping") if batch.get(k) is not None})
    return model(batch["input_ids"], head_mask=head_mask, **inputs, **kwargs)


def teacher_forced_forward(model: nn.Module, batch: Batch, head_mask: Tensor | None = None, **kwargs: Any):
    """An encoder-decoder, teacher-forced on the batch's decoder_input_ids; its (L_enc + 2 L_dec, H)
    head mask is split over encoder self-, decoder self- and cross-attention (`Seq2Seq.split_head_mask`)."""
    inputs = _attention_inputs(batch)
    if "decoder_input_ids" not in batch:
        raise ValueError(f"a seq2seq batch needs 'decoder_input_ids' (teacher forcing); got keys {sorted(batch)}")
    masks = {} if head_mask is None else model.split_head_mask(head_mask)
    return model(batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"],
                 decoder_attention_mask=batch.get("decoder_attention_mask"), **inputs, **masks, **kwargs)


# --------------------------------------------------------------------------- LM statistics
def _upcast(logits: Tensor) -> Tensor:
    """Half-precision logits are summed in float32; float32 / float64 are kept as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def masked_lm_logits(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """(logits (N, V), labels (N,)) of a masked LM at batch["labels"] != -100 (BERT convention:
    the original id at masked positions, -100 elsewhere)."""
    if "labels" not in batch:
        raise ValueError("masked-LM metrics need batch['labels'] (B, T) with -100 at unmasked positions")
    out = segment_forward(model, batch, head_mask, **kw)
    labels = batch["labels"]
    where = labels != IGNORE  # (B, T)
    return model.mlm_logits(out.last_hidden_state[where]), labels[where]  # (N, V), (N,)


def masked_lm_stat(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """Summed masked-LM cross-entropy and number of predicted tokens (an encoder)."""
    logits, labels = masked_lm_logits(model, batch, head_mask, **kw)
    return F.cross_entropy(_upcast(logits), labels, reduction="sum"), torch.tensor(labels.numel())


def causal_lm_stat(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """Summed next-token cross-entropy over real (non-pad, non -100) targets, and their number (a
    decoder). Targets are batch["labels"] if given (same shape as input_ids) else input_ids, shifted by one."""
    out = plain_forward(model, batch, head_mask, **kw)
    targets = batch.get("labels", batch["input_ids"])[:, 1:]  # (B, T-1)
    valid = targets != IGNORE
    if batch.get("attention_mask") is not None:
        valid = valid & batch["attention_mask"][:, 1:].bool()
    logits = out.logits[:, :-1][valid]  # (N, V)
    return F.cross_entropy(_upcast(logits), targets[valid], reduction="sum"), valid.sum()


def denoising_stat(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """Summed teacher-forced cross-entropy of an encoder-decoder over batch["labels"] (B, Td) (-100:
    none), the decoder reading batch["decoder_input_ids"] (the labels shifted right), and their number."""
    out = teacher_forced_forward(model, batch, head_mask, **kw)
    targets = batch["labels"]
    valid = targets != IGNORE
    return F.cross_entropy(_upcast(out.logits[valid]), targets[valid], reduction="sum"), valid.sum()


def permutation_lm_stat(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """XLNet's permutation-LM loss: summed cross-entropy of the query stream's logits (B, P, V) at the
    batch's targets (`target_mapping`, `perm_mask`) against batch["labels"] (B, P) (-100: none), and
    their number."""
    out = permutation_forward(model, batch, head_mask, **kw)
    valid = batch["labels"] != IGNORE
    return F.cross_entropy(_upcast(out.logits[valid]), batch["labels"][valid], reduction="sum"), valid.sum()


def bilm_stat(model: nn.Module, batch: Batch, head_mask: Tensor | None, **kw: Any) -> tuple[Tensor, Tensor]:
    """A biLM's loss (ELMo: the mean of the forward and backward next-token NLLs, `plmodels.elmo.bilm_loss`)
    summed over its predictions per direction, and their number. `bilm_loss` runs its own padded
    forward, so forward keywords (unpad) are not passed on: they change the speed, not the result."""
    r = bilm_loss(model, batch["input_ids"], batch.get("attention_mask"), head_mask=head_mask)
    return r.loss * r.n, torch.tensor(r.n)


# --------------------------------------------------------------------------- held-out logits
def _masked_eval_logits(model: nn.Module, batch: Any, select: Tensor) -> Tensor:
    return model.mlm_logits(model.masked_hidden(batch.input_ids, select))  # the last block at the targets only


def _causal_eval_logits(model: nn.Module, batch: Any, select: Tensor) -> Tensor:
    return model(batch.input_ids, attn_impl="sdpa").logits[select]


def _permutation_eval_logits(model: nn.Module, batch: Any, select: Tensor) -> Tensor:
    e = batch.extras  # the query stream at the targets (B, P, V)
    return model(batch.input_ids, attention_mask=e["attention_mask"], perm_mask=e["perm_mask"],
                 target_mapping=e["target_mapping"], attn_impl="sdpa").logits[select]


# --------------------------------------------------------------------------- sentence features
def pooled_features(out: Any, attention_mask: Tensor) -> Tensor:
    """[CLS]'s pooled vector (B, D) (BERT)."""
    return out.pooler_output


def last_token_features(out: Any, attention_mask: Tensor) -> Tensor:
    """The last real token's vector (B, D) (right padding), the one that has read the whole sequence."""
    last = attention_mask.sum(1) - 1
    h = out.last_hidden_state
    return h[torch.arange(len(h)), last]


def bilm_features(out: Any, attention_mask: Tensor, d_proj: int) -> Tensor:
    """[forward after the last token; backward after the first] (B, 2P) of a biLM."""
    last = attention_mask.sum(1) - 1
    h = out.last_hidden_state
    return torch.cat([h[torch.arange(len(h)), last, :d_proj], h[:, 0, d_proj:]], dim=-1)


def _per_layer(model: nn.Module) -> list[int]:
    return list(model.n_heads_per_layer)


def _one_stack(model: nn.Module) -> dict[str, nn.Module]:
    return {"": model}


def _encoder_and_decoder(model: nn.Module) -> dict[str, nn.Module]:
    """An encoder-decoder's two stacks: its uniform call (the encoder) and its decoder teacher-forced on
    the sentence itself (the probing analyses' `stack="decoder"`, model id suffix ";decoder")."""
    return {"": model, ";decoder": TeacherForcedDecoder(model)}


def _content_and_query(model: nn.Module) -> dict[str, nn.Module]:
    """XLNet's stacks: the content stream (its uniform call, the probed vectors) and the query stream,
    the one that predicts, read left to right as a causal LM (model id suffix ";query")."""
    return {"": model, ";query": XLNetQueryStream(model)}


def _bilm_and_directions(model: nn.Module) -> dict[str, nn.Module]:
    """A biLM's stacks: both directions' states concatenated (its uniform call, the probed vectors) and
    each direction read as a language model of its own (model id suffixes ";forward", ";backward")."""
    return {"": model, ";forward": BiLMDirection(model, "forward"), ";backward": BiLMDirection(model, "backward")}


# --------------------------------------------------------------------------- the registry
def _final_norm(model: nn.Module, h: Tensor) -> Tensor:
    """A pre-LN model's final LayerNorm (post-LN models have none: their blocks end normalised)."""
    norm = getattr(model, "final_norm", None)
    return h if norm is None else norm(h)


@dataclass(frozen=True)
class Family:
    """What differs per model family (module docstring); one record per checkpoint kind."""

    kind: str  # config.json's "kind", and `model.kind`
    model_class: type[nn.Module]  # the model (one file per architecture; docs/design.md's family table)
    config_class: type  # its frozen config dataclass
    paper: str  # where the architecture comes from
    default_objective: str | None  # objective "auto" (plmodels.training.objectives.OBJECTIVES)
    preset: Callable[[str], dict]  # preset name -> config fields without vocab_size
    tokenizer: Literal["wordpiece", "bpe"]  # trained for a run that names none
    segments: bool  # reads token_type_ids; has pad_token_id / type_vocab_size / use_nsp
    head_mask: bool  # forward takes an (L, H) head mask
    cross_attention: bool  # decoder-to-encoder attention
    lm_inputs: LMInputs  # the form of its LM batch
    lm_metric: str  # probes.pruning.METRICS name of its LM metric
    lm_name: str  # the LM metric in words
    lm_stat: BatchStat  # (model, batch, head_mask, **forward_kw) -> (summed loss, count)
    lm_logits: Callable[[nn.Module, Any, Tensor], Tensor] | None  # held-out logits at the targets
    forward_batch: Callable[..., Any]  # (model, batch, head_mask, **kw) -> output
    analysis_kwargs: Mapping[str, Any]  # extra keywords of a hidden-states forward
    sentence_features: Callable[[nn.Module, Any, Tensor], Tensor]  # (model, out, attention_mask) -> (B, D)
    summary_token: Literal["first", "last"]  # the token whose hidden state stands for a sequence ([CLS] / last real)
    heads_per_layer: Callable[[nn.Module], list[int]] = _per_layer  # rows of the head grid
    # a residual vector h (..., D) of any layer -> LM logits (..., V), as the last layer is read (the
    # logit and tuned lens, probes/lens.py); None: the family has no single head to read through
    residual_logits: Callable[[nn.Module, Tensor], Tensor] | None = None
    # the stacks whose layers the flow suite reads: model name suffix -> a model with the uniform
    # hidden-states forward (an encoder-decoder: its encoder, and its decoder teacher-forced)
    flow_stacks: Callable[[nn.Module], dict[str, nn.Module]] = _one_stack
    # a further stack's prediction form when it is not its own record's `lm_inputs`: suffix -> form
    # (workbench/analyses/flow.py's PREDICTION_VIEW; a biLM's backward LM predicts the previous token)
    flow_views: Mapping[str, str] = field(default_factory=dict)
    # the stacks whose "predict" items get an MI curve (the others' are read by the lens only: an
    # encoder-decoder's teacher-forced decoder, whose next token is a copy of its source)
    flow_predict_mi: tuple[str, ...] = ("",)


FAMILIES: dict[str, Family] = {f.kind: f for f in (
    Family("encoder", Encoder, EncoderConfig, "BERT (Devlin et al. 2019); RoBERTa, ALBERT, ELECTRA as flags",
           "mlm", encoder_preset, "wordpiece", segments=True, head_mask=True, cross_attention=False,
           lm_inputs="masked", lm_metric="mlm_loss", lm_name="masked-LM loss", lm_stat=masked_lm_stat,
           lm_logits=_masked_eval_logits, forward_batch=segment_forward, analysis_kwargs={},
           sentence_features=lambda m, out, mask: pooled_features(out, mask), summary_token="first",
           residual_logits=lambda m, h: m.mlm_logits(_final_norm(m, h))),
    Family("decoder", Decoder, DecoderConfig, "GPT-2 (Radford et al. 2019)",
           "clm", decoder_preset, "bpe", segments=False, head_mask=True, cross_attention=False,
           lm_inputs="causal", lm_metric="perplexity", lm_name="perplexity", lm_stat=causal_lm_stat,
           lm_logits=_causal_eval_logits, forward_batch=plain_forward, analysis_kwargs={"return_logits": False},
           sentence_features=lambda m, out, mask: last_token_features(out, mask), summary_token="last",
           residual_logits=lambda m, h: m.lm_logits(_final_norm(m, h))),
    Family("bilm", ElmoBiLM, ElmoConfig, "ELMo (Peters et al. 2018)",
           "bilm", bilm_preset, "wordpiece", segments=False, head_mask=False, cross_attention=False,
           lm_inputs="bidirectional", lm_metric="bilm_loss",
           lm_name="biLM loss (mean of the two directions' next-token NLLs)", lm_stat=bilm_stat,
           lm_logits=None, forward_batch=plain_forward, analysis_kwargs={},
           sentence_features=lambda m, out, mask: bilm_features(out, mask, m.config.d_proj), summary_token="last",
           flow_stacks=_bilm_and_directions, flow_views={";backward": "previous"},
           flow_predict_mi=("", ";forward", ";backward")),
    Family("tbilm", TransformerBiLM, TransformerBiLMConfig, "ELMo's transformer control (two causal decoders)",
           "tbilm", tbilm_preset, "wordpiece", segments=False, head_mask=True, cross_attention=False,
           lm_inputs="bidirectional", lm_metric="bilm_loss",
           lm_name="biLM loss (mean of the two directions' next-token NLLs)", lm_stat=bilm_stat,
           lm_logits=None, forward_batch=plain_forward, analysis_kwargs={},
           sentence_features=lambda m, out, mask: bilm_features(out, mask, m.config.d_proj), summary_token="last",
           flow_stacks=_bilm_and_directions, flow_views={";backward": "previous"},
           flow_predict_mi=("", ";forward", ";backward")),
    Family("seq2seq", Seq2Seq, Seq2SeqConfig, "T5 (Raffel et al. 2020), BART (Lewis et al. 2020) as flags",
           None, seq2seq_preset, "wordpiece", segments=False, head_mask=True, cross_attention=True,
           lm_inputs="denoising", lm_metric="denoising_loss", lm_name="denoising loss, teacher-forced",
           lm_stat=denoising_stat, lm_logits=None, forward_batch=teacher_forced_forward, analysis_kwargs={},
           sentence_features=lambda m, out, mask: last_token_features(out, mask), summary_token="last",
           heads_per_layer=lambda m: list(m.all_heads_per_layer), flow_stacks=_encoder_and_decoder),
    Family("xlnet", XLNet, XLNetConfig, "XLNet (Yang et al. 2019)",
           "plm", xlnet_preset, "wordpiece", segments=False, head_mask=True, cross_attention=False,
           lm_inputs="permutation", lm_metric="plm_loss", lm_name="permutation-LM loss (fixed orders)",
           lm_stat=permutation_lm_stat, lm_logits=_permutation_eval_logits, forward_batch=permutation_forward,
           analysis_kwargs={"return_logits": False},
           sentence_features=lambda m, out, mask: last_token_features(out, mask), summary_token="last",
           flow_stacks=_content_and_query, flow_predict_mi=("", ";query")),
)}
KINDS: tuple[str, ...] = tuple(FAMILIES)
ModelKind = Literal[KINDS]  # type: ignore[valid-type]  # the kinds, for configs' type hints


def family(kind: str) -> Family:
    """The record of `kind`; an unknown kind is a ValueError naming the known ones."""
    if kind not in FAMILIES:
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[kind]


def family_of(model: nn.Module) -> Family:
    """The record of a model object (its `kind`)."""
    kind = getattr(model, "kind", None)
    if kind is None:
        raise ValueError(f"{type(model).__name__} has no `kind`: not a plmodels model (families: {sorted(FAMILIES)})")
    return family(kind)


def preset(kind: str, name: str) -> dict:
    """The model-config fields (no vocab_size) of preset `name` for `kind`."""
    return family(kind).preset(name)
