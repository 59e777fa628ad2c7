"""probes.lens: the logit lens at the last layer is the model's own distribution (an encoder, a decoder,
and an encoder-decoder's decoder stack read teacher-forced); the tuned lens learns a planted translation
and round-trips through safetensors."""
import pytest
import torch

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig, TeacherForcedDecoder
from plmodels.elmo import BiLMDirection, ElmoBiLM, ElmoConfig
from plmodels.xlnet import XLNet, XLNetConfig, XLNetQueryStream
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


def seq2seqs():
    torch.manual_seed(0)
    shape = dict(vocab_size=40, d_model=32, n_layers=2, n_decoder_layers=3, n_heads=4, d_ff=64, max_positions=16,
                 dropout=0.0)
    t5, bart = Seq2Seq(Seq2SeqConfig.t5(**shape)), Seq2Seq(Seq2SeqConfig.bart(**shape))
    bart.final_logits_bias.normal_()  # BART's checkpoints hold zeros; a non-zero bias the lens must add too
    return [t5, bart]


@pytest.mark.parametrize("model", seq2seqs(), ids=["t5", "bart"])
def test_the_decoder_stacks_lens_at_its_last_layer_is_the_seq2seqs_own_distribution(model):
    """T5 (pre-LN: the decoder's final RMSNorm, then the tied head rescaled by d^-0.5) and BART (post-LN,
    final_logits_bias): the teacher-forced decoder's last layer read through the lens equals the model's
    own teacher-forced logits at the same positions, to 1e-5."""
    model.eval()
    stack = TeacherForcedDecoder(model)
    ids = torch.randint(5, 40, (2, 9))
    hidden = torch.stack(stack(ids, output_hidden_states=True).hidden_states)  # (L_dec+1, B, T, D)
    assert hidden.shape[0] == model.config.n_decoder_layers + 1
    lens = logit_lens(lm_readout(stack), hidden)  # (L_dec+1, B, T, V)
    start = ids.new_full((2, 1), model.config.decoder_start_token_id)
    own = model(ids, decoder_input_ids=torch.cat([start, ids], 1)).logits[:, 1:]  # the states that read each token
    torch.testing.assert_close(torch.log_softmax(lens[-1], -1), torch.log_softmax(own, -1), atol=1e-5, rtol=0)
    m = lens_metrics(lens[-1].flatten(0, 1), own.flatten(0, 1))
    assert float(m["kl"].abs().max()) < 1e-5 and float(m["top1_agree"].min()) == 1.0
    assert not torch.allclose(lens[1], own, atol=1e-3)  # a lower layer does differ: the check has teeth


def test_xlnets_query_stream_reads_left_to_right_and_its_lens_is_the_models_prediction():
    """The query-stream state at t is XLNet's own query stream for target t + 1 in the left-to-right
    order: read through the lens at the last layer it is the model's own logits there (1e-5); it has read
    token t and not token t + 1 (changing t + 1 leaves it, changing t moves it)."""
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)).eval()
    stream = XLNetQueryStream(model)
    ids = torch.randint(5, 40, (2, 7))
    hidden = stream(ids, output_hidden_states=True).hidden_states  # L + 1 of (B, T, D)
    assert len(hidden) == 3 and torch.equal(hidden[0][0, 0], hidden[0][1, 3])  # layer 0: mask_emb everywhere
    t, T = 3, ids.shape[1]
    perm = torch.ones(T, T).triu().expand(2, -1, -1)
    target = torch.zeros(2, 1, T)
    target[:, 0, t + 1] = 1.0
    own = model(ids, perm_mask=perm, target_mapping=target).logits[:, 0]  # (B, V) the query stream at t + 1
    lens = logit_lens(lm_readout(stream), torch.stack(hidden)[:, :, t])  # (L+1, B, V)
    torch.testing.assert_close(torch.log_softmax(lens[-1], -1), torch.log_softmax(own, -1), atol=1e-5, rtol=0)
    changed = ids.clone()
    changed[:, t + 1] = (ids[:, t + 1] - 4) % 35 + 5  # another token at the target
    torch.testing.assert_close(stream(changed, output_hidden_states=True).hidden_states[-1][:, t], hidden[-1][:, t])
    changed = ids.clone()
    changed[:, t] = (ids[:, t] - 4) % 35 + 5  # another token just read
    assert not torch.allclose(stream(changed, output_hidden_states=True).hidden_states[-1][:, t], hidden[-1][:, t])


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_bilm_directions_lens_is_its_own_lm(direction):
    """ELMo's direction read alone: its last layer through the lens is the biLM's own next-token
    (forward) or previous-token (backward) logits (1e-5), and the other direction's are not."""
    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(vocab_size=40, d_embed=16, d_hidden=32, d_proj=16, n_layers=2, dropout=0.0)).eval()
    ids = torch.randint(5, 40, (2, 7))
    out = model(ids, return_logits=True)
    own, other = (out.logits, out.backward_logits) if direction == "forward" else (out.backward_logits, out.logits)
    stack = BiLMDirection(model, direction)
    lens = logit_lens(lm_readout(stack), torch.stack(stack(ids, output_hidden_states=True).hidden_states))
    torch.testing.assert_close(lens[-1], own, atol=1e-5, rtol=0)
    assert not torch.allclose(lens[-1], other, atol=1e-3)


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
