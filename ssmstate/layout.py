"""Page layout and byte math: the one place memory is computed.

The allocator (:class:`ssmstate.cache.StateCache`), the planner, the vLLM spec
and every report take their byte counts from :class:`PageLayout`; nothing
recomputes memory on the side.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import torch

from ssmstate.dtypes import dtype_name, dtype_size, is_quantized
from ssmstate.errors import ConfigError
from ssmstate.geometry import Mamba2Geometry

Scheme = Literal["replay", "native"]

#: int32 cursors per page, one row each of ``StateCache.cursors``: ring_start, num_committed, pending, conv_shift
#: (replay); the native scheme keeps its state slot in row 0 and leaves row 1 unused.
CURSORS_PER_PAGE = 4
RING_START, NUM_COMMITTED, PENDING, CONV_SHIFT = range(CURSORS_PER_PAGE)
STATE_SLOT = RING_START
CURSOR_BYTES_PER_PAGE = CURSORS_PER_PAGE * 4
#: Per-layer tensor of an 8-bit checkpoint's fp32 decode scales, (H, P) per page (FlashInfer's state_scale).
SCALE_NAME = "checkpoint_scale"


def _check_k(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"num_speculative_tokens must be an int >= 0, got {value!r}")


def _check_w(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"window must be an int >= 1, got {value!r}")


@attrs.frozen
class SpecConfig:
    """Speculative-decoding shape.

    Args:
        num_speculative_tokens: K draft tokens per step; T = 1 + K tokens are verified.
        window: W, the most committed inputs a ring carries into a step. A longer
            window means fewer checkpoint flushes; FlashInfer stops at 16.
    """

    num_speculative_tokens: int = attrs.field(validator=_check_k)
    window: int = attrs.field(default=16, validator=_check_w)

    def __attrs_post_init__(self) -> None:
        if self.window < self.num_tokens:
            raise ConfigError(
                f"window W={self.window} must be at least T=1+K={self.num_tokens}: a verify "
                f"window that does not fit the ring cannot be replayed"
            )

    @property
    def num_tokens(self) -> int:
        """T = 1 + K, the longest verify window."""
        return 1 + self.num_speculative_tokens

    @property
    def ring_len(self) -> int:
        """R = W + T ring rows, exact (no power-of-two padding)."""
        return self.window + self.num_tokens


def _check_stored(spec: "TensorSpec", attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if sorted(value) != list(range(len(spec.shape))):
        raise ConfigError(f"{spec.name}: stored must be a permutation of its {len(spec.shape)} dims, got {value!r}")


@attrs.frozen
class TensorSpec:
    """One per-layer cache tensor: its per-page shape, dtype and memory order.

    ``shape`` is the logical shape every API and kernel indexes. ``stored`` lists the per-page dims in
    memory order, outermost first (default: row-major). A page is dense: ``stored = (1, 0)`` on a
    ``(D, W)`` spec keeps the page as ``(W, D)`` in memory, so ``t[page, :, col]`` is contiguous, and the
    tensor is that storage transposed. Allocate and slice only through :meth:`zeros`, :meth:`view` and
    :meth:`stored_view`, so the order lives here.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stored: tuple[int, ...] = attrs.field(converter=tuple, validator=_check_stored)

    @stored.default
    def _row_major(self) -> tuple[int, ...]:
        return tuple(range(len(self.shape)))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_size(self.dtype)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The per-page shape in memory order."""
        return tuple(self.shape[d] for d in self.stored)

    @property
    def page_strides(self) -> tuple[int, ...]:
        """Element strides of the per-page dims (logical order) of a dense page in this order."""
        strides, step = [0] * len(self.shape), 1
        for d in reversed(self.stored):
            strides[d], step = step, step * self.shape[d]
        return tuple(strides)

    def stored_view(self, t: torch.Tensor) -> torch.Tensor:
        """``(pages, *shape)`` -> ``(pages, *stored_shape)``, a view (dense per page when ``t`` is laid out)."""
        return t.permute(0, *(1 + d for d in self.stored))

    def from_stored(self, t: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`stored_view`: a ``(pages, *stored_shape)`` tensor as ``(pages, *shape)``."""
        return t.permute(0, *(1 + self.stored.index(d) for d in range(len(self.shape))))

    def zeros(self, num_pages: int, device: torch.device | str) -> torch.Tensor:
        """A zeroed ``(num_pages, *shape)`` tensor, each page dense in this order."""
        return self.from_stored(torch.zeros((num_pages, *self.stored_shape), dtype=self.dtype, device=device))

    def view(self, raw: torch.Tensor) -> torch.Tensor:
        """``raw`` ``(pages, nbytes)`` 1-byte pages (any page stride, unit byte stride) as ``(pages, *shape)``."""
        return self.from_stored(raw.view(self.dtype).view(-1, *self.stored_shape))

    def is_laid_out(self, t: torch.Tensor) -> bool:
        """Whether each page of ``t`` ``(pages, *shape)`` is dense in this order (size-1 dims' strides free)."""
        return all(n == 1 or s == want for n, s, want in zip(t.shape[1:], t.stride()[1:], self.page_strides))


def conv_spec(conv_dim: int, width: int, dtype: torch.dtype) -> TensorSpec:
    """The conv window ``(conv_dim, width)``, stored channels innermost: every column's channels are
    contiguous (the order vLLM keeps its conv state in), so a conv update reads and writes whole columns."""
    return TensorSpec("conv", (conv_dim, width), dtype, stored=(1, 0))


@attrs.frozen
class PageLayout:
    """What one page holds, per Mamba layer, for one scheme.

    ``replay``: one page per request with the checkpoint, the x/B/dt rings and the
    conv window. ``native``: 1 + K pages per request, each holding a full SSM
    state and a conv window (vLLM's native speculative layout).

    The replay conv window is ``conv_kernel - 1 + T`` columns wide: one column
    more than vLLM's native ``conv_kernel - 1 + K``, so that rolling back a full
    T-token window (0 accepted) keeps the oldest history column. vLLM's native
    scheme always keeps the bonus token and never needs it.
    """

    scheme: Scheme
    geometry: Mamba2Geometry
    spec: SpecConfig

    @classmethod
    def replay(cls, geometry: Mamba2Geometry, spec: SpecConfig) -> "PageLayout":
        return cls("replay", geometry, spec)

    @classmethod
    def native(cls, geometry: Mamba2Geometry, spec: SpecConfig) -> "PageLayout":
        return cls("native", geometry, spec)

    def __attrs_post_init__(self) -> None:
        if self.scheme not in ("replay", "native"):
            raise ConfigError(f"scheme must be 'replay' or 'native', got {self.scheme!r}")
        if not isinstance(self.geometry, Mamba2Geometry):
            raise ConfigError(f"geometry must be a Mamba2Geometry, got {self.geometry!r:.80}")
        if not isinstance(self.spec, SpecConfig):
            raise ConfigError(f"spec must be a SpecConfig, got {self.spec!r:.80}")
        if self.scheme == "native" and is_quantized(self.geometry.state_dtype):
            # The native scheme writes a full state for every verified token, so an 8-bit state would take a
            # quantization step per token instead of once per flush, and vLLM's native kernels read no scales.
            raise ConfigError(
                f"the native scheme keeps {dtype_name(self.geometry.state_dtype)} states unsupported; 8-bit "
                f"checkpoints need the replay scheme (quantized once per flush)"
            )

    # -- shapes ---------------------------------------------------------------
    @property
    def conv_width(self) -> int:
        g, s = self.geometry, self.spec
        extra = s.num_tokens if self.scheme == "replay" else s.num_speculative_tokens
        return g.conv_kernel - 1 + extra

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """Per-layer tensors, per page (the page dimension is left out).

        An 8-bit checkpoint (int8, float8_e4m3fn) adds ``checkpoint_scale`` (H, P) fp32 right after it.
        """
        g, s = self.geometry, self.spec
        H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
        state = TensorSpec("checkpoint" if self.scheme == "replay" else "state", (H, P, N), g.state_dtype)
        conv = conv_spec(g.conv_dim_per_rank, self.conv_width, g.conv_state_dtype)
        if self.scheme == "native":
            return (state, conv)
        R = s.ring_len
        scale = (TensorSpec(SCALE_NAME, (H, P), torch.float32),) if is_quantized(g.state_dtype) else ()
        return (
            state,
            *scale,
            TensorSpec("x_ring", (H, R, P), g.act_dtype),
            TensorSpec("B_ring", (G, R, N), g.act_dtype),
            TensorSpec("dt_ring", (H, R), torch.float32),
            conv,
        )

    # -- bytes ------------------------------------------------------------------
    @property
    def layer_page_bytes(self) -> int:
        """Bytes one page holds for one layer."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def page_bytes(self) -> int:
        """Bytes one page holds over all Mamba layers (the page layout of docs/design.md, times the layers)."""
        return self.geometry.num_layers * self.layer_page_bytes

    @property
    def cursor_bytes(self) -> int:
        """Device cursor bytes per page (shared by all layers)."""
        return CURSOR_BYTES_PER_PAGE

    @property
    def allocated_bytes_per_page(self) -> int:
        """What the allocator spends per page: tensors of every layer plus cursors."""
        return self.page_bytes + self.cursor_bytes

    @property
    def pages_per_request(self) -> int:
        return 1 if self.scheme == "replay" else self.spec.num_tokens

    @property
    def bytes_per_request(self) -> int:
        """Mamba state bytes one request costs (all layers, cursors excluded)."""
        return self.pages_per_request * self.page_bytes

    @property
    def allocated_bytes_per_request(self) -> int:
        return self.pages_per_request * self.allocated_bytes_per_page

    def pool_bytes(self, num_pages: int) -> int:
        """Bytes a :class:`StateCache` of ``num_pages`` pages (null page included) allocates."""
        return num_pages * self.allocated_bytes_per_page

    def max_pages(self, budget_bytes: int) -> int:
        """Most pages (null page included) a cache can have inside ``budget_bytes``."""
        return max(0, int(budget_bytes) // self.allocated_bytes_per_page)

    def max_requests(self, budget_bytes: int) -> int:
        """Most concurrent requests inside ``budget_bytes``, after the null page."""
        return max(0, self.max_pages(budget_bytes) - 1) // self.pages_per_request

    def describe(self) -> dict[str, object]:
        return {
            "scheme": self.scheme,
            "num_speculative_tokens": self.spec.num_speculative_tokens,
            "window": self.spec.window,
            "ring_len": self.spec.ring_len if self.scheme == "replay" else None,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "stored": list(t.stored), "dtype": dtype_name(t.dtype),
                 "bytes": t.nbytes}
                for t in self.tensors
            ],
            "layer_page_bytes": self.layer_page_bytes,
            "page_bytes": self.page_bytes,
            "pages_per_request": self.pages_per_request,
            "bytes_per_request": self.bytes_per_request,
        }
