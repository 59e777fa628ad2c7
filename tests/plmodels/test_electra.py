"""ELECTRA (plmodels/electra.py): the labels, the shared embeddings, the generator's shape, the loss."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from plmodels.electra import (
    ElectraConfig,
    ElectraPair,
    electra_loss,
    generator_config,
    generator_state,
    rtd_labels,
    sample_replacements,
)
from plmodels.encoder import EncoderConfig
from plmodels.training.masking import MaskingConfig, mask_tokens, masked_slots, step_generator

V = 60
DISC = EncoderConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=32, dropout=0.0,
                     embedding_size=16)


def _batch(seed=0, B=3, T=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    masked, labels = mask_tokens(ids, mask_id=4, vocab_size=V, special_ids={0, 1, 2, 3, 4}, generator=g,
                                 cfg=MaskingConfig(rate=0.3, mask_frac=0.85, random_frac=0.0))
    return ids, masked, labels


def test_generator_shape_is_a_quarter_of_the_discriminator():
    g = generator_config(DISC, 0.25)
    assert (g.d_model, g.n_heads, g.d_ff, g.n_layers) == (8, 1, 16, 2)
    assert g.embedding_size == 16 and not g.use_rtd
    mini = EncoderConfig(vocab_size=V, d_model=256, n_heads=4, d_ff=1024, n_layers=4, embedding_size=128)
    assert (generator_config(mini, 0.25).d_model, generator_config(mini, 0.25).n_heads) == (64, 1)


def test_generator_embeddings_are_the_discriminators():
    torch.manual_seed(0)
    pair = ElectraPair(DISC)
    ge, de = pair.generator.embeddings, pair.discriminator.embeddings
    for name in ("word", "position", "segment", "norm"):
        for p, q in zip(getattr(ge, name).parameters(), getattr(de, name).parameters()):
            assert p is q
    assert ge.project is not de.project  # each model projects E to its own width
    assert ge.project.weight.shape == (8, 16) and de.project.weight.shape == (32, 16)
    # one tensor in parameters(), with both models' gradients in it
    ids = list(map(id, pair.parameters()))
    assert len(ids) == len(set(ids)) and ids.count(id(de.word.weight)) == 1
    x = torch.randint(5, V, (2, 6))
    pair.generator(x).last_hidden_state.sum().backward()
    g_only = de.word.weight.grad.clone()
    pair.discriminator(x).last_hidden_state.sum().backward()
    assert g_only.abs().sum() > 0 and not torch.equal(de.word.weight.grad, g_only)
    # the generator's own tensors leave the shared block out
    assert not any(k.startswith(("embeddings.word", "embeddings.position", "embeddings.norm")) for k in generator_state(pair))
    assert "embeddings.project.weight" in generator_state(pair)


def test_rtd_labels_count_a_restored_token_as_original():
    original = torch.tensor([[2, 10, 11, 12, 3]])
    corrupted = torch.tensor([[2, 10, 40, 12, 3]])  # position 3 was masked and sampled back to 12
    assert rtd_labels(corrupted, original).tolist() == [[0, 0, 1, 0, 0]]


def test_loss_labels_equal_corrupted_ne_original_with_restored_samples():
    torch.manual_seed(0)
    pair = ElectraPair(DISC)
    ids, masked, labels = _batch()
    sel = labels != -100
    out = electra_loss(pair, ids, masked, step_generator(0, 0), slots=masked_slots(labels))
    assert torch.equal(out.labels, (out.replaced != ids).float())
    assert torch.equal(out.replaced[~sel], masked[~sel])  # only masked positions change
    assert out.labels[~sel].sum() == 0  # an unmasked position is never "replaced"
    # force a restoring sample: logits that single out the original token
    logits = torch.full((int(sel.sum()), V), -1e4)
    logits[torch.arange(int(sel.sum())), ids[sel]] = 0.0
    assert torch.equal(sample_replacements(logits, 1.0, step_generator(0, 1)), ids[sel])


def test_loss_is_mlm_plus_lambda_rtd_and_reproducible():
    torch.manual_seed(0)
    pair = ElectraPair(DISC, ElectraConfig(rtd_weight=50.0))
    ids, masked, labels = _batch(1)
    a = electra_loss(pair, ids, masked, step_generator(3, 7), slots=masked_slots(labels))
    b = electra_loss(pair, ids, masked, step_generator(3, 7), slots=masked_slots(labels))
    assert torch.equal(a.replaced, b.replaced) and a.loss.item() == b.loss.item()
    assert float(a.loss) == pytest.approx(float(a.mlm) + 50.0 * float(a.rtd), rel=1e-6)
    sel = labels != -100
    g = pair.generator
    mlm = F.cross_entropy(g.mlm_logits(g(masked).last_hidden_state[sel]), labels[sel])
    assert float(a.mlm) == pytest.approx(float(mlm), abs=1e-5)
    d = pair.discriminator
    rtd = F.binary_cross_entropy_with_logits(d.rtd_logits(d(a.replaced).last_hidden_state), a.labels)
    assert float(a.rtd) == pytest.approx(float(rtd), abs=1e-6)
    a.loss.backward()  # no gradient through the sample, but both models receive one
    assert pair.generator.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert pair.discriminator.rtd.out.weight.grad.abs().sum() > 0


def test_config_checks():
    with pytest.raises(ValueError, match="generator_frac"):
        ElectraConfig(generator_frac=0.0)
    with pytest.raises(ValueError, match="next-sentence"):
        ElectraPair(dataclasses.replace(DISC, use_nsp=True))
