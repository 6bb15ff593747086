"""Argument checks of the lifecycle verbs: pure functions of their inputs, each raising a typed error that names
the problem before anything is changed."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import torch

from ssmstate.errors import BackendUnavailableError, ConfigError, ShapeError, SSMStateError
from ssmstate.geometry import Mamba2Geometry
from ssmstate.plan import RequestId

Tensor = torch.Tensor
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def is_int(v: object) -> bool:
    """A Python or numpy integer, not a bool: what counts, sizes and indices accept."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_hashable(request_id: object, verb: str) -> None:
    try:
        hash(request_id)
    except TypeError:
        raise SSMStateError(f"{verb}: a request id must be hashable, got {type(request_id).__name__}") from None


def check_request_ids(request_ids: object, verb: str) -> tuple[tuple[RequestId, ...], frozenset[RequestId]]:
    """``request_ids`` (a list, tuple or other iterable; never a string) as a tuple of distinct hashable ids, and
    their set."""
    if isinstance(request_ids, (str, bytes)) or not isinstance(request_ids, Iterable):
        raise SSMStateError(f"{verb}: request_ids must be a list or tuple of request ids, got {request_ids!r:.80}")
    ids = tuple(request_ids)
    try:
        distinct = frozenset(ids)
    except TypeError:
        bad = next(type(r).__name__ for r in ids if not is_hashable(r))
        raise SSMStateError(f"{verb}: a request id must be hashable, got {bad}") from None
    if len(distinct) != len(ids):
        raise SSMStateError(f"{verb} got the same request twice")
    return ids, distinct


def is_hashable(v: object) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def check_A_values(A: Tensor) -> None:
    """``SSMStateError`` unless every ``A <= 0`` (``A = -exp(A_log)``; NaN refused too). One host sync."""
    bad = ~(A <= 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise SSMStateError(f"A must be <= 0 (A = -exp(A_log)), got A[{i}] = {float(A[i])}: every decay exponent "
                            f"is clamped to <= 0, so a positive A would silently depart from the recurrence")


def tensor_version(t: Tensor) -> int:
    try:
        return t._version
    except (RuntimeError, AttributeError):  # inference tensors keep no version counter
        return -1


def byte_span(t: Tensor) -> tuple[int, int]:
    """The byte range ``t``'s elements occupy (strides are never negative in torch)."""
    n = t.numel()
    if n == 0:
        return 0, 0
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + n * t.element_size()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + extent * t.element_size()


def check_no_overlap(out: Tensor, inputs: Mapping[str, Tensor | None]) -> None:
    """``ShapeError`` if ``out`` shares memory with an input: a backend may write ``out`` before it has read
    every input, so in-place outputs are refused on every backend alike."""
    o0, o1 = byte_span(out)
    for name, t in inputs.items():
        if t is None:
            continue
        a0, a1 = byte_span(t)
        if a0 < o1 and o0 < a1:
            raise ShapeError(f"out overlaps {name}: pass an output buffer that shares no memory with the inputs")


def resolve_device(device: object) -> torch.device:
    """``device`` as a torch.device with its cuda index filled in; refused unless it is a cpu or present cuda
    device."""
    try:
        dev = torch.device(device)  # type: ignore[arg-type]
    except (TypeError, RuntimeError, ValueError):
        raise ConfigError(f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {dev} was asked for, but cuda is not available here")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise BackendUnavailableError(f"device {dev}: cuda has {torch.cuda.device_count()} devices here")
    elif dev.type != "cpu":
        raise ConfigError(f"device must be a cpu or cuda device, got {dev}")
    return dev


def check_tensor(name: str, t: object, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
                 device: torch.device) -> Tensor:
    if not isinstance(t, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ShapeError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype not in dtypes:
        raise ShapeError(f"{name} has dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")
    if t.device != device:
        raise ShapeError(f"{name} is on {t.device}, expected {device}")
    return t


def check_page_ids(page_ids: object, device: torch.device) -> Tensor:
    """``page_ids`` unless it is not a 1-D int32 tensor on ``device`` (``ShapeError``)."""
    if not isinstance(page_ids, torch.Tensor) or page_ids.dtype != torch.int32 or page_ids.dim() != 1 \
            or page_ids.device != device:
        raise ShapeError(f"page_ids must be a 1-D int32 tensor on {device}")
    return page_ids


def check_host_pages(page_ids: Tensor, num_pages: int, verb: str, distinct: bool = False) -> None:
    """Refuse page ids (a CPU tensor) outside ``[0, num_pages)``, or (``distinct``) a page other than 0 twice."""
    ids = page_ids.numpy()
    bad = (ids < 0) | (ids >= num_pages)
    if bad.any():
        raise SSMStateError(f"{verb}: page id {int(ids[bad.argmax()])} out of range [0, {num_pages})")
    if distinct:
        live = ids[ids != 0]
        if np.unique(live).size != live.size:
            raise SSMStateError(f"{verb}: a page appears twice in page_ids {ids.tolist()}")


def step_lengths(num_tokens: object, n: int, T: int) -> tuple[bool, int | list[int], int]:
    """``begin_step``'s ``num_tokens`` for ``n`` requests checked against ``T``: whether it is one int for every
    row, the row lengths (that int, or one Python int per request), and the padding rows' length."""
    if type(num_tokens) is int or is_int(num_tokens):
        q = int(num_tokens)  # type: ignore[call-overload]
        if not 1 <= q <= T:
            raise SSMStateError(f"num_tokens must be ints in [1, T={T}], got {q!r}")
        return True, q, q
    if isinstance(num_tokens, (str, bytes)) or not isinstance(num_tokens, Iterable):
        raise SSMStateError(f"num_tokens must be an int or a sequence of ints in [1, T={T}], "
                            f"got {num_tokens!r:.80}")
    qs = list(num_tokens)
    if len(qs) != n:
        raise SSMStateError(f"num_tokens has {len(qs)} entries for {n} requests")
    if not all(type(q) is int and 1 <= q <= T for q in qs):
        bad = [q for q in qs if not (is_int(q) and 1 <= q <= T)]
        if bad:
            raise SSMStateError(f"num_tokens must be ints in [1, T={T}], got {bad[0]!r:.80}")
        qs = [int(q) for q in qs]  # numpy integers
    return False, qs, 0


def step_rows(pad_to: object, n: int, max_batch: int) -> int:
    """``begin_step``'s row count: ``n``, or ``pad_to`` checked to lie in ``[n, max_batch]``."""
    if pad_to is None:
        rows = n
    elif is_int(pad_to):
        rows = int(pad_to)  # type: ignore[call-overload]
    else:
        raise SSMStateError(f"pad_to must be an int in [{n}, max_batch={max_batch}] or None, got {pad_to!r:.80}")
    if rows < n or rows > max_batch:
        raise SSMStateError(f"pad_to={pad_to} must be in [{n}, max_batch={max_batch}]")
    return rows


def engine_step_sizes(rows: int, total_tokens: object, max_seqlen: object, num_tokens: object, T: int
                      ) -> tuple[int, int, tuple[int, ...]]:
    """``begin_step_from_tensors``'s host sizes for ``rows`` rows checked against ``T``: ``max_seqlen``,
    ``total_tokens`` and the row lengths (``max_seqlen`` for every row when ``num_tokens`` is None)."""
    if not is_int(max_seqlen) or not 1 <= max_seqlen <= T:  # type: ignore[operator]
        raise SSMStateError(f"max_seqlen must be an int in [1, T={T}], got {max_seqlen!r:.80}")
    max_seqlen = int(max_seqlen)  # type: ignore[call-overload]
    if not is_int(total_tokens) or not 0 <= total_tokens <= rows * max_seqlen:  # type: ignore[operator]
        raise SSMStateError(f"total_tokens must be an int in [0, rows * max_seqlen], got {total_tokens!r:.80}")
    total_tokens = int(total_tokens)  # type: ignore[call-overload]
    if num_tokens is None:
        return max_seqlen, total_tokens, (max_seqlen,) * rows
    ok = not isinstance(num_tokens, (str, bytes)) and isinstance(num_tokens, Iterable)
    qs = tuple(num_tokens) if ok else ()  # type: ignore[arg-type]
    if not ok or len(qs) != rows or not all(is_int(q) and 0 <= q <= max_seqlen for q in qs) \
            or sum(qs) != total_tokens:
        raise SSMStateError(f"num_tokens must be {rows} ints in [0, max_seqlen={max_seqlen}] summing to "
                            f"{total_tokens}, got {num_tokens!r:.80}")
    return max_seqlen, total_tokens, tuple(int(q) for q in qs)


def check_host_cu_seqlens(cu_seqlens: Tensor, total_tokens: int, max_seqlen: int,
                          num_tokens: tuple[int, ...] | None) -> None:
    """Refuse a CPU ``cu_seqlens`` that does not rise from 0 by steps in ``[0, max_seqlen]`` to
    ``total_tokens``, or whose rows differ from the given ``num_tokens``."""
    cu = cu_seqlens.numpy()
    steps = np.diff(cu)
    if cu[0] != 0 or cu[-1] != total_tokens or (steps < 0).any() or (steps > max_seqlen).any():
        raise SSMStateError(f"cu_seqlens must rise from 0 by steps in [0, max_seqlen={max_seqlen}] to "
                            f"total_tokens={total_tokens}, got {cu.tolist()}")
    if num_tokens is not None and tuple(steps.tolist()) != num_tokens:
        raise SSMStateError(f"num_tokens {list(num_tokens)} differ from the rows of cu_seqlens {steps.tolist()}")


def check_verify_inputs(g: Mamba2Geometry, device: torch.device, L: int, x: object, dt: object, B: object,
                        C: object, A: object, D: object, dt_bias: object, z: object, out: object) -> None:
    """``verify``'s tensors for a step of ``L`` tokens: shapes, dtypes and device, and an ``out`` that shares no
    memory with the inputs."""
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    act = (g.act_dtype,)
    check_tensor("x", x, (L, H, P), act, device)
    check_tensor("dt", dt, (L, H), FLOATS, device)
    check_tensor("B", B, (L, G, N), act, device)
    check_tensor("C", C, (L, G, N), act, device)
    check_tensor("A", A, (H,), FLOATS, device)
    if D is not None:
        check_tensor("D", D, (H,), FLOATS, device)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, (H,), FLOATS, device)
    if z is not None:
        check_tensor("z", z, (L, H, P), act, device)
    if out is not None:
        check_tensor("out", out, (L, H, P), act, device)
        check_no_overlap(out, {"x": x, "dt": dt, "B": B, "C": C, "A": A, "D": D, "dt_bias": dt_bias, "z": z})


def check_conv_inputs(g: Mamba2Geometry, device: torch.device, L: int, xBC: object, weight: object, bias: object,
                      out: object) -> None:
    """``conv``'s tensors for a step of ``L`` tokens: shapes, dtypes and device, and an ``out`` in ``xBC``'s
    dtype that shares no memory with the inputs."""
    Dc = g.conv_dim_per_rank
    check_tensor("xBC", xBC, (L, Dc), FLOATS, device)
    check_tensor("weight", weight, (Dc, g.conv_kernel), FLOATS, device)
    if bias is not None:
        check_tensor("bias", bias, (Dc,), FLOATS, device)
    if out is not None:
        check_tensor("out", out, (L, Dc), (xBC.dtype,), device)  # type: ignore[union-attr]
        check_no_overlap(out, {"xBC": xBC, "weight": weight, "bias": bias})  # type: ignore[arg-type]


def host_counts(num_accepted: object, n: int, rows: int, low: int, qs: np.ndarray,
                request_ids: tuple[RequestId, ...]) -> np.ndarray:
    """``commit``'s host ``num_accepted`` (an int, a sequence or a CPU tensor) as the ``n`` requests' counts,
    each checked to lie in ``[low, q]`` for its row length ``q``."""
    if isinstance(num_accepted, torch.Tensor):
        counts = num_accepted.numpy()
    elif is_int(num_accepted):
        counts = np.full((n,), int(num_accepted))  # type: ignore[call-overload]
    else:
        try:
            counts = np.asarray(num_accepted)
        except (ValueError, TypeError):  # ragged nesting
            counts = np.asarray(None)
    if counts.ndim != 1 or counts.dtype.kind not in "iu":
        raise SSMStateError(f"num_accepted must be a 1-D sequence of ints, got {num_accepted!r:.200}")
    if counts.shape[0] not in (n, rows):
        raise SSMStateError(f"num_accepted has {counts.shape[0]} entries for {n} requests")
    a = counts[:n]
    bad = (a < low) | (a > qs)
    if bad.any():
        i = int(bad.argmax())
        raise SSMStateError(
            f"num_accepted[{i}]={int(a[i])} out of range [{low}, {int(qs[i])}] for request "
            f"{request_ids[i]!r}"
        )
    return a


def check_rounding(backend: object, layout: object, stochastic_rounding: object, seed: object) -> None:
    """The manager's rounding options: ``ConfigError`` for a non-bool switch, a seed outside int64 or stochastic
    rounding of an fp32 checkpoint; ``BackendUnavailableError`` for a backend that cannot round stochastically."""
    from ssmstate.ops.quant import check_sr_dtype

    if not isinstance(stochastic_rounding, bool):
        raise ConfigError(f"stochastic_rounding must be a bool, got {stochastic_rounding!r:.80}")
    if not is_int(seed) or not -2**63 <= int(seed) < 2**63:  # type: ignore[call-overload]
        raise ConfigError(f"seed must be an int64, got {seed!r:.80}")
    if not stochastic_rounding:
        return
    if layout.scheme != "replay":  # type: ignore[attr-defined]
        raise ConfigError("stochastic rounding applies to replay checkpoints; the native scheme stores every state")
    check_sr_dtype(layout.geometry.state_dtype)  # type: ignore[attr-defined]
    if not getattr(backend, "supports_stochastic_rounding", False):
        raise BackendUnavailableError(
            f"backend {getattr(backend, 'name', backend)!r} does not write stochastically rounded checkpoints; "
            f"use backend='reference' or stochastic_rounding=False"
        )


def check_conv_verify_inputs(g: Mamba2Geometry, device: torch.device, L: int, xBC: object, dt: object, A: object,
                             weight: object, bias: object, D: object, dt_bias: object, z: object,
                             out: object) -> None:
    """``conv_verify``'s tensors for a step of ``L`` tokens: ``xBC`` (L, conv_dim) in the act dtype (its conv output
    feeds the verify as x, B and C), the conv's and the verify's other tensors as :func:`check_conv_inputs` and
    :func:`check_verify_inputs` take them, and an ``out`` that shares no memory with any input."""
    H, P = g.heads_per_rank, g.head_dim
    check_tensor("xBC", xBC, (L, g.conv_dim_per_rank), (g.act_dtype,), device)
    check_conv_inputs(g, device, L, xBC, weight, bias, None)
    check_tensor("dt", dt, (L, H), FLOATS, device)
    check_tensor("A", A, (H,), FLOATS, device)
    for name, t, shape in (("D", D, (H,)), ("dt_bias", dt_bias, (H,))):
        if t is not None:
            check_tensor(name, t, shape, FLOATS, device)
    if z is not None:
        check_tensor("z", z, (L, H, P), (g.act_dtype,), device)
    if out is not None:
        check_tensor("out", out, (L, H, P), (g.act_dtype,), device)
        inputs = {"xBC": xBC, "dt": dt, "A": A, "weight": weight, "bias": bias, "D": D, "dt_bias": dt_bias, "z": z}
        check_no_overlap(out, inputs)  # type: ignore[arg-type]
