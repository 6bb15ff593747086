"""Triton fused layer step: conv update + ReplaySSM verify in one launch, same contract as
:func:`ssmstate.ops.reference.replay_conv_verify`.

Each program reads its row's page once: the conv window's old columns, the ring's history and the checkpoint tile;
the launch writes the new conv window, the ring's new x, B and dt rows, the checkpoint on flush rows (``c + q > W``,
decided per row on the device) and ``y``. The conv output never goes to memory. Two kernels:

* where the TMA verify kernel takes the geometry, that kernel with the conv computed in it
  (:mod:`~ssmstate.ops.triton.verify_tma`, ``KW`` > 0): the verify's launch (its launch choice and overrides,
  :func:`~ssmstate.ops.triton.config.choose_launch`), each program computing the conv outputs it reads; where
  that launch is the per-warp kernel's (``override(shape="warp")``), that kernel with the conv in it
  (:mod:`~ssmstate.ops.triton.verify_warp`, ``KW`` > 0);
* elsewhere (or with ``override(fused={"TMA": 0})``) the portable kernel
  (:mod:`~ssmstate.ops.triton.conv_verify_kernel`, :func:`~ssmstate.ops.triton.config.fused_launch`).
"""

from __future__ import annotations

import torch
import triton

from ssmstate.checks import check_tensor
from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops.reference import check_row_cursors_shape
from ssmstate.ops.triton.common import INTERPRETED, KernelLaunch, dot_precisions, outer_strides, pow2, rows_aligned
from ssmstate.ops.triton.config import (
    DeviceClass, Launch, check_launch, choose_launch, device_class, fused_launch, fused_tma, tma_block_p,
)
from ssmstate.ops.triton.conv_verify_kernel import conv_verify_kernel
from ssmstate.ops.triton import verify_warp
from ssmstate.ops.triton.verify import ConvIn, Step, kernel_launches, tma_supported

Tensor = torch.Tensor

#: the longest window (tokens per row) the kernel's sequence tiles take
MAX_T = 16
#: checkpoint dtypes the fused kernel reads and writes (8-bit checkpoints run the separate conv and verify)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def replay_conv_verify(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    conv_window: Tensor,
    conv_shift: Tensor,
    xBC: Tensor,
    dt: Tensor,
    A: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    window: int,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    activation: str | None = "silu",
    dt_softplus: bool = True,
    row_cursors: Tensor | None = None,
    counters: Tensor | None = None,
    pdl: bool = False,
    row_shift: Tensor | None = None,
) -> Tensor:
    """One layer's conv update and verify in one launch (see :func:`ssmstate.ops.reference.replay_conv_verify`).

    No allocation, no host synchronization (CUDA-graph safe).

    Args:
        checkpoint: (pages, H, P, N) fp32/bf16/fp16, cache-owned; rewritten on flush rows.
        x_ring: (pages, H, R, P), B_ring: (pages, G, R, N) act dtype; dt_ring: (pages, H, R) fp32. Cache-owned;
            the window's rows are appended past the committed ones.
        ring_start, num_committed: (pages,) int32 cursors, read only.
        conv_window: (pages, H·P + 2·G·N, width) conv dtype, cache-owned, updated in place; ``width - (k - 1)``
            is the longest row (T). conv_shift: (pages,) int32 cursor, read only.
        xBC: (tokens, H·P + 2·G·N) in the rings' dtype, channels contiguous, caller-owned: x, then B, then C.
        dt: (tokens, H) raw, any float. A: (H,) float, negative. weight: (conv_dim, k) float (the last column
            multiplies the current token); bias: (conv_dim,) or None. Model parameters, read only.
        page_ids: (rows,) int32, 0 = padding row. cu_seqlens: (rows + 1,) int32.
        window: W; R = x_ring.shape[2] must be >= W + the longest row.
        out: (tokens, H, P), caller-owned, written for every non-padding token.
        D: (H,) skip or None. dt_bias: (H,) or None. z: (tokens, H, P) gate or None. activation: "silu" or None.
        row_cursors: (2, rows) int32 or None: each row's page's ``ring_start`` and ``num_committed``, gathered once
            per step (``StepPlan.row_cursors``; the reference checks them); the TMA kernel reads them beside the
            page id, the portable one reads the cursors at the page.
        counters: (pages, G) int32, all zero, persistent (owned by the caller, e.g. the backend per cache): each
            launch uses and leaves them zero (the kernel module's notes say why they exist).
        pdl: launch as a programmatic dependent of the kernel before (GPU only): every program reads its page id
            and cursors (the TMA kernel, where its launch gains from it, its first checkpoint tile too), waits for
            that kernel to end before it reads the step's inputs, then lets the next kernel launch.
        row_shift: (rows,) int32 or None: each row's page's ``conv_shift``, gathered once per step
            (``StepPlan.row_conv_shift``); the TMA kernel reads it beside the page id instead of after it.
    Returns:
        ``out``.
    """
    for launch in conv_verify_launches(checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, conv_window,
                                       conv_shift, xBC, dt, A, weight, bias, page_ids, cu_seqlens, window, out, D=D,
                                       dt_bias=dt_bias, z=z, activation=activation, dt_softplus=dt_softplus,
                                       row_cursors=row_cursors, counters=counters, pdl=pdl, row_shift=row_shift):
        launch.run()
    return out


def conv_verify_launches(checkpoint: Tensor, x_ring: Tensor, B_ring: Tensor, dt_ring: Tensor, ring_start: Tensor,
                         num_committed: Tensor, conv_window: Tensor, conv_shift: Tensor, xBC: Tensor, dt: Tensor,
                         A: Tensor, weight: Tensor, bias: Tensor | None, page_ids: Tensor, cu_seqlens: Tensor,
                         window: int, out: Tensor, D: Tensor | None = None, dt_bias: Tensor | None = None,
                         z: Tensor | None = None, activation: str | None = "silu", dt_softplus: bool = True,
                         row_cursors: Tensor | None = None, counters: Tensor | None = None,
                         pdl: bool = False, row_shift: Tensor | None = None) -> list[KernelLaunch]:
    """The launches :func:`replay_conv_verify` makes for these arguments (checked first), without running them:
    what ``tools/kernel_resources.py --fused`` compiles for a GPU on a machine without one."""
    pages, H, P, N = checkpoint.shape
    R, G = x_ring.shape[2], B_ring.shape[1]
    Dc, width = conv_window.shape[1], conv_window.shape[2]
    k = weight.shape[1]
    T = width - (k - 1)
    rows = page_ids.shape[0]
    _check(checkpoint, x_ring, B_ring, xBC, conv_window, weight, counters, activation, pdl, row_cursors, rows,
           H, P, G, N, T, R, window)
    if row_shift is not None:
        check_tensor("row_shift", row_shift, (rows,), (torch.int32,), xBC.device)
    dev = device_class(xBC.device)
    XB, GN = H * P, G * N
    x = xBC[:, :XB].unflatten(1, (H, P))
    B = xBC[:, XB:XB + GN].unflatten(1, (G, N))
    C = xBC[:, XB + GN:].unflatten(1, (G, N))
    aligned = rows_aligned(x_ring, B_ring, x, B, conv_window.transpose(1, 2), xBC)
    launch = _verify_kernel_launch(checkpoint, conv_window, xBC, x, B, C, rows, H, P, N, G, R, T, aligned, dev)
    if launch is not None:
        conv = ConvIn(window=conv_window, shift=conv_shift, row_shift=row_shift, xBC=xBC, weight=weight, bias=bias,
                      counters=counters, silu=activation == "silu")
        step = Step(checkpoint, None, None, 0, x_ring, B_ring, dt_ring, ring_start, num_committed, x, dt, A, B, C,
                    D, dt_bias, z, out, page_ids, cu_seqlens, window, row_cursors, T, bool(dt_softplus),
                    pdl and dev.pdl, aligned, conv=conv)
        return kernel_launches(step, launch, dev)
    return [_portable_launch(checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, conv_window, conv_shift,
                             xBC, dt, A, weight, bias, page_ids, cu_seqlens, window, out, D, dt_bias, z, activation,
                             dt_softplus, counters, pdl, dev)]


def _verify_kernel_launch(checkpoint: Tensor, conv_window: Tensor, xBC: Tensor, x: Tensor, B: Tensor, C: Tensor,
                          rows: int, H: int, P: int, N: int, G: int, R: int, T: int, aligned: bool,
                          dev: DeviceClass) -> Launch | None:
    """The verify kernel's launch that computes the fused layer's conv in it (the TMA kernel's, or the per-warp
    kernel's where the launch choice or an override takes it), or None where neither takes it (the geometry, the
    conv window's storage order or a dtype other than xBC's, or ``override(fused={"TMA": 0})``): then the
    portable fused kernel runs."""
    if not fused_tma() or not verify_warp.warp_conv_supported(conv_window, xBC):
        return None
    tma_ok = tma_supported(checkpoint, tma_block_p(P, N, dev), dev)
    warp_ok = aligned and dev.compiled and dev.hopper and verify_warp.warp_supported(checkpoint, x, B, C, R, T)
    if not (tma_ok or warp_ok):  # whatever an override names: neither kernel reads this checkpoint
        return None
    launch = choose_launch(rows, H, P, N, R, T, xBC.device, G, state_size=checkpoint.element_size(), tma_ok=tma_ok,
                           fused=True, warp_ok=warp_ok)
    if launch.kernel == "warp":  # its launch builder raises where it cannot take the call (an override)
        return launch
    if launch.kernel != "tma" or not tma_supported(checkpoint, launch.block_p, dev):
        return None
    check_launch(launch, H=H, G=G, N=N, R=R, rows=rows, dev=dev)
    return launch


def _portable_launch(checkpoint: Tensor, x_ring: Tensor, B_ring: Tensor, dt_ring: Tensor, ring_start: Tensor,
                     num_committed: Tensor, conv_window: Tensor, conv_shift: Tensor, xBC: Tensor, dt: Tensor,
                     A: Tensor, weight: Tensor, bias: Tensor | None, page_ids: Tensor, cu_seqlens: Tensor,
                     window: int, out: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
                     activation: str | None, dt_softplus: bool, counters: Tensor, pdl: bool,
                     dev: DeviceClass) -> KernelLaunch:
    """The portable fused kernel's launch."""
    pages, H, P, N = checkpoint.shape
    R, G = x_ring.shape[2], B_ring.shape[1]
    width = conv_window.shape[2]
    k = weight.shape[1]
    T = width - (k - 1)
    rows = page_ids.shape[0]
    launch = fused_launch(rows, H, P, N, G, dev)
    hpg = H // G
    block_n = pow2(N)
    dot_prec, fold_prec = dot_precisions(dev.compiled)
    npt = -(-P // launch.block_p)
    dummy = dt_ring  # a placeholder for absent optional inputs
    gdc = pdl and dev.pdl
    args = (checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, conv_window, conv_shift, counters,
            xBC, dt, A, weight, bias if bias is not None else dummy, D if D is not None else dummy,
            dt_bias if dt_bias is not None else dummy, z if z is not None else xBC, out, page_ids, cu_seqlens,
            window, R, P, N, width, H * P, G * N,
            *outer_strides(checkpoint=checkpoint)[:2], *outer_strides(x_ring=x_ring), *outer_strides(B_ring=B_ring),
            *dt_ring.stride(), *conv_window.stride(), counters.stride(0), *outer_strides(xBC=xBC), *dt.stride(),
            *weight.stride(), *(outer_strides(z=z) if z is not None else (0, 0)), *outer_strides(out=out))
    kwargs = dict(S_CK_P=checkpoint.stride(2), KW=k - 1, TMAX=T, NPT=npt, HPG=hpg, HPP=launch.hpp,
                  BLOCK_P=launch.block_p, BLOCK_N=block_n, FOLD_N=min(block_n, launch.fold_n), BLOCK_K=pow2(R),
                  BLOCK_S=pow2(T), BLOCK_L=triton.next_power_of_2(width),
                  EVEN=(P % launch.block_p == 0) and N == block_n, HAS_BIAS=bias is not None,
                  SILU=activation == "silu", HAS_D=D is not None, HAS_DTB=dt_bias is not None, HAS_Z=z is not None,
                  DT_SOFTPLUS=bool(dt_softplus), DOT_PREC=dot_prec,
                  FOLD_SPLIT=dev.compiled and B_ring.dtype in (torch.bfloat16, torch.float16), FOLD_PREC=fold_prec,
                  IDX64=INTERPRETED, NATIVE_G=dev.compiled and B_ring.dtype in (torch.bfloat16, torch.float16),
                  ACT16=dev.compiled and x_ring.dtype in (torch.bfloat16, torch.float16),  # the interpreter: fp32 dots
                  GDC=gdc, num_warps=launch.num_warps, num_stages=1)
    if gdc:
        kwargs["launch_pdl"] = True
    if launch.maxnreg and dev.compiled:
        kwargs["maxnreg"] = launch.maxnreg
    return KernelLaunch(conv_verify_kernel, (H // launch.hpp * npt, rows), args, kwargs)


def _check(checkpoint: Tensor, x_ring: Tensor, B_ring: Tensor, xBC: Tensor, conv_window: Tensor, weight: Tensor,
           counters: Tensor | None, activation: object, pdl: object, row_cursors: Tensor | None, rows: int,
           H: int, P: int, G: int, N: int, T: int, R: int, window: int) -> None:
    """What the kernel needs beyond the manager's checks (this entry is also called directly)."""
    if checkpoint.dtype not in STATE_DTYPES:
        raise ShapeError(f"the fused conv + verify kernel takes fp32/bf16/fp16 checkpoints, got {checkpoint.dtype}; "
                         f"run conv_update and replay_verify")
    if conv_window.shape[1] != H * P + 2 * G * N or weight.shape[0] != conv_window.shape[1] \
            or xBC.shape[-1] != conv_window.shape[1]:
        raise ShapeError(f"conv channels must be H*P + 2*G*N = {H * P + 2 * G * N} (x, B, C) in the window "
                         f"{tuple(conv_window.shape)}, weight {tuple(weight.shape)} and xBC {tuple(xBC.shape)}")
    if T < 1 or T > MAX_T or R < window + T:
        raise ShapeError(f"the fused kernel takes rows of 1..{MAX_T} tokens with R >= W + T; got T={T} (conv "
                         f"window width {conv_window.shape[2]}, kernel {weight.shape[1]}), R={R}, W={window}")
    if xBC.dtype != x_ring.dtype or B_ring.dtype != x_ring.dtype:
        raise ShapeError(f"xBC ({xBC.dtype}) and the rings ({x_ring.dtype}/{B_ring.dtype}) must share a dtype")
    if not (isinstance(counters, Tensor) and counters.dtype == torch.int32
            and tuple(counters.shape) == (checkpoint.shape[0], G) and counters.device == xBC.device):
        got = f"{tuple(counters.shape)} {counters.dtype}" if isinstance(counters, Tensor) else repr(counters)
        raise ShapeError(f"counters must be a zeroed ({checkpoint.shape[0]}, {G}) int32 tensor on {xBC.device}, "
                         f"got {got}")
    if activation not in ("silu", None):
        raise ConfigError(f"activation must be 'silu' or None, got {activation!r}")
    if not isinstance(pdl, bool):
        raise ConfigError(f"pdl must be a bool, got {pdl!r}")
    if row_cursors is not None:
        check_row_cursors_shape(row_cursors, rows, xBC.device)
