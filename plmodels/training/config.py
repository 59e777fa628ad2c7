"""The pretraining config: `PretrainConfig` and the files it is read from (a JSON file, or a shipped
recipe by name: plmodels/recipes/pretrain/*.json).

A run depends on one `PretrainConfig` and nothing else (STYLE.md, "a run is one config file with no
hidden defaults"). It is typed (`plmodels.config`): unknown keys and wrong types are errors naming the
file and the field. `load_config` takes an object, a JSON path or a recipe name; a file may name
another in `"extends"` (`read_config_file`), and overrides are merged into the nested dicts key by
key (`merge_overrides`). Corpus paths are resolved against `data_dir` (`resolve_path`), and
`config_diff` lists what differs between two resolved configs (resumption refuses a different one,
except in `RESUME_SAFE_KEYS`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from plmodels import recipes
from plmodels.config import Config, merge, read_json_object
from plmodels.electra import ElectraConfig
from plmodels.paths import data_root
from plmodels.families import FAMILIES, ModelKind
from plmodels.families import preset as preset_fields

from .distil import DistilConfig
from .masking import MaskingConfig
from .schedule import SCHEDULES
from .spans import SpanConfig


@dataclass(frozen=True)
class T5Args(Config):
    """T5's span corruption (`objective_args` of objective "t5"; training/denoising.py)."""

    noise_density: float = 0.15  # share of a row's tokens in noise spans
    mean_span_length: float = 3.0  # mean noise-span length in tokens
    n_sentinels: int = 100  # <extra_id_i> tokens appended to the run's tokenizer (T5's extra_ids)

    def __post_init__(self) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(f"T5Args.noise_density must be in (0, 1), got {self.noise_density}")
        if not self.mean_span_length >= 1.0:
            raise ValueError(f"T5Args.mean_span_length must be >= 1, got {self.mean_span_length}")
        if self.n_sentinels < 1:
            raise ValueError(f"T5Args.n_sentinels must be >= 1, got {self.n_sentinels}")


@dataclass(frozen=True)
class BartArgs(Config):
    """BART's text infilling (`objective_args` of objective "bart"; training/denoising.py)."""

    mask_ratio: float = 0.3  # share of a row's words in masked spans
    poisson_lambda: float = 3.0  # mean span length in words (Poisson; zero-length spans insert a [MASK])
    random_ratio: float = 0.1  # share of the spans replaced by a random token instead of [MASK]
    permute_sentences: bool = False  # also shuffle the sentences of a row (BART's final recipe does)
    whole_word: bool = True  # spans of whole words (fairseq's span-poisson masking); False: of tokens

    def __post_init__(self) -> None:
        for name in ("mask_ratio", "random_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"BartArgs.{name} must be in [0, 1], got {getattr(self, name)}")
        if not self.poisson_lambda > 0:
            raise ValueError(f"BartArgs.poisson_lambda must be > 0, got {self.poisson_lambda}")


@dataclass(frozen=True)
class PLMArgs(Config):
    """XLNet's permutation language modelling (`objective_args` of objective "plm"; training/plm.py).

    partial_k = K of partial prediction (Yang et al. 2019, Sec. 2.3): a row predicts the last
    1/K of its factorisation order (n_tokens // K targets, [CLS] and [SEP] never among them). The
    default 6 is the paper's XLNet-Large value (its scripts' num_predict=85 at seq_len 512), 7 the
    one its Base ablation also tried; 6 puts more targets in a row (21 of a 128-token row's 126
    words against 18), so more signal per step where steps are what a CPU run lacks."""

    partial_k: int = 6  # predict the last 1/K of each row's factorisation order

    def __post_init__(self) -> None:
        if isinstance(self.partial_k, bool) or not isinstance(self.partial_k, int) or self.partial_k < 1:
            raise ValueError(f"PLMArgs.partial_k must be an int >= 1, got {self.partial_k!r}")


# objective -> (the model kind it trains, the class of its objective_args or None); objectives.py
# holds what each one computes
OBJECTIVE_FIELDS: dict[str, tuple[str, type | None]] = {
    "mlm": ("encoder", None), "clm": ("decoder", None), "span": ("encoder", SpanConfig),
    "electra": ("encoder", ElectraConfig), "distil": ("encoder", DistilConfig), "bilm": ("bilm", None),
    "tbilm": ("tbilm", None), "t5": ("seq2seq", T5Args), "bart": ("seq2seq", BartArgs),
    "plm": ("xlnet", PLMArgs),
}
# the objective names a config may give, for its type hint: "auto" and OBJECTIVE_FIELDS' keys
ObjectiveName = Literal[("auto", *OBJECTIVE_FIELDS)]  # type: ignore[valid-type]
# objective "auto" per kind, read off the family records; None: the kind has several and the config must name one
AUTO_OBJECTIVE: dict[str, str | None] = {kind: f.default_objective for kind, f in FAMILIES.items()}
# the objectives whose step `compile: true` compiles (loop.CompiledStep): those whose loss calls the
# trained model itself (its forward; an encoder's hidden_at), with batches of one shape per row length
# in a compiled run (Objective.static_shapes). The others are refused: SpanBERT's and ELECTRA's
# losses call models held inside a module of their own, which CompiledStep does not reach, and
# DistilBERT's and the biLMs' steps have not been tried compiled.
COMPILED_OBJECTIVES = ("mlm", "clm", "t5", "bart", "plm")

# Keys that may change when a run resumes: they change neither the data, the model nor the updates.
RESUME_SAFE_KEYS = {"max_minutes", "log_every", "num_threads", "name", "compile"}


@dataclass(frozen=True)
class PretrainConfig(Config):
    """Everything a pretraining run depends on; no hidden defaults are read from elsewhere."""

    kind: ModelKind                               # a plmodels.families.FAMILIES key: masked LM (BERT), causal LM
                                                  # (GPT-2), ELMo's biLSTM LM, its transformer control,
                                                  # an encoder-decoder (T5 / BART), or XLNet
    train_source: str                             # corpus folder or file (corpus.py), relative to data_dir
    objective: ObjectiveName = "auto"
                                                  # what a step trains (objectives.py): auto = mlm for an
                                                  # encoder, clm for a decoder, bilm / tbilm for those
                                                  # kinds, plm for xlnet (a seq2seq must name t5 or
                                                  # bart); span = SpanBERT, electra = ELECTRA, distil =
                                                  # DistilBERT, t5 = span corruption, bart = text
                                                  # infilling, plm = XLNet's permutation LM
    objective_args: dict = field(default_factory=dict)  # the objective's own fields (objectives.py)
    train_split: str | None = "train"             # its split (None: the format's first)
    eval_source: str | None = None                # held-out corpus for the eval loss (None: no eval)
    eval_split: str | None = "valid"
    extra_eval: dict = field(default_factory=dict)  # name -> [source, split]: extra perplexity corpora
    data_dir: str = "${WORKBENCH_DATA}"           # base of relative paths (env var, else ../shared/data)
    name: str = ""                                # free text, for the card
    preset: str = "mini"                          # tiny | mini | small | base (plmodels.presets)
    model: dict = field(default_factory=dict)     # overrides of the preset's model-config fields
    tokenizer_path: str | None = None             # reuse a saved tokenizer folder instead of training
                                                  # (a relative path is taken from the current directory,
                                                  # like --out: tokenizers are run outputs, not data)
    vocab_size: int = 16000                       # tokenizer vocabulary when trained
    tokenizer_sample_chars: int = 5_000_000       # characters sampled from the train split to train it
    lowercase: bool = False                       # WordPiece lowercasing
    max_train_texts: int | None = None            # cap on training documents read (None: all)
    seq_len: int = 128                            # tokens per packed row
    short_seq_len: int | None = None              # "short first": rows of this length for the first
    short_frac: float = 0.0                       # short_frac of the schedule (steps, or time on the clock),
                                                  # batch_size * seq_len / short_seq_len rows a step (the same
                                                  # tokens per step); then seq_len (Devlin et al. 2019, A.2:
                                                  # 128 for 90% of the steps, then 512)
    eval_seq_len: int | None = None               # held-out row length (None: seq_len); fix it to compare
                                                  # runs trained at different lengths on the same targets
    batch_size: int = 32                          # rows per micro-batch (per process)
    grad_accum: int = 1                           # micro-batches per optimizer step
    lr: float = 5e-4                              # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)      # AdamW betas (RoBERTa)
    eps: float = 1e-6                             # AdamW epsilon
    weight_decay: float = 0.01
    warmup_steps: int = 100
    schedule: str = "linear"                      # linear | cosine | constant | onecycle | wsd
    min_lr_ratio: float = 0.0                     # floor of the decay as a share of lr
    decay_frac: float = 0.2                       # "wsd": share of the post-warmup steps spent decaying
    clip: float = 1.0                             # max global grad norm (0 = off)
    max_steps: int = 1000                         # optimizer steps; also the schedule's length
    max_minutes: float | None = None              # wall-clock training budget (whichever comes first)
    schedule_clock: str = "steps"                 # "steps" | "time": lr schedule over max_steps, or over
                                                  # max_minutes too (ends with the budget; not replayable)
    eval_every: int = 200                         # steps between evaluations (0 = only at the end)
    eval_sequences: int = 256                     # held-out rows evaluated (fixed rows, fixed mask)
    log_every: int = 10                           # steps between progress lines on stderr
    ckpt_every: int = 0                           # checkpoint every N steps (0 = off)
    ckpt_log_spaced: bool = True                  # also checkpoint at steps 1, 2, 4, 8, ... (2^k)
    bf16: str = "auto"                            # "auto" | "on" | "off": autocast to bfloat16
    seed: int = 0
    num_threads: int | None = None                # torch.set_num_threads (None: leave as is)
    compile: bool = False                         # torch.compile what the train step runs (CompiledStep)
    masking: dict = field(default_factory=dict)   # MaskingConfig fields (encoder only)
    eval_masking: dict = field(default_factory=dict)  # MaskingConfig fields of the held-out mask (encoder);
                                                  # empty = BERT's 15% 80/10/10, whatever `masking` is

    def __post_init__(self) -> None:
        if self.kind not in AUTO_OBJECTIVE:
            raise ValueError(f"kind must be one of {sorted(AUTO_OBJECTIVE)}, got {self.kind!r}")
        if not self.train_source:
            raise ValueError("train_source must name a corpus folder or file")
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "log_every", "vocab_size", "tokenizer_sample_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "eval_sequences"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_seq_len is not None and self.eval_seq_len < 1:
            raise ValueError(f"eval_seq_len must be >= 1 or null, got {self.eval_seq_len}")
        if (self.short_seq_len is None) != (self.short_frac == 0.0):
            raise ValueError(f"short_seq_len and short_frac go together (a length and a share of the schedule), "
                             f"got short_seq_len={self.short_seq_len}, short_frac={self.short_frac}")
        if self.short_seq_len is not None:
            if not 0.0 < self.short_frac < 1.0:
                raise ValueError(f"short_frac must be in (0, 1), got {self.short_frac}")
            if not 1 <= self.short_seq_len < self.seq_len:
                raise ValueError(f"short_seq_len must be in [1, seq_len={self.seq_len}), got {self.short_seq_len}")
            if (self.batch_size * self.seq_len) % self.short_seq_len:
                raise ValueError(f"short_seq_len={self.short_seq_len} must divide batch_size * seq_len = "
                                 f"{self.batch_size * self.seq_len}, so that a short step reads the same tokens")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {self.schedule!r}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"decay_frac must be in (0, 1], got {self.decay_frac}")
        if self.bf16 not in ("auto", "on", "off"):
            raise ValueError(f"bf16 must be 'auto', 'on' or 'off', got {self.bf16!r}")
        if self.lr <= 0 or self.clip < 0 or self.weight_decay < 0:
            raise ValueError(f"need lr > 0, clip >= 0, weight_decay >= 0; got {self.lr}, {self.clip}, {self.weight_decay}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or null, got {self.max_minutes}")
        if self.schedule_clock not in ("steps", "time"):
            raise ValueError(f"schedule_clock must be 'steps' or 'time', got {self.schedule_clock!r}")
        if self.schedule_clock == "time" and self.max_minutes is None:
            raise ValueError("schedule_clock 'time' needs max_minutes (the budget the schedule spans)")
        preset_fields(self.kind, self.preset)  # checks the preset name
        MaskingConfig.from_dict(self.masking, "masking")  # checks the masking keys and types
        em = MaskingConfig.from_dict(self.eval_masking, "eval_masking")
        if em.nsp or em.sop or em.rate_final is not None:
            raise ValueError("eval_masking.nsp and .sop must be false and eval_masking.rate_final null (the "
                             "held-out mask is fixed and has no sentence pairs)")
        name = self.objective if self.objective != "auto" else AUTO_OBJECTIVE[self.kind]
        if name is None:
            raise ValueError(f"objective 'auto' has no default for kind {self.kind!r}: set objective to 't5' "
                             "(T5's span corruption) or 'bart' (BART's text infilling)")
        kind, args = OBJECTIVE_FIELDS[name]
        if self.kind != kind:
            raise ValueError(f"objective {name!r} trains an {kind}, not a {self.kind}")
        if args is None and self.objective_args:
            raise ValueError(f"objective {name!r} takes no objective_args, got {sorted(self.objective_args)}")
        if args is not None:
            args.from_dict(self.objective_args, f"objective_args ({name})")
        if self.compile and name not in COMPILED_OBJECTIVES:
            raise ValueError(f"compile: true covers the objectives {list(COMPILED_OBJECTIVES)}, not {name!r}")

    @property
    def heldout_len(self) -> int:
        """Tokens per held-out row: eval_seq_len, else seq_len."""
        return self.eval_seq_len or self.seq_len

    @property
    def masking_config(self) -> MaskingConfig:
        return MaskingConfig.from_dict(self.masking, "masking")


def merge_overrides(d: dict, overrides: dict | None) -> dict:
    """`d` updated by `overrides`; the nested dicts ("model", "masking", "eval_masking",
    "extra_eval", "objective_args") are merged key by key (`plmodels.config.merge`)."""
    return merge(d, overrides)


def config_path(config: str | Path, relative_to: Path | None = None) -> Path:
    """The file of a pretraining config: a path (relative to `relative_to` when given, else to the
    working directory) or the name of a shipped recipe (plmodels/recipes/pretrain/)."""
    return recipes.find("pretrain", config, relative_to)


def read_config_file(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """A pretraining config file as a dict. A file with `"extends": BASE` is BASE's dict updated by
    the file's own keys as `merge_overrides` updates (the nested dicts merged key by key); BASE is a
    path relative to the file's folder or a recipe name, and may extend another."""
    path = Path(path)
    chain = _chain + (path.resolve(),)
    if chain[-1] in _chain:
        raise ValueError("config 'extends' cycle: " + " -> ".join(str(p) for p in chain))
    d = read_json_object(path)
    base = d.pop("extends", None)
    if base is None:
        return d
    if not isinstance(base, str):
        raise ValueError(f"{path}: 'extends' must name a config file or config, got {base!r}")
    try:
        base_path = config_path(base, relative_to=path.parent)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path}: 'extends': {e}") from None
    return merge_overrides(read_config_file(base_path, chain), d)


def load_config(config: "PretrainConfig | str | Path", overrides: dict | None = None) -> PretrainConfig:
    """A PretrainConfig from an object, a JSON path or a recipe name, with overrides (a file may
    extend another: `read_config_file`)."""
    if isinstance(config, PretrainConfig):
        return (PretrainConfig.from_dict(merge_overrides(config.to_dict(), overrides), "overrides", overrides)
                if overrides else config)
    path = config_path(config)
    return PretrainConfig.from_dict(merge_overrides(read_config_file(path), overrides), source=str(path),
                                    overrides=overrides)


def resolve_path(p: str, data_dir: str) -> Path:
    """`p` if absolute, else under `data_dir` (where "${WORKBENCH_DATA}" is `plmodels.paths.data_root()`:
    the env var, else ../shared/data)."""
    if os.path.isabs(p):
        return Path(p)
    if "${WORKBENCH_DATA}" in data_dir:
        data_dir = data_dir.replace("${WORKBENCH_DATA}", str(data_root()))
    return Path(data_dir).expanduser() / p


def config_diff(a: dict, b: dict) -> list[str]:
    """Sorted keys whose values differ between two config dicts (nested dicts as "model.x")."""
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += [f"{k}.{s}" for s in config_diff(va, vb)]
        elif va != vb:
            keys.append(k)
    return keys
