"""ALBERT's cross-layer parameter sharing (Lan et al. 2020, Table 4) as `EncoderConfig.share_layers`.

Blocks 1..L-1 hold block 0's nn.Parameter objects ("all": attention, MLP, both LayerNorms;
"attention": fused QKV + output projection; "ffn": the MLP) but keep their own modules, so every
analysis still sees L layers. Checked here: the parameter count by formula, one shared tensor that
receives the gradient of every layer (against an untied copy with the same weights), per-layer hook
sites / hidden states / attentions / head masks, the pruning rule for shared attention weights,
checkpoint round trips that keep the ties, the unchanged default config.json, and the HF export's
refusal."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.testing import assert_close

from plmodels import Encoder, EncoderConfig, load, save
from plmodels.encoder import SHARED_PARTS
from plmodels.hf.export import export_hf, hf_layout

from .tiny import TINY, batch

L = 3  # three layers: a bug that ties only blocks 0 and 1 shows
MODES = pytest.mark.parametrize("share", ["all", "attention", "ffn"])
SHARED = pytest.mark.parametrize("share", ["all", "attention"])  # modes that share the attention weights


def albert(share: str, **overrides) -> Encoder:
    torch.manual_seed(0)
    return Encoder(EncoderConfig(**{**TINY, "n_layers": L, "embedding_size": 16, "share_layers": share,
                                    **overrides})).eval()


def perturbed(model: Encoder, std: float = 0.3) -> Encoder:
    """Weights far from the N(0, 0.02) init, whose attention is nearly uniform in every layer."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():  # each shared tensor once
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model


def untied_copy(model: Encoder) -> Encoder:
    """The same function with every layer's parameters its own (share_layers="none")."""
    copy = Encoder(dataclasses.replace(model.config, share_layers="none")).eval()
    weights = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    copy.load_state_dict(weights, strict=True)
    return copy


def shared_names(share: str) -> list[str]:
    """Block-relative names of the parameters this mode shares, e.g. "attn.qkv.weight"."""
    block = albert("none").blocks[0]
    return [f"{part}.{n}" for part in SHARED_PARTS[share] for n, _ in block.get_submodule(part).named_parameters()]


def param(model: nn.Module, name: str) -> nn.Parameter:
    return model.get_parameter(name)


@pytest.mark.parametrize("share", ["none", "all", "attention", "ffn"])
def test_parameter_count_is_the_formula(share):
    V, D, F, P, S, E = TINY["vocab_size"], TINY["d_model"], TINY["d_ff"], TINY["max_positions"], 2, 16
    embeddings = E * (V + P + S) + 2 * E  # word, position, segment tables + the embedding LayerNorm (post-LN)
    projection = E * D + D  # factorised embeddings: E -> D
    attn = D * 3 * D + 3 * D + D * D + D  # fused QKV and output projection, with biases
    mlp = D * F + F + F * D + D
    norms = 2 * 2 * D  # norm1, norm2 (gain and bias)
    heads = (D * E + E) + 2 * E + V + (D * D + D)  # MLM dense + LayerNorm + decoder bias (tied decoder), pooler
    parts = {"attn": attn, "mlp": mlp, "norm": norms}
    shared_parts = {"none": set(), "all": {"attn", "mlp", "norm"}, "attention": {"attn"}, "ffn": {"mlp"}}[share]
    shared = sum(parts[p] for p in shared_parts)  # once
    per_layer = sum(parts[p] for p in parts if p not in shared_parts)  # L times
    expected = embeddings + projection + shared + L * per_layer + heads
    model = albert(share)
    params = list(model.parameters())
    assert len({id(p) for p in params}) == len(params)  # AdamW sees each shared tensor once
    assert sum(p.numel() for p in params) == expected
    assert sum(p.numel() for p in model.state_dict().values()) == expected  # and it is saved once


@MODES
def test_shared_parameters_are_one_object_and_the_rest_are_per_layer(share):
    model = albert(share)
    names = set(shared_names(share))
    for name, _ in model.blocks[0].named_parameters():
        for l in range(1, L):
            same = model.blocks[l].get_parameter(name) is model.blocks[0].get_parameter(name)
            assert same == (name in names), (l, name)
    assert set(model.parameter_aliases()) == {f"blocks.{l}.{n}" for l in range(1, L) for n in names}
    # the hook sites are not shared: each block has its own modules
    assert model.blocks[1].attn is not model.blocks[0].attn and model.blocks[1].mlp.post is not model.blocks[0].mlp.post


@MODES
def test_the_shared_tensor_gets_the_sum_of_every_layers_gradient(share):
    model = albert(share)
    copy = untied_copy(model)
    ids, mask = batch()

    def loss(m):
        out = m(ids, attention_mask=mask)
        return m.mlm_logits(out.last_hidden_state).logsumexp(-1).mean() + out.pooler_output.pow(2).sum()

    assert_close(loss(model), loss(copy))  # same function
    loss(model).backward()
    loss(copy).backward()
    for name, p in model.blocks[0].named_parameters():
        per_layer = [copy.blocks[l].get_parameter(name).grad for l in range(L)]
        if name in shared_names(share):
            assert_close(p.grad, sum(per_layer), atol=1e-6, rtol=1e-5)
            assert not torch.allclose(p.grad, per_layer[0], atol=1e-6)  # the other layers contributed
        else:
            for l in range(L):
                assert_close(model.blocks[l].get_parameter(name).grad, per_layer[l], atol=1e-6, rtol=1e-5)


def test_hooks_hidden_states_and_attentions_stay_per_layer_under_all_sharing():
    model = perturbed(albert("all"))
    ids, mask = batch()
    assert model.hook_names() == albert("none").hook_names()  # blocks.{l}.* for every l
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    ref = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(ref.hidden_states) == L + 1 and len(ref.attentions) == L
    for l in range(L):
        assert_close(cache[f"blocks.{l}.resid_post"], ref.hidden_states[l + 1])
        assert_close(cache[f"blocks.{l}.attn.pattern"], ref.attentions[l])
    # one set of weights, but a different input at each depth: different outputs and patterns
    for a, b in [(0, 1), (1, 2), (0, 2)]:
        assert not torch.allclose(ref.hidden_states[a + 1], ref.hidden_states[b + 1], atol=1e-2)
        assert not torch.allclose(ref.attentions[a], ref.attentions[b], atol=1e-2)
    # an edit at one layer's site changes that layer only, not the (shared-weight) others
    def zero(t, name):
        return torch.zeros_like(t)

    with model.hooks([("blocks.1.attn_out", zero)]):
        edited = model(ids, attention_mask=mask, output_hidden_states=True)
    assert_close(edited.hidden_states[1], ref.hidden_states[1])
    assert not torch.allclose(edited.hidden_states[2], ref.hidden_states[2], atol=1e-3)


@SHARED
def test_a_head_mask_gates_a_head_in_one_layer_of_shared_weights(share):
    model = albert(share)
    ids, mask = batch()
    head_mask = torch.ones(L, TINY["n_heads"])
    head_mask[1, 2] = 0.0
    out = model(ids, attention_mask=mask, head_mask=head_mask, output_attentions=True)
    assert (out.attentions[1][:, 2] == 0).all()
    assert (out.attentions[0][:, 2] > 0).any() and (out.attentions[2][:, 2] > 0).any()
    ref = untied_copy(model)(ids, attention_mask=mask, head_mask=head_mask)  # the same model, untied
    assert_close(out.last_hidden_state, ref.last_hidden_state, atol=1e-5, rtol=1e-5)
    plain = model(ids, attention_mask=mask)
    assert not torch.allclose(out.last_hidden_state, plain.last_hidden_state, atol=1e-4)


@SHARED
def test_pruning_a_shared_head_in_some_layers_only_is_refused(share):
    model = albert(share)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"layers \[0, 1, 2\] share one set of attention weights.*"
                                         r"\{2: \[1\]\}.*head_mask"):
        model.prune_heads({0: [1, 3], 1: [1, 3], 2: [3]})
    with pytest.raises(ValueError, match=r"share_layers"):
        model.prune_heads({1: [0]})
    assert model.n_heads_per_layer == [TINY["n_heads"]] * L and model.config.pruned_heads == {}  # untouched
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())
    with pytest.raises(ValueError, match=r"pruned_heads.*share_layers.*same heads"):  # a hand-edited config too
        EncoderConfig(**{**TINY, "n_layers": L, "share_layers": share, "pruned_heads": {0: [1]}})


def test_without_shared_attention_each_layer_prunes_its_own_heads():
    model = albert("ffn")
    model.prune_heads({1: [0, 2]})
    assert model.n_heads_per_layer == [4, 2, 4]
    assert model.blocks[1].mlp.fc_in.weight is model.blocks[0].mlp.fc_in.weight  # the MLP stays shared


@SHARED
def test_pruning_every_sharing_layer_cuts_the_shared_tensor_once_and_keeps_it_tied(share):
    model = albert(share)
    ids, mask = batch()
    D, Dh = TINY["d_model"], TINY["d_model"] // TINY["n_heads"]
    n_before = sum(p.numel() for p in model.parameters())
    head_mask = torch.ones(L, TINY["n_heads"])
    head_mask[:, [1, 3]] = 0.0
    masked = model(ids, attention_mask=mask, head_mask=head_mask).last_hidden_state
    model.prune_heads({l: [3, 1] for l in range(L)})
    assert model.config.pruned_heads == {l: [1, 3] for l in range(L)}
    assert model.n_heads_per_layer == [2] * L
    for l in range(1, L):
        for name in ("qkv.weight", "qkv.bias", "out.weight", "out.bias"):
            assert model.blocks[l].attn.get_parameter(name) is model.blocks[0].attn.get_parameter(name)
    head = 3 * Dh * D + 3 * Dh + D * Dh  # a head's QKV rows (+ biases) and output-projection columns
    assert sum(p.numel() for p in model.parameters()) == n_before - 2 * head  # cut once, not L times
    # zero-masking the heads in every layer = pruning them (Michel et al. 2019)
    assert_close(model(ids, attention_mask=mask).last_hidden_state, masked, atol=1e-5, rtol=1e-5)
    model.prune_heads({l: [0] for l in range(L)})  # a second prune, on top of the first
    assert model.n_heads_per_layer == [1] * L and model.blocks[2].attn.qkv.weight is model.blocks[0].attn.qkv.weight


@MODES
def test_checkpoint_round_trip_keeps_the_ties(share, tmp_path):
    model = albert(share)
    if "attn" in SHARED_PARTS[share]:
        model.prune_heads({l: [2] for l in range(L)})
    perturbed(model, 0.01)  # values the init would not give
    ids, mask = batch()
    path = save(model, None, tmp_path / "ckpt")
    stored = load_file(str(path / "model.safetensors"))
    assert not [k for k in stored if k in model.parameter_aliases()]  # each shared tensor stored once
    assert set(stored) == {n for n, _ in model.named_parameters()}
    loaded, _ = load(path)
    assert loaded.config == model.config
    for alias, first in model.parameter_aliases().items():
        assert loaded.get_parameter(alias) is loaded.get_parameter(first)
    assert len(list(loaded.parameters())) == len(list(model.parameters()))
    assert_close(loaded(ids, attention_mask=mask).last_hidden_state, model(ids, attention_mask=mask).last_hidden_state,
                 atol=0, rtol=0)
    # the trainer's resume path: load_state_dict on the file's tensors (aliases filled in, in place)
    fresh = albert(share, pruned_heads=model.config.pruned_heads)
    fresh.load_state_dict(stored, strict=True)
    assert_close(fresh(ids).last_hidden_state, model(ids).last_hidden_state, atol=0, rtol=0)
    assert all(fresh.get_parameter(a) is fresh.get_parameter(f) for a, f in fresh.parameter_aliases().items())


def test_state_dict_of_a_wrapper_and_assign_loading_keep_the_ties():
    model = albert("all")
    wrapper = nn.ModuleDict({"encoder": model})
    state = wrapper.state_dict()
    assert "encoder.blocks.0.attn.qkv.weight" in state and "encoder.blocks.1.attn.qkv.weight" not in state
    other = nn.ModuleDict({"encoder": albert("all")})
    other.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    enc = other["encoder"]
    assert enc.blocks[2].mlp.fc_in.weight is enc.blocks[0].mlp.fc_in.weight
    assert torch.equal(enc.blocks[2].norm1.weight, model.blocks[0].norm1.weight)
    # a full state dict whose "copies" disagree cannot be loaded into one shared tensor
    full = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    full["blocks.2.attn.out.weight"] += 1.0
    with pytest.raises(ValueError, match=r"blocks.2.attn.out.weight differs from blocks.0.attn.out.weight"):
        albert("all").load_state_dict(full)


def test_the_default_config_json_has_no_share_layers_key(tmp_path):
    cfg = EncoderConfig(**TINY)
    assert "share_layers" not in cfg.to_dict()
    torch.manual_seed(0)
    path = save(Encoder(cfg), None, tmp_path / "plain")
    meta = json.loads((path / "config.json").read_text())
    assert "share_layers" not in meta["config"] and "share_layers" not in (path / "config.json").read_text()
    assert EncoderConfig.from_dict(meta["config"]).share_layers == "none"  # an old config.json loads as before
    shared = EncoderConfig(**TINY, share_layers="all")
    assert shared.to_dict()["share_layers"] == "all" and EncoderConfig.from_dict(shared.to_dict()) == shared


def test_share_layers_is_checked():
    with pytest.raises(ValueError, match=r"EncoderConfig.share_layers must be one of .*'ffn'.*got 'mlp'"):
        EncoderConfig(**TINY, share_layers="mlp")


def test_the_hugging_face_export_refuses_partial_sharing(tmp_path):
    # "all" exports as ALBERT (tests/plmodels/test_hf_albert.py); "attention" / "ffn" have no HF class
    with pytest.raises(ValueError, match=r"share_layers='ffn'"):
        hf_layout("encoder", EncoderConfig(**TINY, share_layers="ffn"))
    path = save(albert("attention", embedding_size=None), None, tmp_path / "ours")
    with pytest.raises(ValueError, match=r"share_layers='attention'"):
        export_hf(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
