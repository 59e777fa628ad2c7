"""Exporting ALBERT-style (share_layers="all") and ELECTRA-discriminator (use_rtd) encoders of ours
in the Hugging Face layout: transformers' Auto classes load them and compute our logits (<= 1e-4 on
a padded batch), our importers read them back to the same state dict, a Unigram tokenizer exports as
AlbertTokenizer with our ids, and what no transformers class computes is refused naming the field.

transformers is used here only as the reference; plmodels never imports it."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, processors, trainers

from plmodels import Encoder, EncoderConfig, save
from plmodels.hf.encoders import import_hf_albert, import_hf_electra
from plmodels.hf.export import export_hf, hf_layout
from plmodels.tokenizer import Tokenizer, albert_pipeline

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = {"vocab_size": 60, "d_model": 32, "n_heads": 4, "d_ff": 48, "max_positions": 16, "layer_norm_eps": 1e-6}
ATOL = 1e-4


def perturbed(config):
    torch.manual_seed(0)
    model = Encoder(config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, 6:] = 0
    ids[-1, 6:] = 0
    types = torch.zeros_like(ids)
    types[0, 5:] = 1
    return ids, mask, types


def diff(a, b, keep) -> float:
    return (a[keep] - b[keep]).abs().max().item()


@pytest.mark.parametrize("variant", ["factorised-sop", "unfactorised-untied"])
def test_albert_export_computes_what_ours_computes(tmp_path, variant):
    if variant == "factorised-sop":
        config = EncoderConfig(**SIZES, n_layers=3, share_layers="all", embedding_size=16, use_nsp=True,
                               activation="gelu_tanh")
    else:
        config = EncoderConfig(**SIZES, n_layers=3, share_layers="all", tie_embeddings=False)
    ours = perturbed(config)
    out = export_hf(save(ours, None, tmp_path / "ours"), tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    sop = variant == "factorised-sop"
    assert hf_cfg["architectures"] == ["AlbertForPreTraining" if sop else "AlbertForMaskedLM"]
    assert (hf_cfg["num_hidden_groups"], hf_cfg["inner_group_num"], hf_cfg["embedding_size"]) == (1, 1, 16 if sop else 32)
    ref = quiet(transformers.AutoModelForMaskedLM.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "AlbertForMaskedLM"
    ids, mask, types = batch()
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        logits = ours.mlm_logits(o.last_hidden_state)
    figures = {"logits": diff(logits, r.logits, keep),
               "hidden": max(diff(a, b, keep) for a, b in zip(o.hidden_states, r.hidden_states, strict=True))}
    if sop:  # the sentence-order head through AlbertForPreTraining
        pre = quiet(transformers.AlbertForPreTraining.from_pretrained, str(out), attn_implementation="eager").eval()
        with torch.no_grad():
            p = pre(ids, attention_mask=mask, token_type_ids=types)
        figures["sop"] = (ours.nsp_logits(o.pooler_output) - p.sop_logits).abs().max().item()
        figures["pretraining_logits"] = diff(logits, p.prediction_logits, keep)
    print(f"albert export {variant} max |diff|:", figures)
    assert max(figures.values()) <= ATOL
    # our importer reads the export back to the same state dict (and the same sharing)
    back, _ = quiet(import_hf_albert, out)
    assert back.config == ours.config
    a, b = back.state_dict(), ours.state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert back.blocks[2].attn.qkv.weight is back.blocks[0].attn.qkv.weight
    stored = load_file(str(out / "model.safetensors"))
    assert not any(".albert_layers.1." in k or "albert_layer_groups.1" in k for k in stored)


@pytest.mark.parametrize("embedding_size", [16, None], ids=["factorised", "unfactorised"])
def test_electra_discriminator_export_computes_what_ours_computes(tmp_path, embedding_size):
    config = EncoderConfig(**SIZES, n_layers=2, use_rtd=True, embedding_size=embedding_size, activation="relu")
    ours = perturbed(config)
    with pytest.warns(UserWarning, match="mlm"):  # ElectraForPreTraining has no MLM head and no pooler
        out = export_hf(save(ours, None, tmp_path / "ours"), tmp_path / "hf")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["architectures"] == ["ElectraForPreTraining"] and hf_cfg["hidden_act"] == "relu"
    ref = quiet(transformers.AutoModelForPreTraining.from_pretrained, str(out), attn_implementation="eager").eval()
    assert type(ref).__name__ == "ElectraForPreTraining"
    ids, mask, types = batch()
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        rtd = ours.rtd_logits(o.last_hidden_state)
    figures = {"rtd": diff(rtd, r.logits, keep),
               "hidden": max(diff(a, b, keep) for a, b in zip(o.hidden_states, r.hidden_states, strict=True))}
    print(f"electra export {embedding_size} max |diff|:", figures)
    assert max(figures.values()) <= ATOL
    back, _ = quiet(import_hf_electra, out)
    assert back.config == ours.config
    a, b = back.state_dict(), ours.state_dict()
    kept = [k for k in b if not k.startswith(("mlm.", "pooler."))]  # what the discriminator layout has no place for
    assert sorted(k for k in a if not k.startswith(("mlm.", "pooler."))) == sorted(kept)
    assert all(torch.equal(a[k], b[k]) for k in kept)


def test_a_unigram_tokenizer_exports_as_albert_tokenizer(tmp_path):
    hf = HFTokenizer(models.Unigram())
    hf.normalizer, hf.pre_tokenizer, hf.decoder = albert_pipeline(do_lower_case=False)
    texts = ["The quick brown fox jumps over the lazy dog.", "Héllo wörld, café! 東京 😀"] * 5
    hf.train_from_iterator(texts, trainer=trainers.UnigramTrainer(
        vocab_size=70, special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], unk_token="<unk>",
        show_progress=False))
    hf.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    transformers.AlbertTokenizerFast(tokenizer_object=hf, do_lower_case=False).save_pretrained(tmp_path / "tok")
    tok = Tokenizer.from_hf_folder(tmp_path / "tok")
    assert tok.kind == "unigram" and not tok.lowercase
    ours = perturbed(EncoderConfig(**{**SIZES, "vocab_size": tok.vocab_size}, n_layers=2, share_layers="all"))
    out = export_hf(save(ours, tok, tmp_path / "ours"), tmp_path / "hf")
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (tok_cfg["tokenizer_class"], tok_cfg["do_lower_case"], tok_cfg["keep_accents"]) == ("AlbertTokenizer", False, False)
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in texts + ["Héllo  WORLD\t東京 😀 ﬁ", "  x  ", ""]:
        assert auto(text)["input_ids"] == tok.encode(text), text
        assert auto(text, add_special_tokens=False)["input_ids"] == tok.encode(text, add_special=False), text


@pytest.mark.parametrize("fields, field", [
    ({"share_layers": "attention"}, "share_layers"),
    ({"share_layers": "ffn"}, "share_layers"),
    ({"share_layers": "all", "use_rtd": True}, "use_rtd"),
    ({"share_layers": "all", "type_vocab_size": 0}, "type_vocab_size"),
    ({"share_layers": "all", "bias": False}, "bias"),
    ({"share_layers": "all", "norm": "pre"}, "norm"),
    ({"share_layers": "all", "position_ids": "roberta", "pad_token_id": 1}, "position_ids"),
    ({"use_rtd": True, "use_nsp": True}, "use_nsp"),
    ({"use_rtd": True, "mlp": "gated"}, "mlp"),
    ({"use_rtd": True, "position": "alibi"}, "position"),
    ({"position": "rope", "share_layers": "all"}, "share_layers"),
])
def test_what_albert_and_electra_cannot_compute_is_refused_naming_the_field(fields, field):
    with pytest.raises(ValueError, match=rf"Hugging Face layout: {field}="):
        hf_layout("encoder", EncoderConfig(**SIZES, n_layers=2, **fields))
