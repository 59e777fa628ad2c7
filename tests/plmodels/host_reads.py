"""`HostReads`, the instrument of the no-host-read tests (issue 81): an aten dispatch mode that records
the calls reading a device value on the host or selecting by a mask (tests/plmodels/test_loop.py
checks what it sees)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Records the aten calls that read a tensor's value on the host or pick out rows by a mask (on
    CUDA each waits for the device's queue): .item() / int() / float() / bool() (_local_scalar_dense),
    nonzero, masked_select, and indexing or index assignment with a boolean mask."""

    SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
             "aten::unique_consecutive", "aten::_unique2", "aten::repeat_interleave"}
    INDEXING = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}

    def __init__(self, calls: list[str]):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.SYNCS:
            self.calls.append(name)
        elif name in self.INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                           for i in args[1] if i is not None):
            self.calls.append(f"{name} with a mask")
        return func(*args, **(kwargs or {}))
