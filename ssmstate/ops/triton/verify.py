"""Triton ReplaySSM verify: the host entry, same contract as :func:`ssmstate.ops.reference.replay_verify`.

Three kernels over the same math (:mod:`~ssmstate.ops.triton.verify_tma`, the default where the geometry allows,
the portable :mod:`~ssmstate.ops.triton.verify_ldg`, and the per-warp Gluon kernel
:mod:`~ssmstate.ops.triton.verify_warp`, the H100's for fp32 checkpoints);
:mod:`~ssmstate.ops.triton.config` chooses the launch.
Each reads the checkpoint tile once and never forms an intermediate state; the flush decision ``c + q > W`` is taken
per row on the device, so one call serves a mixed batch and nothing syncs. Padding rows (page 0) exit at once and
write nothing. Tensors are read and written contiguously along P and N (stride 1 there, as every cache tensor and
the manager's inputs are).
"""

from __future__ import annotations

import attrs
import torch
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops.reference import check_row_cursors_shape
from ssmstate.ops.triton.common import (
    INTERPRETED, KernelLaunch, dot_precisions, outer_strides, pow2, rows_aligned,
)
from ssmstate.ops.triton.config import (
    DeviceClass, Launch, check_launch, choose_launch, device_class, fused_gather, pdl_tile, tma_block_p,
)
from ssmstate.ops.triton.quant import check_sr_seed, kernel_checkpoint, scale_strides
from ssmstate.ops.triton.verify_ldg import verify_ldg_kernel
from ssmstate.ops.triton.verify_tma import verify_tma_kernel
from ssmstate.ops.triton import verify_warp

Tensor = torch.Tensor

#: the longest window (tokens per row) the kernels' sequence tiles take
MAX_T = 16


def replay_verify(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    window: int,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    dt_softplus: bool = True,
    max_seqlen: int | None = None,
    row_cursors: Tensor | None = None,
    pdl: bool = False,
    checkpoint_scale: Tensor | None = None,
    sr_seed: Tensor | None = None,
    layer: int = 0,
) -> Tensor:
    """ReplaySSM verify for one layer (same contract as :func:`ssmstate.ops.reference.replay_verify`).

    One launch (two for the split launch shape); no allocation, no host synchronization (CUDA-graph safe).

    Args:
        checkpoint: (pages, H, P, N) fp32/bf16/fp16/int8/fp8_e4m3fn, cache-owned; rewritten on flush rows. Inner dim
            contiguous. An int8/fp8 one holds codes, decoded with ``checkpoint_scale``.
        x_ring: (pages, H, R, P) act dtype. B_ring: (pages, G, R, N) act dtype. dt_ring: (pages, H, R) fp32
            processed dt. All cache-owned; the window's rows are appended past the committed ones.
        ring_start, num_committed: (pages,) int32 cursors, read only.
        x: (tokens, H, P) in ``x_ring``'s dtype. dt: (tokens, H) raw, any float.
        A: (H,) float, negative. B, C: (tokens, G, N), B in ``B_ring``'s dtype.
        page_ids: (rows,) int32, 0 = padding row. cu_seqlens: (rows + 1,) int32.
        window: W; R = x_ring.shape[2] must be >= W + the longest row.
        out: (tokens, H, P), caller-owned, written for every non-padding token.
        D: (H,) skip or None. dt_bias: (H,) or None. z: (tokens, H, P) gate or None.
        Every tensor with a P or N dimension must be contiguous in it (stride 1).
        max_seqlen: longest row (<= 16); defaults to ``R - window`` (= T on the layout).
        row_cursors: (2, rows) int32 or None: ``ring_start`` and ``num_committed`` of each row's page, gathered
            once per step (``StepPlan.row_cursors``) and equal to the pages' cursors (the reference checks it).
            The TMA kernel then loads a row's cursors in the page id's round trip instead of one after it.
        pdl: launch as a programmatic dependent of the kernel before it in the stream (GPU only; ignored in the
            interpreter). Each program issues its page id, cursors and (where the launch gains from it) its first
            checkpoint tile's read, then waits for that kernel to end before reading the step's inputs, and then
            lets the next kernel launch. Safe when the kernel before writes none of the pages' tensors, cursors,
            ``page_ids``, ``cu_seqlens`` or ``row_cursors``, and, if it is itself a programmatic dependent, lets its
            dependents launch only after its own wait, as :func:`ssmstate.ops.triton.conv.conv_update`
            (``pdl=True``) and this kernel do. Results are the same bits as without.
        checkpoint_scale: (pages, H, P) fp32 decode scales of an int8/fp8 checkpoint (None for any other),
            cache-owned, contiguous in P; a flush row rewrites its page's, with its codes
            (:mod:`ssmstate.ops.quant` defines the encoding).
        sr_seed: (1,) int64 device seed: flush rows' checkpoint writes are stochastically rounded (bf16, fp16,
            int8, fp8 checkpoints), bit for bit as :func:`ssmstate.ops.quant.quantize`; None rounds to nearest.
        layer: the layer index the stochastic-rounding hash mixes in.

    Launches are chosen by :func:`ssmstate.ops.triton.config.choose_launch`; benchmarks and tests pick others
    with :func:`ssmstate.ops.triton.config.override`. Results agree to fp32/tf32 rounding across launches.

    Returns:
        ``out``.
    """
    launches = verify_launches(checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, x, dt, A, B, C,
                               page_ids, cu_seqlens, window, out, D=D, dt_bias=dt_bias, z=z, dt_softplus=dt_softplus,
                               max_seqlen=max_seqlen, row_cursors=row_cursors, pdl=pdl,
                               checkpoint_scale=checkpoint_scale, sr_seed=sr_seed, layer=layer)
    # a launch that overflows shared memory fails before it runs; the split flush launch (two 64 x N fp32 tiles at
    # most) fits Hopper's 227 KB for N <= 256, so a failure never leaves the first launch's writes half done
    try:
        for launch in launches:
            launch.run()
    except OutOfResources as exc:
        raise ConfigError(f"verify launch does not fit this GPU ({exc}); override a smaller one") from exc
    return out


def verify_launches(checkpoint: Tensor, x_ring: Tensor, B_ring: Tensor, dt_ring: Tensor, ring_start: Tensor,
                    num_committed: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, page_ids: Tensor,
                    cu_seqlens: Tensor, window: int, out: Tensor, D: Tensor | None = None,
                    dt_bias: Tensor | None = None, z: Tensor | None = None, dt_softplus: bool = True,
                    max_seqlen: int | None = None, row_cursors: Tensor | None = None,
                    pdl: bool = False, checkpoint_scale: Tensor | None = None, sr_seed: Tensor | None = None,
                    layer: int = 0) -> list[KernelLaunch]:
    """The kernel launches :func:`replay_verify` makes for these arguments (checked first), without running them:
    what ``tools/kernel_resources.py`` compiles for a GPU on a machine without one."""
    pages, H, P, N = checkpoint.shape
    R = x_ring.shape[2]
    G = B_ring.shape[1]
    T = max_seqlen if max_seqlen is not None else R - window
    rows = page_ids.shape[0]
    _check_inputs(x, x_ring, B, B_ring, T, pdl, row_cursors, rows)
    checkpoint, checkpoint_scale = kernel_checkpoint(checkpoint, checkpoint_scale)
    check_sr_seed(checkpoint, sr_seed, layer)
    dev = device_class(x.device)
    aligned = rows_aligned(x_ring, B_ring, x, B)
    launch = verify_launch(checkpoint, x, B, C, R, G, T, rows, aligned=aligned, pdl=pdl, sr_seed=sr_seed)
    if launch.kernel == "tma" and not (tma_supported(checkpoint, launch.block_p, dev) and aligned):
        raise ConfigError(f"the TMA verify kernel needs a GPU of compute capability 9.0+, a contiguous checkpoint, "
                          f"P divisible by BLOCK_P={launch.block_p}, N a power of two in [16, 256] and the rows of "
                          f"the rings, x and B on 16-byte boundaries; got {_arch_name(dev)}, "
                          f"{tuple(checkpoint.shape)}, row strides x {x.stride()[:-1]}, B {B.stride()[:-1]}")
    check_launch(launch, H=H, G=G, N=N, R=R, rows=rows, dev=dev)
    step = Step(checkpoint, checkpoint_scale, sr_seed, int(layer), x_ring, B_ring, dt_ring, ring_start,
                num_committed, x, dt, A, B, C, D, dt_bias, z, out, page_ids, cu_seqlens, window, row_cursors, T,
                bool(dt_softplus), pdl and dev.pdl, aligned)
    return kernel_launches(step, launch, dev)


def verify_launch(checkpoint: Tensor, x: Tensor, B: Tensor, C: Tensor, R: int, G: int, T: int, rows: int, *,
                  aligned: bool, pdl: bool = False, sr_seed: Tensor | None = None) -> Launch:
    """The launch :func:`replay_verify` takes for a call on these tensors (``checkpoint``: an 8-bit one as its
    codes), with any :func:`~ssmstate.ops.triton.config.override` applied; ``aligned``: every row of the rings, x
    and B starts on a 16-byte boundary (:func:`~ssmstate.ops.triton.common.rows_aligned`), which the per-warp and
    TMA kernels need and the portable kernel states to the compiler where it holds."""
    _, H, P, N = checkpoint.shape
    dev = device_class(x.device)
    # a programmatic dependent keeps the TMA launches, which choose by grid size what goes out before the wait (the
    # per-warp kernel always copies its tile first: measured slower beyond 2 programs per SM in the TMA kernel)
    return choose_launch(rows, H, P, N, R, T, x.device, G, state_size=checkpoint.element_size(),
                         tma_ok=aligned and tma_supported(checkpoint, tma_block_p(P, N, dev), dev),
                         warp_ok=aligned and dev.compiled and dev.hopper and sr_seed is None and not pdl
                         and verify_warp.warp_supported(checkpoint, x, B, C, R, T))


def kernel_launches(step: "Step", launch: Launch, dev: DeviceClass) -> list[KernelLaunch]:
    """The launches of ``step`` on ``launch``'s kernel (with ``step.conv``, the fused layer's: the TMA or the
    per-warp kernel, which compute the conv in them)."""
    if launch.kernel == "tma":
        return tma_launches(step, launch, dev)
    if launch.kernel == "warp":
        return [_warp_launch(step, launch, dev)]
    return [_ldg_launch(step, launch, dev)]


def _check_inputs(x: Tensor, x_ring: Tensor, B: Tensor, B_ring: Tensor, T: int, pdl: object,
                  row_cursors: Tensor | None, rows: int) -> None:
    if T > MAX_T:
        raise ShapeError(f"the Triton verify kernel handles windows of at most {MAX_T} tokens, got T={T}")
    if x.dtype != x_ring.dtype or B.dtype != B_ring.dtype:
        raise ShapeError(f"x/B ({x.dtype}/{B.dtype}) must have the ring dtypes ({x_ring.dtype}/{B_ring.dtype})")
    if not isinstance(pdl, bool):
        raise ConfigError(f"pdl must be a bool, got {pdl!r}")
    if row_cursors is not None:
        check_row_cursors_shape(row_cursors, rows, x.device)


def tma_supported(checkpoint: Tensor, block_p: int, dev: DeviceClass) -> bool:
    """The TMA kernel can read ``checkpoint`` (pages, H, P, N) as (pages * H * P, N) tiles of ``block_p`` rows."""
    pages, H, P, N = checkpoint.shape
    return (block_p > 0 and P % block_p == 0 and tma_block_p(P, N, dev) > 0
            and checkpoint.is_contiguous() and checkpoint.data_ptr() % 16 == 0)


@attrs.frozen
class ConvIn:
    """The fused layer's conv operands (:mod:`~ssmstate.ops.triton.conv_verify`): the verify's ``x``, ``B`` and
    ``C`` are then views of ``xBC``'s channels, and the TMA or per-warp kernel computes their conv outputs
    itself."""

    window: Tensor  # (pages, conv_dim, width) conv dtype, channels contiguous (stride 1), cache-owned, updated
    shift: Tensor  # (pages,) int32 conv_shift, cache-owned, read
    row_shift: Tensor | None  # (rows,) int32, the step plan's gathered conv_shift, or None
    xBC: Tensor  # (tokens, conv_dim), channels contiguous, the caller's
    weight: Tensor  # (conv_dim, k) float, the model's
    bias: Tensor | None  # (conv_dim,) or None
    counters: Tensor  # (pages, G) int32, zero between launches, the backend's
    silu: bool

    def args(self, H: int, P: int, N: int, G: int) -> tuple[object, ...]:
        """The kernel's conv arguments, in its order."""
        rs = self.row_shift
        return (self.xBC, self.window, self.shift, rs, self.weight, self.bias, self.counters, int(self.silu),
                self.window.shape[2], H * P, G * N, self.xBC.stride(0), self.window.stride(0),
                self.window.stride(2), rs.stride(0) if rs is not None else 0, *self.weight.stride(),
                self.counters.stride(0))


#: the kernel's conv arguments where there is no conv
NO_CONV = (None, None, None, None, None, None, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


@attrs.frozen
class Step:
    """One verify call's tensors and scalars, as the launch builders read them (``checkpoint``: an e4m3 one as its
    bytes)."""

    checkpoint: Tensor
    checkpoint_scale: Tensor | None
    sr_seed: Tensor | None
    layer: int
    x_ring: Tensor
    B_ring: Tensor
    dt_ring: Tensor
    ring_start: Tensor
    num_committed: Tensor
    x: Tensor
    dt: Tensor
    A: Tensor
    B: Tensor
    C: Tensor
    D: Tensor | None
    dt_bias: Tensor | None
    z: Tensor | None
    out: Tensor
    page_ids: Tensor
    cu_seqlens: Tensor
    window: int
    row_cursors: Tensor | None
    T: int
    dt_softplus: bool
    gdc: bool  # pdl=True on a GPU that has PDL: the launch waits for the kernel before
    aligned: bool  # rows_aligned of the rings, x and B (and the fused layer's conv window and xBC)
    conv: ConvIn | None = None  # the fused layer's conv (the TMA and per-warp kernels)

    def strides(self) -> tuple[int, ...]:
        """The strides but the last of every tensor, in the kernels' order."""
        z = self.z if self.z is not None else self.x
        return (*outer_strides(checkpoint=self.checkpoint)[:2], *outer_strides(x_ring=self.x_ring),
                *outer_strides(B_ring=self.B_ring), *self.dt_ring.stride(), *outer_strides(x=self.x),
                *self.dt.stride(), *outer_strides(B=self.B), *outer_strides(C=self.C), *outer_strides(z=z),
                *outer_strides(out=self.out))


def tma_launches(s: Step, launch: Launch, dev: DeviceClass) -> list[KernelLaunch]:
    """The TMA kernel's launch, or (split) the non-flush launch and the flush launch."""
    pages, H, P, N = s.checkpoint.shape
    R, G, rows = s.x_ring.shape[2], s.B_ring.shape[1], s.page_ids.shape[0]
    tile_bytes = launch.block_p * N * s.checkpoint.element_size()  # one head's checkpoint tile
    sms = dev.sms if dev.compiled else 1
    programs = H // launch.heads * (P // launch.block_p) * rows
    tile_early = pdl_tile(launch, programs, sms) if s.gdc else 0
    desc = TensorDescriptor.from_tensor(s.checkpoint.view(pages * H * P, N), [launch.block_p, N])
    rc_strides = s.row_cursors.stride() if s.row_cursors is not None else (0, 0)
    args = (rows, desc, s.checkpoint, s.checkpoint_scale, s.sr_seed, s.layer, s.x_ring, s.B_ring, s.dt_ring,
            s.ring_start, s.num_committed, s.row_cursors, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, s.z, s.out,
            s.page_ids, s.cu_seqlens, s.window, R, H, N, *s.strides()[:2], *scale_strides(s.checkpoint_scale),
            *s.strides()[2:], *rc_strides, *(s.conv.args(H, P, N, G) if s.conv is not None else NO_CONV))
    kw = s.conv.weight.shape[1] - 1 if s.conv is not None else 0
    const = dict(P=P, HPG=H // G, BLOCK_P=launch.block_p, BLOCK_N=N, BLOCK_K=pow2(R),
                 BLOCK_KN=pow2(min(s.window, R)) if launch.ksplit else pow2(R), BLOCK_S=pow2(s.T, launch.block_s),
                 DT_SOFTPLUS=s.dt_softplus, INTERP=INTERPRETED, KW=kw, BLOCK_L=pow2(kw + s.T, 1) if kw else 1,
                 BLOCK_T=pow2(s.T, 2) if kw else 1, LATE=launch.late, GATHER=bool(kw) and fused_gather(),
                 num_warps=4, num_stages=1)
    if not launch.split:
        l2pf = max(launch.l2pf, 1) if tile_early == 1 else launch.l2pf  # the first tile's read before the wait
        kwargs = dict(const, HEADS=launch.heads, HSTAGES=2 if launch.heads > 1 else 1,
                      FOLD_N=min(N, launch.fold_n), BLOCK_ROWS=16,
                      **_l2_prefetch(l2pf, tile_bytes, s, launch.heads, dev),
                      PF_AHEAD=launch.pf_heads if dev.compiled else 0, ROUTE=0,
                      EARLY=launch.early and launch.heads == 1, GDC=(2 if tile_early == 2 else 1) if s.gdc else 0,
                      TMA_STORE=launch.tma_store and launch.fold_n >= N, **_cap(launch, dev), **_pdl_flag(s.gdc))
        return [KernelLaunch(verify_tma_kernel, (H // launch.heads * (P // launch.block_p), rows), args, kwargs)]
    # split: the non-flush rows under the launch's register cap, PROGS programs per SM; the flush rows uncapped, 2
    # per SM, folding whole tiles; on the GPU the second starts as the first's programs exit (PDL)
    split = dict(const, HSTAGES=1, BLOCK_ROWS=pow2(rows), PF_AHEAD=launch.pf_heads if dev.compiled else 0,
                 EARLY=False)
    first = dict(split, HEADS=launch.heads, FOLD_N=min(N, launch.fold_n), ROUTE=1, GDC=1 if s.gdc else 0,
                 **_l2_prefetch(launch.l2pf, tile_bytes, s, launch.heads, dev),
                 TMA_STORE=launch.tma_store and launch.fold_n >= N, **_cap(launch, dev), **_pdl_flag(s.gdc))
    second = dict(split, HEADS=1, FOLD_N=N, ROUTE=2, GDC=0, TMA_STORE=launch.tma_store,
                  **_l2_prefetch(0, tile_bytes, s, 1, dev), **_pdl_flag(dev.pdl))
    return [KernelLaunch(verify_tma_kernel, (launch.progs * sms, 1), args, first),
            KernelLaunch(verify_tma_kernel, (2 * sms if dev.compiled else 3, 1), args, second)]


def _warp_launch(s: Step, launch: Launch, dev: DeviceClass) -> KernelLaunch:
    """The per-warp kernel's launch (:mod:`~ssmstate.ops.triton.verify_warp`): program (head, row); with
    ``s.conv`` the fused layer's."""
    pages, H, P, N = s.checkpoint.shape
    R, G, rows = s.x_ring.shape[2], s.B_ring.shape[1], s.page_ids.shape[0]
    if not (dev.compiled and dev.hopper) or not verify_warp.warp_supported(s.checkpoint, s.x, s.B, s.C, R, s.T):
        raise ConfigError(f"the per-warp verify kernel runs on a GPU of compute capability 9.0+ only, with Gluon, an "
                          f"fp32 checkpoint (pages, H, 64, N) with N a multiple of 32 up to 256, 16-bit x, B and C, a "
                          f"ring of at most 32 rows and windows of at most 8 tokens; got {_arch_name(dev)}, "
                          f"{tuple(s.checkpoint.shape)} "
                          f"{s.checkpoint.dtype}, x {s.x.dtype}, B/C {s.B.dtype}/{s.C.dtype}, R={R}, T={s.T}")
    if s.sr_seed is not None:
        raise ConfigError("the per-warp verify kernel takes no stochastic rounding")
    cv = s.conv  # the fused layer's: its window and xBC as verify_warp.warp_conv_supported takes them
    if not s.aligned:
        raise ConfigError(f"the per-warp verify kernel reads the rows of the rings, x and B (and the fused layer's "
                          f"conv window columns and xBC tokens) on 16-byte boundaries; got row strides x "
                          f"{s.x.stride()[:-1]}, B {s.B.stride()[:-1]}" + (
                              f", conv window {cv.window.stride()}, xBC {cv.xBC.stride()}" if cv is not None else ""))
    rc = s.row_cursors
    rc_strides = rc.stride() if rc is not None else (0, 0)
    st = s.strides()
    args = (verify_warp.warp_descriptor(s.checkpoint), s.checkpoint, s.x_ring, s.B_ring, s.dt_ring, s.ring_start,
            s.num_committed, rc, s.x, s.dt, s.A, s.B, s.C, s.D, s.dt_bias, s.z, s.out, s.page_ids, s.cu_seqlens,
            s.window, R, H, *st, *rc_strides, *(cv.args(H, P, N, G) if cv is not None else NO_CONV))
    kw = cv.weight.shape[1] - 1 if cv is not None else 0
    kwargs = dict(P=P, N=N, HPG=H // G, BLOCK_K=32, FOLD_K=pow2(s.window), BLOCK_S=verify_warp.BLOCK_S,
                  NC=verify_warp.CHUNK_N, DT_SOFTPLUS=s.dt_softplus, GDC=s.gdc, KW=kw,
                  BLOCK_L=pow2(kw + s.T, 1) if kw else 1,
                  num_warps=verify_warp.NUM_WARPS, **_cap(launch, dev), **_pdl_flag(s.gdc))
    return KernelLaunch(verify_warp.verify_warp_kernel, (H, rows), args, kwargs)


def _ldg_launch(s: Step, launch: Launch, dev: DeviceClass) -> KernelLaunch:
    """The portable kernel's launch."""
    pages, H, P, N = s.checkpoint.shape
    R, G, rows = s.x_ring.shape[2], s.B_ring.shape[1], s.page_ids.shape[0]
    hpg = H // G
    if launch.hpp < 1 or hpg % launch.hpp:
        raise ConfigError(f"heads per program must divide the {hpg} heads per group, got {launch.hpp}")
    block_n = pow2(N)
    dummy = s.dt_ring  # a placeholder for absent optional inputs
    dot_prec, fold_prec = dot_precisions(dev.compiled)
    npt = -(-P // launch.block_p)
    args = (s.checkpoint, s.checkpoint_scale, s.sr_seed, s.layer, s.x_ring, s.B_ring, s.dt_ring, s.ring_start,
            s.num_committed, s.x, s.dt, s.A, s.B, s.C, s.D if s.D is not None else dummy,
            s.dt_bias if s.dt_bias is not None else dummy, s.z if s.z is not None else s.x, s.out, s.page_ids, s.cu_seqlens, s.window, R, P, N,
            *s.strides()[:2], *scale_strides(s.checkpoint_scale), *s.strides()[2:])
    kwargs = dict(S_CK_P=s.checkpoint.stride(2), NPT=npt, HPG=hpg, HPP=launch.hpp, BLOCK_P=launch.block_p,
                  BLOCK_N=block_n, BLOCK_K=pow2(R), BLOCK_S=pow2(s.T, launch.block_s),
                  FOLD_N=min(block_n, launch.fold_n),
                  EVEN=(P % launch.block_p == 0) and N == block_n,
                  NATIVE_G=dev.compiled and s.B.dtype == s.C.dtype and s.B.dtype in (torch.bfloat16, torch.float16),
                  NC=min(block_n, launch.nc), NS=3, GDC=s.gdc, HAS_D=s.D is not None, HAS_DTB=s.dt_bias is not None,
                  HAS_Z=s.z is not None, DT_SOFTPLUS=s.dt_softplus, DOT_PREC=dot_prec,
                  FOLD_SPLIT=dev.compiled and s.B_ring.dtype in (torch.bfloat16, torch.float16), FOLD_PREC=fold_prec,
                  IDX64=INTERPRETED, ALIGNED=s.aligned, num_warps=4, num_stages=1, **_cap(launch, dev),
                  **_pdl_flag(s.gdc))
    return KernelLaunch(verify_ldg_kernel, (H // launch.hpp * npt, rows), args, kwargs)


def _arch_name(dev: DeviceClass) -> str:
    return f"compute capability {dev.arch // 10}.{dev.arch % 10}" if dev.compiled else "the interpreter"


def _cap(launch: Launch, dev: DeviceClass) -> dict[str, int]:
    return {"maxnreg": launch.maxnreg} if launch.maxnreg and dev.compiled else {}


def _pdl_flag(on: bool) -> dict[str, bool]:
    return {"launch_pdl": True} if on else {}


def _l2_prefetch(level: int, tile_bytes: int, s: Step, heads: int, dev: DeviceClass) -> dict[str, int]:
    """The TMA kernel's L2 prefetch sizes in bytes (``PF_CK``, ``PF_X``, ``PF_B``, ``PF_DT``; 0 = none).

    ``level``: 0 none, 1 the first head's checkpoint tile (``tile_bytes``), 2 also the rings: the x and dt rings of
    the program's ``heads`` heads (one contiguous span: a program's heads are consecutive) and the group's B ring.
    A bulk prefetch needs 16-byte aligned addresses and sizes, so a ring whose per-page or per-program offsets or
    whose span are not is left out; the interpreter runs none (inline PTX).
    """
    if level == 0 or not dev.compiled:
        return {"PF_CK": 0, "PF_X": 0, "PF_B": 0, "PF_DT": 0}
    if level == 1:
        return {"PF_CK": tile_bytes, "PF_X": 0, "PF_B": 0, "PF_DT": 0}
    return {"PF_CK": tile_bytes, "PF_X": ring_prefetch_bytes(s.x_ring, heads), "PF_B": ring_prefetch_bytes(s.B_ring, 1),
            "PF_DT": ring_prefetch_bytes(s.dt_ring, heads)}


def ring_prefetch_bytes(ring: Tensor, count: int) -> int:
    """Bytes from ``count`` consecutive heads' (or one group's) first row to the end of the last, or 0 where a bulk
    L2 prefetch of them would not be 16-byte aligned."""
    e = ring.element_size()
    inner = (ring.shape[2] - 1) * ring.stride(2) + (ring.shape[3] if ring.dim() == 4 else 1)
    span = ((count - 1) * ring.stride(1) + inner) * e
    # a program starts at a multiple of `count` heads: its offset is a multiple of count * stride(1)
    ok = (ring.data_ptr() % 16 == 0 and span % 16 == 0 and ring.stride(0) * e % 16 == 0
          and count * ring.stride(1) * e % 16 == 0)
    return span if ok else 0


