"""Kareus's hooks inside ``torch.distributed.pipelining`` schedules (torch 2.x).

A pipelining schedule (``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ...) runs each of a rank's
``PipelineStage`` objects through ``forward_one_chunk(mb, ...)`` and ``backward_one_chunk(mb,
...)``, after it has waited for the stage's inputs and before it sends the outputs. Those two
methods are therefore the compute of one pipeline instruction; :func:`instrument_stages` wraps
them on the stage objects (any schedule, no subclass needed) so that ``PipelineHooks`` sees
every forward and backward action: the plan's order is checked (``kareus.OrderError`` names the
expected instruction), the instruction's clock goes to the controller, and the settings of the
open instruction reach a :class:`kareus.torch.NanoBatchedStack` inside the stage's module.

The orders: synchronous 1F1B (``Schedule1F1B``) and interleaved 1F1B with V model chunks per
rank (Narayanan et al., SC '21; ``ScheduleInterleaved1F1B``, the virtual stage of chunk c on
rank s being c * pp + s). torch's interleaved order need not be the one Kareus planned for every
(pp, V, micro-batches); :class:`KareusInterleaved1F1B` runs torch's runtime on the order of
Kareus's C++ ``Schedule`` (``kareus.schedule_order``), so that the plan and the run agree by
construction. With a plan, :func:`kareus_schedule` picks the schedule of the plan.

Only full backward actions are supported: a zero-bubble schedule's split input/weight
backward is not an instruction Kareus plans.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

__all__ = ["instrument_stages", "KareusInterleaved1F1B", "kareus_schedule"]


def _pp_size(stages: Sequence[Any]) -> int:
    n = stages[0].num_stages
    if n % len(stages):
        raise ValueError(f"kareus.pipelining: {n} pipeline stages over {len(stages)} local "
                         "stages per rank: not the interleaved layout (every rank holds as many)")
    return n // len(stages)


def instrument_stages(stages: Sequence[Any], hooks: Any,
                      record: Optional[List[Tuple[str, int, int]]] = None) -> None:
    """Wraps the ``forward_one_chunk``/``backward_one_chunk`` of this rank's ``PipelineStage``
    objects with ``hooks.on_instruction_begin/end(kind, microbatch, chunk)``.

    ``hooks``: a :class:`kareus.torch.PipelineHooks` (with a plan, or ``None`` plan for a
    baseline) or ``kareus.Hooks``. The chunk of a stage is ``stage_index // pp`` (chunk c of
    rank s is virtual stage c * pp + s). ``record`` receives every (kind, chunk, micro-batch)
    as it begins. Instrumenting a stage twice is refused.
    """
    pp = _pp_size(stages)
    for stage in stages:
        if getattr(stage, "_kareus_instrumented", False):
            raise RuntimeError(f"kareus.pipelining: stage {stage.stage_index} is already "
                               "instrumented")
        stage._kareus_instrumented = True
        chunk = stage.stage_index // pp
        stage.forward_one_chunk = _wrap(stage.forward_one_chunk, hooks, "forward", chunk, record)
        stage.backward_one_chunk = _wrap(stage.backward_one_chunk, hooks, "backward", chunk,
                                         record)
        weight = stage.backward_weight_one_chunk

        def refuse_weight(*args: Any, _index: int = stage.stage_index, **kwargs: Any) -> Any:
            raise NotImplementedError(
                f"kareus.pipelining: stage {_index}: a split (input/weight) backward is not an "
                "instruction Kareus plans; use a schedule with full backward actions "
                "(Schedule1F1B, ScheduleInterleaved1F1B)")

        stage.backward_weight_one_chunk = refuse_weight
        stage._kareus_backward_weight = weight


def _wrap(method: Callable[..., Any], hooks: Any, kind: str, chunk: int,
          record: Optional[List[Tuple[str, int, int]]]) -> Callable[..., Any]:
    def run(mb: int, *args: Any, **kwargs: Any) -> Any:
        if kind == "backward" and not kwargs.get("full_backward", True):
            raise NotImplementedError(
                "kareus.pipelining: a backward without its weight gradients (full_backward="
                "False) is not an instruction Kareus plans")
        if record is not None:
            record.append((kind, chunk, int(mb)))
        hooks.on_instruction_begin(kind, int(mb), chunk)
        # No end hook on an exception: the hooks' order stays at the failed instruction, which
        # is what a retry after ``reset()`` expects.
        out = method(mb, *args, **kwargs)
        hooks.on_instruction_end(kind, int(mb), chunk)
        return out

    run.__wrapped__ = method  # type: ignore[attr-defined]
    return run


def _interleaved_base() -> Any:
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    return ScheduleInterleaved1F1B


class _KareusOrderMixin:
    """Replaces the per-rank computation order of a torch runtime schedule by Kareus's."""

    def _calculate_single_rank_operations(self, rank: int) -> List[Any]:
        import kareus
        from torch.distributed.pipelining.schedules import _Action, _ComputationType

        kinds = {"forward": _ComputationType.FORWARD,
                 "backward": _ComputationType.FULL_BACKWARD}
        pp = self.pp_group_size  # type: ignore[attr-defined]
        order = kareus.schedule_order(pp, self.n_local_stages,  # type: ignore[attr-defined]
                                      self._n_microbatches, rank)  # type: ignore[attr-defined]
        return [_Action(c * pp + rank, kinds[k], m, None) for k, c, m in order]


def _make_kareus_interleaved() -> Any:
    try:
        base = _interleaved_base()
    except ImportError:  # torch < 2.4: no torch.distributed.pipelining
        return None
    return type("KareusInterleaved1F1B", (_KareusOrderMixin, base), {
        "__doc__": "``ScheduleInterleaved1F1B`` on the order of Kareus's C++ schedule "
                   "(``kareus.schedule_order``): the order the plan was made for.",
        "__module__": __name__,
    })


KareusInterleaved1F1B = _make_kareus_interleaved()


def kareus_schedule(stages: Sequence[Any], n_microbatches: int, loss_fn: Any = None,
                    **kwargs: Any) -> Any:
    """The schedule Kareus plans for these local stages: ``Schedule1F1B`` for one stage per
    rank, :class:`KareusInterleaved1F1B` for several (keyword arguments go to the schedule)."""
    from torch.distributed.pipelining import Schedule1F1B

    if len(stages) == 1:
        return Schedule1F1B(stages[0], n_microbatches, loss_fn=loss_fn, **kwargs)
    return KareusInterleaved1F1B(list(stages), n_microbatches, loss_fn=loss_fn, **kwargs)
