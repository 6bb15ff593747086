"""Engine-neutral page plumbing: an engine's raw page bytes as named views, Mamba2 decode metadata as a plan.

No engine import: the vLLM plugin (:mod:`ssmstate.integrations.vllm`, which re-exports these names) uses
them, and so can any runner that allocates Mamba pages as raw bytes and describes its decode rows
with vLLM-style Mamba2 metadata (``state_indices_tensor_d``, ``query_start_loc_d``).
"""

from __future__ import annotations

from typing import Any

import torch

from ssmstate.errors import SSMStateError
from ssmstate.layout import PageLayout
from ssmstate.manager import StateManager
from ssmstate.plan import StepPlan


def page_views(layout: PageLayout, raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """Named per-layer views into vLLM's raw pages, in :attr:`PageLayout.tensors` order.

    Args:
        raw: vLLM's ``(num_blocks, 1, 1, page_bytes)`` (or ``(num_blocks, page_bytes)``) int8 view
            of one layer; ``page_bytes`` may include padding up to the attention page.
    Returns:
        name -> ``(num_blocks, *shape)`` typed view (strided by the page, each page dense in the
        spec's memory order: :meth:`TensorSpec.view`), at the offsets vLLM's ``MambaBase.bind_kv_cache``
        slices them.
    """
    # squeeze, never reshape: a copy would silently detach our views from vLLM's memory.
    pages = raw.squeeze(dim=(1, 2)) if raw.dim() == 4 else raw
    if pages.dim() != 2 or pages.stride(-1) != 1:
        raise SSMStateError(f"raw pages must be (blocks, 1, 1, bytes) or (blocks, bytes), got {tuple(raw.shape)}")
    if pages.dtype != torch.int8 or pages.shape[1] < layout.layer_page_bytes:
        raise SSMStateError(f"raw pages must be int8 with at least {layout.layer_page_bytes} bytes per block")
    views: dict[str, torch.Tensor] = {}
    offset = 0
    for t in layout.tensors:
        if offset % t.dtype.itemsize:
            raise SSMStateError(f"{t.name} would start at byte {offset}, not a multiple of its {t.dtype} size")
        views[t.name] = t.view(pages[:, offset: offset + t.nbytes])
        offset += t.nbytes
    return views


def plan_from_mamba2_metadata(manager: StateManager, metadata: Any,
                              query_start_loc_cpu: torch.Tensor | None = None, dry: bool = False) -> StepPlan | None:
    """Open a :class:`StepPlan` for the decode rows of vLLM's Mamba2 metadata; no host sync.

    Uses ``state_indices_tensor_d[:, 0]`` (one block per request: our page) and
    ``query_start_loc_d``; rows past ``num_decodes`` are CUDA-graph padding on
    ``NULL_BLOCK_ID`` (0). Without spec decode (K = 0) vLLM leaves
    ``query_start_loc_d`` unset and every decode row is one token. Host row
    lengths come from ``query_start_loc_cpu`` (the batch's CPU query starts,
    decodes first) when given. ``dry`` (a dummy, profile or capture forward)
    puts every row on the null page, so its kernels run and write nothing.

    Returns None when the batch has no decode rows.
    """
    sid = metadata.state_indices_tensor_d
    if metadata.num_decodes == 0 or sid is None or sid.shape[0] == 0:
        return None
    rows = sid.shape[0]
    nd, total = metadata.num_decodes, metadata.num_decode_tokens
    qsl = metadata.query_start_loc_d
    if qsl is None:
        if total != nd:
            raise SSMStateError(f"Mamba2 metadata has {nd} decode rows of {total} tokens but no query_start_loc_d")
        qsl = torch.arange(rows + 1, dtype=torch.int32, device=sid.device).clamp_(max=total)
    num_tokens = None
    if query_start_loc_cpu is not None:
        host = query_start_loc_cpu[: nd + 1].tolist()
        num_tokens = [b - a for a, b in zip(host, host[1:])] + [0] * (rows - nd)
    T = manager.layout.spec.num_tokens
    pages = torch.zeros_like(sid[:, 0]) if dry else sid[:, 0]
    return manager.begin_step_from_tensors(pages, qsl[: rows + 1], total_tokens=total, max_seqlen=T,
                                           num_tokens=num_tokens)
