"""Parity of imported ALBERT checkpoints (Lan et al. 2020) with Hugging Face transformers: one layer
shared by every depth (our share_layers="all"), factorised embeddings E -> D, the MLM head and the
sentence-order head; the importer's refusals; and the SentencePiece (Unigram) tokenizer, whose ids
equal transformers' AlbertTokenizer on edge-case text.

transformers is used here only as a reference implementation; plmodels never imports it."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import normalizers, pre_tokenizers
from torch.testing import assert_close

from plmodels import load
from plmodels.hf.encoders import import_hf_albert
from plmodels.hf.registry import import_hf
from plmodels.tokenizer import Tokenizer, albert_pipeline

from .hf_configs import albert_config
from .hf_files import ALBERT_EDGE, ALBERT_TEXTS, unigram_folder

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {"atol": 1e-4, "rtol": 0}  # max abs diff <= 1e-4
# ALBERT's vocabulary order: <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4; right padding in rows 1 and 2
IDS = torch.tensor([[2, 5, 6, 7, 3, 8, 9, 3], [2, 10, 11, 12, 3, 0, 0, 0], [2, 13, 3, 14, 15, 3, 0, 0]])
TYPES = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0]])


def perturb(model):
    """Non-trivial LayerNorms and biases, so a mapping slip shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.fixture(scope="module", params=["AlbertForPreTraining", "AlbertForMaskedLM"])
def albert_folder(request, tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(request.param)
    act = "gelu_new" if request.param == "AlbertForPreTraining" else "gelu"
    perturb(getattr(transformers, request.param)(albert_config(hidden_act=act))).save_pretrained(folder)
    return folder, request.param


def test_albert_matches_transformers(albert_folder, tmp_path):
    folder, cls = albert_folder
    pretraining = cls == "AlbertForPreTraining"
    if pretraining:
        ours, tok = import_hf(folder, tmp_path / "ckpt")  # the dispatcher, no warning: every tensor is mapped
    else:
        with pytest.warns(UserWarning, match="pooler"):  # AlbertForMaskedLM has no pooler
            ours, tok = import_hf(folder, tmp_path / "ckpt")
    assert tok is None  # no tokenizer files in the folder
    cfg = ours.config
    assert (cfg.share_layers, cfg.embedding_size, cfg.use_nsp, cfg.layer_norm_eps) == ("all", 16, pretraining, 1e-6)
    assert cfg.activation == ("gelu_tanh" if pretraining else "gelu")
    # one layer serves every depth: the very same Parameter objects
    for l in (1, 2):
        assert ours.blocks[l].attn.qkv.weight is ours.blocks[0].attn.qkv.weight
        assert ours.blocks[l].mlp.fc_out.bias is ours.blocks[0].mlp.fc_out.bias
        assert ours.blocks[l].norm2.weight is ours.blocks[0].norm2.weight
    ref = getattr(transformers, cls).from_pretrained(str(folder), attn_implementation="eager").eval()
    mask = (IDS != 0).long()
    with torch.no_grad():
        r = ref(IDS, attention_mask=mask, token_type_ids=TYPES, output_hidden_states=True, output_attentions=True)
        o = ours(IDS, attention_mask=mask, token_type_ids=TYPES, output_hidden_states=True, output_attentions=True)
        fast = ours(IDS, attention_mask=mask, token_type_ids=TYPES, attn_impl="sdpa", unpad=True).last_hidden_state
        logits = ours.mlm_logits(o.last_hidden_state)
    assert len(o.hidden_states) == len(r.hidden_states) == 4 and len(o.attentions) == len(r.attentions) == 3
    for a, b in zip(o.hidden_states, r.hidden_states, strict=True):  # padded rows too
        assert_close(a, b, **TOL)
    for a, b in zip(o.attentions, r.attentions, strict=True):
        assert_close(a, b, **TOL)
    keep = mask.bool()
    assert_close(fast[keep], r.hidden_states[-1][keep], **TOL)  # the SDPA + unpadded path too
    ref_logits = r.prediction_logits if pretraining else r.logits
    assert_close(logits, ref_logits, **TOL)
    figures = {"hidden": max(float((a - b).abs().max()) for a, b in zip(o.hidden_states, r.hidden_states)),
               "attn": max(float((a - b).abs().max()) for a, b in zip(o.attentions, r.attentions)),
               "mlm": float((logits - ref_logits).abs().max())}
    if pretraining:  # the sentence-order head, on the pooled [CLS]: index 0 = original order, as our sop_pairs
        with torch.no_grad():
            sop = ours.nsp_logits(o.pooler_output)
        assert_close(sop, r.sop_logits, **TOL)
        figures["sop"] = float((sop - r.sop_logits).abs().max())
    print(f"albert {cls} max |diff|:", figures)
    # the report, and the checkpoint (each shared tensor stored once) reloads to the same, still tied, model
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["family"] == "albert" and report["mlm_head"] == "imported" and report["unknown_tensors"] == []
    assert report["fresh_init"] == ([] if pretraining else ["pooler.bias", "pooler.weight"])
    stored = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert "blocks.0.attn.qkv.weight" in stored and not any(k.startswith(("blocks.1.", "blocks.2.")) for k in stored)
    again, _ = load(tmp_path / "ckpt")
    assert again.blocks[2].attn.qkv.weight is again.blocks[0].attn.qkv.weight
    with torch.no_grad():
        assert torch.equal(again(IDS, attention_mask=mask, token_type_ids=TYPES).last_hidden_state,
                           ours(IDS, attention_mask=mask, token_type_ids=TYPES).last_hidden_state)


def test_albert_model_without_heads_gets_fresh_reported_heads(tmp_path):
    torch.manual_seed(1)
    perturb(transformers.AlbertModel(albert_config())).save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="mlm.dense.weight"):
        ours, _ = import_hf_albert(tmp_path / "hf", tmp_path / "ckpt")
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["mlm_head"].startswith("fresh init") and not ours.config.use_nsp
    ref = transformers.AlbertModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    mask = (IDS != 0).long()
    with torch.no_grad():
        r, o = ref(IDS, attention_mask=mask), ours(IDS, attention_mask=mask)
    assert_close(o.last_hidden_state, r.last_hidden_state, **TOL)
    assert_close(o.pooler_output, r.pooler_output, **TOL)


def copy_folder(src, dst, edit_state=None, edit_config=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit_config(cfg) if edit_config else cfg))
    state = load_file(str(src / "model.safetensors"))
    save_file(edit_state(state) if edit_state else state, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("field, value", [
    ("num_hidden_groups", 2), ("inner_group_num", 2), ("hidden_act", "silu"),
    ("position_embedding_type", "relative_key"), ("model_type", "bert"),
])
def test_albert_config_fields_we_cannot_compute_are_refused_by_name(albert_folder, tmp_path, field, value):
    folder = copy_folder(albert_folder[0], tmp_path / "f", edit_config=lambda c: {**c, field: value})
    with pytest.raises(ValueError, match=field):
        import_hf_albert(folder)


def test_albert_with_embedding_size_equal_to_hidden_size(tmp_path):
    """ALBERT projects E -> D even when E = D: an identity projection is dropped (reported), another refused."""
    torch.manual_seed(2)
    model = perturb(transformers.AlbertForMaskedLM(albert_config(embedding_size=32)))
    mapping = model.albert.encoder.embedding_hidden_mapping_in
    with torch.no_grad():
        mapping.weight.copy_(torch.eye(32))
        mapping.bias.zero_()
    model.save_pretrained(tmp_path / "identity")
    ours, _ = quiet(import_hf_albert, tmp_path / "identity", tmp_path / "ckpt")
    assert ours.config.embedding_size is None and ours.embeddings.project is None
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert "albert.encoder.embedding_hidden_mapping_in.weight" in report["ignored_tensors"]
    assert any("identity" in n for n in report["notes"])
    mask = (IDS != 0).long()
    with torch.no_grad():
        assert_close(ours.mlm_logits(ours(IDS, attention_mask=mask).last_hidden_state),
                     model(IDS, attention_mask=mask).logits, **TOL)

    def skew(state):
        state["albert.encoder.embedding_hidden_mapping_in.weight"][0, 1] = 0.5
        return state

    with pytest.raises(ValueError, match="embedding_size"):
        import_hf_albert(copy_folder(tmp_path / "identity", tmp_path / "skewed", skew))


# ------------------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("pipeline", ["albert", "other"])
def test_albert_tokenizer_ids_equal_transformers(tmp_path, pipeline):
    """'other': the tokenizer.json's own normalizer (NFKC, no lowercasing) and pre-tokenizer differ from
    ALBERT's; transformers' AlbertTokenizer rebuilds them from tokenizer_config.json, and so do we."""
    if pipeline == "albert":
        normalizer, pre, _ = albert_pipeline()
    else:
        normalizer, pre = normalizers.NFKC(), pre_tokenizers.Metaspace(prepend_scheme="first")
    folder = unigram_folder(tmp_path / "tok", normalizer, pre)
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer.from_hf_folder(folder)
    assert ours.kind == "unigram" and ours.lowercase
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
    assert ours.special_affixes == ([2], [3]) and ours.doc_sep_id == 3
    for text in ALBERT_EDGE + ALBERT_TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.encode(text, add_special=False) == ref(text, add_special_tokens=False)["input_ids"], text
    # pre-split words give the running text's ids, and the spans cover them
    words = ["Héllo", "WORLD", "café", "東京"]
    enc = ours.encode_words(words)
    assert enc.ids == ours.encode(" ".join(words)) and enc.word_spans[0][0] == 1 and enc.word_spans[-1][1] == len(enc.ids) - 1
    # the workbench's own save / load keeps the ids
    ours.save(tmp_path / "saved")
    again = Tokenizer.load(tmp_path / "saved")
    assert again.kind == "unigram" and all(again.encode(t) == ours.encode(t) for t in ALBERT_EDGE)


def test_albert_import_reads_its_tokenizer(albert_folder, tmp_path):
    folder = copy_folder(albert_folder[0], tmp_path / "f")
    unigram_folder(folder, *albert_pipeline()[:2])
    # a copied folder keeps config.json's model_type albert; the tokenizer files come from save_pretrained
    _, tok = quiet(import_hf, folder, tmp_path / "ckpt")
    assert tok is not None and tok.kind == "unigram"
    assert tok.encode("Héllo WORLD") == transformers.AutoTokenizer.from_pretrained(str(folder))("Héllo WORLD")["input_ids"]
    _, saved = load(tmp_path / "ckpt")
    assert saved.kind == "unigram" and saved.encode(ALBERT_EDGE[0]) == tok.encode(ALBERT_EDGE[0])
