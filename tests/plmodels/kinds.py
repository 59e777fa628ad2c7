"""Helpers shared by the tests of the model kinds (ELMo, T5/BART, XLNet): packed rows to batch, the
check that extraction writes L+1 layers equal to the model's hidden states, and the check that two
batches train alike (`same_loss_and_grads`)."""
import torch

from plmodels.checkpoint import load
from plmodels.tokenizer import Tokenizer
from workbench.store.extraction import extract


def packed_rows(tok_dir, n: int = 4, seq_len: int = 24, seed: int = 0):
    """(tokenizer, (n, seq_len) packed-row look-alikes [CLS] body [SEP] of random ids, no padding)."""
    tok = Tokenizer.load(tok_dir)
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(5, tok.vocab_size, (n, seq_len - 2), generator=g)
    return tok, torch.cat([torch.full((n, 1), tok.cls_id), body, torch.full((n, 1), tok.sep_id)], 1)


SENTENCES = [["the", "cat", "sees", "the", "river", "."], ["two", "dogs", "call", "."]]


def assert_store_is_the_hidden_states(path, root, kind: str, attentions: bool) -> None:
    """extract() on the checkpoint at `path`: L+1 layers of width config.d_model, the kind and the
    attentions recorded, and the stored first-subword vectors equal to a direct forward (float16)."""
    model, tok = load(path)
    store = extract(model, tok, SENTENCES, root, progress=False, attentions=attentions)
    L = model.config.n_layers
    assert store.n_layers == L + 1 and store.d_model == model.config.d_model and store.n_words == 10
    assert store.index["model_kind"] == kind and store.has_attentions == attentions
    enc = tok.encode_words_batch([SENTENCES[1]])[0]
    hs = model(torch.tensor([enc.ids]), output_hidden_states=True).hidden_states
    firsts = [w0 for w0, _ in enc.word_spans]
    for l in range(L + 1):  # first-subword pooling, float16 in the store
        got = torch.from_numpy(store.layer(l)[store.sentence_rows(1)].astype("float32"))
        torch.testing.assert_close(got, hs[l][0, firsts], atol=2e-2, rtol=1e-2)


def assert_same_weights(a: dict, b: dict) -> None:
    """Two state dicts with the same names and bit-identical tensors (a resumed run, a round trip)."""
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def same_loss_and_grads(model, loss_fn, a, b, tol: float = 1e-6) -> int:
    """`loss_fn(model, batch, autocast=False)` on batches `a` and `b` gives the same loss, target count and
    gradient of every parameter (within `tol`, fp32); returns the target count."""
    params = list(model.parameters())
    results = []
    for batch in (a, b):
        loss, n, _ = loss_fn(model, batch, autocast=False)
        results.append((loss, n, torch.autograd.grad(loss, params, allow_unused=True)))
    (la, na, ga), (lb, nb, gb) = results
    assert int(na) == int(nb)
    torch.testing.assert_close(lb, la, rtol=tol, atol=tol)
    for (name, _), x, y in zip(model.named_parameters(), ga, gb):
        assert (x is None) == (y is None), name
        if x is not None:
            torch.testing.assert_close(y, x, rtol=tol, atol=tol, msg=name)
    return int(na)
