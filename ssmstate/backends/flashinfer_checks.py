"""The FlashInfer backend's checks that need no GPU (which layouts checkpointing_ssu and the native
selective_state_update serve, the device) and its on-demand import of ``flashinfer.mamba``; a sibling of
:mod:`ssmstate.backends.flashinfer`, which re-exports them."""

from __future__ import annotations

import inspect
from types import ModuleType

import torch

from ssmstate.dtypes import is_quantized
from ssmstate.errors import BackendUnavailableError
from ssmstate.layout import PageLayout

#: checkpointing_ssu replays the ring in one 16-wide MMA K tile.
MAX_WINDOW = 16
#: selective_state_update's multi-token form is exercised up to 16 tokens here.
MAX_NATIVE_TOKENS = 16
_TWO_BYTE = (torch.bfloat16, torch.float16)
#: checkpointing_ssu's int8/fp8 kernel: four warps of 16 head-dim rows each own the per-row amax, so one head's
#: 64 rows are one tile (d_split 1); it is monolithic only (the two-kernel split takes 2- and 4-byte states)
QUANT_HEAD_DIM = 64
_STATE = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
OTHERS = "backends that can run it: 'reference' (PyTorch, any device) and 'triton'"
INSTALL = "pip install -e '.[flashinfer]' from a checkout (flashinfer-python>=0.7.2)"


# -- checks that need no flashinfer ----------------------------------------------

def unsupported_reasons(layout: PageLayout) -> list[str]:
    """Why FlashInfer cannot serve ``layout`` (empty when it can). Needs neither flashinfer nor a GPU.

    Replay (``checkpointing_ssu``): 2-byte activations (x, B, C, z and the x/B
    rings; its MMAs are bf16/fp16 only), fp32/bf16/fp16 checkpoint or int8/fp8 with its decode scales at
    ``P = 64`` (:data:`QUANT_HEAD_DIM`), ``W <= 16``
    (one MMA K tile), ``T <= W``, ``P`` a multiple of 16 and at least 32 (the
    output MMA tiles head_dim by 16 with a 32-wide floor), ``N`` a multiple of 64
    (the state replay runs an even number of 32-column MMA passes), and
    ``H * P * N`` below 2**31 (32-bit address folds).

    Native (``selective_state_update``, multi-token): 2-byte activations,
    ``T <= 16``, ``P`` a multiple of 16 (16 rows per pass), ``N`` a multiple of 64
    (register tiling of the state rows, for every state dtype) and ``H / G`` a
    power of two up to 64 (its head-group dispatch).
    """
    g, s = layout.geometry, layout.spec
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    T, W = s.num_tokens, s.window
    reasons: list[str] = []
    if g.act_dtype not in _TWO_BYTE:
        reasons.append(f"act_dtype={g.act_dtype} (x, B, C, z and the rings must be bf16 or fp16)")
    if is_quantized(g.state_dtype):
        if layout.scheme != "replay":
            reasons.append(f"state_dtype={g.state_dtype}: 8-bit states are replay checkpoints only")
        elif P != QUANT_HEAD_DIM:
            reasons.append(f"state_dtype={g.state_dtype} needs head_dim P={QUANT_HEAD_DIM} (checkpointing_ssu's "
                           f"8-bit kernel: one 64-row tile per head, d_split 1), got {P}")
    elif g.state_dtype not in _STATE:
        reasons.append(f"state_dtype={g.state_dtype} (needs fp32, bf16 or fp16)")
    if P % 16:
        reasons.append(f"head_dim P={P} is not a multiple of 16")
    if N % 64:
        reasons.append(f"state_size N={N} is not a multiple of 64")
    if layout.scheme == "replay":
        if W > MAX_WINDOW:
            reasons.append(f"window W={W} > {MAX_WINDOW} (checkpointing_ssu replays at most 16 ring rows)")
        if T > W:
            reasons.append(f"T=1+K={T} > window W={W}")
        if P < 32:
            reasons.append(f"head_dim P={P} < 32")
        if H * P * N > _INT32_MAX:
            reasons.append(f"H*P*N={H * P * N} does not fit 32-bit offsets")
    else:
        if T > MAX_NATIVE_TOKENS:
            reasons.append(f"T=1+K={T} > {MAX_NATIVE_TOKENS} tokens per step")
        hpg = H // G
        if hpg > 64 or hpg & (hpg - 1):
            reasons.append(f"heads per group H/G={hpg} is not a power of two <= 64")
    return reasons


def check_layout(layout: PageLayout) -> None:
    """Raise :class:`BackendUnavailableError` naming every reason FlashInfer cannot serve ``layout``."""
    reasons = unsupported_reasons(layout)
    if reasons:
        raise BackendUnavailableError(
            f"flashinfer backend cannot run this {layout.scheme} layout: {'; '.join(reasons)}; {OTHERS}"
        )


def check_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda":
        raise BackendUnavailableError(
            f"flashinfer backend needs a CUDA device, got {device}; {OTHERS} ('reference' on {device.type})"
        )
    return device


# -- flashinfer, imported on demand ------------------------------------------------

def import_flashinfer() -> ModuleType:
    """``flashinfer.mamba``, or :class:`BackendUnavailableError` saying how to get a usable one."""
    try:
        import flashinfer.mamba as fim
    except Exception as exc:  # ImportError, or a broken install failing at import time
        raise BackendUnavailableError(
            f"flashinfer backend: flashinfer-python cannot be imported ({type(exc).__name__}: {exc}); "
            f"{INSTALL}; {OTHERS}"
        ) from None
    fn = getattr(fim, "checkpointing_ssu", None)
    if fn is None or not hasattr(fim, "allocate_checkpointing_ssu_scratch"):
        raise BackendUnavailableError(
            f"flashinfer backend: this flashinfer has no checkpointing_ssu ring API; {INSTALL}; {OTHERS}"
        )
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = None
    if params is not None and not {"prev_num_accepted_tokens", "cu_seqlens", "algorithm"} <= set(params):
        raise BackendUnavailableError(
            f"flashinfer backend: this flashinfer's checkpointing_ssu predates the ring API "
            f"(no prev_num_accepted_tokens/cu_seqlens/algorithm); {INSTALL}; {OTHERS}"
        )
    return fim


def check_gpu(device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"flashinfer backend: CUDA is not available here; {OTHERS}")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise BackendUnavailableError(
            f"flashinfer backend needs compute capability 8.0+ (cp.async, mma.sync), "
            f"{device} is {major}.{minor}; {OTHERS}"
        )
