"""Activation patching, path patching and attribution patching (probes/patching.py) on a tiny model of
every kind: a site patched with its own activation changes nothing, the last residual site carries the
whole source run, attribution patching is patching's first-order term, and path patching's two steps."""
from __future__ import annotations

import pytest
import torch

from plmodels.checkpoint import build_model
from plmodels.families import KINDS, family_of, preset
from probes.patching import HEAD_AXIS, Site, attribution_patch, check_sites, patch_sites, path_patch, site_grid

V, T, N = 61, 7, 4


def tiny(kind: str):
    torch.manual_seed(0)
    return build_model(kind, {**preset(kind, "tiny"), "vocab_size": V}).eval()


def pair(kind: str, changed: int = 2) -> tuple[dict, dict]:
    """(base, source) batches of N items equal except at token `changed` (an aligned minimal pair)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (N, T), generator=g)
    other = ids.clone()
    other[:, changed] = 5 + (ids[:, changed] - 5 + 1 + torch.randint(0, V - 6, (N,), generator=g)) % (V - 5)
    out = []
    for x in (ids, other):
        b = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        if kind == "seq2seq":
            b["decoder_input_ids"] = ids[:, :5].clone()  # the same decoder input: only the source differs
        out.append(b)
    return out[0], out[1]


def readout_score(model):
    """score(model, batch) -> (N,): the last position's output (logits, else the last hidden state)
    times a fixed random vector, through the family's analysis forward."""
    fam = family_of(model)
    w = {}

    def score(m, batch):
        out = fam.forward_batch(m, batch, None)
        r = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        if "w" not in w:
            w["w"] = torch.randn(r.shape[-1], generator=torch.Generator().manual_seed(2))
        return r[:, -1] @ w["w"].to(r.dtype)
    return score


def every_site(model) -> list[Site]:
    """Every hook site that fires in an analysis forward (XLNet's query stream runs only with targets)."""
    kinds = {Site(n).kind for n in model.hook_names() if not Site(n).kind.startswith("query_")}
    return site_grid(model, kinds=tuple(kinds))


@pytest.mark.parametrize("kind", KINDS)
def test_patching_a_site_with_its_own_activation_changes_nothing(kind):
    """Every hook site, whole, per head and at one position (float64: a pattern or scores site takes the
    eager attention path, whose float32 round-off differs from SDPA's by ~5e-6 on these readouts; XLNet
    keeps float32 buffers and always runs its own eager attention)."""
    model = tiny(kind) if kind == "xlnet" else tiny(kind).double()
    base, _ = pair(kind)
    score = readout_score(model)
    sites = every_site(model)
    sites += [Site(s.hook, s.head, position=3) for s in sites if s.kind != "embed"][:6]
    b, s, patched = patch_sites(model, score, base, base, sites)
    assert patched.shape == (len(sites), N)
    torch.testing.assert_close(patched, b.expand_as(patched), atol=1e-6, rtol=0)
    torch.testing.assert_close(s, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_last_residual_site_carries_the_whole_source_run(kind):
    """Patching the last block's output at every position gives the source run's score; patching it
    at a position the readout does not read changes nothing (patched at one index only)."""
    model = tiny(kind)
    base, source = pair(kind)
    last = [n for n in model.hook_names() if Site(n).kind == "resid_post"][-1]
    b, s, p = patch_sites(model, readout_score(model), base, source, [Site(last), Site(last, position=0)])
    assert (b - s).abs().min() > 1e-4  # the intervention moves the readout
    torch.testing.assert_close(p[0], s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p[1], b, atol=1e-6, rtol=0)
    # a per-item position: items 0 and 2 patched where the readout reads, items 1 and 3 at position 0
    last_pos = (base["decoder_input_ids"] if "decoder_input_ids" in base else base["input_ids"]).shape[1] - 1
    where = {"read": torch.tensor([last_pos, 0, last_pos, 0])}
    _, _, q = patch_sites(model, readout_score(model), base, source, [Site(last, position="read")], positions=where)
    torch.testing.assert_close(q[0], torch.stack([s[0], b[1], s[2], b[3]]), atol=1e-5, rtol=1e-5)


# ELMo and XLNet have no per-head site, the tiny transformer biLM one head per direction
@pytest.mark.parametrize("kind", [k for k in KINDS if k not in ("bilm", "xlnet", "tbilm")])
def test_a_head_patch_writes_that_head_only(kind):
    model = tiny(kind)
    base, source = pair(kind)
    head_site = next(s for s in site_grid(model, kinds=("head_out",)) if s.head == 1)
    seen = {}

    def score(m, batch):  # record the head_out tensor the rest of the forward sees
        with m.hooks([(head_site.hook, lambda t, n: seen.__setitem__("x", t))]):
            return readout_score(model)(m, batch)

    score(model, source)
    src = seen["x"].clone()
    score(model, base)
    ref = seen["x"].clone()
    patch_sites(model, score, base, source, [head_site])
    got = seen["x"]
    ax = HEAD_AXIS["head_out"]
    torch.testing.assert_close(got.select(ax, 1), src.select(ax, 1))
    other = [h for h in range(got.shape[ax]) if h != 1]
    torch.testing.assert_close(got[:, :, other], ref[:, :, other])
    assert not torch.allclose(src.select(ax, 1), ref.select(ax, 1))


def test_unknown_sites_and_unaligned_batches_are_one_clear_error():
    model = tiny("decoder")
    base, source = pair("decoder")
    with pytest.raises(ValueError, match=r"unknown site\(s\) \['blocks.9.resid_post'\] for a decoder model"):
        check_sites(model, [Site("blocks.9.resid_post")])
    with pytest.raises(ValueError, match=r"names position 'subject', which is not a key of positions \[\]"):
        patch_sites(model, readout_score(model), base, source, [Site("blocks.0.resid_post", position="subject")])
    with pytest.raises(ValueError, match=r"\['blocks.0.mlp_out\[1\]'\] have no head axis"):
        check_sites(model, [Site("blocks.0.mlp_out", head=1)])
    short = {k: v[:, :5] for k, v in source.items()}
    with pytest.raises(ValueError, match=r"must be aligned .* differ at \['attention_mask', 'input_ids'\]"):
        patch_sites(model, readout_score(model), base, short, [Site("blocks.0.resid_post")])


def noisy_score(model):
    """The readout score with batch["noise"] (N, T, D) added at the embed site: a source run that
    differs from the base run by a small continuous step."""
    inner = readout_score(model)

    def score(m, batch):
        with m.hooks([("embed", lambda t, n: t + batch["noise"])]):
            return inner(m, {k: v for k, v in batch.items() if k != "noise"})
    return score


@pytest.mark.parametrize("kind", ["encoder", "decoder", "seq2seq", "tbilm"])
def test_attribution_patching_is_the_first_order_term_of_patching(kind):
    """For a source a small step away from the base (1e-5 at the embed site, whose vectors are ~2e-2:
    a 1e-3 step already leaves a 3 % second-order term at a pre-LN decoder's residual stream) every
    site's attribution is its patching effect to first order (float64)."""
    model = tiny(kind).double()
    base, _ = pair(kind)
    D = model.config.d_model
    embed = next(n for n in model.hook_names() if Site(n).kind == "embed")
    Te = base["input_ids"].shape[1]
    g = torch.Generator().manual_seed(3)
    step = 1e-5 * torch.randn(N, Te, D, generator=g, dtype=torch.float64)
    b0 = {**base, "noise": torch.zeros(N, Te, D, dtype=torch.float64)}
    b1 = {**base, "noise": step}
    score = noisy_score(model)
    if embed != "embed":  # an encoder-decoder's embed site is per stack: noise the encoder's
        score = _encoder_noise_score(model)
    sites = site_grid(model)
    b, _, patched = patch_sites(model, score, b0, b1, sites)
    real = patched - b
    approx = attribution_patch(model, score, b0, b1, sites)
    assert real.abs().max() > 1e-5
    torch.testing.assert_close(approx, real, atol=1e-3 * real.abs().max().item(), rtol=0)


def _encoder_noise_score(model):
    inner = readout_score(model)

    def score(m, batch):
        with m.hooks([("encoder.embed", lambda t, n: t + batch["noise"])]):
            return inner(m, {k: v for k, v in batch.items() if k != "noise"})
    return score


def test_attribution_patching_is_exact_where_the_score_is_linear():
    """A post-LN encoder's readout is linear in its last block's output: attribution = patching there."""
    model = tiny("encoder")
    base, source = pair("encoder")
    score = readout_score(model)
    site = Site(f"blocks.{model.config.n_layers - 1}.resid_post")
    b, _, p = patch_sites(model, score, base, source, [site])
    torch.testing.assert_close(attribution_patch(model, score, base, source, [site]), p - b, atol=1e-4, rtol=1e-4)


def test_path_patching_through_the_output_of_a_last_layer_head_is_patching_it():
    """A last-layer head reaches the last residual site directly (its peers do not depend on it), so its
    path effect through that site is its patching effect; a receiver before the sender is refused."""
    model = tiny("decoder")
    base, source = pair("decoder")
    score = readout_score(model)
    L = model.config.n_layers
    sender = Site(f"blocks.{L - 1}.attn.head_out", head=1)
    _, _, p = patch_sites(model, score, base, source, [sender])
    got = path_patch(model, score, base, source, sender, Site(f"blocks.{L - 1}.resid_post"))
    torch.testing.assert_close(got, p[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="must come after the sender"):
        path_patch(model, score, base, source, sender, Site("blocks.0.attn.head_out", head=0))


def test_path_patching_through_a_silenced_receiver_carries_nothing():
    """Sender (0, 1) to receiver head (1, 0), gated to zero by the head mask: no path, no effect, although
    patching the sender itself moves the score; through an open receiver head the effect is not zero."""
    model = tiny("decoder")
    base, source = pair("decoder")
    mask = torch.ones(model.config.n_layers, model.config.n_heads)
    mask[1, 0] = 0.0

    def score(m, batch):
        out = m(batch["input_ids"], attention_mask=batch["attention_mask"], head_mask=mask)
        return out.logits[:, -1, 7] - out.logits[:, -1, 8]

    sender = Site("blocks.0.attn.head_out", head=1)
    b, _, p = patch_sites(model, score, base, source, [sender])
    assert (p[0] - b).abs().max() > 1e-3
    shut = path_patch(model, score, base, source, sender, Site("blocks.1.attn.head_out", head=0))
    torch.testing.assert_close(shut, b, atol=1e-6, rtol=0)
    open_ = path_patch(model, score, base, source, sender, Site("blocks.1.attn.head_out", head=1))
    assert (open_ - b).abs().max() > 1e-5


def test_sites_name_their_layer_and_the_default_grid_holds_every_head():
    assert Site("decoder.blocks.3.cross_attn.head_out", head=1).layer == 3 and Site("embed").layer == -1
    assert Site("blocks.2.attn.q", 0, "subject").label == "blocks.2.attn.q[0]@subject"
    model = tiny("decoder")
    L, H = model.config.n_layers, model.config.n_heads
    grid = site_grid(model)
    assert [s.kind for s in grid].count("head_out") == L * H and len(grid) == L * (H + 3)
    assert [(s.layer, s.head) for s in grid if s.kind == "head_out"] == [(l, h) for l in range(L) for h in range(H)]


@pytest.mark.parametrize("kind", ["pattern", "scores"])
def test_a_pattern_patched_at_one_position_is_that_query_row(kind):
    """A pattern's (or the scores') position is its query axis: row 2 of head 1 comes from the source,
    nothing else (copied when seen: the no-grad softmax overwrites the scores in place)."""
    model = tiny("decoder")
    base, source = pair("decoder", changed=1)
    site = Site(f"blocks.1.attn.{kind}", head=1, position=2)
    seen = {}

    def score(m, batch):
        with m.hooks([(site.hook, lambda t, n: seen.__setitem__("x", t.clone()))]):
            return readout_score(model)(m, batch)

    score(model, source)
    src = seen["x"].clone()
    score(model, base)
    ref = seen["x"].clone()
    patch_sites(model, score, base, source, [site])
    want = ref.clone()
    want[:, 1, 2] = src[:, 1, 2]
    torch.testing.assert_close(seen["x"], want)
    assert not torch.allclose(src[:, 1, 2], ref[:, 1, 2])


def test_items_in_chunks_give_the_numbers_of_one_batch():
    model = tiny("encoder")
    base, source = pair("encoder")
    sites = site_grid(model)
    whole = patch_sites(model, readout_score(model), base, source, sites)
    chunked = patch_sites(model, readout_score(model), base, source, sites, batch_size=3)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attribution_patch(model, readout_score(model), base, source, sites, batch_size=3),
                               attribution_patch(model, readout_score(model), base, source, sites), atol=1e-5, rtol=1e-5)


def _inserted(changed: int = 2) -> tuple[dict, dict, torch.Tensor, torch.Tensor]:
    """(base, source, to_source, to_base): N items of T tokens, padded by one, and the same items with one
    token inserted after position `changed` (a word of two pieces where the base has one), each batch
    carrying the position its score reads ("read": the last real token); the alignments by word: the
    word's last piece to the word's last piece, later positions shifted, the source's extra piece to none."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (N, T), generator=g)
    extra = torch.randint(5, V, (N, 1), generator=g)
    base_ids = torch.cat([ids, torch.zeros(N, 1, dtype=torch.long)], 1)
    src_ids = torch.cat([ids[:, :changed], extra, ids[:, changed:]], 1)
    mask = torch.ones(N, T + 1, dtype=torch.long)
    base = {"input_ids": base_ids, "attention_mask": mask.clone().index_fill_(1, torch.tensor([T]), 0),
            "read": torch.full((N,), T - 1)}
    source = {"input_ids": src_ids, "attention_mask": mask, "read": torch.full((N,), T)}
    to_source = torch.tensor([p if p < changed else p + 1 for p in range(T)] + [-1]).repeat(N, 1)
    to_base = torch.tensor([p if p < changed else -1 if p == changed else p - 1 for p in range(T + 1)]).repeat(N, 1)
    return base, source, to_source, to_base


def read_score(model):
    """The decoder's logit of token 7 at the position batch["read"] (N,)."""
    def score(m, batch):
        out = m(batch["input_ids"], attention_mask=batch["attention_mask"])
        return out.logits[torch.arange(len(batch["read"])), batch["read"], 7]
    return score


def test_an_alignment_by_word_moves_the_source_positions_onto_the_base_ones():
    """A source with one more piece inside a word: aligned by word, the last block's output patched at
    every position gives the source's score in both directions (the readout position is mapped); at the
    base's extra piece's counterpart (none) it changes nothing; the identity alignment is no alignment;
    a middle site's patch equals a hand-made hook that copies the mapped positions."""
    model = tiny("decoder").double()
    base, source, to_source, to_base = _inserted()
    score = read_score(model)
    last = Site([n for n in model.hook_names() if Site(n).kind == "resid_post"][-1])
    b, s, p = patch_sites(model, score, base, source, [last], align=to_source)
    torch.testing.assert_close(p[0], s, atol=1e-9, rtol=0)
    assert (s - b).abs().min() > 1e-4  # the two runs differ: the identity above is not trivial
    _, _, q = patch_sites(model, score, source, base, [last], align=to_base)
    torch.testing.assert_close(q[0], b, atol=1e-9, rtol=0)
    _, _, none = patch_sites(model, score, source, base, [Site(last.hook, position=2)], align=to_base)
    torch.testing.assert_close(none[0], s, atol=1e-9, rtol=0)  # the extra piece keeps its own value
    ident = torch.arange(T + 1).repeat(N, 1)
    sites = site_grid(model)
    torch.testing.assert_close(patch_sites(model, score, base, source, sites, align=ident)[2],
                               patch_sites(model, score, base, source, sites)[2], atol=0, rtol=0)
    torch.testing.assert_close(attribution_patch(model, score, base, source, sites, align=ident),
                               attribution_patch(model, score, base, source, sites), atol=0, rtol=0)
    mid = Site("blocks.0.attn.head_out", head=1)
    cache = {}
    with model.hooks([(mid.hook, lambda t, n: cache.setdefault("src", t.detach()))]):
        score(model, source)

    def by_hand(t, n):
        out = t.clone()
        for i in range(N):
            for q_, k in enumerate(to_source[i].tolist()):
                if k >= 0:
                    out[i, q_, 1] = cache["src"][i, k, 1]
        return out
    with model.hooks([(mid.hook, by_hand)]):
        want = score(model, base)
    got = patch_sites(model, score, base, source, [mid], align=to_source)[2][0]
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert (got - b).abs().max() > 1e-6


def test_an_alignment_of_no_position_changes_nothing_and_patterns_refuse_one():
    model = tiny("decoder")
    base, source, to_source, _ = _inserted()
    score = read_score(model)
    sites = site_grid(model)
    b, _, p = patch_sites(model, score, base, source, sites, align=torch.full_like(to_source, -1))
    torch.testing.assert_close(p, b.expand_as(p), atol=0, rtol=0)
    assert attribution_patch(model, score, base, source, sites, align=torch.full_like(to_source, -1)).abs().max() == 0
    with pytest.raises(ValueError, match=r"\['blocks.0.attn.pattern'\] have their positions on a query and a key"):
        patch_sites(model, score, base, source, [Site("blocks.0.attn.pattern")], align=to_source)
