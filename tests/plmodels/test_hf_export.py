"""Exporting our checkpoints in the Hugging Face layout (plmodels.hf.export) gives models that
transformers loads with its Auto classes and that compute what ours compute.

Small random models of ours (LayerNorms and biases perturbed so nothing is trivially 0 or 1; tied
and untied heads; eps and activation off their defaults so a field that is not carried shows) are
saved with plmodels.save together with a tokenizer trained here, exported, and loaded with
AutoModelForMaskedLM / AutoModelForCausalLM (eager attention). On a right-padded batch, the logits
and every hidden state agree to 1e-4 at the real tokens (GPT-2: its hidden_states[L] is after ln_f,
so it is compared with our final_norm(hidden_states[L])). The export reads back through our
importers into the same state dict, AutoTokenizer gives our ids, and what transformers cannot compute
exactly is refused naming the config field.

RoPE models export as RoFormerForMaskedLM (post-LN encoders) and GPTNeoXForCausalLM (pre-LN
decoders), with biases and with bias=False (zeros written), and so do models built from the shipped
RoPE recipes (encoder-mini-cram, decoder-mini-cram) over a tiny vocabulary. A GPT-NeoX export of
Pythia's shape (parallel residual, a quarter of each head rotated, another base, untied) computes
what ours computes and imports back (hf_gpt_neox) into the same config and state dict; RoFormer has
no importer, so no round trip.

transformers is used here only as the reference; plmodels never imports it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig, save
from plmodels.components.positions import apply_rope, rope_cos_sin
from plmodels.hf.export import export_hf, hf_layout, rope_pair_permutation, roformer_positions
from plmodels.hf.gpt2 import import_hf_gpt2
from plmodels.hf.gpt_neox import import_hf_gpt_neox
from plmodels.hf.bert import import_hf_bert
from plmodels.tokenizer import Tokenizer

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=16)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Héllo wörld, café! The dog sat on the mat.",
         "A cat and a dog ran home; the cats ran too.", "東京 😀 antidisestablishmentarianism"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def tokenizers():
    return {"wordpiece": Tokenizer.train_wordpiece(TEXTS * 3, vocab_size=120, lowercase=True, min_frequency=1),
            "bpe": Tokenizer.train_bpe(TEXTS * 3, vocab_size=300, min_frequency=1)}


def perturbed(model):
    """`model` in eval mode with LayerNorm gains/biases and all biases moved off 1 / 0."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def checkpoint(root: Path, name: str, config, tokenizer=None) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    model = perturbed((Encoder if isinstance(config, EncoderConfig) else Decoder)(config))
    return model, save(model, tokenizer, root / name)


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def padded_batch(vocab: int, pad: int = 0):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, 6:] = 0
    ids[-1, 6:] = pad
    return ids, mask


def max_diff(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> float:
    return (a[keep] - b[keep]).abs().max().item()


def same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def check_tokenizer(folder: Path, ours: Tokenizer) -> None:
    auto = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert auto(text)["input_ids"] == ours.encode(text), text
        assert auto(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special=False), text


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_bert_export_computes_what_ours_computes(tokenizers, tmp_path, tie):
    # untied: gelu_tanh, an NSP head (-> BertForPreTraining), two token types in the batch
    extra = {} if tie else {"activation": "gelu_tanh", "use_nsp": True, "type_vocab_size": 3}
    config = EncoderConfig(vocab_size=120, **SIZES, layer_norm_eps=1e-6, tie_embeddings=tie, **extra)
    ours, ckpt = checkpoint(tmp_path, "ours", config, tokenizers["wordpiece"])
    out = export_hf(ckpt, tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["architectures"] == ["BertForMaskedLM" if tie else "BertForPreTraining"]
    assert (hf_cfg["layer_norm_eps"], hf_cfg["tie_word_embeddings"], hf_cfg["max_position_embeddings"]) == (1e-6, tie, 16)
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {p.name for p in out.iterdir()}
    ref = quiet(transformers.AutoModelForMaskedLM.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "BertForMaskedLM"
    ids, mask = padded_batch(120)
    types = torch.zeros_like(ids)
    if not tie:
        types[0, 4:] = 2
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        logits = ours.mlm_logits(o.last_hidden_state)
    assert max_diff(logits, r.logits, keep) <= ATOL
    assert len(o.hidden_states) == len(r.hidden_states) == 3
    assert max(max_diff(a, b, keep) for a, b in zip(o.hidden_states, r.hidden_states)) <= ATOL
    if not tie:  # the NSP head and pooler, through the architecture the folder names
        pre = quiet(transformers.BertForPreTraining.from_pretrained, str(out), attn_implementation="eager").eval()
        with torch.no_grad():
            nsp = pre(ids, attention_mask=mask, token_type_ids=types).seq_relationship_logits
            assert (nsp - ours.nsp_logits(o.pooler_output)).abs().max().item() <= ATOL
    back, tok = quiet(import_hf_bert, out)
    same_state(back.state_dict(), ours.state_dict())
    assert tok.encode(TEXTS[1]) == tokenizers["wordpiece"].encode(TEXTS[1])
    check_tokenizer(out, tokenizers["wordpiece"])


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_gpt2_export_computes_what_ours_computes(tokenizers, tmp_path, tie):
    config = DecoderConfig(vocab_size=300, **SIZES, layer_norm_eps=3e-5, tie_embeddings=tie)
    ours, ckpt = checkpoint(tmp_path, "ours", config, tokenizers["bpe"])
    out = export_hf(ckpt, tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert (hf_cfg["architectures"], hf_cfg["n_inner"], hf_cfg["layer_norm_epsilon"]) == (["GPT2LMHeadModel"], 48, 3e-5)
    ref = quiet(transformers.AutoModelForCausalLM.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "GPT2LMHeadModel"
    assert (ref.lm_head.weight is ref.transformer.wte.weight) == tie
    ids, mask = padded_batch(300)
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, output_hidden_states=True)
        assert max_diff(o.logits, r.logits, keep) <= ATOL
        # hidden_states[L]: GPT-2's is after ln_f, ours before final_norm (docs/interop.md)
        assert max(max_diff(a, b, keep) for a, b in zip(o.hidden_states[:-1], r.hidden_states[:-1])) <= ATOL
        assert max_diff(ours.final_norm(o.hidden_states[-1]), r.hidden_states[-1], keep) <= ATOL
    back, tok = quiet(import_hf_gpt2, out)
    same_state(back.state_dict(), ours.state_dict())
    assert back.config.tie_embeddings == tie and tok.encode(TEXTS[3]) == tokenizers["bpe"].encode(TEXTS[3])
    check_tokenizer(out, tokenizers["bpe"])


def test_roberta_and_distilbert_exports(tokenizers, tmp_path):
    from plmodels.hf.encoders import import_hf_distilbert, import_hf_roberta

    from .hf_files import write_roberta_files

    vocab = write_roberta_files(tmp_path / "rtok")
    rtok = Tokenizer.from_hf_folder(tmp_path / "rtok")
    cases = {
        "roberta": (EncoderConfig(vocab_size=vocab, **SIZES, position_ids="roberta", pad_token_id=1, type_vocab_size=1,
                                  tie_embeddings=False), rtok, import_hf_roberta, "RobertaForMaskedLM"),
        "distilbert": (EncoderConfig(vocab_size=120, **SIZES, type_vocab_size=0, activation="relu"),
                       tokenizers["wordpiece"], import_hf_distilbert, "DistilBertForMaskedLM"),
    }
    for name, (config, tok, importer, arch) in cases.items():
        ours, ckpt = checkpoint(tmp_path, name, config, tok)
        if name == "distilbert":
            with pytest.warns(UserWarning, match="pooler"):
                out = export_hf(ckpt, tmp_path / f"{name}-hf")
            assert "pooler" in (out / "README.md").read_text()
        else:
            out = export_hf(ckpt, tmp_path / f"{name}-hf")
            assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 16 + 1 + 1
        ref = quiet(transformers.AutoModelForMaskedLM.from_pretrained, str(out), attn_implementation="eager").eval()
        assert type(ref).__name__ == arch
        ids, mask = padded_batch(config.vocab_size, pad=config.pad_token_id)
        keep = mask.bool()
        with torch.no_grad():
            r = ref(ids, attention_mask=mask, output_hidden_states=True)
            o = ours(ids, attention_mask=mask, output_hidden_states=True)
            assert max_diff(ours.mlm_logits(o.last_hidden_state), r.logits, keep) <= ATOL, name
            assert max(max_diff(a, b, keep) for a, b in zip(o.hidden_states, r.hidden_states)) <= ATOL, name
        back, _ = quiet(importer, out)
        theirs, mine = back.state_dict(), ours.state_dict()
        if name == "distilbert":  # DistilBERT has no pooler: the importer gives a fresh one
            theirs = {k: v for k, v in theirs.items() if not k.startswith("pooler.")}
            mine = {k: v for k, v in mine.items() if not k.startswith("pooler.")}
        same_state(theirs, mine)
        check_tokenizer(out, tok)
    assert json.loads((tmp_path / "roberta-hf" / "tokenizer_config.json").read_text())["tokenizer_class"] == "RobertaTokenizerFast"


def test_rope_pair_permutation_turns_our_rotation_into_roformers():
    """RoFormer rotates (2i, 2i+1), ours (i, i + Dh/2), by the same angles: permuting q and k by perm
    gives RoFormer's rotation of the permuted vectors, and the scores q . k are unchanged."""
    from transformers.models.roformer.modeling_roformer import RoFormerSelfAttention

    Dh, T = 8, 6
    perm = rope_pair_permutation(Dh)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    q, k = torch.randn(2, 1, 2, T, Dh, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(T, Dh)
    ours_q, ours_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    theirs_q, theirs_k = RoFormerSelfAttention.apply_rotary_position_embeddings(
        roformer_positions(T, Dh)[None, None], q[..., perm], k[..., perm])
    assert torch.allclose(theirs_q, ours_q[..., perm], atol=1e-6) and torch.allclose(theirs_k, ours_k[..., perm], atol=1e-6)
    assert torch.allclose(theirs_q @ theirs_k.transpose(-1, -2), ours_q @ ours_k.transpose(-1, -2), atol=1e-5)


def _roformer_check(ours, out: Path, vocab: int, types: torch.Tensor | None = None) -> float:
    ref = quiet(transformers.AutoModelForMaskedLM.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "RoFormerForMaskedLM"
    cfg = ours.config
    # our sin / cos table is what it reads (not its own float64 one)
    assert torch.equal(ref.roformer.encoder.embed_positions.weight,
                       roformer_positions(cfg.max_positions, cfg.d_model // cfg.n_heads))
    ids, mask = padded_batch(vocab, pad=cfg.pad_token_id)
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        diff = max_diff(ours.mlm_logits(o.last_hidden_state), r.logits, keep)
        assert diff <= ATOL
        hidden = o.hidden_states if cfg.embedding_size is None else o.hidden_states[1:]  # theirs: after the projection
        assert max(max_diff(a, b, keep) for a, b in zip(hidden, r.hidden_states[-len(hidden):])) <= ATOL
    return diff


@pytest.mark.parametrize("variant", ["biases", "no-bias"])
def test_roformer_export_computes_what_ours_computes(tokenizers, tmp_path, variant):
    # biases: perturbed, tied, three token types in the batch; no-bias: bias=False (zeros written), no
    # token types (one zero row written), untied, factorised embeddings (embeddings_project), relu, eps 1e-5
    extra = ({"type_vocab_size": 3, "activation": "gelu_tanh", "layer_norm_eps": 1e-6} if variant == "biases" else
             {"bias": False, "type_vocab_size": 0, "tie_embeddings": False, "embedding_size": 24, "activation": "relu",
              "layer_norm_eps": 1e-5})
    config = EncoderConfig(vocab_size=120, **SIZES, position="rope", **extra)
    ours, ckpt = checkpoint(tmp_path, "ours", config, tokenizers["wordpiece"])
    with pytest.warns(UserWarning, match="pooler"):  # RoFormer has no pooler
        out = export_hf(ckpt, tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert (hf_cfg["architectures"], hf_cfg["rotary_value"], hf_cfg["tie_word_embeddings"]) == (
        ["RoFormerForMaskedLM"], False, variant == "biases")
    assert hf_cfg["type_vocab_size"] == (3 if variant == "biases" else 1)
    readme = (out / "README.md").read_text()
    assert "permuted" in readme and "pooler" in readme and (("zeros" in readme) == (variant == "no-bias"))
    types = None
    if variant == "biases":
        types = torch.zeros(3, 9, dtype=torch.long)
        types[0, 4:] = 2
    _roformer_check(ours, out, 120, types)
    check_tokenizer(out, tokenizers["wordpiece"])


NEOX_VARIANTS = {
    "biases": {"layer_norm_eps": 3e-5},
    "no-bias": {"bias": False, "tie_embeddings": False, "activation": "gelu"},
    # Pythia's shape: parallel residual, 2 of 8 channels per head rotated (rotary_pct 0.25), untied head
    "pythia": {"parallel_residual": True, "rotary_dims": 2, "rope_base": 5000.0, "tie_embeddings": False,
               "activation": "gelu"},
}


@pytest.mark.parametrize("variant", list(NEOX_VARIANTS))
def test_gpt_neox_export_computes_what_ours_computes(tokenizers, tmp_path, variant):
    config = DecoderConfig(vocab_size=300, **SIZES, position="rope", **NEOX_VARIANTS[variant])
    ours, ckpt = checkpoint(tmp_path, "ours", config, tokenizers["bpe"])
    out = export_hf(ckpt, tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    pythia = variant == "pythia"
    assert (hf_cfg["architectures"], hf_cfg["use_parallel_residual"], hf_cfg["rotary_pct"]) == (
        ["GPTNeoXForCausalLM"], pythia, 0.25 if pythia else 1.0)
    assert hf_cfg["rope_parameters"]["rope_theta"] == (5000.0 if pythia else 10000.0)
    assert ("zeros" in (out / "README.md").read_text()) == (variant == "no-bias")
    ref = quiet(transformers.AutoModelForCausalLM.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "GPTNeoXForCausalLM"
    assert (ref.lm_head.weight is ref.gpt_neox.embed_in.weight) == (variant == "biases")
    ids, mask = padded_batch(300)
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, output_hidden_states=True)
        assert max_diff(o.logits, r.logits, keep) <= ATOL
        # hidden_states[L]: GPT-NeoX's is after final_layer_norm, ours before final_norm (as GPT-2)
        assert max(max_diff(a, b, keep) for a, b in zip(o.hidden_states[:-1], r.hidden_states[:-1])) <= ATOL
        assert max_diff(ours.final_norm(o.hidden_states[-1]), r.hidden_states[-1], keep) <= ATOL
    check_tokenizer(out, tokenizers["bpe"])
    if variant != "no-bias":  # zero biases come back as biases: the same function, another state dict
        back, tok = quiet(import_hf_gpt_neox, out)
        assert back.config == ours.config and tok is not None and tok.encode(TEXTS[1]) == tokenizers["bpe"].encode(TEXTS[1])
        theirs, mine = back.state_dict(), ours.state_dict()
        assert theirs.keys() == mine.keys() and all(torch.equal(theirs[k], mine[k]) for k in mine)


@pytest.mark.parametrize("recipe", ["encoder-mini-cram", "decoder-mini-cram"])
def test_the_shipped_rope_recipes_export(tokenizers, tmp_path, recipe):
    """The recipe's model section over its preset (the trainer's build_model_config), a tiny vocabulary."""
    from plmodels.training.config import load_config
    from plmodels.training.loop import build_model_config

    cfg = load_config(recipe)
    tok = tokenizers["wordpiece" if cfg.kind == "encoder" else "bpe"]
    fields = build_model_config(cfg, tok)
    assert (fields["position"], fields["bias"]) == ("rope", False)
    config = (EncoderConfig if cfg.kind == "encoder" else DecoderConfig)(**fields)
    ours, ckpt = checkpoint(tmp_path, "ours", config, tok)
    out = quiet(export_hf, ckpt, tmp_path / "hf")
    if cfg.kind == "encoder":
        assert json.loads((out / "config.json").read_text())["num_attention_heads"] == 8
        _roformer_check(ours, out, tok.vocab_size)
    else:
        ref = quiet(transformers.AutoModelForCausalLM.from_pretrained, str(out), attn_implementation="eager").eval()
        ids, mask = padded_batch(tok.vocab_size)
        with torch.no_grad():
            assert max_diff(ours(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits, mask.bool()) <= ATOL
    check_tokenizer(out, tok)


@pytest.mark.parametrize("config, field, why", [
    (EncoderConfig(vocab_size=61, **SIZES, position="rope", norm="pre"), "norm", "post-LN"),
    (EncoderConfig(vocab_size=61, **SIZES, mlp="gated"), "mlp", "gated"),
    (DecoderConfig(vocab_size=61, **SIZES, output="adaptive", tie_embeddings=False, adaptive_cutoffs=(20, 40)),
     "output", "adaptive softmax"),
])
def test_what_transformers_cannot_compute_is_refused_naming_the_field(tmp_path, config, field, why):
    _, ckpt = checkpoint(tmp_path, "ours", config)
    with pytest.raises(ValueError, match=rf"{field}=.*{why}"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["ours"]


@pytest.mark.parametrize("kind, fields, field", [
    ("encoder", {"norm": "pre"}, "norm"),
    ("decoder", {"norm": "post"}, "norm"),
    ("encoder", {"position": "alibi"}, "position"),
    ("decoder", {"mlp": "gated"}, "mlp"),
    ("encoder", {"bias": False}, "bias"),
    ("encoder", {"pruned_heads": {0: [1]}}, "pruned_heads"),
    ("decoder", {"pruned_heads": {0: [1], 1: [0]}}, "pruned_heads"),
    ("encoder", {"position_ids": "roberta", "pad_token_id": 1, "activation": "relu"}, "activation"),
    ("encoder", {"position_ids": "roberta", "pad_token_id": 1, "type_vocab_size": 0}, "type_vocab_size"),
    ("encoder", {"type_vocab_size": 0, "layer_norm_eps": 1e-5}, "layer_norm_eps"),
    ("encoder", {"type_vocab_size": 0, "use_nsp": True}, "use_nsp"),
    ("encoder", {"position": "rope", "use_nsp": True}, "use_nsp"),
    ("encoder", {"position": "rope", "mlp": "gated"}, "mlp"),
    ("encoder", {"position": "rope", "pruned_heads": {0: [1]}}, "pruned_heads"),
    ("encoder", {"position": "rope", "use_rtd": True}, "use_rtd"),
    ("encoder", {"embedding_size": 16}, "embedding_size"),  # only RoFormer has a place for the projection
    ("decoder", {"position": "rope", "norm": "post"}, "norm"),
    ("decoder", {"parallel_residual": True}, "parallel_residual"),  # GPT-2 has sequential blocks only
    ("decoder", {"position": "rope", "output": "adaptive", "tie_embeddings": False, "adaptive_cutoffs": (20, 40)}, "output"),
])
def test_more_refusals_name_their_field(kind, fields, field):
    cls = EncoderConfig if kind == "encoder" else DecoderConfig
    with pytest.raises(ValueError, match=rf"Hugging Face layout: {field}="):
        hf_layout(kind, cls(vocab_size=61, **SIZES, **fields))


def test_a_rotary_fraction_transformers_cannot_give_back_is_refused():
    """transformers rotates int(head_dim x rotary_pct) channels: 30 of 44 is 0.6818...,
    and int(44 x 0.6818...) = 29; 22 of 44 (0.5) exports."""
    sizes = {**SIZES, "d_model": 44, "n_heads": 1}
    with pytest.raises(ValueError, match="Hugging Face layout: rotary_dims=30"):
        hf_layout("decoder", DecoderConfig(vocab_size=61, **sizes, position="rope", rotary_dims=30))
    assert hf_layout("decoder", DecoderConfig(vocab_size=61, **sizes, position="rope", rotary_dims=22))[1]["rotary_pct"] == 0.5


def test_an_existing_export_is_replaced_whole(tokenizers, tmp_path):
    _, ckpt = checkpoint(tmp_path, "ours", DecoderConfig(vocab_size=300, **SIZES), None)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert export_hf(ckpt, out) == out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "no tokenizer" in (out / "README.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "ours"]  # no temporary left behind
