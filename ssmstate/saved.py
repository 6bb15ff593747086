"""A preempted request's state on the host, and the check ``resume`` makes before trusting it."""

from __future__ import annotations

from collections.abc import Mapping as _MappingABC
from typing import TYPE_CHECKING

import attrs
import torch

from ssmstate.errors import ShapeError, SSMStateError
from ssmstate.layout import CURSORS_PER_PAGE, PageLayout, TensorSpec

if TYPE_CHECKING:
    from ssmstate.cache import StateCache

Tensor = torch.Tensor


@attrs.frozen(eq=False)
class SavedState:
    """A preempted request on the host: every layer's page slices and the cursors.

    Attributes:
        layout: the layout it was saved from; resume checks it matches.
        tensors: per layer, name -> (pages_per_request, *shape) CPU tensor.
        cursors: (4, pages_per_request) int32 CPU tensor.
    """

    layout: PageLayout
    tensors: tuple[dict[str, Tensor], ...]
    cursors: Tensor

    @property
    def nbytes(self) -> int:
        total = self.cursors.numel() * 4
        for layer in self.tensors:
            total += sum(t.numel() * t.element_size() for t in layer.values())
        return total


def _bytes(t: Tensor) -> Tensor:
    """A 1-byte tensor as uint8 (fp8 has no index_select/index_copy on CPU; bytes move verbatim)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def _host_pages(spec: TensorSpec, t: Tensor, idx: Tensor) -> Tensor:
    """Pages ``idx`` of ``t`` copied to the host, each page dense in ``spec``'s memory order."""
    return spec.from_stored(_bytes(spec.stored_view(t)).index_select(0, idx).cpu().view(t.dtype))


def save_pages(cache: "StateCache", pages: list[int], layout: PageLayout) -> SavedState:
    """Copy every layer's tensors (an 8-bit checkpoint's codes and scales included) and the cursors of
    ``pages`` to the host, byte for byte (each page dense in its spec's memory order, like the cache)."""
    idx = torch.tensor(pages, dtype=torch.long, device=cache.device)
    tensors = tuple({spec.name: _host_pages(spec, layer[spec.name], idx) for spec in cache.layout.tensors}
                    for layer in cache.layers)
    return SavedState(layout, tensors, cache.cursors.index_select(1, idx).cpu())


def restore_pages(cache: "StateCache", pages: list[int], saved: SavedState) -> None:
    """Overwrite every tensor and cursor of ``pages`` with ``saved`` (already checked), byte for byte."""
    idx = torch.tensor(pages, dtype=torch.long, device=cache.device)
    for layer, saved_layer in zip(cache.layers, saved.tensors):
        for name, t in layer.items():
            _bytes(t).index_copy_(0, idx, _bytes(saved_layer[name]).to(cache.device))
    cache.cursors.index_copy_(1, idx, saved.cursors.to(cache.device))


def check_saved(saved: SavedState, layout: PageLayout) -> None:
    """``ShapeError``/``SSMStateError`` unless ``saved`` holds exactly ``layout``'s tensors and in-range
    cursors."""
    ppr, num_layers = layout.pages_per_request, layout.geometry.num_layers
    layers = saved.tensors
    if not isinstance(layers, (tuple, list)):
        raise ShapeError(f"resume: saved tensors must be a tuple of per-layer dicts, got {type(layers).__name__}")
    if len(layers) != num_layers:
        raise ShapeError(f"resume: the saved state has {len(layers)} layers, the layout has {num_layers}")
    names = {spec.name for spec in layout.tensors}
    for i, layer in enumerate(layers):
        if not isinstance(layer, _MappingABC):
            raise ShapeError(f"resume: saved layer {i} must be a dict of tensors, got {type(layer).__name__}")
        if set(layer) != names:
            missing, extra = sorted(names - set(layer)), sorted(map(repr, set(layer) - names))
            raise ShapeError(f"resume: saved layer {i} lacks tensors {missing} / has unknown tensors {extra}")
        for spec in layout.tensors:
            t = layer[spec.name]
            want = (ppr, *spec.shape)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != spec.dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ShapeError(f"resume: saved layer {i} {spec.name} is {got}, expected {want} {spec.dtype}")
    cur = saved.cursors
    if not isinstance(cur, torch.Tensor) or cur.dtype != torch.int32 or tuple(cur.shape) != (CURSORS_PER_PAGE, ppr):
        got = f"{tuple(cur.shape)} {cur.dtype}" if isinstance(cur, torch.Tensor) else type(cur).__name__
        raise ShapeError(f"resume: saved cursors are {got}, expected ({CURSORS_PER_PAGE}, {ppr}) int32")
    _check_saved_cursors(cur, layout)


def _check_saved_cursors(cur: Tensor, layout: PageLayout) -> None:
    """``SSMStateError`` unless every saved cursor row is in its range for ``layout`` (nothing pending)."""
    ppr, spec = layout.pages_per_request, layout.spec
    shift_max = layout.conv_width - (layout.geometry.conv_kernel - 1)
    if layout.scheme == "replay":
        bounds = (("ring_start", 0, spec.ring_len - 1), ("num_committed", 0, spec.window), ("pending", 0, 0),
                  ("conv_shift", 0, shift_max))
    else:
        bounds = (("state_slot", 0, ppr - 1), ("the spare cursor", 0, 0), ("pending", 0, 0),
                  ("conv_shift", 0, shift_max))
    values = cur.cpu()
    for row, (name, lo, hi) in enumerate(bounds):
        v = values[row]
        bad = (v < lo) | (v > hi)
        if bool(bad.any()):
            raise SSMStateError(f"resume: saved cursor {name} = {int(v[bad][0])} out of range [{lo}, {hi}] "
                                f"(a preempted request is idle: nothing pending)")
