"""Named hook sites for reading and editing activations (after TransformerLens, Nanda et al. 2022).

Every site is a tiny identity module, `HookPoint`, placed so that its module path *is* its public
name (docs/design.md, "Hook sites"):

| name                      | shape          | what                                                   |
|---------------------------|----------------|--------------------------------------------------------|
| `embed`                   | (B, T, D)      | embedding output = hidden_states[0]                    |
| `blocks.{l}.resid_pre`    | (B, T, D)      | input of block l                                       |
| `blocks.{l}.attn.q`, `.k`, `.v` | (B, T, H, Dh) | per-head queries (after RoPE), keys (after RoPE), values |
| `blocks.{l}.attn.scores`  | (B, H, T, T)   | scaled, masked scores before the softmax (eager path only) |
| `blocks.{l}.attn.pattern` | (B, H, T, T)   | post-softmax attention probabilities (eager path only) |
| `blocks.{l}.attn.head_out`| (B, T, H, Dh)  | per-head output before the output projection (head mask applied) |
| `blocks.{l}.attn_out`     | (B, T, D)      | attention sub-layer output (after projection and dropout) |
| `blocks.{l}.mlp.post`     | (B, T, F)      | MLP hidden activation (after the nonlinearity)         |
| `blocks.{l}.mlp_out`      | (B, T, D)      | MLP sub-layer output (after dropout)                   |
| `blocks.{l}.resid_post`   | (B, T, D)      | output of block l = hidden_states[l+1]                 |

TransformerLens names are accepted as aliases wherever a name is (`TL_ALIASES`: `hook_resid_pre`,
`attn.hook_pattern`, `attn.hook_z` = `attn.head_out`, `attn.hook_q/k/v`, `attn.hook_attn_scores`,
`mlp.hook_post`, `hook_attn_out`, `hook_mlp_out`, `hook_resid_post`), and a cache answers to both.

A hook is `fn(tensor, name) -> tensor | None`; returning a tensor replaces the activation, None
keeps it (in-place edits still count). Hooks exist only inside `model.hooks(...)`, which removes
them in `finally`. With no hook registered a site costs one Python call and one list check.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]

# TransformerLens' hook names (Nanda et al. 2022) -> ours, per block: `blocks.{l}.<key>` -> `blocks.{l}.<value>`.
# Not aliased: TL's hook_embed / hook_pos_embed (our `embed` is their sum after the embedding
# LayerNorm) and hook_rot_q/k (our q and k sites are already after RoPE).
TL_ALIASES = {
    "hook_resid_pre": "resid_pre", "hook_resid_post": "resid_post", "hook_attn_out": "attn_out",
    "hook_mlp_out": "mlp_out", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k", "attn.hook_v": "attn.v",
    "attn.hook_attn_scores": "attn.scores", "attn.hook_pattern": "attn.pattern", "attn.hook_z": "attn.head_out",
    "mlp.hook_post": "mlp.post",
}
_TL_BY_OURS = {v: k for k, v in TL_ALIASES.items()}
EAGER_SITES = (".pattern", ".scores")  # sites that only the eager attention path has


def _per_block(name: str, table: dict[str, str]) -> str | None:
    head, sep, rest = name.partition(".")
    if head == "blocks" and sep:
        layer, _, site = rest.partition(".")
        if site in table:
            return f"blocks.{layer}.{table[site]}"
    return None


def resolve_hook_name(name: str) -> str:
    """Our name for `name`, which may be a TransformerLens alias (`blocks.3.attn.hook_pattern` ->
    `blocks.3.attn.pattern`); any other name is returned unchanged."""
    return _per_block(name, TL_ALIASES) or name


def tl_alias(name: str) -> str | None:
    """The TransformerLens name of one of our sites, or None when TL has no equivalent."""
    return _per_block(name, _TL_BY_OURS)


class ActivationCache(dict):
    """What `run_with_cache` returns: {our hook name: tensor}, also indexed by TransformerLens names."""

    def __getitem__(self, name: str) -> torch.Tensor:
        return super().__getitem__(resolve_hook_name(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(resolve_hook_name(name))

    def get(self, name: str, default=None):
        return super().get(resolve_hook_name(name), default)


class HookPoint(nn.Module):
    """Identity that runs the registered hook functions on the tensor passing through."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # set by HookedModel.name_hook_points to the module path
        self.fns: list[HookFn] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # bypasses nn.Module's call machinery: an idle site is one call and one list check
        return self.forward(x) if self.fns else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fns:
            result = fn(x, self.name)
            if result is not None:
                x = result
        return x


class HookedModel:
    """Mixin for nn.Module models: `hooks`, `run_with_cache`, `hook_names`.

    The model calls `self.name_hook_points()` at the end of its constructor.
    """

    def name_hook_points(self) -> None:
        for name, module in self.named_modules():  # type: ignore[attr-defined]
            if isinstance(module, HookPoint):
                module.name = name
        # kept as a plain list so the per-forward "any pattern hook?" check does not walk modules
        self._pattern_points = [p for n, p in self.hook_points().items() if n.endswith(EAGER_SITES)]

    def hook_points(self) -> dict[str, HookPoint]:
        return {
            name: m
            for name, m in self.named_modules()  # type: ignore[attr-defined]
            if isinstance(m, HookPoint)
        }

    def hook_names(self) -> list[str]:
        """All valid hook names, in forward order."""
        return list(self.hook_points())

    def _pattern_hooks_active(self) -> bool:
        return any(p.fns for p in self._pattern_points)

    @contextmanager
    def hooks(self, fwd: Sequence[tuple[str, HookFn]] = ()) -> Iterator["HookedModel"]:
        """Register forward hooks for the duration of the `with` block; always removed after.

        fwd: [(name, fn)], fn(tensor, name) -> tensor | None; a name may be a TransformerLens alias
        (fn is then called with our name). Unknown names -> ValueError.
        """
        points = self.hook_points()
        unknown = [name for name, _ in fwd if resolve_hook_name(name) not in points]
        if unknown:
            raise ValueError(f"unknown hook name(s) {unknown}; valid names are: {list(points)} "
                             f"(or their TransformerLens aliases, plmodels.components.hooks.TL_ALIASES)")
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name, fn in fwd:
                point = points[resolve_hook_name(name)]
                point.fns.append(fn)
                added.append((point, fn))
            yield self
        finally:
            for point, fn in added:
                point.fns.remove(fn)

    def run_with_cache(
        self, input_ids: torch.Tensor, names: Sequence[str] | None = None, *, detach: bool = True,
        names_filter: "Callable[[str], bool] | Sequence[str] | str | None" = None, **kw
    ):
        """Run the model and record activations: returns (output, cache), an `ActivationCache`
        {our name: tensor} that also answers to TransformerLens names.

        names=None records every site, including attention patterns and scores (which makes
        `attn_impl="auto"` take the eager path). `names_filter`, as in TransformerLens: a name, a
        list of names or a predicate, tried on our name and on its TL alias (e.g.
        `lambda n: n.endswith("hook_pattern")`). `detach=False` keeps the autograd graph. **kw go to
        forward.
        """
        names = self.hook_names() if names is None else [resolve_hook_name(n) for n in names]
        if names_filter is not None:
            if isinstance(names_filter, str):
                names_filter = [names_filter]
            if not callable(names_filter):
                names_filter = {resolve_hook_name(n) for n in names_filter}.__contains__
            alias = {n: tl_alias(n) for n in names}
            names = [n for n in names if names_filter(n) or (alias[n] is not None and names_filter(alias[n]))]
        cache = ActivationCache()

        def save(t: torch.Tensor, name: str) -> None:
            cache[name] = t.detach() if detach else t

        with self.hooks(fwd=[(name, save) for name in names]):
            out = self(input_ids, **kw)  # type: ignore[operator]
        return out, cache
