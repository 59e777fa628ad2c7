"""Import any supported Hugging Face checkpoint folder: `import_hf` reads `model_type` from its
config.json and hands the folder to that family's importer. Each importer reads the weights
(safetensors, or pytorch_model.bin through weights_only only; sharded or not) and the tokenizer from the folder's
own files, never from a hub, and never needs transformers.

| model_type | our class | importer |
|---|---|---|
| bert | Encoder | `plmodels.hf.bert.import_hf_bert` |
| roberta | Encoder (`position_ids="roberta"`, one token type) | `plmodels.hf.encoders.import_hf_roberta` |
| xlm-roberta | Encoder, as RoBERTa; SentencePiece Unigram tokenizer | `plmodels.hf.encoders.import_hf_xlm_roberta` |
| distilbert | Encoder (no token types) | `plmodels.hf.encoders.import_hf_distilbert` |
| electra | Encoder (`embedding_size` E projected to D; discriminator: `use_rtd`) | `plmodels.hf.encoders.import_hf_electra` |
| albert | Encoder (`share_layers="all"`, `embedding_size`; sentence-order head: `use_nsp`) | `plmodels.hf.encoders.import_hf_albert` |
| gpt2 | Decoder | `plmodels.hf.gpt2.import_hf_gpt2` |
| gpt_neox | Decoder (RoPE on `rotary_dims` channels, `parallel_residual`, untied head) | `plmodels.hf.gpt_neox.import_hf_gpt_neox` |
| t5 | Seq2Seq (relative position buckets, RMS norms) | `plmodels.hf.seq2seq.import_hf_t5` |
| bart | Seq2Seq (learned positions, post-LN) | `plmodels.hf.seq2seq.import_hf_bart` |
| xlnet | XLNet (two-stream relative attention) | `plmodels.hf.xlnet.import_hf_xlnet` |

Every importer reads sharded checkpoints too (`common.read_hf_weights`), and the SentencePiece
tokenizers of ALBERT, T5, XLNet and XLM-R from tokenizer.json as transformers 5 rebuilds them
(`Tokenizer.from_hf_folder`; docs/interop.md).

`import_hf` also writes the checkpoint's provenance into its card (`provenance`): the source folder,
the sha256 of its config.json and of its weight files, and the seed and step the caller says the
folder is (an imported suite of the zoo, workbench/zoo.py, passes the ones its folder pattern names).
Pythia's issue tracker records served checkpoints whose weights were not those of their step: the
hashes let a user check what was analysed against what the suite publishes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from ..checkpoint import file_sha256
from .encoders import (import_hf_albert, import_hf_distilbert, import_hf_electra, import_hf_roberta,
                          import_hf_xlm_roberta)
from .gpt2 import import_hf_gpt2
from .gpt_neox import import_hf_gpt_neox
from .bert import import_hf_bert
from .common import weight_files
from .seq2seq import import_hf_bart, import_hf_t5
from .xlnet import import_hf_xlnet

IMPORTERS: dict[str, Callable] = {
    "bert": import_hf_bert, "roberta": import_hf_roberta, "xlm-roberta": import_hf_xlm_roberta,
    "distilbert": import_hf_distilbert,
    "electra": import_hf_electra, "albert": import_hf_albert, "gpt2": import_hf_gpt2, "gpt_neox": import_hf_gpt_neox,
    "t5": import_hf_t5, "bart": import_hf_bart, "xlnet": import_hf_xlnet,
}
# model_type -> the kind of our model its importer builds (plmodels/families.py), known before importing
HF_KINDS: dict[str, str] = {
    "bert": "encoder", "roberta": "encoder", "xlm-roberta": "encoder", "distilbert": "encoder", "electra": "encoder",
    "albert": "encoder", "gpt2": "decoder", "gpt_neox": "decoder", "t5": "seq2seq", "bart": "seq2seq",
    "xlnet": "xlnet",
}


def model_type(src: str | Path) -> str:
    """`model_type` of a Hugging Face folder's config.json; FileNotFoundError / ValueError naming the file."""
    cfg = Path(src) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{src} has no config.json (not a Hugging Face model folder)")
    try:
        kind = json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{cfg}: not a JSON object ({e})") from None
    if not isinstance(kind, str):
        raise ValueError(f"{cfg}: no model_type field")
    return kind


def supported_type(src: str | Path) -> str:
    """`model_type` of a folder whose family has an importer; a ValueError naming config.json otherwise."""
    kind = model_type(src)
    if kind not in IMPORTERS:
        raise ValueError(f"{Path(src) / 'config.json'}: model_type {kind!r} cannot be imported; "
                         f"supported: {', '.join(sorted(IMPORTERS))}")
    return kind


def provenance(src: str | Path, seed: int | None = None, step: int | None = None) -> dict:
    """What a Hugging Face folder is, for its imported checkpoint's card: `source` (the folder,
    absolute), `config_sha256` (its config.json's bytes), `weights` (the weight files read, by name),
    `weights_sha256` (the sha256 of each of them, in that order, hashed together: one file's own sha256
    when there is one file) and `claimed_seed`, `claimed_step` (what the caller says the folder is; None
    when it says nothing). Nothing here checks the claim: the hashes are there to compare with the
    suite's published ones."""
    src = Path(src).resolve()
    files = weight_files(src)
    sums = [file_sha256(f) for f in files]
    joint = sums[0] if len(sums) == 1 else hashlib.sha256("".join(sums).encode()).hexdigest()
    return {"source": str(src), "config_sha256": file_sha256(src / "config.json"),
            "weights": [f.name for f in files], "weights_sha256": joint, "claimed_seed": seed, "claimed_step": step}


def import_hf(src_dir: str | Path, out_dir: str | Path | None = None, card: dict | None = None,
              seed: int | None = None, step: int | None = None):
    """(model in eval mode, Tokenizer or None) of a Hugging Face folder of a supported family; with
    out_dir also saved as a workbench checkpoint (safetensors, card with the import report and the
    folder's `provenance`, with the `seed` and `step` it claims to be)."""
    kind = supported_type(src_dir)
    if out_dir is not None:
        card = {**(card or {}), "provenance": provenance(src_dir, seed, step)}
    return IMPORTERS[kind](src_dir, out_dir, card=card)
