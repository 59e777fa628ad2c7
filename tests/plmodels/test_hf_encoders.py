"""Parity of imported RoBERTa, DistilBERT and ELECTRA checkpoints with Hugging Face transformers, and the
importers' refusals and reports. Also: the new EncoderConfig option (position_ids) leaves old
configs and checkpoints as they were.

transformers is used here only as a reference implementation; plmodels never imports it."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from plmodels import Encoder, EncoderConfig, checkpoint_hash, load, save
from plmodels.components.positions import padding_position_ids, sinusoidal_table
from plmodels.hf.encoders import (ALBERT, DISTILBERT, ELECTRA, ROBERTA, albert_config, distilbert_config,
                                  electra_config, hf_names, import_hf_distilbert, import_hf_electra, import_hf_roberta,
                                  map_family_state)
from plmodels.hf.encoders import roberta_config as our_roberta_config

from .hf_configs import ROBERTA_IDS, ROBERTA_PAD, SIZES, distil_config, roberta_config

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {"atol": 1e-4, "rtol": 0}  # max abs diff <= 1e-4
# DistilBERT (BERT vocabulary): [PAD]=0, [CLS]=2, [SEP]=3; right padding
DISTIL_IDS = torch.tensor([[2, 5, 6, 7, 8, 9, 3, 0], [2, 10, 11, 12, 3, 0, 0, 0]])


def perturb(model, also=()):
    """Non-trivial LayerNorms, biases (and the named tables) so a mapping slip shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or any(a in name for a in also):
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def roberta_mlm(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf_roberta_mlm")
    perturb(transformers.RobertaForMaskedLM(roberta_config()).eval(), also=("position_embeddings",)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def roberta_base(tmp_path_factory):
    """A RobertaModel: pooler, no LM head."""
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("hf_roberta_model")
    perturb(transformers.RobertaModel(roberta_config()).eval(), also=("position_embeddings",)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[False, True], ids=["learned", "sinusoidal"])
def distil_mlm(request, tmp_path_factory):
    torch.manual_seed(2)
    folder = tmp_path_factory.mktemp("hf_distilbert")
    model = transformers.DistilBertForMaskedLM(distil_config(sinusoidal_pos_embds=request.param)).eval()
    perturb(model).save_pretrained(folder)
    return folder


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def max_diff(ours, ref) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(ours, ref, strict=True))


def check_parity(ours, ref_out, ids, mask, ref_logits=None):
    """Every hidden state (padded rows too), every attention map and the MLM logits; returns the figures."""
    with torch.no_grad():
        o = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, attn_impl="sdpa", unpad=True).last_hidden_state
    keep = mask.bool()
    assert len(o.hidden_states) == len(ref_out.hidden_states) and len(o.attentions) == len(ref_out.attentions)
    for a, b in zip(o.hidden_states, ref_out.hidden_states, strict=True):
        assert_close(a, b, **TOL)
    for a, b in zip(o.attentions, ref_out.attentions, strict=True):
        assert_close(a, b, **TOL)
    assert_close(fast[keep], ref_out.hidden_states[-1][keep], **TOL)  # the SDPA + unpadded path too
    figures = {"hidden": max_diff(o.hidden_states, ref_out.hidden_states), "attn": max_diff(o.attentions, ref_out.attentions)}
    if ref_logits is not None:
        with torch.no_grad():
            logits = ours.mlm_logits(o.last_hidden_state)
        assert_close(logits, ref_logits, **TOL)
        figures["logits"] = float((logits - ref_logits).abs().max())
    return figures, o


# ------------------------------------------------------------------------------ RoBERTa
def test_roberta_position_ids_match_transformers():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 9, (6, 11), generator=g)  # pad id 1 anywhere: left, right, inside
    ids[0, :3] = 1
    ids[1, -4:] = 1
    ref = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids
    for pad in (0, 1, 3):
        assert torch.equal(padding_position_ids(ids, pad), ref(ids, pad))


def test_roberta_mlm_matches_transformers(roberta_mlm, tmp_path):
    with pytest.warns(UserWarning, match="pooler"):  # RobertaForMaskedLM has no pooler
        ours, tok = import_hf_roberta(roberta_mlm, tmp_path / "ckpt")
    assert tok is None  # the folder has no tokenizer files
    cfg = ours.config
    assert (cfg.position_ids, cfg.pad_token_id, cfg.type_vocab_size, cfg.max_positions) == ("roberta", 1, 1, 24 - 2)
    assert ours.embeddings.position.weight.shape == (24, 32)
    ref = transformers.RobertaForMaskedLM.from_pretrained(str(roberta_mlm), attn_implementation="eager").eval()
    mask = (ROBERTA_IDS != ROBERTA_PAD).long()
    with torch.no_grad():
        r = ref(ROBERTA_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    figures, _ = check_parity(ours, r, ROBERTA_IDS, mask, r.logits)
    print("roberta mlm max |diff|:", figures)
    # the longest input fills the table: 22 tokens use rows 2..23
    long_ids = torch.randint(3, 40, (1, 22))
    with torch.no_grad():
        assert_close(ours(long_ids).last_hidden_state, ref.roberta(long_ids).last_hidden_state, **TOL)
    with pytest.raises(ValueError, match="max_positions=22"):
        ours(torch.randint(3, 40, (1, 23)))
    # the report, and the checkpoint reloads to the same model (position_ids kept in its config)
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["family"] == "roberta" and report["mlm_head"] == "imported" and report["unknown_tensors"] == []
    assert report["fresh_init"] == ["pooler.bias", "pooler.weight"]
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())["config"]
    assert saved["position_ids"] == "roberta"
    loaded, _ = load(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.equal(loaded(ROBERTA_IDS, attention_mask=mask).last_hidden_state,
                           ours(ROBERTA_IDS, attention_mask=mask).last_hidden_state)


def test_roberta_model_without_lm_head_gets_a_reported_fresh_head(roberta_base, tmp_path):
    with pytest.warns(UserWarning, match="mlm.dense.weight"):
        ours, _ = import_hf_roberta(roberta_base, tmp_path / "ckpt", card={"note": "x"})
    card = json.loads((tmp_path / "ckpt" / "card.json").read_text())
    report = card["import"]
    assert card["note"] == "x" and report["mlm_head"] == "fresh init (not in the source checkpoint)"
    assert {"mlm.dense.weight", "mlm.norm.weight", "mlm.bias"} <= set(report["fresh_init"])
    assert not any(k.startswith("pooler") for k in report["fresh_init"])  # RobertaModel has its pooler
    ref = transformers.RobertaModel.from_pretrained(str(roberta_base), attn_implementation="eager").eval()
    mask = (ROBERTA_IDS != ROBERTA_PAD).long()
    with torch.no_grad():
        r = ref(ROBERTA_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    figures, o = check_parity(ours, r, ROBERTA_IDS, mask)
    assert_close(o.pooler_output, r.pooler_output, **TOL)
    print("roberta model max |diff|:", figures)


def copy_folder(src, dst, edit_state=None, edit_config=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit_config(cfg) if edit_config else cfg))
    state = load_file(str(src / "model.safetensors"))
    save_file(edit_state(state) if edit_state else state, str(dst / "model.safetensors"))
    return dst


def test_a_wrong_shaped_tensor_is_refused_naming_it_and_both_shapes(roberta_mlm, distil_mlm, tmp_path):
    def shrink(name):
        def edit(state):
            state[name] = state[name][:-1].contiguous()
            return state
        return edit

    bad = copy_folder(roberta_mlm, tmp_path / "r", shrink("roberta.encoder.layer.1.intermediate.dense.weight"))
    with pytest.raises(ValueError, match=r"roberta\.encoder\.layer\.1\.intermediate\.dense\.weight: expected \(48, 32\), found \(47, 32\)"):
        import_hf_roberta(bad)
    bad = copy_folder(distil_mlm, tmp_path / "d", shrink("distilbert.transformer.layer.0.attention.k_lin.bias"))
    with pytest.raises(ValueError, match=r"distilbert\.transformer\.layer\.0\.attention\.k_lin\.bias: expected \(32,\), found \(31,\)"):
        import_hf_distilbert(bad)


def test_unknown_tensors_are_listed_and_missing_ones_are_errors(roberta_mlm, tmp_path):
    def add(state):
        return {**state, "classifier.dense.weight": torch.zeros(3, 32), "roberta.encoder.layer.0.adapter.weight": torch.zeros(2)}

    folder = copy_folder(roberta_mlm, tmp_path / "extra", add)
    with pytest.warns(UserWarning, match="classifier.dense.weight"):
        import_hf_roberta(folder, tmp_path / "ckpt")
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["unknown_tensors"] == ["classifier.dense.weight", "roberta.encoder.layer.0.adapter.weight"]

    # tied duplicates of the vocabulary projection: ignored when equal, listed (with a note) when not
    def duplicates(state):
        word = state["roberta.embeddings.word_embeddings.weight"]
        return {**state, "lm_head.decoder.weight": word + 1, "lm_head.decoder.bias": state["lm_head.bias"].clone()}

    with pytest.warns(UserWarning, match="lm_head.decoder.weight"):
        ours, _ = import_hf_roberta(copy_folder(roberta_mlm, tmp_path / "dup", duplicates), tmp_path / "ckpt2")
    report = json.loads((tmp_path / "ckpt2" / "card.json").read_text())["import"]
    assert report["unknown_tensors"] == ["lm_head.decoder.weight"] and "lm_head.decoder.bias" in report["ignored_tensors"]
    assert any("tie_word_embeddings" in n for n in report["notes"])
    assert ours.mlm.decoder is None  # tied, as transformers ties it

    def drop(state):
        del state["roberta.encoder.layer.1.attention.self.key.weight"]
        return state

    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.qkv\.weight \(from roberta\.encoder\.layer\.1\.attention\.self\.query\.weight"):
        quiet(import_hf_roberta, copy_folder(roberta_mlm, tmp_path / "missing", drop))


@pytest.mark.parametrize("family, buffers", [
    (ROBERTA, ["roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids"]),
    (DISTILBERT, ["distilbert.embeddings.position_ids"]),
    (ELECTRA, ["electra.embeddings.position_ids", "electra.embeddings.token_type_ids"]),
    (ALBERT, ["albert.embeddings.position_ids", "albert.embeddings.token_type_ids"]),
])
def test_the_buffers_older_transformers_saved_are_ignored_not_unknown(family, buffers):
    # transformers before 4.31 saved these index buffers in the state dict (hub checkpoints still carry
    # them); the current transformers the parity tests use does not, so they are listed here by hand
    state = {name: torch.arange(4)[None] for name in buffers}
    state[buffers[0].replace("position_ids", "LayerNorm.gamma")] = torch.ones(4)   # a TF-era LayerNorm name
    mapped = map_family_state(state, family)
    assert mapped.ignored == buffers and mapped.unknown == []
    assert list(mapped.parts) == ["embeddings.norm.weight"]


def test_the_task_heads_are_named_outside_the_encoders_prefix():
    # a checkpoint with a task head saves the encoder under the family's prefix and the head beside it
    assert hf_names(ALBERT, "nsp.weight") == ["sop_classifier.classifier.weight"]
    assert hf_names(ALBERT, "mlm.dense.bias") == ["predictions.dense.bias"]
    assert hf_names(ALBERT, "blocks.0.norm2.weight") == [
        "albert.encoder.albert_layer_groups.0.albert_layers.0.full_layer_layer_norm.weight"]
    assert hf_names(ROBERTA, "mlm.norm.bias") == ["lm_head.layer_norm.bias"]
    assert hf_names(ROBERTA, "blocks.11.norm1.weight") == ["roberta.encoder.layer.11.attention.output.LayerNorm.weight"]
    assert hf_names(DISTILBERT, "blocks.3.mlp.fc_in.bias", prefixed=False) == ["transformer.layer.3.ffn.lin1.bias"]
    assert hf_names(DISTILBERT, "mlm.bias") == ["vocab_projector.bias"]
    assert hf_names(ELECTRA, "rtd.out.weight") == ["discriminator_predictions.dense_prediction.weight"]
    assert hf_names(ELECTRA, "blocks.1.attn.qkv.bias") == [
        f"electra.encoder.layer.1.attention.self.{p}.bias" for p in ("query", "key", "value")]


BERT_SIZES = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings"}


@pytest.mark.parametrize("ours, reference, required", [
    (our_roberta_config, transformers.RobertaConfig, BERT_SIZES),
    (electra_config, transformers.ElectraConfig, BERT_SIZES),
    (albert_config, transformers.AlbertConfig, BERT_SIZES - {"max_position_embeddings"}),
    (distilbert_config, transformers.DistilBertConfig,
     {"vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings"}),
])
def test_a_config_key_left_out_is_refused_by_name_or_read_as_transformers_default(ours, reference, required):
    # the sizes are required (refused by name when absent); every other key our config readers fall back
    # on gets the value transformers itself would use. Not embedding_size: ELECTRA's reader takes an
    # absent one as hidden_size (no projection) where ElectraConfig's default is 128; a checkpoint's
    # projection weights then fail the shape check by name.
    full = reference().to_dict()
    want = ours(full)
    refused = set()
    for key in set(full) - {"embedding_size"} if reference is transformers.ElectraConfig else full:
        try:
            got = ours({k: v for k, v in full.items() if k != key})
        except (KeyError, ValueError) as e:
            assert key in str(e)
            refused.add(key)
            continue
        assert got == want, key
    assert refused == required


@pytest.mark.parametrize("field, value", [
    ("position_embedding_type", "relative_key"), ("is_decoder", True), ("add_cross_attention", True),
    ("hidden_act", "relu"),  # the LM head is gelu regardless: refused with an LM head
    ("hidden_act", "silu"), ("model_type", "bert"), ("pad_token_id", None), ("max_position_embeddings", 2),
])
def test_roberta_config_fields_we_cannot_compute_are_refused_by_name(roberta_mlm, tmp_path, field, value):
    folder = copy_folder(roberta_mlm, tmp_path / "f", edit_config=lambda c: {**c, field: value})
    with pytest.raises(ValueError, match=field):
        import_hf_roberta(folder)


def test_a_tokenizer_we_cannot_read_is_noted_not_fatal(roberta_base, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    folder = copy_folder(roberta_base, tmp_path / "f")
    HFTokenizer(models.Unigram([("<pad>", 0.0), ("a", -1.0)], unk_id=None)).save(str(folder / "tokenizer.json"))
    with pytest.warns(UserWarning, match="tokenizer not loaded"):
        _, tok = import_hf_roberta(folder, tmp_path / "ckpt")
    assert tok is None and not (tmp_path / "ckpt" / "tokenizer").exists()
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert any(n.startswith("tokenizer not loaded") and "Unigram" in n for n in report["notes"])


def test_roberta_relu_without_lm_head_imports(roberta_base, tmp_path):
    folder = copy_folder(roberta_base, tmp_path / "f", edit_config=lambda c: {**c, "hidden_act": "relu"})
    ours, _ = quiet(import_hf_roberta, folder)
    assert ours.config.activation == "relu"


def test_untied_roberta_uses_its_own_decoder(tmp_path):
    torch.manual_seed(3)
    model = perturb(transformers.RobertaForMaskedLM(roberta_config(tie_word_embeddings=False)).eval())
    model.save_pretrained(tmp_path / "hf")
    ours, _ = quiet(import_hf_roberta, tmp_path / "hf")
    assert ours.config.tie_embeddings is False and ours.mlm.decoder is not None
    ref = transformers.RobertaForMaskedLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    mask = (ROBERTA_IDS != ROBERTA_PAD).long()
    with torch.no_grad():
        assert_close(ours.mlm_logits(ours(ROBERTA_IDS, attention_mask=mask).last_hidden_state),
                     ref(ROBERTA_IDS, attention_mask=mask).logits, **TOL)


# ------------------------------------------------------------------------------ DistilBERT
def test_distilbert_mlm_matches_transformers(distil_mlm, tmp_path):
    with pytest.warns(UserWarning, match="pooler"):  # DistilBERT never has a pooler
        ours, _ = import_hf_distilbert(distil_mlm, tmp_path / "ckpt")
    assert ours.config.type_vocab_size == 0 and ours.embeddings.segment is None
    assert ours.config.position_ids == "index" and ours.config.layer_norm_eps == 1e-12
    ref = transformers.DistilBertForMaskedLM.from_pretrained(str(distil_mlm), attn_implementation="eager").eval()
    mask = (DISTIL_IDS != 0).long()
    with torch.no_grad():
        r = ref(DISTIL_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    figures, _ = check_parity(ours, r, DISTIL_IDS, mask, r.logits)
    print("distilbert max |diff|:", figures)
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["mlm_head"] == "imported" and report["unknown_tensors"] == []
    assert report["fresh_init"] == ["pooler.bias", "pooler.weight"]
    sinusoidal = json.loads((distil_mlm / "config.json").read_text())["sinusoidal_pos_embds"]
    assert any("sinusoidal_pos_embds" in n for n in report["notes"]) == sinusoidal
    if sinusoidal:  # transformers stores the formula's table
        assert_close(ours.embeddings.position.weight, sinusoidal_table(24, 32), atol=1e-6, rtol=0)


def test_distilbert_sinusoidal_table_missing_from_the_file_is_computed(tmp_path):
    torch.manual_seed(4)
    model = perturb(transformers.DistilBertForMaskedLM(distil_config(sinusoidal_pos_embds=True)).eval())
    model.save_pretrained(tmp_path / "full")

    def drop(state):
        del state["distilbert.embeddings.position_embeddings.weight"]
        return state

    folder = copy_folder(tmp_path / "full", tmp_path / "cut", drop)
    with pytest.warns(UserWarning, match="computed"):
        ours, _ = import_hf_distilbert(folder)
    mask = (DISTIL_IDS != 0).long()
    with torch.no_grad():
        assert_close(ours(DISTIL_IDS, attention_mask=mask).last_hidden_state,
                     model.distilbert(DISTIL_IDS, attention_mask=mask).last_hidden_state, **TOL)
    # without sinusoidal_pos_embds the same file is an error naming the tensor
    folder = copy_folder(folder, tmp_path / "cut2", edit_config=lambda c: {**c, "sinusoidal_pos_embds": False})
    with pytest.raises(ValueError, match="embeddings.position.weight.*distilbert.embeddings.position_embeddings.weight"):
        quiet(import_hf_distilbert, folder)


@pytest.mark.parametrize("field, value", [("activation", "silu"), ("model_type", "roberta")])
def test_distilbert_config_fields_we_cannot_compute_are_refused_by_name(distil_mlm, tmp_path, field, value):
    folder = copy_folder(distil_mlm, tmp_path / "f", edit_config=lambda c: {**c, field: value})
    with pytest.raises(ValueError, match=field):
        import_hf_distilbert(folder)


# ------------------------------------------------------------------------------ old configs
OLD_STYLE = {  # an EncoderConfig as checkpoints wrote it before position_ids existed
    "vocab_size": 61, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 48, "max_positions": 16,
    "position": "learned", "norm": "post", "activation": "gelu", "mlp": "plain", "bias": True, "dropout": 0.1,
    "layer_norm_eps": 1e-12, "tie_embeddings": True, "type_vocab_size": 2, "use_nsp": False, "pad_token_id": 0,
    "pruned_heads": {},
}


def test_old_style_configs_load_and_save_unchanged(tmp_path):
    cfg = EncoderConfig.from_dict(OLD_STYLE, "old config.json")
    assert cfg.position_ids == "index" and cfg.position_rows == 16
    assert cfg.to_dict() == OLD_STYLE  # the new field is left out at its default: same config.json bytes
    torch.manual_seed(0)
    model = Encoder(cfg)
    assert model.embeddings.position.weight.shape == (16, 32)
    path = save(model, None, tmp_path / "m")
    assert json.loads((path / "config.json").read_text())["config"] == OLD_STYLE
    assert checkpoint_hash(path) == checkpoint_hash(save(load(path)[0], None, tmp_path / "m2"))
    # the option round-trips when used, and is checked
    rob = EncoderConfig.from_dict({**OLD_STYLE, "position_ids": "roberta", "pad_token_id": 1})
    assert rob.position_rows == 16 + 2 and EncoderConfig.from_dict(rob.to_dict()) == rob
    with pytest.raises(ValueError, match="position_ids"):
        EncoderConfig.from_dict({**OLD_STYLE, "position_ids": "roberta", "position": "rope"})
    with pytest.raises(ValueError, match="position_ids"):
        EncoderConfig.from_dict({**OLD_STYLE, "position_ids": "fairseq"})


# ------------------------------------------------------------------------------ ELECTRA
ELECTRA_IDS = torch.tensor([[2, 5, 6, 7, 8, 9, 3, 0], [2, 10, 11, 12, 3, 0, 0, 0]])   # BERT vocabulary, right padding


def electra_config(**overrides):
    # embedding_size 16 < hidden 32: the tables are projected, as in every released ELECTRA
    return transformers.ElectraConfig(**{**SIZES, "hidden_size": 32, "embedding_size": 16,
                                         "max_position_embeddings": 24, **overrides})


@pytest.mark.parametrize("head", ["discriminator", "generator"])
def test_electra_matches_transformers(head, tmp_path):
    torch.manual_seed(0)
    cls = transformers.ElectraForPreTraining if head == "discriminator" else transformers.ElectraForMaskedLM
    perturb(cls(electra_config()).eval()).save_pretrained(tmp_path / "hf")
    ours, _ = quiet(import_hf_electra, tmp_path / "hf", tmp_path / "ckpt")
    assert ours.config.embedding_size == 16 and ours.embeddings.project.weight.shape == (32, 16)
    assert ours.config.use_rtd == (head == "discriminator")
    ref = cls.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    mask = (ELECTRA_IDS != 0).long()
    with torch.no_grad():
        r = ref(ELECTRA_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    if head == "generator":
        figures, _ = check_parity(ours, r, ELECTRA_IDS, mask, r.logits)
    else:
        figures, o = check_parity(ours, r, ELECTRA_IDS, mask)
        with torch.no_grad():
            rtd = ours.rtd_logits(o.last_hidden_state)
        assert_close(rtd, r.logits, **TOL)                       # replaced-token logits per position
        figures["rtd"] = float((rtd - r.logits).abs().max())
        report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
        assert "mlm.dense.weight" in report["fresh_init"]        # a discriminator has no MLM head
    print(f"electra {head} max |diff|:", figures)


def test_electra_round_trips_through_our_checkpoint(tmp_path):
    torch.manual_seed(1)
    perturb(transformers.ElectraForPreTraining(electra_config()).eval()).save_pretrained(tmp_path / "hf")
    ours, _ = quiet(import_hf_electra, tmp_path / "hf", tmp_path / "ckpt")
    again, _ = load(tmp_path / "ckpt")
    with torch.no_grad():
        a = ours(ELECTRA_IDS, attention_mask=(ELECTRA_IDS != 0).long()).last_hidden_state
        b = again(ELECTRA_IDS, attention_mask=(ELECTRA_IDS != 0).long()).last_hidden_state
    assert torch.equal(a, b) and again.config.embedding_size == 16 and again.rtd is not None
