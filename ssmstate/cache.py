"""State cache: the per-layer tensors of a :class:`PageLayout` and the shared cursors."""

from __future__ import annotations

import math

import torch

from ssmstate.errors import ShapeError
from ssmstate.layout import (
    CONV_SHIFT, CURSORS_PER_PAGE, NUM_COMMITTED, PENDING, RING_START, SCALE_NAME, STATE_SLOT, PageLayout, TensorSpec,
)


class StateCache:
    """Allocates, for ``num_pages`` pages, every layer's tensors plus one set of cursors.

    ``layers[l][name]`` is a ``(num_pages, *spec.shape)`` tensor for each
    :class:`~ssmstate.layout.TensorSpec` of the layout, each page dense in the
    spec's memory order (:meth:`TensorSpec.zeros`). Cursors are one
    ``(4, num_pages)`` int32 tensor shared by every layer, with named row views:

    * replay: ``ring_start``, ``num_committed``, ``pending``, ``conv_shift``;
    * native: ``state_slot`` (in row 0), ``pending``, ``conv_shift``.

    Everything starts zeroed, so page 0 (the null page) and fresh pages hold a
    finite state that padding rows may safely point at; an 8-bit checkpoint's
    ``checkpoint_scale`` starts at 1, what encoding a zero state stores.

    ``checkpoint_seed`` is the (1,) int64 device seed of stochastically rounded
    checkpoint writes, or None for round-to-nearest; the manager sets and advances it.
    """

    def __init__(self, layout: PageLayout, num_pages: int, device: torch.device | str) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        self.layers: list[dict[str, torch.Tensor]] = [
            {t.name: t.zeros(num_pages, self.device) for t in layout.tensors}
            for _ in range(layout.geometry.num_layers)
        ]
        for layer in self.layers:
            if SCALE_NAME in layer:
                layer[SCALE_NAME].fill_(1.0)
        self.checkpoint_seed: torch.Tensor | None = None
        self._set_cursors(torch.zeros((CURSORS_PER_PAGE, num_pages), dtype=torch.int32, device=self.device))

    @classmethod
    def from_tensors(cls, layout: PageLayout, layers: list[dict[str, torch.Tensor]],
                     cursors: torch.Tensor) -> "StateCache":
        """A cache over tensors someone else allocated (an engine's KV-cache pages).

        ``layers[l][name]`` must be ``(num_pages, *spec.shape)`` with the spec's
        dtype for every :class:`~ssmstate.layout.TensorSpec` of ``layout``, each
        page dense in the spec's memory order (``spec.page_strides``, as
        :meth:`TensorSpec.view` slices them); the page dimension may be strided
        (engine pages hold several tensors back to back), but pages may not
        overlap. ``cursors`` is ``(4, num_pages)`` int32 on the same device. Nothing
        is allocated or zeroed; the engine owns which pages are in use.
        """
        if len(layers) != layout.geometry.num_layers:
            raise ShapeError(f"got {len(layers)} layers, the layout has {layout.geometry.num_layers}")
        if not isinstance(cursors, torch.Tensor) or cursors.dtype != torch.int32 or cursors.dim() != 2 \
                or cursors.shape[0] != CURSORS_PER_PAGE:
            raise ShapeError(f"cursors must be an int32 ({CURSORS_PER_PAGE}, num_pages) tensor")
        num_pages, device = cursors.shape[1], cursors.device
        for i, layer in enumerate(layers):
            for spec in layout.tensors:
                t = layer.get(spec.name)
                if not isinstance(t, torch.Tensor):
                    raise ShapeError(f"layer {i} has no tensor {spec.name!r}")
                if tuple(t.shape) != (num_pages, *spec.shape) or t.dtype != spec.dtype or t.device != device:
                    raise ShapeError(
                        f"layer {i} {spec.name}: got {tuple(t.shape)} {t.dtype} on {t.device}, expected "
                        f"{(num_pages, *spec.shape)} {spec.dtype} on {device}"
                    )
                _check_strides(i, spec, t)
        self = cls.__new__(cls)
        self.layout, self.num_pages, self.device = layout, num_pages, device
        self.layers = [{spec.name: layer[spec.name] for spec in layout.tensors} for layer in layers]
        self.checkpoint_seed = None
        self._set_cursors(cursors)
        return self

    def _set_cursors(self, cursors: torch.Tensor) -> None:
        self.cursors = cursors
        self.ring_start = cursors[RING_START]
        self.state_slot = cursors[STATE_SLOT]
        self.num_committed = cursors[NUM_COMMITTED]
        self.pending = cursors[PENDING]
        self.conv_shift = cursors[CONV_SHIFT]

    def enable_stochastic_rounding(self, seed: int) -> None:
        """Write checkpoints with stochastic rounding from now on, starting at ``seed`` (an int64)."""
        from ssmstate.ops.quant import check_sr_dtype

        check_sr_dtype(self.layout.geometry.state_dtype)
        self.checkpoint_seed = torch.tensor([seed], dtype=torch.int64, device=self.device)

    def advance_seed(self) -> None:
        """Move the stochastic-rounding seed on (one device op, no sync; captured with a CUDA graph), so no
        two checkpoint writes of an element draw the same bits."""
        if self.checkpoint_seed is not None:
            self.checkpoint_seed.add_(1)

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
        """Zero every tensor and cursor of ``pages`` (one index_fill per tensor; decode scales to 1)."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.device)
        for layer in self.layers:
            for name, t in layer.items():
                if name == SCALE_NAME:
                    t.index_fill_(0, idx, 1.0)
                else:  # through a byte view for 1-byte dtypes (no index_fill for fp8 on CPU); all-zero bits = 0
                    (t.view(torch.uint8) if t.element_size() == 1 else t).index_fill_(0, idx, 0)
        self.cursors.index_fill_(1, idx, 0)


def _check_strides(layer: int, spec: TensorSpec, t: torch.Tensor) -> None:
    """``ShapeError`` unless every page of ``t`` is dense in ``spec``'s order and pages do not overlap: the
    kernels take the strides, but the layout (and vLLM's prefill view of the conv window) fixes them."""
    page = math.prod(spec.shape)
    if not spec.is_laid_out(t) or (t.shape[0] > 1 and t.stride(0) < page):
        raise ShapeError(
            f"layer {layer} {spec.name}: got strides {tuple(t.stride())}, expected {spec.page_strides} after the "
            f"page stride (each page dense, dims stored in the order {spec.stored}) and a page stride >= {page}"
        )
