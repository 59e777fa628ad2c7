"""Activation patching at the named hook sites: run a model on two aligned inputs and put one site's
activation from the *source* run into the *base* run (Vig et al. 2020, "Investigating gender bias in
language models using causal mediation analysis"; Meng et al. 2022's causal tracing; Heimersheim &
Nanda 2024, "How to use and interpret activation patching"), path patching of one site's effect
through a chosen later site (Wang et al. 2022, "Interpretability in the wild", Sec. 3.1;
Goldowsky-Dill et al. 2023) and attribution patching, its first-order approximation for every site at
once (Nanda 2023, "Attribution patching"; Syed, Rager & Conmy 2023, "Attribution patching outperforms
automated circuit discovery").

A site is a hook name of the model (docs/design.md, "Hook sites": `blocks.{l}.resid_post`,
`blocks.{l}.attn_out`, `blocks.{l}.mlp_out`, `blocks.{l}.attn.head_out`, `.q/.k/.v`, a seq2seq
model's `decoder.blocks.{l}.cross_attn.head_out`, an ELMo layer's `fwd`/`bwd`, ...), optionally one
head of it (the head axis of the per-head sites, `HEAD_AXIS`) and one token position: an int (the
same index for every item), a name of an entry of the `positions` mapping the patching functions take
((N,) one index per item: the subject's last token, the reading position), or None (every position).
Nothing here branches on a model kind: the sites are read off `model.hook_names()`.

The inputs are two batches of the same shapes (a mapping of tensors, as the families' analysis
forwards take them: `plmodels.families.Family.forward_batch`): item n of the base batch and item n of
the source batch differ only where the intervention changed the input (the subject's number, a name).
By default they are aligned token by token: position p of the base run takes position p of the source
run. Where the intervention changes the number of tokens (a plural subject of one more subword), an
`align` (N, T) tensor aligns them by word (Vig et al. 2020; Finlayson et al. 2021 patch at the changed
word's last token and the positions after it): position p of item n of the base run takes the source
run's position align[n, p], and keeps its own where align[n, p] < 0 (a piece of the changed word with no
counterpart). `score(model, batch) -> (N,)` runs the forward and reads one number per item off its
output (a logit difference of the two forms, a probability, a loss).

- `patch_sites(model, score, base, source, sites)` -> (S, N): score of the base run with site s's
  activation replaced by the source run's (at the aligned positions, with `align`). Denoising: base =
  corrupted, source = clean; noising: base = clean, source = corrupted.
- `path_patch(model, score, base, source, sender, receiver, freeze)` -> (N,): the base run where only
  the receiver sees the sender's source activation (Wang et al.'s path patching): (1) run the base
  input with the sender patched from the source and every site of `freeze` (by default every other
  head's output) held at its base value, and read the receiver; (2) run the base input with only the
  receiver replaced by that value.
- `attribution_patch(model, score, base, source, sites)` -> (S, N): (a_source - a_base) . d score /
  d a at the base run, summed over the site's slice (a_source aligned as in `patch_sites`): one forward
  and one backward for every site.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

Batch = Mapping[str, Tensor]
Score = Callable[[nn.Module, Batch], Tensor]  # (model, batch) -> (N,) one number per item

# the axis of the heads in a per-head site's tensor, by the site's last name component
HEAD_AXIS: dict[str, int] = {"q": 2, "k": 2, "v": 2, "head_out": 2, "scores": 1, "pattern": 1}  # (B,T,H,Dh) | (B,H,T,T)
# the axis of the (query) positions; every other site is (B, T, ...)
POSITION_AXIS: dict[str, int] = {"scores": 2, "pattern": 2}
# site kinds of the default grid (`site_grid`): the residual stream, the sub-layer outputs, each head's output
# (an encoder-decoder's self- and cross-attention outputs; an ELMo layer's two directions)
GRID_KINDS: tuple[str, ...] = ("resid_post", "attn_out", "self_attn_out", "cross_attn_out", "mlp_out", "head_out",
                               "fwd", "bwd")


@dataclass(frozen=True)
class Site:
    """One place to patch: a hook name, optionally one head of it and one token position."""

    hook: str  # our hook name (docs/design.md, "Hook sites")
    head: int | None = None  # index on the site's head axis (HEAD_AXIS); None: the whole tensor
    # token (query) position: an int for every item, a key of `positions` (one per item), None: every one
    position: int | str | None = None

    @property
    def kind(self) -> str:
        """The hook name's last component: "resid_post", "head_out", "q", "cross_attn_out", ..."""
        return self.hook.rsplit(".", 1)[-1]

    @property
    def layer(self) -> int:
        """The block index in the name (`...blocks.3...` -> 3); -1 for a site outside the blocks (embed)."""
        parts = self.hook.split(".")
        return next((int(parts[i + 1]) for i, p in enumerate(parts[:-1]) if p == "blocks"), -1)

    @property
    def label(self) -> str:
        head = "" if self.head is None else f"[{self.head}]"
        pos = "" if self.position is None else f"@{self.position}"
        return f"{self.hook}{head}{pos}"

    def index(self, ndim: int, positions: Mapping[str, Tensor] | None = None) -> tuple:
        """The slice of a (B, ...) activation this site covers; a named position is looked up in
        `positions` ((B,) per item: advanced indexing on the batch and the position axes)."""
        idx: list = [slice(None)] * ndim
        if self.head is not None:
            idx[HEAD_AXIS[self.kind]] = self.head
        if isinstance(self.position, str):
            if positions is None or self.position not in positions:
                raise ValueError(f"patching: site {self.label} names position {self.position!r}, which is not a key "
                                 f"of positions {sorted(positions or {})}")
            per_item = positions[self.position]
            idx[0] = torch.arange(len(per_item))
            idx[POSITION_AXIS.get(self.kind, 1)] = per_item
        elif self.position is not None:
            idx[POSITION_AXIS.get(self.kind, 1)] = self.position
        return tuple(idx)


def check_sites(model: nn.Module, sites: Iterable[Site]) -> list[Site]:
    """The sites as a list; a hook name the model lacks, or a head on a site without heads, is a
    ValueError naming it."""
    sites = list(sites)
    names = set(model.hook_names())
    bad = [s.hook for s in sites if s.hook not in names]
    if bad:
        raise ValueError(f"patching: unknown site(s) {bad} for a {getattr(model, 'kind', type(model).__name__)} "
                         f"model; its hook sites are {sorted(names)}")
    headless = [s.label for s in sites if s.head is not None and s.kind not in HEAD_AXIS]
    if headless:
        raise ValueError(f"patching: site(s) {headless} have no head axis; heads exist at {sorted(HEAD_AXIS)}")
    return sites


def site_grid(model: nn.Module, kinds: Sequence[str] = GRID_KINDS, heads: bool = True) -> list[Site]:
    """Every site of the model whose kind is in `kinds`, in forward order; a per-head kind (HEAD_AXIS)
    gives one site per head of its attention module (`n_heads`, after pruning) when `heads`, else the
    whole tensor."""
    out = []
    for name in model.hook_names():
        site = Site(name)
        if site.kind not in kinds:
            continue
        if heads and site.kind in HEAD_AXIS:
            out.extend(Site(name, h) for h in range(_n_heads(model, site)))
        else:
            out.append(site)
    return out


def _n_heads(model: nn.Module, site: Site) -> int:
    """Heads of the attention module that owns `site` (its `n_heads`: the heads still present)."""
    module = model.get_submodule(site.hook.rsplit(".", 1)[0])
    n = getattr(module, "n_heads", None)
    if n is None:
        raise ValueError(f"patching: {site.hook}'s module {type(module).__name__} has no n_heads")
    return int(n)


def _check_batches(base: Batch, source: Batch) -> None:
    keys = sorted(set(base) | set(source))
    bad = [k for k in keys if k not in base or k not in source or base[k] is None and source[k] is not None
           or base[k] is not None and (source[k] is None or base[k].shape != source[k].shape)]
    if bad:
        shapes = [tuple(getattr(b.get(k), "shape", ())) for k in bad for b in (base, source)]
        raise ValueError(f"patching: base and source batches must be aligned (same keys and shapes); they differ "
                         f"at {bad}: base, source shapes {shapes}")


def _chunks(batch: Batch, size: int) -> Iterable[dict[str, Tensor]]:
    n = len(next(iter(v for v in batch.values() if v is not None)))
    for s in range(0, n, size):
        yield {k: (None if v is None else v[s: s + size]) for k, v in batch.items()}


@torch.no_grad()
def cache_activations(model: nn.Module, score: Score, batch: Batch, hooks: Iterable[str]
                      ) -> tuple[Tensor, dict[str, Tensor]]:
    """(score (N,), {hook: activation}) of one run."""
    cache: dict[str, Tensor] = {}

    def save(t: Tensor, name: str) -> None:
        cache[name] = t.detach()

    hooks = sorted(set(hooks))
    with model.hooks([(h, save) for h in hooks]):
        s = score(model, batch)
    silent = [h for h in hooks if h not in cache]
    if silent:
        raise ValueError(f"patching: site(s) {silent} did not run in this forward (XLNet's query stream needs a "
                         "target_mapping; a seq2seq decoder needs decoder_input_ids)")
    return s, cache


def check_align(sites: Sequence[Site], align: Tensor | None) -> None:
    """An alignment moves activations along the position axis 1: a site whose positions are on another
    axis (`POSITION_AXIS`: an attention pattern's query and key positions) cannot take one."""
    if align is None:
        return
    bad = [s.label for s in sites if s.kind in POSITION_AXIS]
    if bad:
        raise ValueError(f"patching: site(s) {bad} have their positions on a query and a key axis; an alignment "
                         f"by word (align) moves activations of shape (B, T, ...) only")
    if align.dim() != 2 or align.dtype != torch.long:
        raise ValueError(f"patching: align must be an (N, T) long tensor, got {tuple(align.shape)} {align.dtype}")


def aligned(value: Tensor, base: Tensor, align: Tensor) -> Tensor:
    """The source run's activation `value` (B, T, ...) moved onto the base run's positions: out[b, p] =
    value[b, align[b, p]], and base[b, p] (the base run's own) where align[b, p] < 0. align: (B, T)."""
    if tuple(align.shape) != tuple(base.shape[:2]):
        raise ValueError(f"patching: align {tuple(align.shape)} does not match the activation's (B, T) "
                         f"{tuple(base.shape[:2])}")
    shape = tuple(align.shape) + (1,) * (base.dim() - 2)
    idx = align.clamp(min=0).reshape(shape).expand_as(value)
    return torch.where((align >= 0).reshape(shape), value.gather(1, idx), base)


def _patcher(site: Site, value: Tensor, positions: Mapping[str, Tensor] | None = None,
             align: Tensor | None = None) -> Callable[[Tensor, str], Tensor]:
    def fn(t: Tensor, name: str) -> Tensor:
        src = value if align is None else aligned(value, t, align)
        idx = site.index(t.dim(), positions)
        out = t.clone()
        out[idx] = src[idx].to(t.dtype)
        return out
    return fn


@torch.no_grad()
def patch_sites(model: nn.Module, score: Score, base: Batch, source: Batch, sites: Iterable[Site],
                batch_size: int = 256, positions: Mapping[str, Tensor] | None = None,
                align: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(base score (N,), source score (N,), patched (S, N)): patched[s] is the base run's score with
    site s's activation taken from the source run (module docstring). Items go `batch_size` at a time;
    `positions` {name: (N,)} are the per-item positions of the base run that sites may name; `align`
    (N, T): the source position each base position takes (-1: none), None: token by token."""
    sites = check_sites(model, sites)
    _check_batches(base, source)
    check_align(sites, align)
    hooks = {s.hook for s in sites}
    b_all, s_all, p_all = [], [], []
    chunks = zip(_chunks(base, batch_size), _chunks(source, batch_size), _position_chunks(positions, batch_size),
                 _align_chunks(align, batch_size))
    for b, src, pos, al in chunks:
        s_score, cache = cache_activations(model, score, src, hooks)
        b_all.append(score(model, b))
        s_all.append(s_score)
        rows = []
        for site in sites:
            with model.hooks([(site.hook, _patcher(site, cache[site.hook], pos, al))]):
                rows.append(score(model, b))
        p_all.append(torch.stack(rows) if rows else torch.zeros(0, len(s_score)))
    return torch.cat(b_all), torch.cat(s_all), torch.cat(p_all, dim=1)


def _position_chunks(positions: Mapping[str, Tensor] | None, size: int) -> Iterable[dict[str, Tensor] | None]:
    """The per-item positions cut as the batches are (None forever when there are none)."""
    if not positions:
        while True:
            yield None
    yield from _chunks(positions, size)


def _align_chunks(align: Tensor | None, size: int) -> Iterable[Tensor | None]:
    """The alignment cut as the batches are (None forever without one)."""
    for chunk in _position_chunks(None if align is None else {"align": align}, size):
        yield None if chunk is None else chunk["align"]


def _forward_order(model: nn.Module, site: Site) -> int:
    return model.hook_names().index(site.hook)


@torch.no_grad()
def path_patch(model: nn.Module, score: Score, base: Batch, source: Batch, sender: Site, receiver: Site,
               freeze: Sequence[str] = ("head_out",)) -> Tensor:
    """(N,) the base run's score when the sender's source activation reaches the output only through
    the receiver (module docstring). `freeze`: site kinds held at their base value in step (1), except
    the sender's and the receiver's own slices; the default holds every other head, so MLPs recompute
    (Wang et al. 2022). The receiver must come after the sender in forward order."""
    check_sites(model, [sender, receiver])
    _check_batches(base, source)
    if isinstance(sender.position, str) or isinstance(receiver.position, str):
        raise ValueError("path_patch: per-item (named) positions are not supported; give an int or None")
    if _forward_order(model, receiver) <= _forward_order(model, sender):
        raise ValueError(f"path_patch: the receiver {receiver.label} must come after the sender {sender.label} "
                         "in forward order (model.hook_names())")
    frozen = [n for n in model.hook_names() if Site(n).kind in freeze]
    _, base_cache = cache_activations(model, score, base, set(frozen) | {receiver.hook})
    _, src_cache = cache_activations(model, score, source, {sender.hook})
    seen: dict[str, Tensor] = {}

    def step1(t: Tensor, name: str) -> Tensor:
        out = base_cache[name].clone() if name in frozen else t.clone()
        if name == receiver.hook:  # the receiver's own slice is recomputed, then read
            idx = receiver.index(t.dim())
            out[idx] = t[idx]
            seen[name] = out
        if name == sender.hook:
            idx = sender.index(t.dim())
            out[idx] = src_cache[name][idx]
        return out

    with model.hooks([(n, step1) for n in sorted(set(frozen) | {sender.hook, receiver.hook})]):
        score(model, base)
    with model.hooks([(receiver.hook, _patcher(receiver, seen[receiver.hook]))]):
        return score(model, base)


def attribution_patch(model: nn.Module, score: Score, base: Batch, source: Batch, sites: Iterable[Site],
                      batch_size: int = 256, positions: Mapping[str, Tensor] | None = None,
                      align: Tensor | None = None) -> Tensor:
    """(S, N) the first-order estimate of `patch_sites(...)[2] - base score`: sum over the site's
    slice of (a_source - a_base) * d score / d a, the gradient taken at the base run (Nanda 2023;
    Syed et al. 2023), a_source aligned to the base run's positions by `align` as in `patch_sites`.
    Items do not interact in a forward, so one backward of the summed score gives every item's gradient."""
    sites = check_sites(model, sites)
    _check_batches(base, source)
    check_align(sites, align)
    hooks = sorted({s.hook for s in sites})
    out = []
    chunks = zip(_chunks(base, batch_size), _chunks(source, batch_size), _position_chunks(positions, batch_size),
                 _align_chunks(align, batch_size))
    for b, src, pos, al in chunks:
        _, src_cache = cache_activations(model, score, src, hooks)
        acts: dict[str, Tensor] = {}

        def keep(t: Tensor, name: str) -> Tensor:
            if not t.requires_grad:  # nothing upstream needs a gradient (frozen weights): make it a leaf
                t = t.detach().requires_grad_(True)
            acts[name] = t  # not detached: a detach would cut the paths of the sites upstream of it
            return t

        with torch.enable_grad(), model.hooks([(h, keep) for h in hooks]):
            s = score(model, b)
            grads = torch.autograd.grad(s.sum(), [acts[h] for h in hooks], allow_unused=True)
        grad = {h: (torch.zeros_like(acts[h]) if g is None else g) for h, g in zip(hooks, grads)}
        rows = []
        for site in sites:
            idx = site.index(acts[site.hook].dim(), pos)
            a_base = acts[site.hook].detach()
            a_src = src_cache[site.hook] if al is None else aligned(src_cache[site.hook], a_base, al)
            contrib = ((a_src - a_base) * grad[site.hook])[idx]
            rows.append(contrib.reshape(len(s), -1).sum(1))
        out.append(torch.stack(rows) if rows else torch.zeros(0, len(s)))
    return torch.cat(out, dim=1)
