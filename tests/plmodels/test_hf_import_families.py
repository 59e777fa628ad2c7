"""`import_hf` on saved transformers folders of T5, BART and XLNet: the family is read from
config.json, the weights from model.safetensors, and the imported model computes what transformers
computes (logits to 1e-4 on padded batches; the state-dict converters behind it are parity-tested
layer by layer in test_seq2seq_parity.py and test_xlnet.py). The saved checkpoint reads back to the
same tensors; a tokenizer the workbench cannot read yet is a note in the card, not a failure; a
config field we cannot compute is an error naming the file and the field."""
from __future__ import annotations

import json

import pytest
import torch

import plmodels
from plmodels.hf.registry import IMPORTERS, import_hf
from plmodels.hf.seq2seq import bart_config, t5_config
from plmodels.hf.xlnet import from_hf_xlnet_state_dict, xlnet_config
from tests.plmodels.hf_bert_folder import save_bert_folder
from tests.plmodels.hf_configs import CASES, albert_config, distil_config, neox_config, roberta_config
from tests.plmodels.hf_files import write_roberta_files
from tests.plmodels.hf_models import hf_bart, hf_gpt2, hf_t5, hf_xlnet, seq2seq_batch, xlnet_batch
from tests.plmodels.kinds import assert_same_weights

transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:import_hf_")]

ATOL = 1e-4   # as test_seq2seq_parity.py and test_xlnet.py


def _seq2seq_logits(model, pad: int):
    ids, mask, dec, dec_mask = seq2seq_batch(pad=pad)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    return out.logits[dec_mask.bool()]


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_seq2seq_folder_imports_and_round_trips(tmp_path, family):
    hf = hf_t5() if family == "t5" else hf_bart()
    pad = hf.config.pad_token_id
    hf.save_pretrained(tmp_path / "hf")
    model, tok = import_hf(tmp_path / "hf", tmp_path / "ours")
    assert type(model).__name__ == "Seq2Seq" and not model.training
    torch.testing.assert_close(_seq2seq_logits(model, pad), _seq2seq_logits(hf, pad), atol=ATOL, rtol=0)
    back, _ = plmodels.load(tmp_path / "ours")
    assert_same_weights(model.state_dict(), back.state_dict())
    report = json.loads((tmp_path / "ours" / "card.json").read_text())["import"]
    assert report["family"] == family and tok is None
    assert report["notes"] == ["tokenizer not loaded: the folder has no tokenizer files"]


def test_bart_folder_with_its_byte_level_bpe_reads_the_tokenizer(tmp_path):
    folder = tmp_path / "hf"
    n = write_roberta_files(folder)  # BART's tokenizer files are RoBERTa's (<s> </s> <pad> <unk> <mask>)
    hf_bart().save_pretrained(folder)
    model, tok = import_hf(folder)
    assert tok is not None and tok.vocab_size == n
    assert tok.pad_id == model.config.pad_token_id == 1


def test_xlnet_folder_imports_and_round_trips(tmp_path):
    hf = hf_xlnet()
    hf.save_pretrained(tmp_path / "hf")
    model, tok = import_hf(tmp_path / "hf", tmp_path / "ours")
    assert type(model).__name__ == "XLNet"
    ids, mask, tt = xlnet_batch()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, token_type_ids=tt).logits
        ref = hf(ids, attention_mask=mask, token_type_ids=tt, use_mems=False).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], ref[real], atol=ATOL, rtol=0)
    back, _ = plmodels.load(tmp_path / "ours")
    assert_same_weights(model.state_dict(), back.state_dict())
    assert tok is None


def test_a_field_we_cannot_compute_names_the_file_and_the_field(tmp_path):
    hf_t5().save_pretrained(tmp_path / "hf")
    cfg_path = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["feed_forward_proj"] = "gated-silu"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json \(t5\): feed_forward_proj='gated-silu'"):
        import_hf(tmp_path / "hf")


def test_a_tensor_missing_from_the_folder_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_xlnet().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    state = {k: v for k, v in load_file(str(path)).items() if "layer.1.ff.layer_2.weight" not in k}
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"blocks\.1\.fc_out\.weight"):
        import_hf(tmp_path / "hf")


def _tiny_folders(root) -> dict:
    """One small random folder per family, as transformers saves it (no tokenizer files)."""
    torch.manual_seed(0)
    bert = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=48, max_position_embeddings=24)
    models = {
        "roberta": transformers.RobertaForMaskedLM(roberta_config()),
        "xlm-roberta": transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(**roberta_config().to_dict())),
        "distilbert": transformers.DistilBertForMaskedLM(distil_config()),
        "electra": transformers.ElectraForPreTraining(transformers.ElectraConfig(
            vocab_size=40, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=24)),
        "albert": transformers.AlbertForMaskedLM(albert_config()),
        "gpt2": hf_gpt2(50, True, 0), "gpt_neox": transformers.GPTNeoXForCausalLM(neox_config(*CASES["pythia"])),
        "t5": hf_t5(), "bart": hf_bart(), "xlnet": hf_xlnet(),
    }
    folders = {"bert": save_bert_folder(transformers.BertForPreTraining(bert), root / "bert")}
    for family, model in models.items():
        model.save_pretrained(root / family)
        folders[family] = root / family
    return folders


def test_every_family_reports_the_same_fields(tmp_path):
    """The card's import report answers the same questions for every family (docs/interop.md,
    "Import report"): where from, which family and weights file, what was not mapped, ignored or
    left at a fresh init, the tokenizer, notes."""
    folders = _tiny_folders(tmp_path / "hf")
    assert sorted(folders) == sorted(IMPORTERS)
    shared = {"source", "family", "weights", "unknown_tensors", "ignored_tensors", "fresh_init", "tokenizer", "notes"}
    for family, folder in folders.items():
        import_hf(folder, tmp_path / "ckpt" / family)
        report = json.loads((tmp_path / "ckpt" / family / "card.json").read_text())["import"]
        assert shared <= set(report), (family, shared - set(report))
        assert report["family"] == family and report["weights"] == "model.safetensors", family
        assert report["unknown_tensors"] == [], family
        assert (report["tokenizer"] is None) == (family != "bert"), family  # only the BERT folder has vocab.txt


@pytest.mark.parametrize("ours, reference, required", [
    (t5_config, "T5Config", {"vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                             "relative_attention_num_buckets"}),
    # BART's encoder and decoder share one size here: leaving one side out differs from the other
    (bart_config, "BartConfig", {"vocab_size", "d_model", "max_position_embeddings", "encoder_layers",
                                 "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads",
                                 "decoder_attention_heads"}),
    (xlnet_config, "XLNetConfig", {"vocab_size", "d_model", "n_layer", "n_head", "d_inner"}),
])
def test_a_config_key_left_out_is_refused_by_name_or_read_as_transformers_default(ours, reference, required):
    # the sizes are required; every other key falls back on the value transformers would use (the
    # parity tests always pass the full dict, so they cannot see a wrong fallback)
    full = getattr(transformers, reference)().to_dict()
    want = ours(full)
    refused = set()
    for key in full:
        try:
            got = ours({k: v for k, v in full.items() if k != key})
        except ValueError as e:
            assert key in str(e)
            refused.add(key)
            continue
        assert got == want, key
    assert refused == required


def test_t5_max_positions_from_n_positions_of_older_configs():
    # transformers 4's T5 config.json carried n_positions (t5-small: 512); newer ones leave it out
    full = transformers.T5Config().to_dict()
    assert t5_config({**full, "n_positions": 1024}).max_positions == 1024
    assert t5_config(full).max_positions == 512


def test_xlnet_config_activations_and_head_size_by_hand():
    full = transformers.XLNetConfig().to_dict()
    for act, ours in (("gelu", "gelu"), ("relu", "relu"), ("gelu_new", "gelu_tanh")):
        assert xlnet_config({**full, "ff_activation": act}).activation == ours
    # without d_head it is d_model // n_head, which must give back d_model: 10 = 3 x 3 + 1 is refused
    small = {k: v for k, v in full.items() if k != "d_head"}
    with pytest.raises(ValueError, match="x n_head=3 != d_model=10"):
        xlnet_config({**small, "d_model": 10, "n_head": 3})


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_xlnet_tied_lm_loss_is_checked_against_the_embeddings_with_or_without_prefix(prefix):
    # lm_loss.weight is the word embedding table (tied): dropped when equal, refused when not; a state
    # without an LM bias gets zeros
    W = torch.arange(6.0).reshape(3, 2)
    got = from_hf_xlnet_state_dict({prefix + "word_embedding.weight": W, "lm_loss.weight": W.clone()})
    assert list(got) == ["word_embedding.weight", "lm_bias"] and got["lm_bias"].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="lm_loss.weight differs from the word embeddings"):
        from_hf_xlnet_state_dict({prefix + "word_embedding.weight": W, "lm_loss.weight": W + 1})


def test_t5_and_bart_configs_read_each_field_from_its_key():
    # values away from every default, so a field read from a misspelt key (and so its fallback) shows
    t5 = t5_config(transformers.T5Config(
        pad_token_id=5, decoder_start_token_id=6, dropout_rate=0.2, layer_norm_epsilon=1e-5, n_positions=1024,
        relative_attention_max_distance=64, num_decoder_layers=3, feed_forward_proj="gated-gelu").to_dict())
    assert (t5.pad_token_id, t5.decoder_start_token_id, t5.dropout, t5.layer_norm_eps, t5.max_positions,
            t5.relative_max_distance, t5.n_decoder_layers, t5.activation, t5.mlp) == (
        5, 6, 0.2, 1e-5, 1024, 64, 3, "gelu_tanh", "gated")
    bart = bart_config(transformers.BartConfig(
        pad_token_id=5, decoder_start_token_id=6, dropout=0.2, scale_embedding=True, activation_function="relu",
        decoder_layers=3).to_dict())
    assert (bart.pad_token_id, bart.decoder_start_token_id, bart.dropout, bart.scale_embedding, bart.activation,
            bart.n_decoder_layers) == (5, 6, 0.2, True, "relu", 3)


def test_xlnet_config_reads_each_field_from_its_key_and_refuses_what_it_cannot_compute():
    # values away from every default, so a field read from a misspelt key (and so its fallback) shows
    x = xlnet_config(transformers.XLNetConfig(dropout=0.2, layer_norm_eps=1e-5, bi_data=True, clamp_len=7,
                                              attn_type="uni", ff_activation="relu").to_dict())
    assert (x.dropout, x.layer_norm_eps, x.bi_data, x.clamp_len, x.attn_type, x.activation) == (
        0.2, 1e-5, True, 7, "uni", "relu")
    # refused by name: same_length under the causal mask (ours has no same-length mask), an untied LM head
    full = transformers.XLNetConfig().to_dict()
    with pytest.raises(ValueError, match="same_length=True with attn_type='uni'"):
        xlnet_config({**full, "attn_type": "uni", "same_length": True})
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        xlnet_config({**full, "tie_word_embeddings": False})
    # each alone is read: same_length changes nothing under the bidirectional mask (transformers builds
    # its mask only for attn_type 'uni'), and a tied head is ours
    assert xlnet_config({**full, "same_length": True}) == xlnet_config({**full, "tie_word_embeddings": True}) \
        == xlnet_config(full)
