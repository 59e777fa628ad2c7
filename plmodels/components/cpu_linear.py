"""Inference-time linear layers on oneDNN, for the forward passes that only read a model (extraction).

PyTorch's CPU build runs `F.linear` in fp32 on MKL's GEMM. MKL picks its kernels by CPU vendor: on
AMD EPYCs it runs the AVX2 ones even where the CPU has AVX-512, and reaches about half the
machine's fp32 peak (a 8192 x 256 @ 256 x 768 product: 155-200 GFLOP/s on the 2-core AVX512-BF16
EPYC of docs/benchmarks.md, against 430 GFLOP/s for oneDNN's own GEMM, which PyTorch ships too and
which picks kernels by instruction set). `onednn_linear()` routes every `F.linear` of a forward pass
to oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op PyTorch's compiler emits for CPU linears).

It is a `TorchFunctionMode`, so no model file changes and every family (`nn.Linear` anywhere)
takes it. A call goes to oneDNN only when nothing records a gradient (inference mode or no_grad),
the tensors are on the CPU, and the input is float32 or bfloat16; anything else runs `F.linear`
unchanged. Under CPU bf16 autocast the mode casts input, weight and bias to bfloat16 itself (the op
is outside autocast's lists) and keeps each weight's cast for the mode's lifetime, as autocast's
own cache does. Results equal `F.linear`'s up to fp32 rounding (both accumulate in fp32; tested to
1e-5 relative); on Intel CPUs, where MKL already uses AVX-512, expect little gain.

`available()` says whether this PyTorch has the op; without it the mode changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def available() -> bool:
    """Whether this PyTorch build has oneDNN's linear op (x86 CPU wheels do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class onednn_linear(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch.no_grad)
    """`with onednn_linear(): model(...)`: the forward's linear layers on oneDNN (see the module
    docstring for when a call is routed and when it is left alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled = available()
        self._bf16: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(weight) -> (weight, its bf16 cast)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and self.enabled:
            out = self._linear(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    def _cast(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.dtype == torch.bfloat16:
            return t
        hit = self._bf16.get(id(t))
        if hit is None or hit[0] is not t:
            hit = (t, t.to(torch.bfloat16))
            self._bf16[id(t)] = hit
        return hit[1]

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """oneDNN's x W^T + b, or None where the call must stay on F.linear."""
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                        (bias is not None and bias.requires_grad)):
            return None
        if x.device.type != "cpu" or weight.device.type != "cpu" or x.dim() < 2:
            return None
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            x, weight, bias = x.to(torch.bfloat16), self._cast(weight), self._cast(bias)
        if x.dtype not in (torch.float32, torch.bfloat16) or weight.dtype != x.dtype:
            return None
        if bias is not None and bias.dtype != x.dtype:
            return None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
