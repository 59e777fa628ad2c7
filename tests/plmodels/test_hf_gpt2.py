"""Importing a Hugging Face GPT-2 folder (plmodels.hf.gpt2) reproduces transformers' GPT2LMHeadModel.

Random tiny GPT2LMHeadModels (tied and untied LM head, LayerNorms and biases perturbed so none is
trivially 1 or 0) are saved with `save_pretrained` (safetensors) or as a tensors-only
pytorch_model.bin, together with GPT-2-style tokenizer files, and imported. Every hidden state,
every attention map and the LM logits must agree to 1e-4 on a right-padded batch.

Final-norm convention: GPT-2's hidden_states[L] is after ln_f; ours is the last block's raw output.
ours[L] is compared with the input of GPT-2's ln_f (a forward pre-hook), and GPT-2's
hidden_states[L] with our final_norm(ours[L]) and our last_hidden_state.

transformers is used here only as the reference; plmodels never imports it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from plmodels import DecoderConfig, load
from plmodels.hf.common import UnsafePickleError
from plmodels.hf.gpt2 import config_from_gpt2, gpt2_name, import_hf_gpt2, map_gpt2_state

from .hf_files import write_gpt2_files
from .hf_models import GPT2_EPS as EPS
from .hf_models import GPT2_SIZES as SIZES
from .hf_models import hf_gpt2

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Héllo wörld, café!", "東京 😀 antidisestablishmentarianism", "The quick brown fox.", "a\n\nb  c"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """"tied" / "untied": save_pretrained folders (model.safetensors); "bin": the tied model as a
    tensors-only pytorch_model.bin without the "transformer." prefix, with lm_head.weight (shared
    with wte) and the attn.bias / attn.masked_bias buffers of older checkpoints. Each holds GPT-2
    tokenizer files (vocab.json + merges.txt) whose vocabulary is the model's."""
    root = tmp_path_factory.mktemp("hf_gpt2")
    vocab = write_gpt2_files(root / "tok")
    out = {}
    for name, tie, seed in (("tied", True, 0), ("untied", False, 1)):
        folder = root / name
        hf_gpt2(vocab, tie, seed).save_pretrained(str(folder))
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(root / "tok" / f, folder / f)
        out[name] = folder
    folder = out["bin"] = root / "bin"
    folder.mkdir()
    for f in ("config.json", "vocab.json", "merges.txt"):
        shutil.copy(out["tied"] / f, folder / f)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(out["tied"])).eval()
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items()}
    assert "lm_head.weight" in state and "wte.weight" in state
    T = SIZES["n_positions"]
    for l in range(SIZES["n_layer"]):
        state[f"h.{l}.attn.bias"] = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
        state[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, folder / "pytorch_model.bin")
    return out


def reference(folder: Path) -> transformers.GPT2LMHeadModel:
    return transformers.GPT2LMHeadModel.from_pretrained(str(folder), attn_implementation="eager").eval()


def right_padded(tok, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T) of TEXTS with BOS, cut to n_positions, right-padded (id 0, masked)."""
    seqs = [tok.encode(t)[:n_positions] for t in TEXTS]
    T = max(map(len, seqs))
    assert len({len(s) for s in seqs}) > 1, "the batch must hold padding"
    ids, mask = torch.zeros(len(seqs), T, dtype=torch.long), torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
    return ids, mask


def max_diffs(ours, ref, ids, mask, unpad: bool = False) -> dict[str, float]:
    """Largest |ours - GPT-2| over real positions for every hidden state, attention map and the logits."""
    pre_ln_f = []
    handle = ref.transformer.ln_f.register_forward_pre_hook(lambda m, args: pre_ln_f.append(args[0]))
    try:
        with torch.no_grad():
            r = ref(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            o = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True,
                     attn_impl="eager", unpad=unpad)
            normed = ours.final_norm(o.hidden_states[-1])
    finally:
        handle.remove()
    real = mask.bool()  # real query positions; right padding numbers them 0.. in both models
    L = ours.config.n_layers
    assert len(o.hidden_states) == len(r.hidden_states) == L + 1 and len(o.attentions) == len(r.attentions) == L

    def d(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a[real] - b[real]).abs().max().item()

    out = {f"hidden[{l}]": d(o.hidden_states[l], r.hidden_states[l]) for l in range(L)}
    out[f"hidden[{L}] (pre ln_f)"] = d(o.hidden_states[L], pre_ln_f[0])
    out[f"final_norm(hidden[{L}])"] = d(normed, r.hidden_states[L])
    out["last_hidden_state"] = d(o.last_hidden_state, r.hidden_states[L])
    for l, (a, b) in enumerate(zip(o.attentions, r.attentions, strict=True)):  # (B, H, T, T), real query rows
        assert a.shape == b.shape
        out[f"attention[{l}]"] = (a.transpose(1, 2)[real] - b.transpose(1, 2)[real]).abs().max().item()
    out["logits"] = d(o.logits, r.logits)
    return out


@pytest.mark.parametrize("variant, unpad", [("tied", False), ("untied", False), ("bin", False), ("tied", True)])
def test_import_matches_gpt2_hidden_states_attentions_and_logits(folders, variant, unpad, tmp_path):
    folder = folders[variant]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean checkpoint imports without a warning
        ours, tok = import_hf_gpt2(folder, tmp_path / "ckpt", card={"name_note": "test"})
    ref = reference(folders["tied"] if variant == "bin" else folder)
    assert ours.config == config_from_gpt2(json.loads((folder / "config.json").read_text()))
    cfg = ours.config
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.max_positions) == (32, 2, 4, 48, 16)
    assert cfg.layer_norm_eps == EPS and cfg.activation == "gelu_tanh" and cfg.norm == "pre"
    assert cfg.tie_embeddings == (variant != "untied") and (ours.lm_head is None) == (variant != "untied")
    ids, mask = right_padded(tok, cfg.max_positions)
    assert not mask.all()
    diffs = max_diffs(ours, ref, ids, mask, unpad=unpad)
    assert max(diffs.values()) <= ATOL, diffs
    # the tokenizer is the folder's own, with GPT2TokenizerFast's ids
    ref_tok = transformers.GPT2TokenizerFast.from_pretrained(str(folder))
    assert [tok.encode(t, add_special=False) for t in TEXTS] == [ref_tok(t)["input_ids"] for t in TEXTS]
    assert tok.bos_id == tok.eos_id == ref_tok.eos_token_id == cfg.vocab_size - 1 and tok.pad_id is None
    # the checkpoint reloads to the same model and tokenizer; the card carries the import report
    loaded, tok2 = load(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.equal(loaded(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits)
    assert tok2.encode(TEXTS[1]) == tok.encode(TEXTS[1]) and tok2.specials == tok.specials
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["unknown_tensors"] == [] and report["notes"] == []
    untied = "untied (the checkpoint's own lm_head.weight)"
    assert report["lm_head"] == (untied if variant == "untied" else "tied to wte")
    assert report["tokenizer"] == "vocab.json + merges.txt"
    if variant == "bin":
        assert sorted(report["ignored_tensors"]) == sorted(
            ["lm_head.weight"] + [f"h.{l}.attn.{b}" for l in range(2) for b in ("bias", "masked_bias")])
    else:
        assert report["ignored_tensors"] == []


def test_bin_and_safetensors_give_the_same_weights(folders):
    a, _ = import_hf_gpt2(folders["bin"])
    b, _ = import_hf_gpt2(folders["tied"])
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def _copy(folder: Path, dst: Path, state: dict[str, torch.Tensor]) -> Path:
    dst.mkdir()
    for f in ("config.json", "vocab.json", "merges.txt"):
        shutil.copy(folder / f, dst / f)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_wrong_shaped_tensor_is_refused_naming_it_and_both_shapes(folders, tmp_path):
    state = load_file(str(folders["tied"] / "model.safetensors"))
    state["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 40)  # Conv1D (in, out): n_inner is 48
    state["transformer.wpe.weight"] = torch.zeros(20, 32)  # n_positions is 16
    broken = _copy(folders["tied"], tmp_path / "broken", state)
    with pytest.raises(ValueError) as e:
        import_hf_gpt2(broken, tmp_path / "out")
    msg = str(e.value)
    assert "transformer.h.1.mlp.c_fc.weight has shape (32, 40), expected (32, 48)" in msg
    assert "transformer.wpe.weight has shape (20, 32), expected (16, 32)" in msg
    assert not (tmp_path / "out").exists()
    # a block the config does not have is refused too, by its name
    state = load_file(str(folders["tied"] / "model.safetensors"))
    state["transformer.h.2.ln_1.weight"] = torch.ones(32)
    with pytest.raises(ValueError, match=r"transformer\.h\.2\.ln_1\.weight has no place"):
        import_hf_gpt2(_copy(folders["tied"], tmp_path / "extra_block", state))


def test_a_missing_tensor_is_refused_by_name(folders, tmp_path):
    state = load_file(str(folders["untied"] / "model.safetensors"))
    del state["transformer.ln_f.bias"], state["lm_head.weight"]
    with pytest.raises(ValueError, match=r"lacks tensors .*ln_f\.bias \(our final_norm\.bias\), lm_head\.weight"):
        import_hf_gpt2(_copy(folders["untied"], tmp_path / "missing", state))


def test_unknown_tensors_are_listed_in_the_report_and_warned_about(folders, tmp_path):
    state = load_file(str(folders["tied"] / "model.safetensors"))
    extra = {"score.weight": torch.zeros(2, 32), "transformer.h.0.attn.rotary.inv_freq": torch.ones(4)}
    folder = _copy(folders["tied"], tmp_path / "extra", {**state, **extra})
    listed = r"unmapped tensors \['score\.weight', 'transformer\.h\.0\.attn\.rotary\.inv_freq'\]"
    with pytest.warns(UserWarning, match=listed):
        ours, _ = import_hf_gpt2(folder, tmp_path / "ckpt")
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["unknown_tensors"] == sorted(extra)
    ref = reference(folders["tied"])
    ids, mask = right_padded(import_hf_gpt2(folders["tied"])[1], 16)
    assert max(max_diffs(ours, ref, ids, mask).values()) <= ATOL  # the known tensors still load


def test_a_config_tie_with_a_different_lm_head_stays_untied_like_transformers(folders, tmp_path):
    state = load_file(str(folders["tied"] / "model.safetensors"))
    assert "lm_head.weight" not in state  # save_pretrained drops the tied copy
    g = torch.Generator().manual_seed(3)
    wte = state["transformer.wte.weight"]
    state["lm_head.weight"] = wte + 0.1 * torch.randn(wte.shape, generator=g)
    folder = _copy(folders["tied"], tmp_path / "untied_in_tensors", state)
    with pytest.warns(UserWarning, match="kept untied"):
        ours, tok = import_hf_gpt2(folder)
    assert not ours.config.tie_embeddings
    ref = reference(folder)
    assert not torch.equal(ref.lm_head.weight, ref.transformer.wte.weight)
    ids, mask = right_padded(tok, 16)
    assert max(max_diffs(ours, ref, ids, mask).values()) <= ATOL


def test_an_untied_config_whose_head_equals_wte_stays_untied(folders, tmp_path):
    state = load_file(str(folders["untied"] / "model.safetensors"))
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours, _ = import_hf_gpt2(_copy(folders["untied"], tmp_path / "f", state))
    assert not ours.config.tie_embeddings and torch.equal(ours.lm_head.weight, ours.wte.weight)


@pytest.mark.parametrize("field, value", [
    ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True), ("add_cross_attention", True),
    ("scale_attn_weights", False), ("activation_function", "silu"), ("model_type", "gpt_neo"),
    ("n_inner", 0), ("layer_norm_epsilon", -1.0), ("n_head", 5),
])
def test_config_fields_we_cannot_represent_are_refused_by_name(field, value):
    hf = transformers.GPT2Config(vocab_size=50, **SIZES).to_dict()
    config_from_gpt2(hf)  # the unchanged config is fine
    with pytest.raises(ValueError, match=field):
        config_from_gpt2({**hf, field: value}, "cfg.json")


def test_config_carries_every_field():
    hf = transformers.GPT2Config(vocab_size=50, **{**SIZES, "n_inner": None}, layer_norm_epsilon=EPS,
                                 activation_function="gelu", resid_pdrop=0.05, tie_word_embeddings=False).to_dict()
    assert config_from_gpt2(hf) == DecoderConfig(
        vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_positions=16, activation="gelu",
        layer_norm_eps=EPS, dropout=0.05, tie_embeddings=False)


def test_mapping_without_the_transformer_prefix():
    state = {"wte.weight": torch.ones(5, 4), "h.0.attn.c_attn.weight": torch.arange(24.).view(4, 6),
             "lm_head.weight": torch.ones(5, 4), "h.0.attn.masked_bias": torch.tensor(-1e4)}
    mapped, unknown, ignored = map_gpt2_state(state)
    assert torch.equal(mapped["blocks.0.attn.qkv.weight"], state["h.0.attn.c_attn.weight"].t())
    assert unknown == [] and ignored == ["lm_head.weight", "h.0.attn.masked_bias"]


def test_a_tokenizer_we_cannot_read_is_noted_not_fatal(folders, tmp_path):
    folder = _copy(folders["tied"], tmp_path / "f", load_file(str(folders["tied"] / "model.safetensors")))
    (folder / "tokenizer.json").write_text(HFTokenizer(models.WordLevel({"a": 0}, unk_token="a")).to_str())
    with pytest.warns(UserWarning, match="tokenizer not loaded"):
        ours, tok = import_hf_gpt2(folder, tmp_path / "ckpt")
    assert tok is None and not (tmp_path / "ckpt" / "tokenizer").exists()
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["tokenizer"] is None and any("not a byte-level BPE" in n for n in report["notes"])


class _Payload:
    """Pickled, a call that would create a marker file when the pickle is loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_a_pytorch_model_bin_with_code_is_refused_and_never_run(folders, tmp_path):
    folder, marker = tmp_path / "bin", tmp_path / "MARKER"
    folder.mkdir()
    shutil.copy(folders["bin"] / "config.json", folder / "config.json")
    state = torch.load(folders["bin"] / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "extra": _Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(UnsafePickleError, match="refused to load"):
        import_hf_gpt2(folder, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_plmodels_does_not_import_transformers():
    code = "import sys, plmodels.hf.gpt2, plmodels.tokenizer; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_a_config_key_left_out_is_refused_by_name_or_read_as_transformers_default():
    # the sizes are required; each other key config_from_gpt2 falls back on gets the value transformers' GPT2Config would use
    full = transformers.GPT2Config().to_dict()
    want = config_from_gpt2(full)
    refused = set()
    for key in full:
        try:
            got = config_from_gpt2({k: v for k, v in full.items() if k != key})
        except ValueError as e:
            assert repr(key) in str(e) or f"{key}=" in str(e)
            refused.add(key)
            continue
        assert got == want, key
    assert refused == {"vocab_size", "n_embd", "n_layer", "n_head", "n_positions"}   # only the sizes are required


def test_gpt2_names_of_our_tensors_by_hand():
    # the name an error message gives for our tensor: GPT-2's, without the "transformer." prefix
    assert gpt2_name("blocks.3.attn.qkv.weight") == "h.3.attn.c_attn.weight"
    assert gpt2_name("blocks.11.mlp.fc_out.bias") == "h.11.mlp.c_proj.bias"
    assert gpt2_name("final_norm.weight") == "ln_f.weight"
    assert gpt2_name("lm_head.weight") == "lm_head.weight" and gpt2_name("not.a.weight") == "not.a.weight"
