"""Kareus runtime for training jobs: run a Kareus plan inside your pipeline schedule.

>>> import kareus
>>> plan = kareus.Plan("plan.json", "workload.yaml")       # validated against the workload
>>> with kareus.Controller(gpu_index=0) as ctl:             # one clock controller per GPU
...     hooks = kareus.Hooks(plan, rank=0, controller=ctl)
...     s = hooks.on_instruction_begin("forward", 0)        # order check + clock; settings
...     ...                                                 # run the instruction
...     hooks.on_instruction_end("forward", 0)
>>> with kareus.Monitor(rank=0, stage=0, path="rank0.jsonl", plan=plan) as mon:
...     hooks = kareus.Hooks(plan, rank=0, monitor=mon)   # every instruction timed
...     mon.begin_iteration(); ...; record = mon.end_iteration()   # time, energy, busy time

Classes: :class:`Plan`, :class:`Instruction`, :class:`Partition`, :class:`MixEntry`,
:class:`Controller`, :class:`Monitor` (energy and time per iteration, NVML read-only),
:class:`Hooks`; errors derive from :class:`Error`
(:class:`InvalidInputError`, :class:`ArgumentError`, :class:`OrderError`, :class:`StateError`,
:class:`NotSupportedError`, :class:`InternalError`) and carry the library's message.
:func:`schedule_order` gives a stage's instruction order, (kind, chunk, microbatch) tuples, from
the C++ pipeline schedule (synchronous or interleaved 1F1B); instructions are named by
(kind, chunk, microbatch), and the hooks take ``chunk=`` on an interleaved plan.
:func:`workload_partitions` gives the kernel graph's partitions (op lists, slot names).
``kareus.torch`` holds the PyTorch side (hooks object for a schedule, nano-batched TP layers).
``kareus.replan`` closes the loop in a running job: a straggler rule on the monitor's per-stage
times and a re-plan from the stored frontier (``kareus plan --from ... --stage-slowdown``).
See docs/runtime.md.
"""

from ._core import (  # noqa: F401
    BACKWARD,
    FORWARD,
    PLAN_FORMAT_VERSION,
    ArgumentError,
    Controller,
    Error,
    Hooks,
    Instruction,
    InternalError,
    InvalidInputError,
    MixEntry,
    Monitor,
    NotSupportedError,
    OrderError,
    Partition,
    Plan,
    StateError,
    __version__,
    schedule_name,
    schedule_order,
    workload_partitions,
)

__all__ = [
    "BACKWARD", "FORWARD", "PLAN_FORMAT_VERSION", "ArgumentError", "Controller", "Error", "Hooks",
    "Instruction", "InternalError", "InvalidInputError", "MixEntry", "Monitor",
    "NotSupportedError", "OrderError", "Partition", "Plan", "StateError", "__version__",
    "schedule_name", "schedule_order", "workload_partitions",
]
