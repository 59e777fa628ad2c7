"""Data parallelism under `torchrun --nproc_per_node=N`: this process's rank, the process group,
and the few collectives the loop needs (gradient averaging, parameter broadcast, rank 0's clock
decisions). With WORLD_SIZE unset everything here is a no-op and training runs in one process.
Only rank 0 writes files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun job (RANK / WORLD_SIZE / LOCAL_RANK env vars)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> tuple[Dist, torch.device, bool]:
    """Join the process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU) and pick the device;
    the flag says whether this call joined it (and so should destroy it when done)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    d = Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device(f"cuda:{d.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    joined = world > 1 and not dist.is_initialized()
    if joined:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return d, device, joined


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def average_gradients(model: torch.nn.Module, d: Dist) -> None:
    """Data parallelism as DistributedDataParallel does it: all-reduce and average the gradients
    (one flat buffer). Done by hand because the MLM head runs outside `forward` (on masked
    positions only), which DDP's forward-graph bookkeeping does not see."""
    if d.world == 1:
        return

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= d.world
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(model: torch.nn.Module, d: Dist) -> None:
    if d.world > 1:
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def rank0_value(x: float, d: Dist, device: torch.device) -> float:
    """Rank 0's `x` on every rank (decisions that depend on the clock are made by rank 0)."""
    if d.world == 1:
        return x

    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def any_rank(flag: bool, d: Dist, device: torch.device) -> bool:
    """True on every rank when `flag` is True on rank 0 (stop decisions are made by rank 0)."""
    return bool(rank0_value(1.0 if flag else 0.0, d, device))
