"""PyTorch executor of Kareus plans: the instruction hooks and a nano-batched TP layer stack.

Kareus (Wu, Chung, Chowdhury, OSDI '26) runs every pipeline instruction as two nano-batches: the
micro-batch is split in half along the batch dimension and each half's tensor-parallel (TP)
collective runs while the other half computes. A *partition* is one nano-batch's compute block
between two collectives plus the other nano-batch's collective; the plan names, per partition,
the compute op before which that collective is launched (the *slot*) and how many SMs it gets.
Like the authors' artifact, which wraps a stage's whole layer stack in one
``torch.autograd.Function``, :class:`NanoBatchedStack` controls the forward and the backward
schedule itself: its backward re-runs the forward (full recompute) and then walks the backward
ops one by one, so that the launch point of every collective is the plan's, in both directions.

The layer is Megatron-LM's (Shoeybi et al., 2019; Narayanan et al., SC '21): RMSNorm, GQA
attention with RoPE, SwiGLU MLP; QKV and FC1 are column-parallel (their input gradient is
AllReduced in backward), the output projection and FC2 are row-parallel (their output is
AllReduced in forward). The op lists and slot names come from Kareus's C++ kernel graph
through the module (``kareus.workload_partitions``, :class:`KernelGraphBlocks`), so that a
plan's slot means the same op here and in the planner. Sequence and context parallelism
(kareus.parallel) run both in the layer's plain ``forward`` and nano-batched, cut into the
kernel graph's blocks (SP: reduce-scatter, norm and all-gather as one communication chain; CP:
the K/V all-gather and dK/dV reduce-scatter as collectives of their own).

Collectives go through ``torch.distributed`` with ``async_op=True``; on CPU that is gloo, on GPUs
NCCL. The SM count of each partition is handed to ``group_for_sms``; :class:`SmGroups`
(kareus.comm) maps it to a communicator created with ``min_ctas = max_ctas`` = that count in
its ``ncclConfig_t`` (torch 2.x). :func:`instrument_stages` (kareus.pipelining) puts the hooks
into ``torch.distributed.pipelining`` schedules. See docs/runtime.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .parallel import (causal_attention_at, cp_causal_attention, gather_along,  # noqa: F401
                       launch_collective, scatter_along)
from .comm import SmGroups, all_gather_json, nccl_options, plan_sm_counts  # noqa: E402,F401
from .pipelining import KareusInterleaved1F1B, instrument_stages, kareus_schedule  # noqa: E402,F401

__all__ = [
    "SmGroups",
    "nccl_options",
    "plan_sm_counts",
    "instrument_stages",
    "KareusInterleaved1F1B",
    "kareus_schedule",
    "ModelShape",
    "PartitionChoice",
    "InstructionSettings",
    "PipelineHooks",
    "TPTransformerLayer",
    "NanoBatchedStack",
    "copy_to_tp",
    "reduce_from_tp",
    "KernelGraphBlocks",
    "local_gpu_pci_bus_id",
    "aggregate_iteration",
    "merge_iteration_records",
]

def local_gpu_pci_bus_id(device: Optional[int] = None, driver_library: str = "libcuda.so.1") -> str:
    """PCI bus id of this process's CUDA device (default: the current one), e.g. "0000:3B:00.0".

    Pass it to ``kareus.Controller(pci_bus_id=...)`` so the controller locks the GPU this rank
    computes on. NVML's device index (``gpu_index``) follows NVML's own order, which is neither
    CUDA's default order nor filtered by ``CUDA_VISIBLE_DEVICES``, so ``gpu_index=local_rank`` can
    name another rank's GPU. torch 1.13's ``get_device_properties`` has neither a bus id nor a
    UUID, so this asks the CUDA driver (``cuDeviceGetPCIBusId``), which numbers devices as the CUDA
    runtime does, ``CUDA_VISIBLE_DEVICES`` applied. Raises RuntimeError without a CUDA driver.
    """
    import ctypes

    if device is None:
        device = torch.cuda.current_device()
    elif isinstance(device, torch.device):
        device = device.index if device.index is not None else torch.cuda.current_device()
    try:
        lib = ctypes.CDLL(driver_library)
    except OSError as e:
        raise RuntimeError(
            f"local_gpu_pci_bus_id: cannot load the CUDA driver ({driver_library}): {e}; "
            "without a GPU driver there is no bus id (use a dry-run controller)") from e

    def call(name: str, *args: Any) -> None:
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"local_gpu_pci_bus_id: {name} failed with CUresult {rc}")

    call("cuInit", ctypes.c_uint(0))
    handle = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(int(device)))
    buf = ctypes.create_string_buffer(64)
    call("cuDeviceGetPCIBusId", buf, ctypes.c_int(len(buf)), handle)
    return buf.value.decode()


class KernelGraphBlocks:
    """The compute ops and slots of every partition, from Kareus's C++ kernel graph.

    ``partitions``: ``kareus.workload_partitions(workload_path)`` (the planner's partitions of
    that workload). A slot names the op before which the other nano-batch's collective is
    launched; taking ops and slots from the graph, not from a copy here, is what makes a plan's
    slot mean the same op in the planner and in this executor. The executor's own blocks are
    checked against these op lists when a stack is built (a graph change that the executor
    does not follow fails there, naming both lists).
    """

    def __init__(self, partitions: Sequence[Dict[str, Any]]):
        self.ops: Dict[str, List[str]] = {}
        self.slots: Dict[str, Dict[str, int]] = {}
        #: Per key: the collective's name and the communication tail's kernels (None: unknown,
        #: a hand-built graph; any chain matches).
        self.chains: Dict[str, Optional[Tuple[str, Tuple[str, ...]]]] = {}
        self._keys: Dict[Tuple[Any, ...], str] = {}
        for p in partitions:
            self.ops.setdefault(p["key"], list(p["ops"]))
            self.slots.setdefault(p["key"], {s["name"]: int(s["op_index"]) for s in p["slots"]})
            name = (p.get("collective") or {}).get("name")
            self.chains.setdefault(p["key"], None if name is None else
                                   (name, tuple(p.get("comm_tail", ()))))

    @staticmethod
    def of_workload(path: str) -> "KernelGraphBlocks":
        import kareus  # the C++ module

        return KernelGraphBlocks(kareus.workload_partitions(path))

    def default_slot(self, key: str) -> str:
        """The slot at the partition's start (the Nanobatching baseline's launch point)."""
        slots = self.slots[key]
        return min(slots, key=lambda name: slots[name])

    def key_of(self, compute: Any, communication: Any) -> str:
        """The partition key of an executor block (``compute``) overlapping the collective
        chain of another (``communication``). The planner names a block that meets several
        kinds of chain by block and chain (``fwd_attn_rs_ag``), and versions of one key with
        other shapes ``_v2``; the one whose ops and chain are the executor's is the key."""
        base, ops, chain = compute.key, compute.op_names(), communication.chain()
        memo = (base, ops, chain)
        if memo in self._keys:
            return self._keys[memo]
        same_chain = sorted((k for k in self.ops if (k == base or k.startswith(base + "_"))
                             and self.chains[k] in (None, chain)),
                            key=lambda k: (k != base, len(k), k))
        for k in same_chain:
            if self.ops[k] == list(ops):
                self._keys[memo] = k
                return k
        if same_chain:
            k = same_chain[0]
            raise ValueError(f"kareus.torch: partition '{k}': the kernel graph's ops are "
                             f"{self.ops[k]}, the executor's {list(ops)}")
        raise ValueError(f"kareus.torch: the kernel graph has no partition '{base}' overlapping "
                         f"{' -> '.join((chain[0],) + chain[1])} (it has {', '.join(self.ops)});"
                         " this executor runs dense layers with tensor, sequence and context "
                         "parallelism")


# ---------------------------------------------------------------------------------------------
# Settings of one instruction.


@dataclass(frozen=True)
class PartitionChoice:
    """How one partition instance runs: the collective's SM count and its launch slot."""

    sms: int
    slot: str


@dataclass
class InstructionSettings:
    """The plan's settings of one instruction (what :class:`NanoBatchedStack` needs).

    ``partitions`` maps a partition key to its choice; ``mixes`` optionally maps a key to
    per-layer choices ``[(choice, instances), ...]``: the first ``instances`` occurrences of the
    key in the instruction (in execution order) use the first choice, and so on.
    """

    kind: str
    microbatch: int
    freq_mhz: int = 0
    partitions: Dict[str, PartitionChoice] = field(default_factory=dict)
    mixes: Dict[str, List[Tuple[PartitionChoice, int]]] = field(default_factory=dict)
    #: The instruction runs its micro-batch whole, collectives in line (no nano-batches): the
    #: plan chose Perseus's execution for it, where overlap does not pay.
    sequential: bool = False
    #: Model chunk of the stage the instruction runs (interleaved schedules; 0 otherwise).
    chunk: int = 0

    @staticmethod
    def from_plan(instruction: Any) -> "InstructionSettings":
        """Converts a ``kareus.Instruction`` (the C++ module's) into this plain form."""
        parts: Dict[str, PartitionChoice] = {}
        mixes: Dict[str, List[Tuple[PartitionChoice, int]]] = {}
        for key, p in instruction.partitions.items():
            parts[key] = PartitionChoice(int(p.sms), str(p.slot))
            if p.mix:
                mixes[key] = [(PartitionChoice(int(s.sms), str(s.slot)), int(s.instances))
                              for s in p.mix]
        return InstructionSettings(str(instruction.kind), int(instruction.microbatch),
                                   int(instruction.freq_mhz), parts, mixes,
                                   bool(getattr(instruction, "sequential", False)),
                                   int(getattr(instruction, "chunk", 0)))


class _Cursor:
    """Hands out each partition instance's choice in execution order (mixes are per occurrence)."""

    def __init__(self, settings: Optional[InstructionSettings]):
        self._settings = settings
        self._seen: Dict[str, int] = {}

    def next(self, key: str) -> Optional[PartitionChoice]:
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        s = self._settings
        if s is None:
            return None  # no plan: NCCL's default CTAs, collective at the partition start
        mix = s.mixes.get(key)
        if mix:
            upto = 0
            for choice, instances in mix:
                upto += instances
                if occurrence < upto:
                    return choice
            return mix[-1][0]
        if key not in s.partitions:
            raise ValueError(
                f"kareus.torch: the plan's {s.kind} instruction of micro-batch {s.microbatch} "
                f"(chunk {s.chunk}) has no setting for partition '{key}'; it has: {', '.join(sorted(s.partitions))}")
        return s.partitions[key]


# ---------------------------------------------------------------------------------------------
# The instruction hooks.


class PipelineHooks:
    """What a pipeline schedule calls around each instruction of one rank.

    Wraps ``kareus.Hooks`` (plan order check, clock to the frequency controller) and keeps the
    settings of the open instruction in :attr:`current`, which :class:`NanoBatchedStack` reads.
    ``plan`` is a ``kareus.Plan``; ``controller`` an optional started ``kareus.Controller``.
    Without ``plan`` (``PipelineHooks(None, rank)``) the hooks only track the open instruction,
    which lets the same schedule run a plain nano-batched baseline.

    Instructions are named by (kind, chunk, micro-batch). On an interleaved plan (``chunks`` >
    1) each hook needs ``chunk``; without it the hooks name chunk 0 and the plan refuses them
    (``kareus.OrderError``) where that is ambiguous. :attr:`order` is the stage's order.

    ``monitor``, a ``kareus.Monitor`` of this rank, times every instruction (with a plan through
    ``kareus.Hooks``, without one directly), so a baseline run without a plan is measured the
    same way; the training loop calls its ``begin_iteration``/``end_iteration``.
    """

    def __init__(self, plan: Any, rank: int, controller: Any = None, monitor: Any = None):
        self.rank, self.plan = rank, plan
        self._hooks = None
        self._monitor = None
        if plan is not None:
            import kareus  # the C++ module; imported here so that the layer works without it

            self._hooks = kareus.Hooks(plan, rank, controller, monitor)
        else:
            self._monitor = monitor
        self.current: Optional[InstructionSettings] = None
        self._open: Optional[Tuple[str, int, int]] = None

    @property
    def stage(self) -> Optional[int]:
        return None if self._hooks is None else self._hooks.stage

    @property
    def chunks(self) -> int:
        """Model chunks per stage in the plan (1 without a plan)."""
        return 1 if self._hooks is None else self._hooks.chunks

    @property
    def order(self) -> Optional[List[Tuple[str, int, int]]]:
        """The stage's instructions as (kind, chunk, micro-batch), in the plan's order (the
        schedule's); None without a plan (use ``kareus.schedule_order``)."""
        if self._hooks is None:
            return None
        return [(i.kind, i.chunk, i.microbatch) for i in self._hooks.instructions]

    def on_instruction_begin(self, kind: str, microbatch: int,
                             chunk: Optional[int] = None) -> Optional[InstructionSettings]:
        """Call right before the instruction's compute; returns its settings (None: no plan)."""
        if self._hooks is not None:
            self.current = InstructionSettings.from_plan(
                self._hooks.on_instruction_begin(kind, microbatch, chunk))
        else:
            if self._monitor is not None:
                self._monitor.begin_instruction(kind, microbatch, 0 if chunk is None else chunk)
            self.current = None
        self._open = (kind, 0 if chunk is None else chunk, microbatch)
        return self.current

    def on_instruction_end(self, kind: str, microbatch: int, chunk: Optional[int] = None) -> None:
        """Call right after the instruction's compute (before its send to the next stage)."""
        if self._hooks is not None:
            self._hooks.on_instruction_end(kind, microbatch, chunk)
        elif self._monitor is not None:
            self._monitor.end_instruction(kind, microbatch, 0 if chunk is None else chunk)
        self._open = None
        self.current = None

    @property
    def open_instruction(self) -> Optional[Tuple[str, int, int]]:
        """(kind, chunk, micro-batch) between begin and end, else None."""
        return self._open


# ---------------------------------------------------------------------------------------------
# The job's figures of one iteration, from every rank's energy-monitor record.


def merge_iteration_records(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The job's figures of one iteration from every rank's ``kareus.Monitor.end_iteration()``
    record, as ``kareus monitor merge`` computes them per iteration (docs/formats.md).

    Returns ``{"iteration", "ranks" (sorted), "time_s" (max over the ranks), "energy_j" (sum
    over the ranks; None if one has no energy), "avg_power_per_gpu_w" (energy_j / (time_s x
    ranks); None without energy), "stage_busy_time_s" (a list indexed by stage: the max over
    the stage's ranks of their instructions' time; None for a stage no record covers),
    "notes"}``. Raises ValueError for no records, a record that is not an iteration record, two
    records of one rank, or ranks at different iterations. Two ranks that measured the same GPU
    (same ``gpu_uuid``) make the sum count it twice: a RuntimeWarning and a note say so.
    """
    if not records:
        raise ValueError("merge_iteration_records: no records")
    for r in records:
        if not isinstance(r, dict) or r.get("record") != "iteration":
            raise ValueError("merge_iteration_records: not an iteration record of "
                             f"kareus.Monitor.end_iteration(): {r!r}")
    by_rank = sorted(records, key=lambda r: r["rank"])
    ranks = [r["rank"] for r in by_rank]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"merge_iteration_records: two records of one rank among ranks {ranks}")
    iterations = {r["iteration"] for r in records}
    if len(iterations) != 1:
        at = ", ".join(f"rank {r['rank']}: {r['iteration']}" for r in by_rank)
        raise ValueError("merge_iteration_records: the ranks are at different iterations "
                         f"({at}); every rank must call begin_iteration/end_iteration for every "
                         "iteration")
    notes: List[str] = []
    gpus: Dict[str, int] = {}
    for r in by_rank:
        uuid = r.get("gpu_uuid")
        if uuid and uuid in gpus:
            notes.append(f"ranks {gpus[uuid]} and {r['rank']} measured the same GPU {uuid}: its "
                         "energy is counted twice (select each rank's own GPU by gpu_uuid or "
                         "pci_bus_id)")
        elif uuid:
            gpus[uuid] = r["rank"]
    if notes:
        import warnings

        warnings.warn("kareus: " + "; ".join(notes), RuntimeWarning)
    time_s = max(float(r["time_s"]) for r in records)
    lacking = [r["rank"] for r in by_rank if r.get("energy_j") is None]
    energy_j: Optional[float] = None
    if lacking:
        notes.append(f"rank(s) {', '.join(map(str, lacking))} have no energy (times only or a "
                     "counter problem; see their records' notes)")
    else:
        energy_j = sum(float(r["energy_j"]) for r in records)
    power = energy_j / (time_s * len(records)) if energy_j is not None and time_s > 0 else None
    busy: List[Optional[float]] = [None] * (max(r["stage"] for r in records) + 1)
    for r in records:
        s = r["stage"]
        busy[s] = max(busy[s] or 0.0, float(r["busy_time_s"]))
    return {"iteration": next(iter(iterations)), "ranks": ranks, "time_s": time_s,
            "energy_j": energy_j, "avg_power_per_gpu_w": power, "stage_busy_time_s": busy,
            "notes": notes}


def aggregate_iteration(record: Dict[str, Any], group: Any = None) -> Dict[str, Any]:
    """The job's figures of one iteration: every rank passes its own ``Monitor.end_iteration()``
    record; the records are all-gathered through the job's process group (``group``, default the
    world; JSON bytes through ``all_gather``, on gloo and, with the current CUDA device set, on
    NCCL; not ``all_gather_object``, which needs numpy on torch 2.x) and merged by
    :func:`merge_iteration_records` on every rank, so
    every rank returns the same dict: ``time_s`` max over the ranks, ``energy_j`` sum (None if a
    rank lacks it), ``avg_power_per_gpu_w``, and ``stage_busy_time_s``, a list indexed by stage
    (the max over the stage's ranks of their busy time: what a re-planner compares with the
    plan's per-stage time). A collective: every rank of the group must call it for the same
    iteration.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("aggregate_iteration needs an initialized torch.distributed process "
                           "group (use merge_iteration_records for records at hand)")
    return merge_iteration_records(all_gather_json(record, group))


# ---------------------------------------------------------------------------------------------
# Tensor-parallel building blocks (Megatron-LM's f and g operators).


class _CopyToTP(torch.autograd.Function):
    """Identity in forward; AllReduce of the gradient in backward (column-parallel input)."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """AllReduce in forward (row-parallel output); identity in backward."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g, None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromTP.apply(x, group)


@dataclass(frozen=True)
class ModelShape:
    """Shape of the Llama-like model (full, before TP sharding)."""

    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope: bool = True
    norm_eps: float = 1e-5


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The mean of squares in fp32: in bf16 its 8-bit mantissa would round the scale itself.
    scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (x.float() * scale).to(x.dtype) * weight


def _rope_tables(seq: int, dim: int, dtype, device,
                 offset: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.outer(torch.arange(offset, offset + seq, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype=dtype, device=device), ang.sin().to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Rotary embedding (Su et al., 2021; rotate-half form) of x [batch, seq, heads, head_dim]
    whose first position is ``offset`` (a context-parallel shard's start)."""
    cos, sin = _rope_tables(x.shape[1], x.shape[-1], x.dtype, x.device, offset)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention: q [b, s, hq, d], k/v [b, s, hkv, d] -> [b, s, hq*d].

    ``F.scaled_dot_product_attention`` picks FlashAttention-2 (Dao, 2023) or the memory-efficient
    kernel on GPUs, the kernel the planner's attention op models; K/V heads are repeated for GQA
    rather than passed with ``enable_gqa`` so that torch before 2.5 runs it too.
    """
    b, s, hq, d = q.shape
    rep = hq // k.shape[2]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True)
    return o.transpose(1, 2).reshape(b, s, hq * d)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class TPTransformerLayer(nn.Module):
    """One Llama-like decoder layer, sharded Megatron-style over the TP group.

    Each rank draws only its shard (column-parallel QKV/FC1 rows, row-parallel output
    projection/FC2 columns), row by row from generators seeded by ``seed``, so every TP layout of
    the same seed computes the same function. ``dtype``: bf16 by default, as trained on GPUs;
    fp32 for references (the tests). ``forward`` is the plain schedule
    (whole micro-batch, synchronous collectives, autograd); :class:`NanoBatchedStack` runs the
    same parameters nano-batched.
    """

    def __init__(self, shape: ModelShape, tp_rank: int, tp_size: int, group, seed: int,
                 dtype=torch.bfloat16, sequence_parallel: bool = False, cp_group: Any = None):
        super().__init__()
        if sequence_parallel and tp_size < 2:
            raise ValueError("kareus.torch: sequence parallelism needs tp > 1")
        self.sequence_parallel, self.cp_group = sequence_parallel, cp_group
        for name, n in (("heads", shape.heads), ("kv_heads", shape.kv_heads),
                        ("ffn_hidden", shape.ffn_hidden)):
            if n % tp_size:
                raise ValueError(f"kareus.torch: {name} {n} is not divisible by tp {tp_size}")
        self.shape, self.group, self.tp_size = shape, group, tp_size
        h, d, f = shape.hidden, shape.head_dim, shape.ffn_hidden
        self.hq, self.hkv, self.f = shape.heads // tp_size, shape.kv_heads // tp_size, f // tp_size
        r = tp_rank

        # Each row is drawn from its own generator, seeded by (layer seed, tensor, row), so a
        # rank draws only its shard and every TP layout of one seed computes the same function.
        def rows(tensor: int, first: int, count: int, cols: int, scale: float) -> torch.Tensor:
            out = torch.empty(count, cols, dtype=torch.float32)
            for i in range(count):
                g = torch.Generator().manual_seed(
                    (seed * 1_000_003 + tensor * 65_537 + first + i) % (2 ** 62))
                out[i] = torch.randn(cols, generator=g, dtype=torch.float32) * scale
            return out

        def norm_weight(tensor: int) -> torch.Tensor:
            return 1.0 + 0.1 * rows(tensor, 0, 1, h, 1.0)[0]

        hq_d, hkv_d = self.hq * d, self.hkv * d
        wq = rows(0, r * hq_d, hq_d, h, h ** -0.5)  # column-parallel: output rows of this rank
        wk = rows(1, r * hkv_d, hkv_d, h, h ** -0.5)
        wv = rows(2, r * hkv_d, hkv_d, h, h ** -0.5)
        # Row-parallel: input columns of this rank, drawn as rows of the transpose.
        wo = rows(3, r * hq_d, hq_d, h, (shape.heads * d) ** -0.5).t()
        w_gate = rows(4, r * self.f, self.f, h, h ** -0.5)
        w_up = rows(5, r * self.f, self.f, h, h ** -0.5)
        w2 = rows(6, r * self.f, self.f, h, f ** -0.5).t()
        self.norm1 = nn.Parameter(norm_weight(7).to(dtype))
        self.wqkv = nn.Parameter(torch.cat([wq, wk, wv], dim=0).to(dtype).contiguous())
        self.wo = nn.Parameter(wo.to(dtype).contiguous())
        self.norm2 = nn.Parameter(norm_weight(8).to(dtype))
        self.w1 = nn.Parameter(torch.cat([w_gate, w_up], dim=0).to(dtype).contiguous())
        self.w2 = nn.Parameter(w2.to(dtype).contiguous())

    def params(self) -> List[nn.Parameter]:
        """In the order :class:`NanoBatchedStack` passes them through autograd."""
        return [self.norm1, self.wqkv, self.wo, self.norm2, self.w1, self.w2]

    def split_qkv(self, qkv: torch.Tensor):
        b, s, _ = qkv.shape
        d = self.shape.head_dim
        q, k, v = qkv.split([self.hq * d, self.hkv * d, self.hkv * d], dim=-1)
        return q.reshape(b, s, self.hq, d), k.reshape(b, s, self.hkv, d), v.reshape(
            b, s, self.hkv, d)

    def rope(self, qkv: torch.Tensor, offset: int = 0):
        q, k, v = self.split_qkv(qkv)
        if self.shape.rope:
            q, k = apply_rope(q, offset), apply_rope(k, offset)
        return q, k, v

    def _enter(self, n: torch.Tensor) -> torch.Tensor:
        """Into a TP region: Megatron's f (identity, gradient AllReduced), or with sequence
        parallelism the all-gather along the sequence (gradient reduce-scattered)."""
        if self.sequence_parallel:
            return gather_along(n, 1, self.group)
        return copy_to_tp(n, self.group)

    def _exit(self, y: torch.Tensor) -> torch.Tensor:
        """Out of a TP region: AllReduce, or reduce-scatter along the sequence."""
        if self.sequence_parallel:
            return scatter_along(y, 1, self.group)
        return reduce_from_tp(y, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The plain schedule. ``x`` [b, s', h]: with sequence parallelism s' is this TP rank's
        share of the CP shard; with context parallelism the CP shard is this CP rank's
        contiguous share of the sequence (positions from cp_rank * shard)."""
        eps = self.shape.norm_eps
        n1 = self._enter(rmsnorm(x, self.norm1, eps))
        offset = 0 if self.cp_group is None else dist.get_rank(self.cp_group) * n1.shape[1]
        q, k, v = self.rope(F.linear(n1, self.wqkv), offset)
        o = causal_attention(q, k, v) if self.cp_group is None else \
            cp_causal_attention(q, k, v, self.cp_group)
        x = x + self._exit(F.linear(o, self.wo))
        n2 = self._enter(rmsnorm(x, self.norm2, eps))
        return x + self._exit(F.linear(swiglu(F.linear(n2, self.w1)), self.w2))


# ---------------------------------------------------------------------------------------------
# The nano-batched executor.


class _NB:
    """State of one nano-batch while the chain of blocks runs."""

    def __init__(self, x: Optional[torch.Tensor]):
        self.r = x  # residual stream (forward; sequence-sharded under SP)
        self.y: Optional[torch.Tensor] = None  # reduced output of the previous block, to add
        self.out: Optional[torch.Tensor] = None  # this block's collective input
        self.rec: Dict[int, Dict[str, Any]] = {}  # per layer: tensors kept for backward
        self.ckpt: Dict[int, torch.Tensor] = {}  # per layer: input (full recompute)
        self.g_r: Optional[torch.Tensor] = None  # gradient of the residual stream
        # The residual gradient as the next GEMMs see it: g_r, or under SP its all-gather.
        self.g_full: Optional[torch.Tensor] = None
        self.g_reduced: Optional[torch.Tensor] = None  # AllReduced gradient of a norm's output
        self.norm_pending: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = None
        self.g_norm_r: Optional[torch.Tensor] = None
        self.tmp: Dict[str, Any] = {}


#: The kernel graph's collectives: (kind, group) of each name (src/workload/kernel_graph.cc).
_COLLECTIVES = {
    "tp_allreduce": ("allreduce", "tp"),
    "tp_reducescatter": ("reducescatter", "tp"),
    "tp_allgather": ("allgather", "tp"),
    "cp_allgather_kv": ("allgather", "cp"),
    "cp_reducescatter_dkv": ("reducescatter", "cp"),
}


@dataclass
class _Block:
    key: str  # "fwd_" / "bwd_" and the kernel graph's block name
    layer: int
    ops: List[Tuple[str, Callable[[_NB], None]]]
    collective_input: Callable[[_NB], torch.Tensor]
    deliver: Callable[[_NB, torch.Tensor], None]
    collective: str = "tp_allreduce"
    #: No tensor-core work (an SP norm between its reduce-scatter and all-gather): too short to
    #: hide a collective behind, so, as in the kernel graph, it joins the communication chain of
    #: the block before it (its `tail`) instead of being a block of its own.
    small: bool = False
    tail: List["_Block"] = field(default_factory=list)

    def op_names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.ops)

    def chain(self) -> Tuple[str, Tuple[str, ...]]:
        """The collective and the communication tail, named as the kernel graph names them."""
        tail: List[str] = []
        for t in self.tail:
            tail += list(t.op_names()) + [t.collective]
        return self.collective, tuple(tail)


def _fold(blocks: List[_Block]) -> List[_Block]:
    out: List[_Block] = []
    for b in blocks:
        if out and b.small:
            out[-1].tail.append(b)
        else:
            out.append(b)
    return out


def _launch(blk: _Block, tensor: torch.Tensor, group: Any):
    return launch_collective(_COLLECTIVES[blk.collective][0], tensor, 1, group)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _keep(name: str, in_tmp: bool = True) -> Callable[[_NB, torch.Tensor], None]:
    """A block's `deliver` that keeps the collective's result as ``tmp[name]`` (or the state's
    attribute ``name``)."""
    def deliver(s: _NB, t: torch.Tensor) -> None:
        if in_tmp:
            s.tmp[name] = t
        else:
            setattr(s, name, t)
    return deliver


def _kv(rotated: Tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The rotated K and V as one tensor, so that one CP collective carries both."""
    return torch.cat([t.detach() for t in rotated[1:]], dim=-1)


class _Builder:
    """Builds the blocks of a stage's layer stack as closures over one set of parameters, as
    the kernel graph cuts them: under sequence parallelism (SP) each norm is a small block of its
    own ending in the TP all-gather, and the GEMM blocks end in a reduce-scatter; under context
    parallelism (CP) the attention is split at the K/V all-gather (forward) and at the K/V
    all-gather and dK/dV reduce-scatter (backward)."""

    def __init__(self, layers: Sequence[TPTransformerLayer], weights: Sequence[torch.Tensor],
                 grads: List[Optional[torch.Tensor]]):
        self.layers, self.w, self.grads = layers, weights, grads
        self.sp = bool(layers) and layers[0].sequence_parallel
        self.cp = bool(layers) and layers[0].cp_group is not None
        self.exit = "tp_reducescatter" if self.sp else "tp_allreduce"

    def _p(self, layer: int, i: int) -> torch.Tensor:
        return self.w[6 * layer + i]

    def _acc(self, layer: int, i: int, g: torch.Tensor) -> None:
        j = 6 * layer + i
        self.grads[j] = g if self.grads[j] is None else self.grads[j] + g

    def _offset(self, l: int, seq: int) -> int:
        """The global position of this CP rank's first token (its shard is contiguous)."""
        return dist.get_rank(self.layers[l].cp_group) * seq if self.cp else 0

    def _norm_entry(self, l: int, norm_key: str, norm_ops, gather_input, gather_deliver,
                    key: str, rest, collective_input, deliver, collective: str) -> List[_Block]:
        """Block `key` (ops `rest`) opened by the norm ops, or under SP preceded by a small
        block `norm_key` of the norm ops ending in the TP all-gather."""
        if self.sp:
            return [_Block(norm_key, l, norm_ops, gather_input, gather_deliver, "tp_allgather",
                           True), _Block(key, l, rest, collective_input, deliver, collective)]
        return [_Block(key, l, norm_ops + rest, collective_input, deliver, collective)]

    # ---- forward blocks; `record`: keep what backward needs (leaves at op boundaries).
    def forward_layer(self, l: int, record: bool, replay: bool) -> List[_Block]:
        lay, eps = self.layers[l], self.layers[l].shape.norm_eps
        d = lay.shape.head_dim

        def residual_add(s: _NB):
            if replay:
                r0 = s.ckpt[l]
            else:
                r0 = s.r if s.y is None else s.r + s.y
                s.ckpt[l] = r0
            s.y = None
            s.r = _leaf(r0) if record else r0
            if record:
                s.rec[l] = {"r0": s.r}

        def norm_op(index: int, rec_key: str):
            def norm(s: _NB):
                if record:
                    with torch.enable_grad():
                        w = _leaf(self._p(l, index))
                        n = rmsnorm(s.r, w, eps)
                    s.rec[l][rec_key] = (n, s.r, w)
                    s.tmp["n"] = n.detach()
                else:
                    s.tmp["n"] = rmsnorm(s.r, self._p(l, index), eps)
            return norm

        def qkv(s: _NB):
            t = F.linear(s.tmp["n"], self._p(l, 1))
            if record:
                s.rec[l]["n1"] = s.tmp["n"]
                t = _leaf(t)
                s.rec[l]["qkv"] = t
            s.tmp["qkv"] = t

        def rope(s: _NB):
            offset = self._offset(l, s.tmp["qkv"].shape[1])
            if record:
                with torch.enable_grad():
                    q, k, v = lay.rope(s.rec[l]["qkv"], offset)
                s.rec[l]["rope"] = (q, k, v)
                q, k, v = _leaf(q), _leaf(k), _leaf(v)
                s.rec[l]["qkv_rot"] = (q, k, v)
            else:
                q, k, v = lay.rope(s.tmp["qkv"], offset)
            s.tmp["qkv_rot"] = (q, k, v)

        def attention(s: _NB):
            if self.cp:  # the backward re-gathers K/V, so no graph is kept here
                q = s.tmp["qkv_rot"][0].detach()
                k, v = s.tmp.pop("kv").split(d, dim=-1)
                with torch.no_grad():
                    s.tmp["o"] = causal_attention_at(q, k, v, self._offset(l, q.shape[1]))
            elif record:
                with torch.enable_grad():
                    o = causal_attention(*s.tmp["qkv_rot"])
                s.rec[l]["attn"] = o
                s.tmp["o"] = o.detach()
            else:
                s.tmp["o"] = causal_attention(*s.tmp["qkv_rot"])

        def out_proj(s: _NB):
            if record:
                s.rec[l]["o"] = s.tmp["o"]
            s.out = F.linear(s.tmp["o"], self._p(l, 2)).contiguous()
            s.tmp.clear()

        def residual_add2(s: _NB):
            r1 = s.r.detach() + s.y
            s.y = None
            s.r = _leaf(r1) if record else r1
            if record:
                s.rec[l]["r1"] = s.r

        def fc1(s: _NB):
            t = F.linear(s.tmp["n"], self._p(l, 4))
            if record:
                s.rec[l]["n2"] = s.tmp["n"]
                t = _leaf(t)
                s.rec[l]["gu"] = t
            s.tmp["gu"] = t

        def act(s: _NB):
            if record:
                with torch.enable_grad():
                    a = swiglu(s.tmp["gu"])
                s.rec[l]["act"] = a
                s.tmp["a"] = a.detach()
            else:
                s.tmp["a"] = swiglu(s.tmp["gu"])

        def fc2(s: _NB):
            if record:
                s.rec[l]["a"] = s.tmp["a"]
            s.out = F.linear(s.tmp["a"], self._p(l, 5)).contiguous()
            s.tmp.clear()

        set_y, set_n, set_kv = _keep("y", False), _keep("n"), _keep("kv")
        out_input, n_input = (lambda s: s.out), (lambda s: s.tmp["n"])

        def kv_input(s: _NB) -> torch.Tensor:
            return _kv(s.tmp["qkv_rot"])

        norm1 = [("residual_add", residual_add), ("rmsnorm", norm_op(0, "norm1"))]
        qkv_ops = [("qkv_gemm", qkv), ("rope", rope)]
        attn_ops = [("attention", attention), ("out_proj", out_proj)]
        if self.cp:
            blocks = self._norm_entry(l, "fwd_attn_norm", norm1, n_input, set_n, "fwd_qkv",
                                      qkv_ops, kv_input, set_kv, "cp_allgather_kv")
            blocks.append(_Block("fwd_ao", l, attn_ops, out_input, set_y, self.exit))
        else:
            blocks = self._norm_entry(l, "fwd_attn_norm", norm1, n_input, set_n, "fwd_attn",
                                      qkv_ops + attn_ops, out_input, set_y, self.exit)
        norm2 = [("residual_add", residual_add2), ("rmsnorm", norm_op(3, "norm2"))]
        mlp = [("fc1", fc1), ("swiglu", act), ("fc2", fc2)]
        return blocks + self._norm_entry(l, "fwd_mlp_norm", norm2, n_input, set_n, "fwd_mlp",
                                         mlp, out_input, set_y, self.exit)

    # ---- backward blocks.
    def _norm_bwd(self, s: _NB):
        """Backward of the RMSNorm whose output gradient the previous block reduced."""
        if s.norm_pending is None:
            return
        n, r, w, index = s.norm_pending
        g_r, g_w = torch.autograd.grad(n, (r, w), s.g_reduced)
        self._acc(index // 6, index % 6, g_w)
        s.g_norm_r, s.norm_pending, s.g_reduced = g_r, None, None

    @staticmethod
    def _residual_grad_add(s: _NB):
        if s.g_norm_r is not None:
            s.g_r = s.g_r + s.g_norm_r
            s.g_norm_r = None
        s.g_full = s.g_r

    def backward_layer(self, l: int) -> List[_Block]:
        d = self.layers[l].shape.head_dim

        def wgrad(i: int, g: torch.Tensor, x: torch.Tensor):
            self._acc(l, i, g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]))

        def fc2_dgrad(s: _NB):
            s.tmp["g_a"] = s.g_full @ self._p(l, 5)

        def fc2_wgrad(s: _NB):
            wgrad(5, s.g_full, s.rec[l]["a"])

        def act_bwd(s: _NB):
            (s.tmp["g_gu"],) = torch.autograd.grad(s.rec[l]["act"], s.rec[l]["gu"], s.tmp["g_a"])

        def fc1_dgrad(s: _NB):
            s.out = (s.tmp["g_gu"] @ self._p(l, 4)).contiguous()

        def fc1_wgrad(s: _NB):
            wgrad(4, s.tmp["g_gu"], s.rec[l]["n2"])
            s.tmp.clear()

        def out_dgrad(s: _NB):
            s.tmp["g_o"] = s.g_full @ self._p(l, 2)

        def out_wgrad(s: _NB):
            wgrad(2, s.g_full, s.rec[l]["o"])

        def attn_bwd(s: _NB):
            if self.cp:  # over the K/V the o block re-gathered
                q = s.rec[l]["qkv_rot"][0]
                with torch.enable_grad():
                    kv = _leaf(s.tmp.pop("kv"))
                    k, v = kv.split(d, dim=-1)
                    o = causal_attention_at(q, k, v, self._offset(l, q.shape[1]))
                s.tmp["g_q"], g_kv = torch.autograd.grad(o, (q, kv), s.tmp["g_o"])
                s.out = g_kv.contiguous()
            else:
                s.tmp["g_qkv_rot"] = torch.autograd.grad(s.rec[l]["attn"], s.rec[l]["qkv_rot"],
                                                         s.tmp["g_o"])

        def rope_bwd(s: _NB):
            if self.cp:
                g_k, g_v = s.tmp.pop("g_kv").split(d, dim=-1)
                g_rot = (s.tmp["g_q"], g_k, g_v)
            else:
                g_rot = s.tmp["g_qkv_rot"]
            (s.tmp["g_qkv"],) = torch.autograd.grad(s.rec[l]["rope"], s.rec[l]["qkv"], g_rot)

        def qkv_dgrad(s: _NB):
            s.out = (s.tmp["g_qkv"] @ self._p(l, 1)).contiguous()

        def qkv_wgrad(s: _NB):
            wgrad(1, s.tmp["g_qkv"], s.rec[l]["n1"])
            s.tmp.clear()

        def deliver_to_norm(rec_key: str, index: int):
            def deliver(s: _NB, g: torch.Tensor):
                n, r, w = s.rec[l][rec_key]
                s.g_reduced, s.norm_pending = g, (n, r, w, 6 * l + index)
            return deliver

        set_g_full, set_kv, set_g_kv = _keep("g_full", False), _keep("kv"), _keep("g_kv")

        def kv_input(s: _NB) -> torch.Tensor:
            return _kv(s.rec[l]["qkv_rot"])

        out_input, g_input = (lambda s: s.out), (lambda s: s.g_r)
        norm = [("rmsnorm_bwd", self._norm_bwd), ("residual_grad_add", self._residual_grad_add)]
        mlp = [("fc2_dgrad", fc2_dgrad), ("fc2_wgrad", fc2_wgrad), ("swiglu_bwd", act_bwd),
               ("fc1_dgrad", fc1_dgrad), ("fc1_wgrad", fc1_wgrad)]
        blocks = self._norm_entry(l, "bwd_mlp", norm, g_input, set_g_full,
                                  "bwd_mlp_gemm" if self.sp else "bwd_mlp", mlp, out_input,
                                  deliver_to_norm("norm2", 3), self.exit)
        out_ops = [("out_proj_dgrad", out_dgrad), ("out_proj_wgrad", out_wgrad)]
        qkv_ops = [("rope_bwd", rope_bwd), ("qkv_gemm_dgrad", qkv_dgrad),
                   ("qkv_gemm_wgrad", qkv_wgrad)]
        if self.cp:
            blocks += self._norm_entry(l, "bwd_o_norm", norm, g_input, set_g_full, "bwd_o",
                                       out_ops, kv_input, set_kv, "cp_allgather_kv")
            blocks.append(_Block("bwd_a", l, [("attention_bwd", attn_bwd)], out_input, set_g_kv,
                                 "cp_reducescatter_dkv"))
            blocks.append(_Block("bwd_qkv", l, qkv_ops, out_input, deliver_to_norm("norm1", 0),
                                 self.exit))
        else:
            blocks += self._norm_entry(l, "bwd_attn_norm", norm, g_input, set_g_full, "bwd_attn",
                                       out_ops + [("attention_bwd", attn_bwd)] + qkv_ops,
                                       out_input, deliver_to_norm("norm1", 0), self.exit)
        return blocks

    def instruction(self, direction: str, record: bool, recompute: bool) -> List[_Block]:
        """The folded blocks of a forward or a backward instruction over the whole stack."""
        blocks: List[_Block] = []
        if direction == "forward":
            for l in range(len(self.layers)):
                blocks += self.forward_layer(l, record, False)
        else:
            for l in reversed(range(len(self.layers))):
                if recompute:
                    blocks += self.forward_layer(l, True, True)
                blocks += self.backward_layer(l)
        return _fold(blocks)


@dataclass
class TraceEvent:
    """One collective launch of the executor, for tests and timelines."""

    direction: str  # "forward" or "backward" (the instruction)
    key: str  # partition key of the compute block it overlapped ("" for the stack tail)
    occurrence: int  # index of that partition instance in the instruction
    layer: int
    compute_nb: int  # nano-batch whose compute the collective overlapped
    collective_nb: int
    collective_of: str  # block whose output the collective takes (a tail: the norm block)
    op_index: int  # launched right before this op of the compute block (-1: alone, at the tail)
    op: str
    sms: Optional[int]
    collective: str = ""  # the kernel graph's name, e.g. "tp_reducescatter"
    #: 0: the partition's collective; 1, 2, ...: the collectives of its communication tail (SP's
    #: all-gather after the norm), started after the block's end on the same SM-count group
    #: (op_index and op name where the chain began).
    chain: int = 0


def _run_tail(blk: _Block, st: _NB, group_of, sms: Optional[int], emit) -> None:
    """The communication tail of `blk`'s collective: each folded block's ops, then its
    collective, on the partition's SM-count group."""
    for j, t in enumerate(blk.tail):
        for _, op in t.ops:
            op(st)
        emit(t, j + 1)
        t.deliver(st, _launch(t, t.collective_input(st), group_of(t, sms)).wait())


def _run_chain(blocks: List[_Block], states: List[_NB], cursor: _Cursor, group_of,
               direction: str, trace: Optional[List[TraceEvent]],
               graph: KernelGraphBlocks) -> None:
    """Runs NB0 b0, NB1 b0, NB0 b1, NB1 b1, ...: each nano-batch's collective is launched
    asynchronously right before the plan's slot op of the other nano-batch's next block and
    waited at that block's end, then its communication tail runs; the last collective runs
    alone (the stack tail)."""
    pending: Optional[Tuple[_NB, _Block, int, torch.Tensor]] = None
    seen: Dict[str, int] = {}
    for step in range(2 * len(blocks)):
        blk, nb = blocks[step // 2], step % 2
        st = states[nb]
        launch_at, sms, key, work = -1, None, "", None
        if pending is not None:
            key = graph.key_of(blk, pending[1])
            choice = cursor.next(key)
            slot = choice.slot if choice is not None else graph.default_slot(key)
            sms = choice.sms if choice is not None else None
            allowed = graph.slots[key]
            if slot not in allowed:
                raise ValueError(f"kareus.torch: partition '{key}': unknown launch slot "
                                 f"'{slot}'; allowed: {', '.join(allowed)}")
            launch_at = allowed[slot]
        occ = seen.get(key, 0)

        def emit(c: _Block, chain: int, i: int = -1, name: str = "") -> None:
            if trace is not None:
                trace.append(TraceEvent(direction, key, occ, blk.layer, nb, pending[2], c.key,
                                        i if chain == 0 else launch_at,
                                        name if chain == 0 else blk.ops[launch_at][0], sms,
                                        c.collective, chain))

        for i, (name, op) in enumerate(blk.ops):
            if i == launch_at:
                work = _launch(pending[1], pending[3], group_of(pending[1], sms))
                emit(pending[1], 0, i, name)
            op(st)
        if pending is not None:
            seen[key] = occ + 1
            pending[1].deliver(pending[0], work.wait())
            _run_tail(pending[1], pending[0], group_of, sms, emit)
        pending = (st, blk, nb, blk.collective_input(st))
    p_state, p_blk, p_nb, tensor = pending
    if trace is not None:
        trace.append(TraceEvent(direction, "", 0, p_blk.layer, -1, p_nb, p_blk.key, -1, "", None,
                                p_blk.collective))
    p_blk.deliver(p_state, _launch(p_blk, tensor, group_of(p_blk, None)).wait())


def _run_sequential(blocks: List[_Block], st: _NB, group_of, direction: str,
                    trace: Optional[List[TraceEvent]]) -> None:
    """Runs the blocks on the whole micro-batch, each collective in line after its block (a
    sequential instruction: Megatron-LM's order, NCCL's default CTAs). Traced as collectives
    that overlap nothing (op_index -1); the last one is the stack tail (key ""), as in
    :func:`_run_chain`."""
    seen: Dict[str, int] = {}
    for n, blk in enumerate(blocks):
        for _, op in blk.ops:
            op(st)
        last = n + 1 == len(blocks)
        key = "" if last else blk.key
        occurrence = 0 if last else seen.get(blk.key, 0)
        seen[blk.key] = seen.get(blk.key, 0) + 1

        def emit(c: _Block, chain: int) -> None:
            if trace is not None:
                trace.append(TraceEvent(direction, key, occurrence, blk.layer, -1, 0, c.key, -1,
                                        "", None, c.collective, chain))

        emit(blk, 0)
        blk.deliver(st, _launch(blk, blk.collective_input(st), group_of(blk, None)).wait())
        _run_tail(blk, st, group_of, None, emit)


def _is_sequential(settings: Optional[InstructionSettings]) -> bool:
    return settings is not None and settings.sequential


def _regroup_ckpts(ckpts: List[Dict[int, torch.Tensor]], parts: int) -> List[Dict[int, torch.Tensor]]:
    """The per-layer inputs saved by a forward run as len(ckpts) batches, as `parts` batches
    (a forward and its backward may differ in nano-batching: one sequential, one overlapped)."""
    if len(ckpts) == parts:
        return ckpts
    whole = {l: torch.cat([c[l] for c in ckpts], dim=0) for l in ckpts[0]}
    return [{l: t.chunk(parts, dim=0)[i].contiguous() for l, t in whole.items()}
            for i in range(parts)]


def _execute(stack: "NanoBatchedStack", blocks: List[_Block], states: List[_NB],
             settings: Optional[InstructionSettings], direction: str) -> None:
    if _is_sequential(settings):
        _run_sequential(blocks, states[0], stack._group_of, direction, stack.trace)
    else:
        _run_chain(blocks, states, _Cursor(settings), stack._group_of, direction, stack.trace,
                   stack.graph)


class _NanoStackFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, stack, *weights):  # type: ignore[override]
        settings = stack._settings_for("forward")
        ctx.stack, ctx.microbatch = stack, None if settings is None else settings.microbatch
        grads: List[Optional[torch.Tensor]] = [None] * len(weights)
        b = _Builder(stack.layers, weights, grads)
        if _is_sequential(settings):
            states = [_NB(x.detach().contiguous())]
        else:
            x0, x1 = x.detach().chunk(2, dim=0)
            states = [_NB(x0.contiguous()), _NB(x1.contiguous())]
        _execute(stack, b.instruction("forward", not stack.recompute, False), states, settings,
                 "forward")
        out = torch.cat([(s.r.detach() + s.y) for s in states], dim=0)
        if stack.recompute:
            ctx.ckpts = [dict(s.ckpt) for s in states]  # layer inputs only
        else:
            ctx.states = states
        ctx.save_for_backward(*weights)
        return out

    @staticmethod
    def backward(ctx, g_out):  # type: ignore[override]
        stack = ctx.stack
        settings = stack._settings_for("backward")
        if settings is not None and ctx.microbatch is not None and \
                settings.microbatch != ctx.microbatch:
            raise RuntimeError(
                f"kareus.torch: the backward of micro-batch {ctx.microbatch} (chunk "
                f"{stack.chunk}) ran while the hooks' open instruction is backward of micro-batch "
                f"{settings.microbatch} (chunk {settings.chunk})")
        weights = ctx.saved_tensors
        grads: List[Optional[torch.Tensor]] = [None] * len(weights)
        b = _Builder(stack.layers, weights, grads)
        parts = 1 if _is_sequential(settings) else 2
        if stack.recompute:
            states = [_NB(None) for _ in range(parts)]
            for s, ck in zip(states, _regroup_ckpts(ctx.ckpts, parts)):
                s.ckpt = ck
        else:
            states = ctx.states
            if len(states) != parts:
                raise RuntimeError(
                    "kareus.torch: a forward and its backward differ in nano-batching (one "
                    "sequential, one overlapped); that needs recompute=True")
        for s, g in zip(states, g_out.chunk(parts, dim=0)):
            s.g_r = g.contiguous()
        _execute(stack, b.instruction("backward", True, stack.recompute), states, settings,
                 "backward")
        for s in states:  # the stack input's gradient: the last norm backward and residual add
            b._norm_bwd(s)
            b._residual_grad_add(s)
        g_x = torch.cat([s.g_r for s in states], dim=0)
        ctx.states = ctx.ckpts = None
        return (g_x, None, *[torch.zeros_like(w) if g is None else g
                             for g, w in zip(grads, weights)])
class NanoBatchedStack(nn.Module):
    """The layers of one pipeline stage, run as two nano-batches with overlapped collectives
    (or, for an instruction the plan marks sequential, as one whole micro-batch).

    ``layers``: the stage's :class:`TPTransformerLayer` s (their parameters are used, not
    copied), all of one kind: tensor parallel, sequence parallel (SP) and/or context parallel
    (CP). Under SP each block's collective is the TP reduce-scatter, followed on the
    communication side by the next norm and its all-gather (the partition's communication
    tail); under CP the K/V all-gather and the dK/dV reduce-scatter are collectives of their own
    blocks, as in the kernel graph. ``hooks``: a :class:`PipelineHooks` (or any object with a
    ``current`` attribute holding the open instruction's :class:`InstructionSettings`); ``None``
    or settings ``None`` run every collective at the partition start (the Nanobatching
    baseline). ``recompute``: full recompute, as Kareus plans it (the backward instruction
    re-runs each layer's forward, with the plan's ``fwd_*`` settings of that backward
    instruction, right before its backward). ``group_for_sms(sms)`` returns the process group a
    TP collective with that SM count uses (``sms`` is None where the plan gives none); by
    default the layers' TP group. ``cp_group_for_sms``: the same for the CP collectives; by
    default the layers' CP group. ``trace``: a list that receives a :class:`TraceEvent` per
    collective, or None. ``graph``: the kernel graph's op lists and slots
    (:class:`KernelGraphBlocks`); by default those of the hooks' plan's workload.
    ``chunk``: the model chunk of the stage these layers are (interleaved schedules: a stage
    holds one stack per chunk, ``Plan.chunk_layers(stage, chunk)`` gives its layers, and the
    schedule runs stack ``c`` for an instruction of chunk ``c``); running it while the open
    instruction is another chunk's raises.

    The micro-batch (dimension 0 of the input) must be even. Not thread-safe.
    """

    def __init__(self, layers: Sequence[TPTransformerLayer], hooks: Any = None,
                 recompute: bool = True, group_for_sms: Optional[Callable[[Optional[int]],
                                                                          Any]] = None,
                 trace: Optional[List[TraceEvent]] = None, chunk: int = 0,
                 graph: Optional[KernelGraphBlocks] = None,
                 cp_group_for_sms: Optional[Callable[[Optional[int]], Any]] = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.hooks, self.recompute, self.trace, self.chunk = hooks, recompute, trace, chunk
        group = layers[0].group if layers else None
        cp_group = layers[0].cp_group if layers else None
        self.group_for_sms = group_for_sms or (lambda sms: group)
        self.cp_group_for_sms = cp_group_for_sms or (lambda sms: cp_group)
        if graph is None:
            plan = getattr(hooks, "plan", None)
            if plan is None:
                raise ValueError("kareus.torch: NanoBatchedStack needs the kernel graph's op "
                                 "lists: hooks with a plan, or graph=KernelGraphBlocks."
                                 "of_workload(workload_path)")
            graph = KernelGraphBlocks.of_workload(plan.workload_path)
        self.graph = graph
        kinds = {(layer.sequence_parallel, layer.cp_group is not None) for layer in layers}
        if len(kinds) > 1:
            raise ValueError("kareus.torch: a NanoBatchedStack's layers must all be of one kind "
                             "(sequence parallel or not, context parallel or not)")
        if layers:  # every partition of both instructions against the graph's, once
            b = _Builder(self.layers, [w for layer in self.layers for w in layer.params()], [])
            for direction in ("forward", "backward"):
                blocks = b.instruction(direction, True, recompute)
                for i in range(1, 2 * len(blocks)):
                    graph.key_of(blocks[i // 2], blocks[(i - 1) // 2])

    def _group_of(self, blk: _Block, sms: Optional[int]) -> Any:
        if _COLLECTIVES[blk.collective][1] == "cp":
            return self.cp_group_for_sms(sms)
        return self.group_for_sms(sms)

    def _settings_for(self, kind: str) -> Optional[InstructionSettings]:
        s = None if self.hooks is None else getattr(self.hooks, "current", None)
        if s is not None and (s.kind != kind or s.chunk != self.chunk):
            raise RuntimeError(f"kareus.torch: the layer stack of chunk {self.chunk} ran its "
                               f"{kind} while the hooks' open instruction is {s.kind} of "
                               f"micro-batch {s.microbatch} (chunk {s.chunk})")
        return s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 2 or x.shape[0] % 2:
            raise ValueError(f"kareus.torch: nano-batching needs an even micro-batch of at least "
                             f"2 sequences, got {x.shape[0]}")
        weights = [w for layer in self.layers for w in layer.params()]
        return _NanoStackFunction.apply(x, self, *weights)
