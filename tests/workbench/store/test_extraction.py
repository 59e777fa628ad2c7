"""Extraction into the activation store: pooled vectors and word attention equal a direct
recomputation, the second request is served from disk, budgets refuse, a failed extraction leaves
nothing behind, task targets map to the right word rows."""
import os

import numpy as np
import pytest
import torch

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from workbench.store import BudgetError, Store, extract, extract_task, extraction, keys

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "unbelievable things happen today",
         "the cat and the dog are friends", "mice hide under tables"] * 4
SENTS = [s.split() for s in TEXTS[:5]] + [["unbelievable", "unhappiness", "the", "cat"], ["x"], []]


@pytest.fixture(scope="module")
def wp():
    return Tokenizer.train_wordpiece(TEXTS, vocab_size=60)


@pytest.fixture(scope="module")
def bpe():
    return Tokenizer.train_bpe(TEXTS, vocab_size=280)


def _enc(tok, max_positions=32):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                        max_positions=max_positions, dropout=0.0)
    return Encoder(cfg)


def _dec(tok, max_positions=32):
    torch.manual_seed(1)
    cfg = DecoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                        max_positions=max_positions, dropout=0.0)
    return Decoder(cfg)


def _entries(folder) -> list:
    """What a folder holds beside the stores' lock files (`workbench.core.io.file_lock`: empty, kept)."""
    return [p for p in folder.iterdir() if not p.name.endswith(".lock")]


def _direct(model, tok, words, pooling):
    """Hand recomputation: one unpadded sentence, per-word loop over hidden_states."""
    enc = tok.encode_words(words)
    with torch.no_grad():
        out = model(torch.tensor([enc.ids]), output_hidden_states=True, output_attentions=True)
    hs = torch.stack(out.hidden_states)[:, 0]  # (L+1, T, D)
    rows = []
    for s, e in enc.word_spans:
        rows.append({"first": hs[:, s], "last": hs[:, e - 1], "mean": hs[:, s:e].mean(1)}[pooling])
    vecs = torch.stack(rows, 1) if rows else hs[:, :0]
    return vecs, torch.stack(out.attentions)[:, 0], enc  # (L+1, n, D), (L, H, T, T)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_pooled_vectors_equal_direct_recomputation(kind, pooling, wp, bpe, tmp_path):
    tok, model = (wp, _enc(wp)) if kind == "encoder" else (bpe, _dec(bpe))
    store = extract(model, tok, SENTS, tmp_path, pooling=pooling, batch_tokens=40, progress=False)
    assert store.n_layers == 3 and store.d_model == 32 and store.n_sentences == len(SENTS)
    assert store.n_words == sum(map(len, SENTS))
    stack = store.layers()
    for s, words in enumerate(SENTS):
        want, _, _ = _direct(model, tok, words, pooling)
        got = torch.from_numpy(stack[:, store.sentence_rows(s)].astype(np.float32))
        torch.testing.assert_close(got, want.half().float(), atol=3e-3, rtol=3e-3)
    np.testing.assert_array_equal(store.layer(-1), stack[-1])


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_store_attention_matches_hand_loop_and_rows_sum_to_one(kind, wp, bpe, tmp_path):
    tok, model = (wp, _enc(wp)) if kind == "encoder" else (bpe, _dec(bpe))
    store = extract(model, tok, SENTS, tmp_path, attentions=True, batch_tokens=40, progress=False)
    specials = store.index["special_tokens"]
    assert specials == (["[CLS]", "[SEP]"] if kind == "encoder" else ["BOS"])
    special_pos = {"[CLS]": 0, "[SEP]": -1, "BOS": 0}
    n_seen = 0
    for s, word, spec in store.iter_sentence_attention():
        _, A, enc = _direct(model, tok, SENTS[s], "first")
        n = len(SENTS[s])
        assert word.shape == (2, 2, n, n) and spec.shape == (2, 2, n, len(specials))
        exp = torch.zeros(2, 2, n, n)
        for i, (a0, a1) in enumerate(enc.word_spans):
            for j, (b0, b1) in enumerate(enc.word_spans):
                exp[:, :, i, j] = A[:, :, a0:a1, b0:b1].sum(-1).mean(-1)
        exp_spec = torch.stack([A[:, :, :, special_pos[k]] for k in specials], -1)
        exp_spec = torch.stack([exp_spec[:, :, a0:a1].mean(2) for a0, a1 in enc.word_spans], 2) if n else exp_spec[:, :, :0]
        # float32 in the store (float16 made near-equal weights tie): equal to the hand loop up to
        # batching's rounding, and every argmax the head statistics take is the hand loop's
        assert word.dtype == np.float32 and spec.dtype == np.float32
        torch.testing.assert_close(torch.from_numpy(word), exp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(spec), exp_spec, atol=1e-5, rtol=1e-5)
        rows = word.sum(-1) + spec.sum(-1)
        np.testing.assert_allclose(rows, 1.0, atol=1e-5)
        if n > 1:
            top2 = np.sort(exp.numpy(), -1)[..., -2:]
            clear = top2[..., 1] - top2[..., 0] > 1e-5
            assert (word.argmax(-1) == exp.numpy().argmax(-1))[clear].all()
        n_seen += 1
    assert n_seen == len(SENTS)


class _Raising(Encoder):
    def forward(self, *a, **k):
        raise AssertionError("the model must not be called when the store exists")


def test_second_request_is_served_from_disk(wp, tmp_path):
    model = _enc(wp)
    first = extract(model, wp, SENTS, tmp_path, attentions=True, progress=False)
    raising = _Raising(model.config)
    raising.load_state_dict(model.state_dict())
    again = extract(raising, wp, SENTS, tmp_path, attentions=True, progress=False)
    assert again.path == first.path
    # a store with attentions also serves a request without
    assert extract(raising, wp, SENTS, tmp_path, attentions=False, progress=False).path == first.path
    np.testing.assert_array_equal(again.layer(1), first.layer(1))
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1   # one store (beside its lock file)


def test_progress_counts_the_tokens_and_progress_false_writes_nothing(wp, tmp_path, capsys):
    model = _enc(wp)
    extract(model, wp, SENTS, tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""
    extract(model, wp, SENTS, tmp_path / "loud")
    n_tokens = sum(len(wp.encode_words(words).ids) for words in SENTS)
    last = capsys.readouterr().err.splitlines()[-1]  # off a terminal: plain lines, the last on close
    assert last.startswith(f"extract: 100% {n_tokens}/{n_tokens} tok [") and "tok/s" in last, last


def test_other_tokenizer_is_refused(wp, bpe, tmp_path):
    store = extract(_enc(wp), wp, SENTS, tmp_path, progress=False)
    store.check_tokenizer(wp)
    other = Tokenizer.train_wordpiece(TEXTS, vocab_size=50)
    with pytest.raises(ValueError, match="tokenizer"):
        Store.open(store.path).check_tokenizer(other)


def test_budget_refusal_gives_the_estimate(wp, tmp_path):
    model = _enc(wp)
    with pytest.raises(BudgetError, match=r"disk .* MiB"):
        extract(model, wp, SENTS, tmp_path / "s", max_bytes_disk=100, progress=False)
    with pytest.raises(BudgetError, match="RAM"):
        extract(model, wp, SENTS, tmp_path / "s", attentions=True, max_bytes_ram=1000, progress=False)
    assert not (tmp_path / "s").exists() or _entries(tmp_path / "s") == []
    # the disk estimate is exact for the layer files: 3 layers x words x 32 x 2 bytes
    store = extract(model, wp, SENTS, tmp_path / "s", progress=False)
    assert store.index["estimate"]["disk"] == 3 * store.n_words * 32 * 2
    assert os.path.getsize(store.path / "layer_0.f16") == store.n_words * 32 * 2


def test_failed_extraction_leaves_no_store_and_rerun_succeeds(wp, tmp_path, monkeypatch):
    model = _enc(wp)
    calls = {"n": 0}
    real = extraction._write_batch

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed mid-way")
        return real(*a, **k)

    monkeypatch.setattr(extraction, "_write_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        extract(model, wp, SENTS, tmp_path, batch_tokens=20, progress=False)
    assert _entries(tmp_path) == []
    monkeypatch.setattr(extraction, "_write_batch", real)
    # a SIGKILLed run leaves a temp folder named with its (dead) pid: the next run removes it
    key_dir = keys.store_dir(tmp_path, keys.store_key(keys.model_fingerprint(model), keys.data_hash(SENTS),
                                                      "first", wp.fingerprint(), "truncate"), "first", False)
    stale = tmp_path / f".{key_dir.name}.tmp-999999999-x"
    stale.mkdir()
    store = extract(model, wp, SENTS, tmp_path, batch_tokens=20, progress=False)
    assert store.path == key_dir and [p.name for p in _entries(tmp_path)] == [key_dir.name]
    want, _, _ = _direct(model, wp, SENTS[0], "first")
    torch.testing.assert_close(torch.from_numpy(store.layers()[:, store.sentence_rows(0)].astype(np.float32)),
                               want.half().float(), atol=3e-3, rtol=3e-3)


def test_truncation_counts_and_span_rows(wp, tmp_path):
    model = _enc(wp, max_positions=8)
    long = "the cat sat on the mat and the dog ran".split()
    records = [
        {"id": "a", "words": ["the", "cat", "sat"], "targets": [
            {"span1": [0, 1], "span2": [1, 3], "label": "x"}, {"span1": [2, 3], "span2": [0, 2], "label": "y"}]},
        {"id": "b", "words": long, "targets": [
            {"span1": [0, 2], "span2": [2, 3], "label": "z"}, {"span1": [1, 2], "span2": [8, 10], "label": "w"}]},
        {"id": "c", "words": ["cat", "the"], "targets": [{"span1": [1, 2], "span2": [0, 1], "label": "x"}]},
    ]
    ta = extract_task(model, wp, records, tmp_path, progress=False)
    enc = wp.encode_words(long)
    n_kept = max(i + 1 for i, (_, e) in enumerate(enc.word_spans) if e <= 7)  # 8 minus [SEP]
    assert ta.store.n_kept().tolist() == [3, n_kept, 2]
    rep = ta.store.index["alignment"]
    assert rep["n_truncated_sentences"] == 1 and rep["n_dropped_words"] == len(long) - n_kept
    assert ta.n_skipped == 1
    assert ta.span1.tolist() == [[0, 1], [2, 3], [3, 5], [3 + n_kept + 1, 3 + n_kept + 2]]
    assert ta.span2.tolist() == [[1, 3], [0, 2], [5, 6], [3 + n_kept, 3 + n_kept + 1]]
    assert ta.labels.tolist() == ["x", "y", "z", "x"] and ta.sent_index.tolist() == [0, 0, 1, 2]
    # the rows really are those words: row of "cat" = first subword of "cat" in its sentence
    direct, _, _ = _direct(model, wp, ["cat", "the"], "first")
    got = ta.store.layer(2)[ta.span2[3, 0]].astype(np.float32)
    torch.testing.assert_close(torch.from_numpy(got), direct[2, 0].half().float(), atol=3e-3, rtol=3e-3)


def test_window_policy_gives_every_word_a_vector(wp, tmp_path):
    model = _enc(wp, max_positions=8)
    long = "the cat sat on the mat and the dog ran".split()
    store = extract(model, wp, [long], tmp_path, policy="window", progress=False)
    assert store.n_words == len(long) and store.index["alignment"]["n_windowed_sentences"] == 1
    assert np.isfinite(store.layer(1).astype(np.float32)).all()
    with pytest.raises(ValueError, match="truncate"):
        extract(model, wp, [long], tmp_path, policy="window", attentions=True, progress=False)


@pytest.mark.slow
def test_extract_cli_reads_a_checkpoint_and_ewt(wp, tmp_path):
    import plmodels
    from workbench.core.paths import data_root

    if not (data_root() / "ud_english_ewt" / "en_ewt-ud-dev.conllu").is_file():
        pytest.skip("shared EWT data not available")
    model = _enc(wp, max_positions=64)
    plmodels.save(model, wp, tmp_path / "ckpt")
    store = extraction.extract_cli(tmp_path / "ckpt", "ewt:dev", tmp_path / "stores", limit=4)
    sents = extraction.load_sentences("ewt:dev", limit=4)
    assert store.n_sentences == 4 and store.index["model_id"] == plmodels.checkpoint_hash(tmp_path / "ckpt")
    want, _, _ = _direct(model, wp, sents[1], "first")
    got = torch.from_numpy(store.layers()[:, store.sentence_rows(1)].astype(np.float32))
    torch.testing.assert_close(got, want.half().float(), atol=3e-3, rtol=3e-3)


def test_bf16_precision_is_a_separate_store_close_to_fp32(wp, tmp_path):
    model = _enc(wp)
    exact = extract(model, wp, SENTS, tmp_path, attentions=True, batch_tokens=40, progress=False)
    fast = extract(model, wp, SENTS, tmp_path, attentions=True, batch_tokens=40, precision="bf16", progress=False)
    assert fast.path != exact.path and fast.index["precision"] == "bf16" and exact.index["precision"] == "fp32"
    a, b = exact.layers().astype(np.float32), fast.layers().astype(np.float32)
    assert not np.array_equal(a, b)  # it really ran in bf16
    scale = np.abs(a).max(axis=(1, 2), keepdims=True)
    assert np.abs(a - b).max() / scale.max() < 0.05  # bf16 rounding, not a different computation
    for (_, wa, sa), (_, wb, sb) in zip(exact.iter_sentence_attention(), fast.iter_sentence_attention()):
        np.testing.assert_allclose(wb.astype(np.float32), wa.astype(np.float32), atol=2e-2)
    with pytest.raises(ValueError, match="precision"):
        extract(model, wp, SENTS, tmp_path, precision="fp8", progress=False)


def _window_direct(model, tok, words, pooling):
    """Hand recomputation under the window policy's definition (workbench/data/align.py): windows of
    whole words of at most max_positions tokens with the specials, the next one starting at the first
    word at least half a window (in subwords) later; word w is owned by the window maximising
    min(subwords left of w, subwords right of w) inside it (ties -> the earlier window), and its
    vector is the model's run on that window alone. A sentence that fits is one window: `_direct`.
    Returns (L+1, n, D) vectors and the windows [(lo, hi)] with the owner of each word."""
    enc = tok.encode_words(words)
    spans, n = list(enc.word_spans), len(enc.word_spans)
    head, tail = list(enc.ids[: spans[0][0]]) if n else [], list(enc.ids[spans[-1][1]:]) if n else []
    budget = model.config.max_positions - len(head) - len(tail)
    windows, lo = [], 0
    while lo < n:
        hi = lo
        while hi < n and spans[hi][1] - spans[lo][0] <= budget:
            hi += 1
        assert hi > lo, "no word is longer than a window here"
        windows.append((lo, hi))
        if hi == n:
            break
        half = spans[lo][0] + max(1, (spans[hi - 1][1] - spans[lo][0]) // 2)
        lo = next((w for w in range(lo + 1, hi) if spans[w][0] >= half), hi)
    owner = [-max((min(spans[w][0] - spans[lo][0], spans[hi - 1][1] - spans[w][1]), -k)
                  for k, (lo, hi) in enumerate(windows) if lo <= w < hi)[1] for w in range(n)]
    hidden = []
    with torch.no_grad():
        for lo, hi in windows:
            ids = head + list(enc.ids[spans[lo][0]: spans[hi - 1][1]]) + tail
            hidden.append(torch.stack(model(torch.tensor([ids]), output_hidden_states=True).hidden_states)[:, 0])
    rows = []
    for w, (s, e) in enumerate(spans):
        a = len(head) + s - spans[windows[owner[w]][0]][0]
        hs, b = hidden[owner[w]], a + e - s
        rows.append({"first": hs[:, a], "last": hs[:, b - 1], "mean": hs[:, a:b].mean(1)}[pooling])
    vecs = torch.stack(rows, 1) if rows else torch.zeros(model.config.n_layers + 1, 0, model.config.d_model)
    return vecs, windows, owner


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_window_policy_vectors_come_from_the_owning_window(kind, pooling, wp, bpe, tmp_path):
    """A window owning words 0..k-1 also holds later words as context: they must not be pooled as
    extra words (first/last crashed on a shape mismatch, mean wrote them over the words of the piece
    after it in the batch). Every word's vector is its owning window's, every sentence that fits is
    unchanged from extracting it alone."""
    tok, model = (wp, _enc(wp, max_positions=16)) if kind == "encoder" else (bpe, _dec(bpe, max_positions=16))
    long = "the cat sat on the mat and the dog ran".split() * 3
    sents = SENTS * 3 + [long] + SENTS  # the reproduction (sentence 24), then more sentences after it
    store = extract(model, tok, sents, tmp_path, pooling=pooling, policy="window", batch_tokens=40,
                    progress=False)
    assert store.n_words == sum(map(len, sents))
    stack = store.layers()
    n_windowed = 0
    for s, words in enumerate(sents):
        want, windows, owner = _window_direct(model, tok, words, pooling)
        n_windowed += len(windows) > 1
        if len(windows) == 1:
            torch.testing.assert_close(want, _direct(model, tok, words, pooling)[0])  # the sentence alone
        got = torch.from_numpy(stack[:, store.sentence_rows(s)].astype(np.float32))
        torch.testing.assert_close(got, want.half().float(), atol=3e-3, rtol=3e-3, msg=f"sentence {s}")
    assert store.index["alignment"]["n_windowed_sentences"] == n_windowed
    # the case under test: the long sentence's first window owns a prefix and holds later words too
    _, windows, owner = _window_direct(model, tok, long, pooling)
    assert len(windows) > 1 and owner.count(0) < windows[0][1]


def _extract_after(barrier, tok, root: str, out) -> None:
    torch.set_num_threads(1)
    model = _enc(tok)
    barrier.wait()
    try:
        out.put(str(extract(model, tok, SENTS * 40, root, attentions=True, progress=False).path))
    except Exception as e:   # noqa: BLE001 - the parent asserts on it
        out.put(f"failed: {type(e).__name__}: {e}")


@pytest.mark.slow
def test_two_processes_asking_for_one_store_at_once_get_it_built_once(wp, tmp_path):
    """Steps of `workbench run` with workers > 1 may ask for one store together: under the store's lock
    one builds it and the other opens it (without the lock the second rename fails: "appeared while it
    was being built")."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_extract_after, args=(barrier, wp, str(tmp_path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    assert got[0] == got[1] and not got[0].startswith("failed"), got
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1
