"""Import a Hugging Face GPT-2 folder into a workbench Decoder (+ Tokenizer), optionally saving it.

The GPT-2 counterpart of bert.import_hf_bert, on the same rules: `config.json` is mapped field
by field and anything our Decoder cannot compute exactly is a ValueError naming the field; weights
come through `common.read_hf_weights` (model.safetensors, else pytorch_model.bin through
torch's tensors-only loader: anything else is an UnsafePickleError and is never unpickled); a
tensor whose shape does not match the config is refused, naming the tensor and both shapes; a
missing one is refused by name; tensors we cannot map are listed in the card's import report and
warned about, never dropped silently. The tokenizer is read from the folder's own files
(`Tokenizer.from_hf_folder`: tokenizer.json, else vocab.json + merges.txt). Nothing here imports
`transformers`.

Weight layout (GPT-2 name, "transformer." prefix optional -> ours):
- `Conv1D` weights are stored (in, out), the transpose of nn.Linear's (out, in): c_attn, c_proj and
  c_fc are transposed; `c_attn`'s columns are [q | k | v], each H blocks of Dh, which are exactly the
  rows of our fused `qkv` once transposed.
- `lm_head.weight`: absent or equal to `wte.weight` -> tied (our default; with
  tie_word_embeddings=false an equal copy is kept untied); a different matrix is kept as our untied
  `lm_head.weight`, even where the config says tie_word_embeddings (transformers then does not tie
  them either, and says so; the report notes it).
- `attn.bias` / `attn.masked_bias` (causal-mask buffers of older checkpoints) are ignored: not weights.

Final-norm convention: both models give L + 1 hidden states (embedding output, then one per block)
and the same last_hidden_state / logits; but GPT-2's hidden_states[L] is taken after `ln_f` while
ours is the last block's raw output (our `final_norm` is applied to last_hidden_state only). So
GPT-2's hidden_states[L] == our final_norm(hidden_states[L]) == our last_hidden_state, and our
hidden_states[L] is GPT-2's last block output before ln_f, which transformers does not return.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import check_state, save
from ..decoder import Decoder, DecoderConfig
from .common import HF_ACTIVATIONS, UnsafePickleError, read_hf_weights, weights_source
from ..tokenizer import Tokenizer

__all__ = ["UnsafePickleError", "config_from_gpt2", "gpt2_name", "import_hf_gpt2", "map_gpt2_state",
           "read_gpt2_tokenizer"]

# GPT-2 name (after the "transformer." prefix is stripped) -> ours; {l} is a layer index.
GPT2_RENAMES = {
    "wte.weight": "wte.weight",
    "wpe.weight": "wpe.weight",
    "ln_f.weight": "final_norm.weight",
    "ln_f.bias": "final_norm.bias",
    "h.{l}.ln_1.weight": "blocks.{l}.norm1.weight",
    "h.{l}.ln_1.bias": "blocks.{l}.norm1.bias",
    "h.{l}.attn.c_attn.weight": "blocks.{l}.attn.qkv.weight",  # Conv1D (D, 3D) -> Linear (3D, D), rows [q; k; v]
    "h.{l}.attn.c_attn.bias": "blocks.{l}.attn.qkv.bias",
    "h.{l}.attn.c_proj.weight": "blocks.{l}.attn.out.weight",  # Conv1D, transposed
    "h.{l}.attn.c_proj.bias": "blocks.{l}.attn.out.bias",
    "h.{l}.ln_2.weight": "blocks.{l}.norm2.weight",
    "h.{l}.ln_2.bias": "blocks.{l}.norm2.bias",
    "h.{l}.mlp.c_fc.weight": "blocks.{l}.mlp.fc_in.weight",  # Conv1D, transposed
    "h.{l}.mlp.c_fc.bias": "blocks.{l}.mlp.fc_in.bias",
    "h.{l}.mlp.c_proj.weight": "blocks.{l}.mlp.fc_out.weight",  # Conv1D, transposed
    "h.{l}.mlp.c_proj.bias": "blocks.{l}.mlp.fc_out.bias",
}
GPT2_CONV1D = re.compile(r"^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
GPT2_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")  # causal-mask buffers, not weights
GPT2_ACTIVATIONS = HF_ACTIVATIONS  # gelu_new / gelu_pytorch_tanh -> gelu_tanh, gelu (erf), relu
# config fields whose other values change what GPT-2 computes in ways our Decoder does not
GPT2_REQUIRED = {
    "scale_attn_weights": True,  # scores / sqrt(Dh)
    "scale_attn_by_inverse_layer_idx": False,  # scores further / (layer + 1)
    "reorder_and_upcast_attn": False,  # numerics only, but not what we compute
    "add_cross_attention": False,  # encoder-decoder cross-attention blocks
    "is_encoder_decoder": False,
}


def _field(hf: dict, key: str, where: str, kind: type = int, positive: bool = True):
    if key not in hf:
        raise ValueError(f"{where}: field {key!r} is missing")
    value = hf[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or (positive and value <= 0)):
        raise ValueError(f"{where}: {key}={value!r} must be a positive integer")
    return value


def config_from_gpt2(hf: dict, where: str = "config.json") -> DecoderConfig:
    """DecoderConfig from a HF GPT2Config dict; a ValueError naming the field for what we cannot represent.

    Carried: vocab_size, n_embd, n_layer, n_head, n_inner (None -> 4 n_embd), n_positions,
    activation_function, layer_norm_epsilon, tie_word_embeddings, resid_pdrop (our one dropout rate;
    embd_pdrop / attn_pdrop only matter in training and are reported by import_hf_gpt2 when they differ).
    """
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{where}: model_type={hf.get('model_type')!r}, only 'gpt2' is supported")
    for key, want in GPT2_REQUIRED.items():
        if key in hf and hf[key] is not None and hf[key] != want:
            raise ValueError(f"{where}: {key}={hf[key]!r} is not supported (our Decoder computes {key}={want!r})")
    act = hf.get("activation_function", "gelu_new")
    if act not in GPT2_ACTIVATIONS:
        raise ValueError(f"{where}: activation_function={act!r} is not supported; known: {sorted(GPT2_ACTIVATIONS)}")
    d = _field(hf, "n_embd", where)
    n_heads = _field(hf, "n_head", where)
    if d % n_heads:
        raise ValueError(f"{where}: n_embd={d} is not a multiple of n_head={n_heads}")
    n_inner = hf.get("n_inner")
    if n_inner is not None:
        n_inner = _field(hf, "n_inner", where)
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"{where}: layer_norm_epsilon={eps!r} must be a positive number")
    return DecoderConfig(
        vocab_size=_field(hf, "vocab_size", where), d_model=d, n_layers=_field(hf, "n_layer", where),
        n_heads=n_heads, d_ff=n_inner or 4 * d, max_positions=_field(hf, "n_positions", where),
        position="learned", norm="pre", activation=GPT2_ACTIVATIONS[act], mlp="plain", bias=True,
        dropout=float(hf.get("resid_pdrop", 0.1)), layer_norm_eps=float(eps),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def _map(hf_state: dict[str, torch.Tensor]):
    """(state, {our name: (HF name, transposed)}, unknown, ignored)."""
    exact = {src: dst for src, dst in GPT2_RENAMES.items() if "{l}" not in src}
    templated = [(re.compile("^" + re.escape(src).replace(r"\{l\}", r"(\d+)") + "$"), dst)
                 for src, dst in GPT2_RENAMES.items() if "{l}" in src]
    state, sources, unknown, ignored = {}, {}, [], []
    wte = hf_state.get("transformer.wte.weight", hf_state.get("wte.weight"))
    for name, tensor in hf_state.items():
        key = name.removeprefix("transformer.")
        if key == "lm_head.weight":
            if wte is not None and tensor.shape == wte.shape and torch.equal(tensor, wte):
                ignored.append(name)  # tied: the same matrix as the token embeddings
            else:
                state["lm_head.weight"], sources["lm_head.weight"] = tensor, (name, False)
            continue
        if GPT2_IGNORED.match(key):
            ignored.append(name)
            continue
        dst = exact.get(key)
        if dst is None:
            for pattern, template in templated:
                if m := pattern.match(key):
                    dst = template.format(l=m[1])
                    break
        if dst is None:
            unknown.append(name)
            continue
        if dst in state:  # the same weight with and without the "transformer." prefix
            raise ValueError(f"GPT-2 state has {name!r} twice (with and without the 'transformer.' prefix)")
        conv = bool(GPT2_CONV1D.match(key)) and tensor.dim() == 2
        state[dst] = tensor.t().contiguous() if conv else tensor  # Conv1D (in, out) -> (out, in)
        sources[dst] = (name, conv)
    return state, sources, unknown, ignored


def gpt2_name(ours: str) -> str:
    """The GPT-2 name (without the "transformer." prefix) of our tensor `ours`, else `ours` itself."""
    if ours == "lm_head.weight":
        return ours
    for src, dst in GPT2_RENAMES.items():
        pattern = "^" + re.escape(dst).replace(r"\{l\}", r"(\d+)") + "$"
        if m := re.match(pattern, ours):
            return src.format(l=m[1]) if "{l}" in src else src
    return ours


def map_gpt2_state(hf_state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """HF GPT-2 names (with or without "transformer.") -> ours. Returns (state, unknown, ignored).

    Conv1D weights are transposed into nn.Linear's (out, in); `lm_head.weight` is ignored when it
    equals the token embeddings (tied) and kept as `lm_head.weight` otherwise (tie_embeddings=False);
    the attn.bias / attn.masked_bias buffers are ignored; any other name is unknown."""
    state, _, unknown, ignored = _map(hf_state)
    return state, unknown, ignored


def check_shapes(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                  sources: dict[str, tuple[str, bool]], where: str) -> None:
    """Refuse tensors whose shapes do not match the config, in the checkpoint's own names and layout."""
    bad = []
    for ours, (name, transposed) in sources.items():
        if ours not in expected:  # e.g. a block beyond n_layer
            bad.append(f"{name} has no place in a model of this config (it would be our {ours})")
        elif state[ours].shape != expected[ours].shape:
            want, got = tuple(expected[ours].shape), tuple(state[ours].shape)
            if transposed:  # report in the file's (in, out) layout
                want, got = want[::-1], got[::-1]
            bad.append(f"{name} has shape {got}, expected {want}")
    if bad:
        raise ValueError(f"{where}: tensors do not match config.json: {'; '.join(bad)}")


def read_gpt2_tokenizer(src: Path) -> Tokenizer | None:
    """The folder's byte-level BPE tokenizer (tokenizer.json, else vocab.json + merges.txt), or None."""
    if (src / "tokenizer.json").is_file() or ((src / "vocab.json").is_file() and (src / "merges.txt").is_file()):
        return Tokenizer.from_hf_folder(src)
    return None


def import_hf_gpt2(src_dir: str | Path, out_dir: str | Path | None = None,
                   card: dict | None = None) -> tuple[Decoder, Tokenizer | None]:
    """Read a HF GPT-2 folder -> (Decoder in eval mode, Tokenizer or None); save a checkpoint if out_dir.

    The import report (unknown and ignored HF tensors, how the LM head was read, notes) is written
    into the card under "import"; unknown tensors and notes are also emitted as a warning. A tokenizer
    that cannot be read (not byte-level BPE, unknown specials) is such a note, not an error.
    """
    src = Path(src_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json (not a Hugging Face model folder)")
    where = str(src / "config.json")
    hf_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config = config_from_gpt2(hf_cfg, where)
    hf_state = read_hf_weights(src)
    state, sources, unknown, ignored = _map(hf_state)
    notes: list[str] = []
    head = next((n for n in ignored if n.removeprefix("transformer.") == "lm_head.weight"), None)
    if head is not None and not config.tie_embeddings:  # untied by config, equal by value: keep it untied
        ignored.remove(head)
        state["lm_head.weight"], sources["lm_head.weight"] = hf_state[head], (head, False)
    if "lm_head.weight" in state:
        if config.tie_embeddings:  # (an lm_head.weight equal to wte was ignored above: tied)
            notes.append("config.json ties the LM head to wte (tie_word_embeddings), but the checkpoint's "
                         "lm_head.weight is a different matrix: it is kept untied, as transformers does")
        config = DecoderConfig.from_dict({**config.to_dict(), "tie_embeddings": False})
        lm_head = "untied (the checkpoint's own lm_head.weight)"
    else:
        lm_head = "tied to wte" if config.tie_embeddings else "missing"
    drops = {k: hf_cfg[k] for k in ("embd_pdrop", "attn_pdrop") if k in hf_cfg and hf_cfg[k] != config.dropout}
    if drops:
        notes.append(f"one dropout rate: resid_pdrop={config.dropout} is used; {drops} differ (training only)")
    model, tokenizer = load_decoder(config, state, sources, src, gpt2_name, notes)
    report: dict[str, Any] = {
        "source": str(src),
        "family": "gpt2",
        "weights": weights_source(src),
        "unknown_tensors": unknown,
        "ignored_tensors": ignored,
        "fresh_init": [],
        "lm_head": lm_head,
        "tokenizer": None if tokenizer is None else ("tokenizer.json" if (src / "tokenizer.json").is_file()
                                                     else "vocab.json + merges.txt"),
        "final_norm": "hidden_states[L] is before final_norm (GPT-2's is after ln_f); last_hidden_state is after",
        "notes": notes,
    }
    if unknown or notes:
        warnings.warn(f"import_hf_gpt2({src}): unmapped tensors {unknown}" + "".join(f"; {n}" for n in notes),
                      stacklevel=2)
    if out_dir is not None:
        save(model, tokenizer, out_dir, card={"data": hf_cfg.get("_name_or_path") or str(src), **(card or {}),
                                              "import": report})
    return model, tokenizer


def load_decoder(config: DecoderConfig, state: dict[str, torch.Tensor], sources: dict[str, tuple[str, bool]],
                 src: Path, hf_name, notes: list[str]) -> tuple[Decoder, Tokenizer | None]:
    """The Decoder of `config` holding the mapped `state` (shapes, missing and leftover tensors refused,
    named in the checkpoint's own names by `hf_name`), and the folder's byte-level BPE tokenizer (None,
    with a note, when it cannot be read; a note when it can emit ids the model does not embed). Shared by
    the GPT-2 and GPT-NeoX importers."""
    model = Decoder(config)
    expected = model.state_dict()
    check_shapes(expected, state, sources, str(src))
    missing = [k for k in expected if k not in state]
    if missing:
        raise ValueError(f"{src}: the checkpoint lacks tensors that config.json needs: "
                         f"{', '.join(f'{hf_name(k)} (our {k})' for k in missing)}")
    check_state(expected, state, str(src))  # nothing left to find; kept as the last word
    model.load_state_dict(state, strict=True)
    model.eval()
    try:
        tokenizer = read_gpt2_tokenizer(src)
    except ValueError as e:  # the weights import without it; the report and a warning say why
        tokenizer = None
        notes.append(f"tokenizer not loaded: {e}")
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        notes.append(f"the tokenizer can emit {tokenizer.vocab_size} ids, the model embeds {config.vocab_size}")
    return model, tokenizer
