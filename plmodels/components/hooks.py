"""Named hook sites for reading and editing activations (after TransformerLens, Nanda et al. 2022).

Every site is a tiny identity module, `HookPoint`, placed so that its module path *is* its public
name (docs/design.md, "Hook sites"):

| name                      | shape          | what                                                   |
|---------------------------|----------------|--------------------------------------------------------|
| `embed`                   | (B, T, D)      | embedding output = hidden_states[0]                    |
| `blocks.{l}.resid_pre`    | (B, T, D)      | input of block l                                       |
| `blocks.{l}.attn.pattern` | (B, H, T, T)   | post-softmax attention probabilities (eager path only) |
| `blocks.{l}.attn.head_out`| (B, T, H, Dh)  | per-head output before the output projection (head mask applied) |
| `blocks.{l}.attn_out`     | (B, T, D)      | attention sub-layer output (after projection and dropout) |
| `blocks.{l}.mlp_out`      | (B, T, D)      | MLP sub-layer output (after dropout)                   |
| `blocks.{l}.resid_post`   | (B, T, D)      | output of block l = hidden_states[l+1]                 |

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
        self._pattern_points = [p for n, p in self.hook_points().items() if n.endswith(".pattern")]

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

        fwd: [(name, fn)], fn(tensor, name) -> tensor | None. Unknown names -> ValueError.
        """
        points = self.hook_points()
        unknown = [name for name, _ in fwd if name not in points]
        if unknown:
            raise ValueError(f"unknown hook name(s) {unknown}; valid names are: {list(points)}")
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name, fn in fwd:
                points[name].fns.append(fn)
                added.append((points[name], fn))
            yield self
        finally:
            for point, fn in added:
                point.fns.remove(fn)

    def run_with_cache(
        self, input_ids: torch.Tensor, names: Sequence[str] | None = None, *, detach: bool = True, **kw
    ):
        """Run the model and record activations: returns (output, cache) with cache[name] a tensor.

        names=None records every site, including attention patterns (which makes `attn_impl="auto"`
        take the eager path). `detach=False` keeps the autograd graph. **kw go to forward.
        """
        names = self.hook_names() if names is None else list(names)
        cache: dict[str, torch.Tensor] = {}

        def save(t: torch.Tensor, name: str) -> None:
            cache[name] = t.detach() if detach else t

        with self.hooks(fwd=[(name, save) for name in names]):
            out = self(input_ids, **kw)  # type: ignore[operator]
        return out, cache
