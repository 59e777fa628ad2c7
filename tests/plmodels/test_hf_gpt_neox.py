"""Parity of imported GPT-NeoX checkpoints (Pythia's layout) with transformers' GPTNeoXForCausalLM.

Small random GPTNeoXForCausalLM models (LayerNorms and biases perturbed so a mapping slip shows)
are saved with save_pretrained and imported; on a batch with right and left padding, every hidden
state, every attention map and the logits agree to 1e-5 (fp32) at the real tokens, on the eager and
on the SDPA + unpadded path, for the hard cases: a quarter and all of each head rotated, parallel
residual on and off, tied and untied heads, another RoPE base. Then Pythia's older file layout
(pytorch_model.bin with `embed_out`, rotary_pct / rotary_emb_base fields and the attention buffers),
the refusals, and the tokenizer.

transformers is used here only as a reference implementation; plmodels never imports it."""

import json
import re
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from plmodels import Decoder, DecoderConfig, load
from plmodels.hf.registry import import_hf
from plmodels.hf.gpt_neox import config_from_neox, import_hf_gpt_neox, map_neox_state, neox_name, neox_qkv_to_ours

from .hf_configs import CASES, NEOX_H as H, NEOX_V as V, neox_config
from .hf_files import TEXTS, write_gpt2_files

# transformers is the reference implementation, one of the test extras: without it this module is
# skipped at collection, not failed
transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {"atol": 1e-5, "rtol": 0}
def perturbed(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.fixture(scope="module", params=list(CASES))
def neox_folder(request, tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(request.param)
    perturbed(transformers.GPTNeoXForCausalLM(neox_config(*CASES[request.param]))).save_pretrained(folder)
    return folder, request.param


def padded_batch():
    """Row 1 right-padded from 6, row 2 left-padded to 3: positions are 0..T-1 in both models."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, :3] = 0
    return ids, mask


def test_gpt_neox_matches_transformers(neox_folder, tmp_path):
    folder, case = neox_folder
    pct, parallel, tie, base = CASES[case]
    ours, tok = import_hf(folder, tmp_path / "ckpt")  # the dispatcher; no warning: every tensor is mapped
    assert tok is None
    cfg = ours.config
    assert (cfg.position, cfg.parallel_residual, cfg.tie_embeddings, cfg.rope_base) == ("rope", parallel, tie, base)
    assert cfg.rope_dims == int(8 * pct) and (cfg.rotary_dims is None) == (pct == 1.0)
    ref = transformers.GPTNeoXForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    ids, mask = padded_batch()
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        o = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, attn_impl="sdpa", unpad=True)
    assert len(o.hidden_states) == len(r.hidden_states) == 4 and len(o.attentions) == len(r.attentions) == 3
    for a, b in zip(o.hidden_states[:-1], r.hidden_states[:-1], strict=True):
        assert_close(a[keep], b[keep], **TOL)
    # GPT-NeoX's hidden_states[L] is after final_layer_norm: our last_hidden_state (hidden_states[L] is before)
    assert_close(o.last_hidden_state[keep], r.hidden_states[-1][keep], **TOL)
    assert_close(ours.final_norm(o.hidden_states[-1])[keep], r.hidden_states[-1][keep], **TOL)
    for a, b in zip(o.attentions, r.attentions, strict=True):  # every key, at the real query rows
        assert_close(a.transpose(1, 2)[keep], b.transpose(1, 2)[keep], **TOL)
    assert_close(o.logits[keep], r.logits[keep], **TOL)
    assert_close(fast.logits[keep], r.logits[keep], **TOL)
    figures = {"hidden": max(float((a - b)[keep].abs().max()) for a, b in zip(o.hidden_states[:-1], r.hidden_states)),
               "attn": max(float((a - b).transpose(1, 2)[keep].abs().max()) for a, b in zip(o.attentions, r.attentions)),
               "logits": float((o.logits - r.logits)[keep].abs().max())}
    print(f"gpt_neox {case} max |diff|:", figures)
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["family"] == "gpt_neox" and report["weights"] == "model.safetensors"
    assert report["unknown_tensors"] == [] and report["fresh_init"] == []
    assert report["lm_head"] == ("tied to embed_in" if tie else "untied (the checkpoint's own embed_out.weight)")
    assert report["rotary"] == f"RoPE on {int(8 * pct)} of 8 channels per head, base {base}"
    assert report["residual"].startswith("parallel" if parallel else "sequential")
    again, _ = load(tmp_path / "ckpt")
    assert again.config == cfg
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask, attn_impl="eager").logits, o.logits)


def test_partial_rotary_is_what_makes_parity():
    """The mutation check of the partial-rotary path: the same weights read as rotating every channel
    (rotary_dims=None) no longer match transformers' rotary_pct=0.25 model."""
    torch.manual_seed(4)
    ref = perturbed(transformers.GPTNeoXForCausalLM(neox_config(*CASES["pythia"])))
    state = {k: v for k, v in ref.state_dict().items()}
    mapped, unknown, _ = map_neox_state(state, H)
    assert unknown == []
    ids, _ = padded_batch()
    with torch.no_grad():
        want = ref(ids).logits
        for rotary, parallel, close in ((2, True, True), (None, True, False), (2, False, False)):
            cfg = config_from_neox(ref.config.to_dict())
            model = Decoder(DecoderConfig.from_dict({**cfg.to_dict(), "rotary_dims": rotary,
                                                     "parallel_residual": parallel})).eval()
            model.load_state_dict(mapped)
            gap = float((model(ids).logits - want).abs().max())
            assert (gap <= 1e-5) == close, (rotary, parallel, gap)


def test_fused_qkv_is_regrouped_from_per_head_to_per_projection():
    # rows of query_key_value: head h holds [q_h; k_h; v_h], each Dh = 2 rows; row r gets the value r
    t = torch.arange(12.0)[:, None].repeat(1, 3)  # (3 D, D) with H = 2, Dh = 2
    ours = neox_qkv_to_ours(t, n_heads=2)[:, 0].tolist()
    # ours: [q_0, q_1, k_0, k_1, v_0, v_1] = rows [0,1, 6,7 | 2,3, 8,9 | 4,5, 10,11]
    assert ours == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    assert neox_qkv_to_ours(torch.arange(12.0), n_heads=2).tolist() == ours  # the bias alike


def test_pythia_file_layout_pickle_with_buffers_and_embed_out(tmp_path):
    """Pythia's released folders: pytorch_model.bin with `embed_out.weight`, the causal-mask buffers
    attention.bias / masked_bias and rotary_emb.inv_freq, and rotary_pct / rotary_emb_base fields
    (half of each head rotated, so inv_freq has two values and tells the base)."""
    torch.manual_seed(2)
    ref = perturbed(transformers.GPTNeoXForCausalLM(neox_config(0.5, True, False, 10000)))
    state = {("embed_out.weight" if k == "lm_head.weight" else k): v.clone() for k, v in ref.state_dict().items()}
    R = 4
    for l in range(3):
        state[f"gpt_neox.layers.{l}.attention.bias"] = torch.ones(24, 24, dtype=torch.bool).tril()[None, None]
        state[f"gpt_neox.layers.{l}.attention.masked_bias"] = torch.tensor(-1e9)
        state[f"gpt_neox.layers.{l}.attention.rotary_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, R, 2).float() / R)
    folder = tmp_path / "pythia"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    hf = {k: v for k, v in ref.config.to_dict().items() if k != "rope_parameters"}
    (folder / "config.json").write_text(json.dumps({**hf, "rotary_pct": 0.5, "rotary_emb_base": 10000}))
    ours, _ = import_hf_gpt_neox(folder, tmp_path / "ckpt")  # no warning: the buffers agree
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["weights"] == "pytorch_model.bin" and report["unknown_tensors"] == []
    assert sorted(report["ignored_tensors"]) == sorted(k for k in state if k.endswith(("bias", "inv_freq"))
                                                       and ".attention." in k and "dense" not in k
                                                       and "query_key_value" not in k)
    assert any("inv_freq" in n and "agree" in n for n in report["notes"])
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ours(ids, attention_mask=mask).logits[mask.bool()],
                     ref(ids, attention_mask=mask).logits[mask.bool()], **TOL)
    # the same buffers under another base than config.json's: the config does not describe the model
    (folder / "config.json").write_text(json.dumps({**hf, "rotary_pct": 0.5, "rotary_emb_base": 20000}))
    with pytest.raises(ValueError, match=r"layers\.0\.attention\.rotary_emb\.inv_freq .*rotary_emb_base=20000"):
        import_hf_gpt_neox(folder)


def _copy(src, dst, edit_config=None, edit_state=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit_config(cfg) if edit_config else cfg))
    state = load_file(str(src / "model.safetensors"))
    save_file(edit_state(state) if edit_state else state, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("edit, field", [
    ({"attention_bias": False}, "attention_bias"),
    ({"hidden_act": "silu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type"),
    # int(8 x 0.4) = 3 rotated channels: RoPE turns pairs
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4}}, "rotary_pct"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_size": 30}, "hidden_size"),
])
def test_config_fields_we_cannot_compute_are_refused_by_name(neox_folder, tmp_path, edit, field):
    folder = _copy(neox_folder[0], tmp_path / "f", edit_config=lambda c: {**c, **edit})
    with pytest.raises(ValueError, match=field):
        import_hf_gpt_neox(folder)


def test_missing_and_misshapen_tensors_are_refused_by_their_names(neox_folder, tmp_path):
    folder, case = neox_folder
    drop = _copy(folder, tmp_path / "drop", edit_state=lambda s: {k: v for k, v in s.items()
                                                                   if "layers.1.mlp.dense_4h_to_h.weight" not in k})
    with pytest.raises(ValueError, match=r"gpt_neox\.layers\.1\.mlp\.dense_4h_to_h\.weight \(our blocks\.1\.mlp\.fc_out"):
        import_hf_gpt_neox(drop)
    skew = _copy(folder, tmp_path / "skew",
                 edit_state=lambda s: {**s, "gpt_neox.layers.0.attention.dense.weight": torch.zeros(32, 31)})
    with pytest.raises(ValueError, match=r"gpt_neox\.layers\.0\.attention\.dense\.weight has shape \(32, 31\), expected \(32, 32\)"):
        import_hf_gpt_neox(skew)
    if not CASES[case][2]:  # untied: without its head the model gives no logits
        headless = _copy(folder, tmp_path / "headless", edit_state=lambda s: {k: v for k, v in s.items()
                                                                             if k not in ("embed_out.weight", "lm_head.weight")})
        with pytest.raises(ValueError, match="tie_word_embeddings=false but the checkpoint has no LM head"):
            import_hf_gpt_neox(headless)
    extra = _copy(folder, tmp_path / "extra", edit_state=lambda s: {**s, "gpt_neox.adapter.weight": torch.zeros(2)})
    with pytest.warns(UserWarning, match="gpt_neox.adapter.weight"):
        import_hf_gpt_neox(extra, tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]["unknown_tensors"] == ["gpt_neox.adapter.weight"]


def test_gpt_neox_tokenizer_ids_equal_transformers(neox_folder, tmp_path):
    """Pythia ships a byte-level BPE tokenizer.json with tokenizer_class GPTNeoXTokenizer; its ids,
    and the roles (<|endoftext|> bos / eos / unk), equal transformers' on the hard cases."""
    files = tmp_path / "files"
    write_gpt2_files(files)
    ref = transformers.GPTNeoXTokenizer(vocab=str(files / "vocab.json"), merges=str(files / "merges.txt"))
    folder = _copy(neox_folder[0], tmp_path / "f")
    ref.save_pretrained(str(folder))
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    _, tok = quiet(import_hf_gpt_neox, folder)
    assert tok is not None and tok.kind == "bpe"
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (ref.bos_token_id, ref.eos_token_id, ref.unk_token_id)
    assert tok.pad_id == ref.pad_token_id == tok.token_to_id("<|padding|>")
    # Pythia's own tokenizer_config.json names no pad token: GPTNeoXTokenizer's default <|padding|> stands
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "pad_token"}))
    bare = transformers.AutoTokenizer.from_pretrained(str(folder))
    _, tok = quiet(import_hf_gpt_neox, folder)
    assert tok.pad_id == bare.pad_token_id == tok.token_to_id("<|padding|>")
    for text in TEXTS:
        assert tok.encode(text, add_special=False) == ref(text, add_special_tokens=False)["input_ids"], text


def test_a_tying_config_with_its_own_head_stays_untied_and_says_so(tmp_path):
    """tie_word_embeddings=true but an embed_out that is another matrix: transformers keeps the file's
    head (it does not tie over a stored weight), and so do we, with a note."""
    torch.manual_seed(5)
    ref = perturbed(transformers.GPTNeoXForCausalLM(neox_config(*CASES["pythia"])))
    folder = tmp_path / "hf"
    ref.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.warns(UserWarning, match="kept untied"):
        ours, _ = import_hf_gpt_neox(folder, tmp_path / "ckpt")
    assert not ours.config.tie_embeddings and not torch.equal(ours.lm_weight(), ours.wte.weight)
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["lm_head"] == "untied (the checkpoint's own embed_out.weight)"
    loaded = quiet(transformers.GPTNeoXForCausalLM.from_pretrained, str(folder), attn_implementation="eager").eval()
    assert loaded.lm_head.weight is not loaded.gpt_neox.embed_in.weight  # transformers keeps it untied too
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ours(ids, attention_mask=mask).logits[mask.bool()],
                     loaded(ids, attention_mask=mask).logits[mask.bool()], **TOL)


def test_a_config_key_left_out_is_refused_by_name_or_read_as_transformers_default():
    # the sizes are required; each other key config_from_neox falls back on gets the value transformers' GPTNeoXConfig would use
    full = transformers.GPTNeoXConfig().to_dict()
    want = config_from_neox(full)
    refused = set()
    for key in full:
        try:
            got = config_from_neox({k: v for k, v in full.items() if k != key})
        except ValueError as e:
            assert key in str(e)
            refused.add(key)
            continue
        assert got == want, key
    assert refused == {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings"}   # only the sizes are required


def test_the_fused_qkv_is_regrouped_by_hand_and_names_map_back():
    # 2 heads of size 2: GPT-NeoX's rows per head [q0 q0 k0 k0 v0 v0 | q1 q1 k1 k1 v1 v1] -> ours [q; k; v]
    state = {"gpt_neox.layers.0.attention.query_key_value.bias": torch.arange(12.0),
             "layers.0.attention.query_key_value.weight": torch.arange(48.0).reshape(12, 4)}
    mapped, unknown, ignored = map_neox_state(state, n_heads=2)
    order = [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    assert mapped["blocks.0.attn.qkv.bias"].tolist() == order
    assert mapped["blocks.0.attn.qkv.weight"][:, 0].tolist() == [4.0 * r for r in order]
    assert unknown == [] and ignored == []
    with pytest.raises(ValueError, match="has 10 rows, not 3 x num_attention_heads"):
        map_neox_state({"layers.0.attention.query_key_value.bias": torch.zeros(10)}, n_heads=2)
    assert neox_name("blocks.11.mlp.fc_out.bias") == "gpt_neox.layers.11.mlp.dense_4h_to_h.bias"
    assert neox_name("blocks.3.attn.qkv.weight") == "gpt_neox.layers.3.attention.query_key_value.weight"
    assert neox_name("lm_head.weight") == "embed_out.weight or lm_head.weight"
    assert neox_name("not.a.weight") == "not.a.weight"


@pytest.mark.parametrize("eps", [0, -1e-5, "1e-5", True, None])
def test_a_layer_norm_eps_that_is_not_a_positive_number_is_refused_by_name(eps):
    full = transformers.GPTNeoXConfig().to_dict()
    with pytest.raises(ValueError, match=re.escape(f"layer_norm_eps={eps!r} must be a positive number")):
        config_from_neox({**full, "layer_norm_eps": eps})
    assert config_from_neox({**full, "layer_norm_eps": 3e-6}).layer_norm_eps == 3e-6


def test_a_stored_inv_freq_that_config_json_does_not_give_is_refused_naming_what_it_implies():
    # half of each 8-wide head rotated: R = 4 channels, inv_freq = 1 / base^(2i/R) has R / 2 = 2 values
    from plmodels.hf.gpt_neox import _check_inv_freq

    config = config_from_neox(neox_config(0.5, True, False, 10000).to_dict())
    name = "gpt_neox.layers.0.attention.rotary_emb.inv_freq"
    right = 1.0 / 10000 ** (torch.arange(0, 4, 2).float() / 4)
    assert "agree" in _check_inv_freq({name: right}, [name], config, "f")
    with pytest.raises(ValueError, match=re.escape(f"f: {name} ((2,) values) is not 1 / base^(2i/R) of "
                                                   "rotary_emb_base=10000.0 and rotary_pct -> R=4 rotated channels "
                                                   "(2 values): ")):
        _check_inv_freq({name: 2 * right}, [name], config, "f")
