"""Sequence and context parallelism for kareus.torch's layer (autograd operators).

Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", MLSys '23; Megatron-LM): outside the tensor-parallel regions (norms,
residual adds) the activations are split along the sequence over the TP group. The
column-parallel GEMMs need the whole sequence, so their input is all-gathered along it (whose
backward is a reduce-scatter of the input gradient); the row-parallel GEMMs' partial outputs are
reduce-scattered along it (backward: all-gather). The pair replaces the TP AllReduce.

Context parallelism, all-gather style (TransformerEngine's ``cp_comm_type="all_gather"`` under
Megatron-Core, as in Kareus's kernel graph; the ring form is Liu et al., "Ring Attention with
Blockwise Transformers", 2023): every CP rank holds a contiguous
shard of the sequence; K and V are all-gathered across the CP group before attention and their
gradients reduce-scattered after its backward; a query at global position p attends to keys at
positions <= p (the causal mask offset by the shard's first position). Megatron balances the
causal work by giving each rank two chunks (first and last); a contiguous shard is the same
function, with less balanced work.

Collectives run on ``torch.distributed``; gloo has no reduce-scatter, so there it is an
AllReduce and a slice (the same sum).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["gather_along", "scatter_along", "cp_causal_attention", "causal_attention_at",
           "launch_collective"]


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def _rank(group: Any) -> int:
    return dist.get_rank(group)


class _Launched:
    """An asynchronous collective of the nano-batched executor; ``wait()`` returns its result."""

    def __init__(self, work: Any, finish):
        self._work, self._finish = work, finish

    def wait(self) -> torch.Tensor:
        self._work.wait()
        return self._finish()


def launch_collective(kind: str, x: torch.Tensor, dim: int, group: Any) -> _Launched:
    """Starts ``kind`` ("allreduce", "reducescatter" or "allgather" along ``dim``) of ``x`` on
    ``group`` with ``async_op=True``."""
    if kind == "allreduce":
        return _Launched(dist.all_reduce(x, group=group, async_op=True), lambda: x)
    n = _size(group)
    if kind == "allgather":
        parts = [torch.empty_like(x) for _ in range(n)]
        work = dist.all_gather(parts, x.contiguous(), group=group, async_op=True)
        return _Launched(work, lambda: torch.cat(parts, dim=dim))
    if kind != "reducescatter":
        raise ValueError(f"kareus.parallel: unknown collective kind '{kind}'")
    if dist.get_backend(group) == "nccl":
        moved = x.movedim(dim, 0).contiguous()
        out = torch.empty((moved.shape[0] // n,) + moved.shape[1:], dtype=x.dtype,
                          device=x.device)
        work = dist.reduce_scatter_tensor(out, moved, group=group, async_op=True)
        return _Launched(work, lambda: out.movedim(0, dim).contiguous())
    total = x.contiguous().clone()
    work = dist.all_reduce(total, group=group, async_op=True)
    return _Launched(work, lambda: total.chunk(n, dim=dim)[_rank(group)].contiguous())


def _all_gather(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return launch_collective("allgather", x, dim, group).wait()


def _reduce_scatter(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return launch_collective("reducescatter", x, dim, group).wait()


class _AlongSequence(torch.autograd.Function):
    """An all-gather (``gather``) or a reduce-scatter along ``dim`` in forward, the other in
    backward: each is the other's adjoint (the gathered tensor's consumers on every rank saw the
    whole tensor, so a shard's gradient is their sum, and a reduce-scattered shard's gradient is
    needed whole by every rank's partial sum)."""

    @staticmethod
    def forward(ctx, x, dim, group, gather):  # type: ignore[override]
        ctx.dim, ctx.group, ctx.gather = dim, group, gather
        return (_all_gather if gather else _reduce_scatter)(x, dim, group)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        adjoint = _reduce_scatter if ctx.gather else _all_gather
        return adjoint(g, ctx.dim, ctx.group), None, None, None


def gather_along(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """All-gather of the shards along ``dim`` (backward: reduce-scatter of the gradient)."""
    return _AlongSequence.apply(x, dim, group, True)


def scatter_along(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Reduce-scatter of partial sums along ``dim`` (backward: all-gather of the gradient)."""
    return _AlongSequence.apply(x, dim, group, False)


def cp_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        cp_group: Optional[Any]) -> torch.Tensor:
    """Causal GQA attention of this CP rank's queries over the whole sequence's keys.

    q [b, s_local, hq, d]; k, v [b, s_local, hkv, d], this rank's shard at global positions
    [rank * s_local, (rank + 1) * s_local). K and V are gathered over ``cp_group``; the mask
    lets global query position p see key positions 0..p. Returns [b, s_local, hq * d].
    """
    offset = _rank(cp_group) * q.shape[1]
    return causal_attention_at(q, gather_along(k, 1, cp_group), gather_along(v, 1, cp_group),
                               offset)


def causal_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        offset: int) -> torch.Tensor:
    """Causal GQA attention of queries at global positions ``offset``.. over keys from position
    0 (k, v already gathered over the CP group): the nano-batched executor gathers K/V as a
    collective of its own, overlapped with the other nano-batch's compute."""
    b, s, hq, d = q.shape
    rep = hq // k.shape[2]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
    q_pos = torch.arange(offset, offset + s, device=q.device)
    k_pos = torch.arange(k.shape[1], device=q.device)
    allowed = k_pos[None, :] <= q_pos[:, None]  # [s_local, s]: True where attention is allowed
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=allowed)
    return o.transpose(1, 2).reshape(b, s, hq * d)
