"""Small random transformers models, the references of the parity tests: GPT-2, T5, BART and XLNet with
non-trivial norms and biases (so a swapped or dropped tensor shows), and the padded batches they are
compared on. transformers is a test extra: without it a module importing this one is skipped at
collection, not failed."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

GPT2_SIZES = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 48, "n_positions": 16}  # n_inner != 4 n_embd: a swap shows
GPT2_EPS = 3e-5  # not GPT-2's 1e-5: the importer must carry it
SEQ2SEQ_VOCAB = 64
XLNET_VOCAB = 100


def hf_gpt2(vocab_size: int, tie: bool, seed: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=vocab_size, **GPT2_SIZES, activation_function="gelu_new", layer_norm_epsilon=GPT2_EPS,
        tie_word_embeddings=tie, bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1,
        # N(0, 0.2), not GPT-2's 0.02: large enough pre-activations for a wrong GELU or eps to show
        initializer_range=0.2, attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases so a mapping slip shows
        for name, p in model.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie
    return model


def _perturb(model: torch.nn.Module) -> None:
    """Non-trivial norms and biases, so that a swapped or dropped one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))


def hf_t5(seed: int = 0, **kw) -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = transformers.T5Config(vocab_size=SEQ2SEQ_VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
                                num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=20,
                                dropout_rate=0.0, layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1,
                                decoder_start_token_id=0, attn_implementation="eager", **kw)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    _perturb(model)
    return model


def hf_bart(seed: int = 0, **kw) -> transformers.BartForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(vocab_size=SEQ2SEQ_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                  decoder_ffn_dim=48, max_position_embeddings=40, dropout=0.0, attention_dropout=0.0,
                                  activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2, init_std=0.2, attn_implementation="eager", **kw)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    _perturb(model)
    with torch.no_grad():
        model.final_logits_bias.add_(0.1 * torch.randn_like(model.final_logits_bias))  # a buffer: zeros in BART
    return model


def seq2seq_batch(pad: int):
    """Encoder ids (3, 11) with the last row padded from 7, decoder ids (3, 9) with the middle row padded from 5."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SEQ2SEQ_VOCAB, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[-1, 7:] = 0
    ids[-1, 7:] = pad
    dec = torch.randint(3, SEQ2SEQ_VOCAB, (3, 9), generator=g)
    dec_mask = torch.ones(3, 9, dtype=torch.long)
    dec_mask[1, 5:] = 0
    dec[1, 5:] = pad
    return ids, mask, dec, dec_mask


def hf_xlnet(seed: int = 0, **kw) -> transformers.XLNetLMHeadModel:
    torch.manual_seed(seed)
    cfg = transformers.XLNetConfig(vocab_size=XLNET_VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0,
                                   mem_len=None, **kw)
    model = transformers.XLNetLMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a swapped or dropped one shows
        for name, p in model.named_parameters():
            if "layer_norm" in name or name.endswith("bias") or "seg_embed" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def xlnet_batch(B: int = 4, T: int = 10):
    """ids (B, T), attention mask with row 1 padded from 6, two segments split at 4."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(6, XLNET_VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0
    ids[1, 6:] = 5
    token_types = torch.zeros(B, T, dtype=torch.long)
    token_types[:, 4:] = 1
    return ids, mask, token_types
