"""probes.lens: the logit lens at the last layer is the model's own distribution; the tuned lens learns
a planted translation and round-trips through safetensors."""
import pytest
import torch

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from probes.lens import TunedLens, lens_metrics, lm_readout, logit_lens

SMALL = dict(vocab_size=40, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_positions=16, dropout=0.0)


def models():
    torch.manual_seed(0)
    return [Encoder(EncoderConfig(**SMALL, norm="post")), Encoder(EncoderConfig(**SMALL, norm="pre")),
            Decoder(DecoderConfig(**SMALL))]


@pytest.mark.parametrize("model", models(), ids=["encoder-post", "encoder-pre", "decoder"])
def test_logit_lens_last_layer_is_the_models_distribution(model):
    model.eval()
    ids = torch.randint(5, 40, (2, 9))
    out = model(ids, output_hidden_states=True)
    hidden = torch.stack(out.hidden_states)  # (L+1, B, T, D)
    lens = logit_lens(lm_readout(model), hidden)
    own = out.logits if model.kind == "decoder" else model.mlm_logits(out.last_hidden_state)
    torch.testing.assert_close(lens[-1], own)
    m = lens_metrics(lens[-1].flatten(0, 1), own.flatten(0, 1), ids.flatten())
    assert float(m["kl"].abs().max()) < 1e-5 and float(m["top1_agree"].min()) == 1.0
    assert not torch.allclose(lens[0], own, atol=1e-3)  # the lower layers do differ: the check has teeth


def test_unknown_kind_is_one_clear_error():
    class Odd:
        kind = "xlnet"
    with pytest.raises(ValueError, match="'xlnet' has no LM readout"):
        lm_readout(Odd())


def test_tuned_lens_learns_a_planted_translation_and_round_trips(tmp_path):
    """Layer 0 is the last layer's vectors scrambled by a fixed invertible map: the logit lens reads it
    badly, the tuned lens learns the inverse and brings KL near 0; the last layer stays the identity."""
    torch.manual_seed(0)
    D, V, N = 8, 12, 2000
    head = torch.nn.Linear(D, V)
    readout = lambda h: head(h)
    last = torch.randn(N, D) * 2
    M = torch.eye(D) + 0.5 * torch.randn(D, D) / D**0.5
    hidden = torch.stack([last @ torch.linalg.inv(M).T, last])  # layer 0 = M^-1 last
    for p in head.parameters():
        p.requires_grad_(False)
    lens = TunedLens(readout=readout, n_steps=400, lr=2e-2, seed=0).fit(hidden)
    kl_tuned = lens.score(hidden)
    final = readout(last)
    kl_logit = float(lens_metrics(readout(hidden[0]), final)["kl"].mean())
    assert kl_tuned[1] == pytest.approx(0.0, abs=1e-6)  # identity at the last layer
    assert kl_tuned[0] < 0.05 * kl_logit
    lens.save(tmp_path)
    again = TunedLens.load(tmp_path, readout)
    torch.testing.assert_close(again.transform(hidden), lens.transform(hidden))
    assert (tmp_path / "tuned_lens.safetensors").is_file()


def test_lens_metrics_by_definition():
    torch.manual_seed(1)
    logits, final, targets = torch.randn(6, 11), torch.randn(6, 11), torch.randint(0, 11, (6,))
    p, q = torch.softmax(final, -1), torch.softmax(logits, -1)
    for given in (None, torch.log_softmax(final, -1)):
        m = lens_metrics(logits, final, targets, final_logp=given)
        torch.testing.assert_close(m["kl"], (p * (p.log() - q.log())).sum(-1))
        torch.testing.assert_close(m["lm_loss"], torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
        torch.testing.assert_close(m["top1_agree"], (logits.argmax(-1) == final.argmax(-1)).float())


def fit_one_layer_at_a_time(readout, hidden, n_steps, lr, batch_size, seed):
    """The tuned lens' definition, layer by layer with its own Adam and loss.backward()."""
    L, N, D = hidden.shape[0] - 1, hidden.shape[1], hidden.shape[2]
    target = torch.log_softmax(readout(hidden[-1]).detach(), -1)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for l in range(L):
        W, b = torch.zeros(D, D, requires_grad=True), torch.zeros(D, requires_grad=True)
        opt = torch.optim.Adam([W, b], lr=lr)
        for _ in range(n_steps):
            idx = torch.randint(0, N, (min(batch_size, N),), generator=gen)
            h = hidden[l, idx]
            logq = torch.log_softmax(readout(h + h @ W.T + b), -1)
            loss = torch.nn.functional.kl_div(logq, target[idx], log_target=True, reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append((W.detach(), b.detach()))
    return out


def test_fit_equals_the_definition_and_leaves_the_readout_without_grad():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 12).requires_grad_(False)
    hidden = torch.randn(4, 300, 8)
    lens = TunedLens(readout=head, n_steps=30, lr=1e-2, batch_size=64, seed=5).fit(hidden)
    want = fit_one_layer_at_a_time(head, hidden, 30, 1e-2, 64, 5)
    for l, (W, b) in enumerate(want):
        torch.testing.assert_close(lens.weight_[l], W, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(lens.bias_[l], b, atol=1e-5, rtol=1e-4)
    assert lens.weight_[0].abs().max() > 1e-3  # the translators did move from 0
    assert not torch.allclose(lens.weight_[0], lens.weight_[1])  # and each layer is its own
    trainable = torch.nn.Linear(8, 12)
    TunedLens(readout=trainable, n_steps=2, seed=5).fit(hidden)
    assert trainable.weight.grad is None  # only the translators get gradients
