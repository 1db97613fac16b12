"""One communicator per SM count: how a plan's per-partition SM counts reach NCCL.

Kareus (Wu, Chung, Chowdhury, OSDI '26) gives every partition's collective its own number of SMs
(NCCL CTAs). NCCL fixes a communicator's CTA limits when the communicator is created
(``ncclCommInitRankConfig`` with an ``ncclConfig_t``, fields ``minCTAs``/``maxCTAs``, NCCL >=
2.17), and torch 2.x passes that config through ``ProcessGroupNCCL.Options().config``
(``min_ctas``, ``max_ctas``, ``cga_cluster_size``, ...). So the only per-collective control is
the choice of communicator: one process group per SM count over the same ranks, created once,
and each collective launched on the group of its partition's SM count.

``dist.new_group`` is collective over the whole job: every rank must create every group, in the
same order, even the groups it is not a member of. That is why the groups are created eagerly
from the whole plan (the SM counts of every stage, for every TP group), never lazily at a
collective's first use (a rank whose stage lacks an SM count would not call ``new_group`` and
the job would hang).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch.distributed as dist

__all__ = ["nccl_options", "plan_sm_counts", "SmGroups", "all_gather_json", "broadcast_json"]

#: A partition's SM count of 0 means copy engines (no SMs, docs/formats.md); NCCL's CTA limits
#: start at 1, so such a collective keeps the default communicator.
COPY_ENGINE_SMS = 0


def nccl_options(sms: int, cga_cluster_size: Optional[int] = None) -> Any:
    """``ProcessGroupNCCL.Options`` whose NCCL config pins the communicator to ``sms`` CTAs
    (``min_ctas = max_ctas = sms``). Raises RuntimeError where torch has no NCCL process group
    or its options carry no NCCL config (torch 1.x): there the SM count cannot reach NCCL."""
    pg_nccl = getattr(dist, "ProcessGroupNCCL", None)
    if pg_nccl is None:
        raise RuntimeError("kareus.comm: this torch has no ProcessGroupNCCL (a CPU-only build); "
                           "the plan's SM counts cannot reach NCCL")
    opts = pg_nccl.Options()
    config = getattr(opts, "config", None)
    if config is None or not hasattr(config, "min_ctas"):
        raise RuntimeError("kareus.comm: ProcessGroupNCCL.Options has no NCCL config "
                           "(min_ctas/max_ctas: torch >= 2.1 with NCCL >= 2.17); see "
                           "docs/runtime.md")
    config.min_ctas = int(sms)
    config.max_ctas = int(sms)
    if cga_cluster_size is not None:
        config.cga_cluster_size = int(cga_cluster_size)
    return opts


def plan_sm_counts(plan: Any) -> List[int]:
    """Every SM count (> 0) any partition of any stage of ``plan`` uses, mixes included, sorted
    (the same list on every rank, which the collective group creation needs)."""
    counts = set()
    for s in range(plan.num_stages):
        for ins in plan.instructions(s):
            for p in ins.partitions.values():
                counts.add(int(p.sms))
                counts.update(int(m.sms) for m in p.mix)
    return sorted(c for c in counts if c != COPY_ENGINE_SMS)


class SmGroups:
    """``group_for_sms`` for :class:`kareus.torch.NanoBatchedStack`: the group of an SM count.

    ``tp_groups``: the ranks of every TP group of the job (every rank passes the same list, in
    the same order); the job's CP groups instead make the ``cp_group_for_sms`` of a
    context-parallel stack; ``rank``: this process's global rank; ``sm_counts``: the SM counts to
    create groups for (:func:`plan_sm_counts`); ``default_group``: the group of collectives
    without an SM count (the stack tail, sequential instructions, copy-engine partitions);
    without it a plain ``new_group(ranks, backend=backend)`` per TP group is created first.
    ``new_group`` defaults to ``torch.distributed.new_group``; a test passes a recording
    stand-in with the same signature (``ranks``, ``backend=``, ``pg_options=``).
    ``options`` builds the options of an SM count (default :func:`nccl_options`).

    Every rank calls ``new_group`` for every (SM count, TP group) pair, sorted by SM count,
    then TP group: a collective order identical on all ranks.
    """

    def __init__(self, tp_groups: Sequence[Sequence[int]], rank: int, sm_counts: Iterable[int],
                 backend: str = "nccl", default_group: Any = None,
                 new_group: Optional[Callable[..., Any]] = None,
                 options: Callable[[int], Any] = nccl_options):
        make = new_group or dist.new_group
        mine = [i for i, g in enumerate(tp_groups) if rank in g]
        if len(mine) != 1:
            raise ValueError(f"kareus.comm: rank {rank} is in {len(mine)} of the TP groups "
                             f"{[list(g) for g in tp_groups]}; it must be in exactly one")
        self.ranks: Tuple[int, ...] = tuple(tp_groups[mine[0]])
        self.options: Dict[int, Any] = {}
        self._groups: Dict[int, Any] = {}
        if default_group is None:
            for i, g in enumerate(tp_groups):
                pg = make(list(g), backend=backend)
                if i == mine[0]:
                    default_group = pg
        self.default_group = default_group
        for sms in sorted(set(int(s) for s in sm_counts)):
            if sms == COPY_ENGINE_SMS:
                continue
            opts = options(sms)
            for i, g in enumerate(tp_groups):
                pg = make(list(g), backend=backend, pg_options=opts)
                if i == mine[0]:
                    self._groups[sms], self.options[sms] = pg, opts

    @property
    def sm_counts(self) -> List[int]:
        return sorted(self._groups)

    def __call__(self, sms: Optional[int]) -> Any:
        if sms is None or sms == COPY_ENGINE_SMS:
            return self.default_group
        try:
            return self._groups[int(sms)]
        except KeyError:
            raise ValueError(f"kareus.comm: no communicator for {sms} SMs; created for "
                             f"{self.sm_counts} (pass the plan's SM counts, plan_sm_counts)") \
                from None


# ---------------------------------------------------------------------------------------------
# Small JSON messages over a process group. torch 2.x's all_gather_object/broadcast_object_list
# unpickle through numpy (tensor.numpy()), which a training image need not have; JSON bytes in a
# uint8 tensor need only torch.


def _device(group: Any) -> Any:
    import torch

    if dist.get_backend(group) == "nccl":  # NCCL moves CUDA tensors only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(obj: Any, device: Any) -> Any:
    import json

    import torch

    data = json.dumps(obj).encode()
    return torch.tensor(list(data), dtype=torch.uint8, device=device)


def _decode(t: Any) -> Any:
    import json

    return json.loads(bytes(t.cpu().tolist()).decode())


def all_gather_json(obj: Any, group: Any = None) -> List[Any]:
    """Every rank's ``obj`` (JSON-serialisable), in rank order, on every rank of ``group``."""
    import torch

    device = _device(group)
    mine = _encode(obj, device)
    n = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=device),
                    group=group)
    width = max(int(s.item()) for s in sizes)
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    parts = [torch.empty(width, dtype=torch.uint8, device=device) for _ in range(n)]
    dist.all_gather(parts, padded, group=group)
    return [_decode(p[:int(s.item())]) for p, s in zip(parts, sizes)]


def broadcast_json(obj: Any, src: int, group: Any = None) -> Any:
    """``obj`` of global rank ``src`` (JSON-serialisable) on every rank of ``group``."""
    import torch

    device = _device(group)
    mine = _encode(obj, device) if dist.get_rank() == src else None
    size = torch.tensor([0 if mine is None else mine.numel()], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    buf = mine if mine is not None else torch.empty(int(size.item()), dtype=torch.uint8,
                                                    device=device)
    dist.broadcast(buf, src=src, group=group)
    return _decode(buf)
