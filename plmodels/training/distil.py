"""DistilBERT's pieces (Sanh et al. 2019, "DistilBERT, a distilled version of BERT"): a student
initialised from every other teacher layer, and the triple loss

    loss = alpha_ce * KD + alpha_mlm * MLM + alpha_cos * COS

KD is the soft-target term at temperature T, KL(p_t || p_s) * T^2 with p = softmax(logits / T),
averaged over the positions it is taken on; MLM is the student's own masked-LM cross-entropy on
the labels; COS is 1 - cos(h_s, h_t) between the last hidden states, averaged over real tokens.
Follows the reference code (huggingface/transformers, examples/research_projects/distillation:
distiller.py for the losses, scripts/extract_distilbert.py for the initialisation, README.md for
the weights 5 / 2 / 1 and train.py for T = 2); where this file differs it says so.

| function                  | job                                                                 |
|---------------------------|---------------------------------------------------------------------|
| `student_from_teacher`    | ceil(L / every) blocks copied from teacher blocks 0, every, 2 every, ... |
| `kd_loss`                 | KL(p_t || p_s) T^2 over (N, V) logits                               |
| `hidden_cosine_loss`      | mean 1 - cos over the real tokens of (B, T, D) hidden states         |
| `DistilConfig`            | teacher path, temperature, the three weights, `every`               |
| `load_teacher`            | a frozen encoder (eval, no grad) from a checkpoint folder           |
| `check_teacher`           | refuses alpha_ce > 0 when the teacher's MLM head was never trained   |
| `distil_loss`             | the triple loss of one batch, and its parts                         |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from plmodels.checkpoint import load, read_card
from plmodels.families import family_of
from plmodels.config import Config
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer

from .masking import MaskedSlots, masked_slots

IGNORE = -100  # label of a position without an MLM target (as loss.py and HF)


def student_from_teacher(teacher: Encoder, every: int = 2) -> Encoder:
    """A DistilBERT-style student of teacher: ceil(L / every) blocks, block i a copy of teacher
    block i * every (L = 12, every = 2: blocks 0, 2, 4, 6, 8, 10; L = 5: 0, 2, 4).

    Copied: the embeddings (word, positions, their LayerNorm and E -> D projection if any), the
    chosen blocks (attention, MLP, both LayerNorms), a pre-LN teacher's final LayerNorm and the MLM
    head. Dropped as DistilBERT does: the NSP head (use_nsp=False) and the pooler, which stays at a
    fresh init (our Encoder always has one; DistilBERT has none); also an ELECTRA RTD head. Segment
    embeddings are dropped with learned positions (type_vocab_size=0) and the function kept: the
    teacher's segment-0 row is added to every row of the student's position table, so
    word + pos + seg0 == word + (pos + seg0), and on single-segment input (no token_type_ids) the
    student's embedding output equals the teacher's (up to the rounding of the regrouped sum).
    With RoPE / ALiBi there is no table to fold it into, so the segment table is kept as it is.
    Pruned teacher heads are carried: student block i keeps teacher block i * every's heads.

    Differs from extract_distilbert.py, which takes teacher layers [0, 2, 4, 7, 9, 11] (every
    other one, then a step of 3 to end on the last layer), drops the segment table without folding
    it (so its student's embeddings differ from BERT's by the segment-0 row) and copies the MLM
    transform only with --vocab_transform. The student is returned in train mode, on the device
    and in the dtype of the teacher's word embeddings.
    """
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"student_from_teacher: every must be an int >= 1, got {every!r}")
    tc: EncoderConfig = teacher.config
    chosen = list(range(0, tc.n_layers, every))  # teacher block of student block i
    fold = tc.position == "learned" and tc.type_vocab_size > 0
    fields = {
        **tc.to_dict(),
        "n_layers": len(chosen),
        "type_vocab_size": 0 if tc.position == "learned" else tc.type_vocab_size,
        "use_nsp": False,
        "use_rtd": False,
        "pruned_heads": {i: list(tc.pruned_heads[t]) for i, t in enumerate(chosen) if tc.pruned_heads.get(t)},
    }
    weight = teacher.embeddings.word.weight
    # in the teacher's dtype before the copy, so no weight is rounded through another precision
    student = Encoder(EncoderConfig.from_dict(fields, "student_from_teacher")).to(device=weight.device, dtype=weight.dtype)
    source = teacher.state_dict()
    state = {}
    for name, tensor in student.state_dict().items():
        if name.startswith("pooler."):
            state[name] = tensor  # dropped, as DistilBERT: keeps the fresh init
            continue
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            key = f"blocks.{chosen[int(i)]}.{rest}"
        else:
            key = name
        value = source[key].detach()
        if name == "embeddings.position.weight" and fold:
            value = value + source["embeddings.segment.weight"][0].detach()  # (rows, E) + (E,)
        state[name] = value.clone()
    student.load_state_dict(state, strict=True)
    return student.train()


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
            weights: torch.Tensor | None = None) -> torch.Tensor:
    """Soft-target distillation loss of (N, V) logits, a scalar:

        T^2 / N * sum_n KL(p_t,n || p_s,n),  p = softmax(logits / T)

    as the reference's KLDivLoss(reduction="batchmean") on log_softmax(s / T), softmax(t / T),
    times T^2 (Hinton et al. 2015: keeps the gradient's scale independent of T). It is the soft
    cross-entropy -sum p_t log p_s minus the teacher's entropy, a constant of the student, so the
    gradients agree; KL is 0 and minimal when the logits are equal. Computed in float32; N = 0
    gives 0. The teacher's side carries no gradient. `weights` (N,) 0/1 keeps some rows only:
    T^2 sum_n w_n KL_n / sum_n w_n (0 when no row is kept), the batchmean over the kept rows, with
    shapes that do not depend on how many there are (no selection, nothing read back to the host)."""
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        shapes = f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        raise ValueError(f"kd_loss: logits must both be (N, V), got {shapes}")
    if not temperature > 0:
        raise ValueError(f"kd_loss: temperature must be > 0, got {temperature}")
    if student_logits.shape[0] == 0:
        return student_logits.sum().float() * 0.0  # keeps the graph; batchmean would divide by 0
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, V)
    log_t = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)  # (N, V)
    if weights is None:
        return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature**2
    kl = F.kl_div(log_s, log_t, reduction="none", log_target=True).sum(-1)  # (N,)
    w = weights.float()
    return (kl * w).sum() / w.sum().clamp_min(1.0) * temperature**2


def hidden_cosine_loss(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """mean over real tokens of 1 - cos(h_s, h_t) for (B, T, D) hidden states, a scalar: the
    reference's CosineEmbeddingLoss(reduction="mean") with target 1 on the rows attention_mask
    (B, T) keeps (None: every token). No real token gives 0. Every row is computed and the padding
    rows weigh 0 (no selection by the mask, nothing read back to the host)."""
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(f"hidden_cosine_loss: shapes differ, {tuple(student_hidden.shape)} vs {tuple(teacher_hidden.shape)}")
    s, t = student_hidden.flatten(0, -2), teacher_hidden.flatten(0, -2)  # (B T, D)
    if s.shape[0] == 0:
        return student_hidden.sum() * 0.0
    target = s.new_ones(s.shape[0])  # (B T,): "these pairs should be similar"
    if attention_mask is None:
        return F.cosine_embedding_loss(s, t.detach(), target, reduction="mean")
    keep = attention_mask.flatten().to(s.dtype)  # (B T,)
    # zero the padding's rows first: a padding state may be anything (inf, NaN), and 0 * NaN is NaN
    rows = F.cosine_embedding_loss(s * keep[:, None], t.detach() * keep[:, None], target, reduction="none")
    return (rows * keep).sum() / keep.sum().clamp_min(1.0)


@dataclass(frozen=True)
class DistilConfig(Config):
    """The distillation settings; the defaults are DistilBERT's (README.md's command, train.py's T)."""

    teacher: str                      # checkpoint folder of the teacher encoder (plmodels.checkpoint)
    temperature: float = 2.0          # softmax temperature T of the KD term (train.py default)
    alpha_ce: float = 5.0             # weight of the KD term (README: --alpha_ce 5.0)
    alpha_mlm: float = 2.0            # weight of the student's MLM loss (README: --alpha_mlm 2.0)
    alpha_cos: float = 1.0            # weight of the hidden-state cosine loss (README: --alpha_cos 1.0)
    every: int = 2                    # student block i starts as teacher block i * every
    # KD on the masked positions only (the reference's --restrict_ce_to_mask); off, as in the
    # README's DistilBERT command: KD over every real token
    restrict_ce_to_mask: bool = False

    def __post_init__(self) -> None:
        if not self.teacher:
            raise ValueError("DistilConfig.teacher must name a checkpoint folder of an encoder "
                             "(--set objective_args.teacher=PATH)")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"DistilConfig.temperature must be a finite number > 0, got {self.temperature}")
        for name in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"DistilConfig.{name} must be a finite number >= 0, got {value}")
        if self.alpha_ce + self.alpha_mlm + self.alpha_cos <= 0:
            raise ValueError("DistilConfig: alpha_ce, alpha_mlm and alpha_cos are all 0; nothing to train")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"DistilConfig.every must be an int >= 1, got {self.every!r}")


def load_teacher(path: str | Path) -> tuple[Encoder, Tokenizer | None]:
    """(teacher encoder in eval mode with requires_grad False, its tokenizer or None) from a
    checkpoint folder; a decoder is refused."""
    model, tokenizer = load(path)
    if family_of(model).lm_inputs != "masked":
        raise ValueError(f"{path}: the teacher must be an encoder (masked LM), this checkpoint is a {model.kind}")
    model.eval().requires_grad_(False)
    return model, tokenizer


def check_teacher(folder: str | Path, cfg: DistilConfig) -> None:
    """ValueError when cfg.alpha_ce > 0 and the teacher in `folder` has no trained MLM head."""
    if cfg.alpha_ce > 0 and not read_card(folder).lm_head_trained:
        raise ValueError(
            f"teacher {folder}: its card says the MLM head is untrained (not in the imported weights, or an "
            f"ELECTRA discriminator's), so its MLM logits are random and the KD term (alpha_ce={cfg.alpha_ce}) would distil noise; "
            f"set alpha_ce=0 (alpha_mlm and alpha_cos still work with this teacher)"
        )


def distil_loss(
    student: Encoder,
    teacher: Encoder,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cfg: DistilConfig,
    slots: MaskedSlots | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The triple loss of one masked batch -> (loss, parts).

    input_ids, labels, attention_mask: (B, T); labels are IGNORE (-100) off the masked positions.
    The teacher runs under no_grad, both without token_type_ids (single segment). KD is taken on
    the masked positions (cfg.restrict_ce_to_mask) or on every real token, MLM on the masked
    positions, COS on the last hidden states at real tokens. parts holds the detached terms that
    were computed (those with a weight > 0: "kd", "mlm", "cos"), and "loss".

    The masked positions are gathered through `slots` (masking.MaskedSlots, the trainer's batch
    carries them; None: the labels' own, read on the host here), padding slots and padding tokens
    weighing 0: every shape is set by the batch's and the slots' sizes, and nothing is read back
    to the host."""
    if not (input_ids.shape == labels.shape and (attention_mask is None or attention_mask.shape == input_ids.shape)):
        raise ValueError("distil_loss: input_ids, labels and attention_mask must all be (B, T)")
    if slots is None:
        slots = masked_slots(labels)
    s_out = student(input_ids, attention_mask=attention_mask)
    with torch.no_grad():
        t_out = teacher(input_ids, attention_mask=attention_mask)
    s_last, t_last = s_out.last_hidden_state.flatten(0, 1), t_out.last_hidden_state.flatten(0, 1)  # (B T, D)
    labelled = slots.targets != IGNORE  # (M,): a padding slot is not
    real = None if attention_mask is None else attention_mask.flatten()  # (B T,)
    terms: dict[str, torch.Tensor] = {}
    kd_masked = cfg.alpha_ce > 0 and cfg.restrict_ce_to_mask
    at_slots = kd_masked or cfg.alpha_mlm > 0
    s_masked = student.mlm_logits(s_last.index_select(0, slots.positions)) if at_slots else None  # (M, V)
    if cfg.alpha_ce > 0:
        with torch.no_grad():
            t_rows = t_last.index_select(0, slots.positions) if kd_masked else t_last  # (M | B T, D)
            t_logits = teacher.mlm_logits(t_rows)
        s_logits = s_masked if kd_masked else student.mlm_logits(s_last)  # (M | B T, V)
        terms["kd"] = kd_loss(s_logits, t_logits, cfg.temperature, labelled if kd_masked else real)
    if cfg.alpha_mlm > 0:
        mlm = F.cross_entropy(s_masked.float(), slots.targets, ignore_index=IGNORE, reduction="sum")
        terms["mlm"] = mlm / slots.count.clamp_min(1.0)
    if cfg.alpha_cos > 0:
        terms["cos"] = hidden_cosine_loss(s_out.last_hidden_state, t_out.last_hidden_state, attention_mask)
    weights = {"kd": cfg.alpha_ce, "mlm": cfg.alpha_mlm, "cos": cfg.alpha_cos}
    loss = sum(weights[name] * value for name, value in terms.items())
    parts = {name: value.detach() for name, value in terms.items()}
    parts["loss"] = loss.detach()
    return loss, parts
