"""Closed loop in the training job: detect a straggling pipeline stage and re-plan around it.

A plan is a prediction made before training; a run lasts weeks. Every iteration the job hands
:class:`StragglerRule` the measured busy time of each stage (the instructions' time between the
hooks, the slowest rank of the stage; :func:`kareus.torch.aggregate_iteration` gathers it over
the job's own process group). The rule compares each stage against the plan's prediction for it,
relative to the same ratio in the first iterations (the job's own calibration: the prediction's
absolute error does not trigger anything, a change does) and to the least slowed stage (a
straggler is slower than the rest of the job; the whole job running slower changes no slack). When a stage's slowdown differs from
the one the current plan assumes by more than ``threshold``, on the same side, for ``k``
iterations in a row, the rule asks for a re-plan with that stage's median over those iterations; :func:`replan` runs
``kareus plan --from FRONTIER --stage-slowdown S=F ...`` (an argument vector, never a shell),
which re-reads the stored frontier with that stage stretched and picks the goal's cheapest plan
(Perseus's straggler insight: the other stages may slow down where they wait).

:class:`ClosedLoop` puts the two together for a job: every rank evaluates the rule on the same
aggregated figures, so every rank decides at the same iteration; rank 0 runs the re-plan and
broadcasts the new plan's path through the job's process group, and every rank switches at the
next iteration boundary. See docs/runtime.md, "Re-planning".
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["StragglerRule", "ReplanDecision", "replan", "find_cli", "ClosedLoop",
           "predicted_stage_busy_s"]

#: Defaults of the rule (docs/runtime.md): a 5% change, three iterations in a row, after three
#: warm-up iterations that set the reference (iteration 0 is skipped: allocator and kernel
#: warm-up).
DEFAULT_THRESHOLD = 0.05
DEFAULT_K = 3
DEFAULT_WARMUP = 3


def find_cli(cli: Optional[str] = None) -> str:
    """The `kareus` CLI: ``cli``, else $KAREUS_CLI, else the one shipped with this module (the
    package's or the build tree's), else PATH."""
    if cli:
        return cli
    env = os.environ.get("KAREUS_CLI")
    if env:
        return env
    try:
        from ._core import cli_path  # type: ignore[attr-defined]
        if cli_path:
            return cli_path
    except ImportError:
        pass
    found = shutil.which("kareus")
    if found is None:
        raise FileNotFoundError("kareus CLI not found: set $KAREUS_CLI or put kareus on PATH")
    return found


def predicted_stage_busy_s(plan_json: Dict[str, Any]) -> List[float]:
    """Per stage, the instructions' predicted run time without the slowdown the plan assumes.

    ``plan_json`` is the plan file's JSON. A re-planned plan (``stage_slowdown``) predicts its
    stages stretched; dividing by the factor gives what the stage costs when it runs as modelled,
    the reference the rule measures the slowdown against.
    """
    slow = plan_json.get("stage_slowdown") or [1.0] * len(plan_json["stages"])
    out = []
    for s, st in enumerate(plan_json["stages"]):
        busy = sum(float(i["time_s"]) for i in st["instructions"])
        out.append(busy / float(slow[s]))
    return out


@dataclass
class ReplanDecision:
    """The rule's request: re-plan for ``stage_slowdown`` (one factor per stage)."""
    iteration: int
    stage_slowdown: List[float]
    reason: str


@dataclass
class StragglerRule:
    """Decides when to re-plan from per-stage busy times (see the module's docstring).

    ``observe`` is called once per iteration with the measured busy time of every stage and the
    unslowed prediction of the plan that ran it (:func:`predicted_stage_busy_s`); it returns a
    decision or None. Pure and deterministic: ranks fed the same figures decide the same.
    """
    stages: int
    threshold: float = DEFAULT_THRESHOLD
    k: int = DEFAULT_K
    warmup: int = DEFAULT_WARMUP
    applied: List[float] = field(default_factory=list)  # the slowdown the current plan assumes
    #: (iteration, per-stage slowdown estimate) of every iteration after the warm-up.
    history: List[Any] = field(default_factory=list)
    _reference: List[List[float]] = field(default_factory=list)
    _streak: List[List[Any]] = field(default_factory=list)
    _seen: int = 0

    def __post_init__(self) -> None:
        if self.stages < 1 or self.k < 1 or self.warmup < 1 or not self.threshold > 0:
            raise ValueError("StragglerRule: stages, k and warmup must be >= 1, threshold > 0")
        if not self.applied:
            self.applied = [1.0] * self.stages
        self._streak = [[] for _ in range(self.stages)]

    @property
    def reference(self) -> Optional[List[float]]:
        """Per stage, the median measured/predicted ratio of the warm-up; None until then."""
        if len(self._reference) < self.warmup:
            return None
        return [statistics.median(r[s] for r in self._reference) for s in range(self.stages)]

    def observe(self, iteration: int, busy_s: Sequence[float],
                predicted_s: Sequence[float]) -> Optional[ReplanDecision]:
        if len(busy_s) != self.stages or len(predicted_s) != self.stages:
            raise ValueError(f"StragglerRule: expected {self.stages} stages")
        self._seen += 1
        ratio = [b / p if p > 0 else 1.0 for b, p in zip(busy_s, predicted_s)]
        if self._seen == 1:
            return None  # iteration 0: warm-up of allocators and kernels
        ref = self.reference
        if ref is None:
            self._reference.append(ratio)
            return None
        slowdown = [r / ref[s] for s, r in enumerate(ratio)]
        # Relative to the job's least slowed stage: a straggler is a stage slower than the rest.
        # A slowdown of the whole job (a shared host, the network) leaves every stage's slack as
        # it was, so it asks for no re-plan, and it is also most of the iteration-to-iteration
        # noise, which this cancels.
        least = min(slowdown)
        slowdown = [x / least for x in slowdown]
        self.history.append((iteration, slowdown))
        # Per stage, a streak of iterations off the current plan's slowdown on the same side: a
        # noisy iteration of one stage and then of another is not a drift.
        for s, (x, a) in enumerate(zip(slowdown, self.applied)):
            side = 1 if x > a * (1 + self.threshold) else -1 if x < a * (1 - self.threshold) else 0
            if side == 0 or (self._streak[s] and self._streak[s][-1][0] != side):
                self._streak[s] = []
            if side != 0:
                self._streak[s].append((side, x))
        due = [s for s in range(self.stages) if len(self._streak[s]) >= self.k]
        if not due:
            return None
        est = list(self.applied)
        for s in due:
            est[s] = statistics.median(x for _, x in self._streak[s][-self.k:])
        # A stage within the threshold of its modelled speed runs as planned; a re-plan is for
        # slower stages only (one faster than modelled is left to the next calibration).
        est = [1.0 if x < 1 + self.threshold else round(x, 4) for x in est]
        self._streak = [[] for _ in range(self.stages)]
        if all(abs(x / a - 1) <= self.threshold for x, a in zip(est, self.applied)):
            return None
        reason = ", ".join(f"stage {s} at {x:.3f}x" for s, x in enumerate(est) if x != 1.0)
        return ReplanDecision(iteration, est, reason or "every stage back to its modelled speed")


def _goal_args(goal: Dict[str, Any]) -> List[str]:
    flags = {"deadline_s": "--deadline", "energy_budget_j": "--energy-budget",
             "power_cap_w": "--power-cap-w", "job_power_cap_kw": "--job-power-cap-kw"}
    for key, flag in flags.items():
        if key in goal:
            return [flag, repr(float(goal[key]))]
    if goal.get("max_throughput"):
        return ["--max-throughput"]
    if goal.get("min_energy"):
        return ["--min-energy"]
    raise ValueError(f"goal {goal!r}: allowed keys deadline_s, energy_budget_j, power_cap_w, "
                     "job_power_cap_kw, max_throughput, min_energy")


def replan(frontier: str, out: str, goal: Dict[str, Any], stage_slowdown: Sequence[float],
           method: str = "kareus", cli: Optional[str] = None,
           timeout_s: float = 60.0) -> Dict[str, Any]:
    """Runs ``kareus plan --from FRONTIER`` for ``goal`` under ``stage_slowdown``; returns its JSON.

    A stage at factor 1 is not passed; with none slower than planned this is a plain
    ``plan --from`` (the plan for the goal without stragglers). Raises RuntimeError with the
    CLI's message when it fails (exit 2: bad input, named by the CLI).
    """
    argv = [find_cli(cli), "plan", "--from", frontier, "--out", out, "--method", method,
            "--json", "--quiet"] + _goal_args(goal)
    for s, x in enumerate(stage_slowdown):
        if x != 1.0:
            argv += ["--stage-slowdown", f"{s}={x!r}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"re-plan failed (exit {r.returncode}): {r.stderr.strip()}")
    j = json.loads(r.stdout)
    j["log"] = r.stderr.strip()
    return j


class ClosedLoop:
    """The rule and the re-plan inside a job (one object per rank).

    ``step(iteration, stage_busy_s)`` is called by every rank after every iteration with the
    job's aggregated per-stage busy times (the same list on every rank). It returns the path of
    a new plan to switch to from the next iteration, or None. Rank 0 runs the re-plan; the path
    (or the error) reaches the other ranks through ``group`` (torch.distributed's
    broadcast_json), so every rank switches at the same boundary or none does.
    """

    def __init__(self, plan_path: str, frontier: str, goal: Dict[str, Any], rank: int,
                 workdir: str, group: Any = None, method: str = "kareus",
                 threshold: float = DEFAULT_THRESHOLD, k: int = DEFAULT_K,
                 warmup: int = DEFAULT_WARMUP, cli: Optional[str] = None):
        with open(plan_path) as f:
            plan_json = json.load(f)
        self.plan_path = plan_path
        self.predicted = predicted_stage_busy_s(plan_json)
        self.rule = StragglerRule(len(self.predicted), threshold, k, warmup,
                                  list(plan_json.get("stage_slowdown") or []))
        self.frontier, self.goal, self.rank, self.workdir = frontier, goal, rank, workdir
        self.group, self.method, self.cli = group, method, cli
        self.replans: List[Dict[str, Any]] = []

    def step(self, iteration: int, stage_busy_s: Sequence[float]) -> Optional[str]:
        d = self.rule.observe(iteration, stage_busy_s, self.predicted)
        if d is None:
            return None
        import torch.distributed as dist

        out = os.path.join(self.workdir, f"plan-replan-{len(self.replans) + 1}.json")
        from .comm import broadcast_json

        msg: List[Any] = [None]
        if self.rank == 0:
            try:
                msg[0] = {"path": out, "result": replan(self.frontier, out, self.goal,
                                                        d.stage_slowdown, self.method, self.cli)}
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                msg[0] = {"error": str(e)}
        msg[0] = broadcast_json(msg[0], src=0, group=self.group)
        if "error" in msg[0]:
            raise RuntimeError(f"re-plan at iteration {iteration}: {msg[0]['error']}")
        with open(msg[0]["path"]) as f:
            plan_json = json.load(f)
        self.plan_path = msg[0]["path"]
        self.predicted = predicted_stage_busy_s(plan_json)
        self.rule.applied = list(d.stage_slowdown)
        self.replans.append({"iteration": iteration, "switch_at": iteration + 1,
                             "stage_slowdown": d.stage_slowdown, "reason": d.reason,
                             "plan": self.plan_path, "result": msg[0]["result"]})
        return self.plan_path
