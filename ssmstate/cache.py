"""State cache: the per-layer tensors of a :class:`PageLayout` and the shared cursors."""

from __future__ import annotations

import torch

from ssmstate.layout import CURSORS_PER_PAGE, PageLayout


class StateCache:
    """Allocates, for ``num_pages`` pages, every layer's tensors plus one set of cursors.

    ``layers[l][name]`` is a ``(num_pages, *spec.shape)`` tensor for each
    :class:`~ssmstate.layout.TensorSpec` of the layout. Cursors are one
    ``(4, num_pages)`` int32 tensor shared by every layer, with named row views:

    * replay: ``ring_start``, ``num_committed``, ``pending``, ``conv_shift``;
    * native: ``state_slot`` (in row 0), ``pending``, ``conv_shift``.

    Everything starts zeroed, so page 0 (the null page) and fresh pages hold a
    finite state that padding rows may safely point at.
    """

    def __init__(self, layout: PageLayout, num_pages: int, device: torch.device | str) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        self.layers: list[dict[str, torch.Tensor]] = [
            {t.name: torch.zeros((num_pages, *t.shape), dtype=t.dtype, device=self.device) for t in layout.tensors}
            for _ in range(layout.geometry.num_layers)
        ]
        self.cursors = torch.zeros((CURSORS_PER_PAGE, num_pages), dtype=torch.int32, device=self.device)
        self.ring_start = self.cursors[0]
        self.state_slot = self.cursors[0]
        self.num_committed = self.cursors[1]
        self.pending = self.cursors[2]
        self.conv_shift = self.cursors[3]

    @property
    def nbytes(self) -> int:
        """Bytes really allocated: every tensor of every layer plus the cursors."""
        total = self.cursors.numel() * self.cursors.element_size()
        for layer in self.layers:
            total += sum(t.numel() * t.element_size() for t in layer.values())
        return total

    def state_name(self) -> str:
        return "checkpoint" if self.layout.scheme == "replay" else "state"

    def zero_pages(self, pages: list[int]) -> None:
        """Zero every tensor and cursor of ``pages`` (one index_fill per tensor)."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.device)
        for layer in self.layers:
            for t in layer.values():
                t.index_fill_(0, idx, 0)
        self.cursors.index_fill_(1, idx, 0)
