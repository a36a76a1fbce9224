"""Counting what a CUDA run would pay for: ATen ops (kernel launches) and host syncs.

    from craft_core.opcount import OpCounter
    with OpCounter() as count:
        compressor(features, coords, ratio=8)
    print(count.ops, count.syncs, count.sync_ops)

Runs anywhere (a CPU is enough): it counts the ATen ops dispatched inside the block that
compute something (`ops`; views and `detach`, which launch no kernel, are in `all_ops` only), and as
a host sync every op that must wait for the device on CUDA: reading a value back (`item`,
`tolist`, `bool(t)`), and ops whose output size depends on the data (`nonzero`, `unique`,
`masked_select`, boolean-mask indexing, `bincount`, `repeat_interleave` without a size).
`nox -s bench` prints the counts per round; the tests bound them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.bincount.default,
    aten.repeat_interleave.Tensor,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
}


class OpCounter(TorchDispatchMode):
    """Counts ATen ops and host syncs dispatched inside a `with` block.

    Attributes:
        ops: ATen ops dispatched that are not views (each a kernel launch on CUDA).
        all_ops: every ATen op dispatched, views included.
        syncs: of which host syncs (see the module docstring), plus `Tensor.tolist` calls.
        sync_ops: which ops synced, and how often.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.all_ops = 0
        self.syncs = 0
        self.sync_ops: Counter[str] = Counter()
        self._tolist: Any = None

    def _count_sync(self, name: str) -> None:
        self.syncs += 1
        self.sync_ops[name] += 1

    def __enter__(self) -> OpCounter:
        # On a CPU tensor `tolist` reads memory without dispatching an op; on CUDA it is a
        # device-to-host copy, so it is counted by hand.
        self._tolist = torch.Tensor.tolist
        original = self._tolist

        def counted_tolist(tensor: torch.Tensor) -> Any:
            self._count_sync("tolist")
            return original(tensor)

        torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign,assignment]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.all_ops += 1
        if not func.is_view and func is not aten.detach.default:
            self.ops += 1
        if func in _SYNC_OPS:
            self._count_sync(str(func.overloadpacket.__name__))
        elif func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            indices = args[1]
            if any(i is not None and i.dtype == torch.bool for i in indices):
                self._count_sync(f"{func.overloadpacket.__name__}(bool mask)")
        return func(*args, **(kwargs or {}))
