"""The learner's weights in memory the driver and the learner process both map: the process
writes each optimiser step's weights there once, the driver reads and broadcasts the newest, with
no pickling or piping of a CNN's megabytes after every update."""

from __future__ import annotations

import math
from typing import Any

Layout = list[tuple[str, int, str, tuple[int, ...]]]
"""Per state-dict entry: its name, byte offset, torch dtype name and shape."""


class SharedWeights:
    """The learner's state dict in one shared uint8 buffer (torch shared memory, mapped by the
    learner process and the driver), as views of each entry's dtype and shape, under a
    cross-process lock: the process writes a whole optimiser step's weights, the driver reads a
    whole one."""

    ALIGN = 64

    def __init__(self, flat: Any, layout: Layout, lock: Any) -> None:
        import torch

        self.flat = flat
        self.layout = layout
        self.lock = lock
        self.views: dict[str, Any] = {}
        for name, offset, dtype, shape in layout:
            dt = getattr(torch, dtype)
            size = math.prod(shape) * torch.empty((), dtype=dt).element_size()
            self.views[name] = flat[offset : offset + size].view(dt).view(shape)

    @classmethod
    def for_state(cls, state: dict[str, Any], lock: Any) -> SharedWeights:
        """A buffer laid out for `state` (a model's state dict), in shared memory."""
        import torch

        layout: Layout = []
        offset = 0
        for name, tensor in state.items():
            layout.append((name, offset, str(tensor.dtype).removeprefix("torch."),
                           tuple(tensor.shape)))  # fmt: skip
            size = tensor.numel() * tensor.element_size()
            offset += -(-size // cls.ALIGN) * cls.ALIGN  # each view aligned for its dtype
        flat = torch.zeros(max(offset, 1), dtype=torch.uint8)
        flat.share_memory_()  # type: ignore[no-untyped-call]
        return cls(flat, layout, lock)

    def arrays(self) -> dict[str, Any]:
        """numpy views of the entries (read them under `lock`)."""
        return {name: view.numpy() for name, view in self.views.items()}
