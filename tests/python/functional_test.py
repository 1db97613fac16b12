#!/usr/bin/python3
"""Functional test of the Kareus runtime on CPU: a plan made by `kareus plan` runs a real
(tiny) training iteration.

A Llama-like model (hidden 64, 4 heads, 2 KV heads, SwiGLU, RoPE) is trained for one iteration
with TP=2 and PP=2 on 4 processes (gloo) over 4 micro-batches, in the order of the workload's
pipeline schedule (kareus.schedule_order: synchronous 1F1B for tiny_tp2_pp2.yaml, 2 layers;
interleaved 1F1B with 2 model chunks per stage for tiny_tp2_pp2_vp2.yaml, 4 layers, one per
virtual stage), twice:
  1. plainly: Megatron-style layers, whole micro-batches, synchronous collectives, autograd;
  2. through kareus.torch: each model chunk's layers as one NanoBatchedStack (two nano-batches,
     asynchronous TP collectives launched before the plan's slot op, full recompute), with
     kareus.Hooks around each instruction (with its chunk) and a dry-run frequency controller
     per rank.
Checks:
  - the plan's order of each stage is the schedule's (kind, chunk, micro-batch) list;
  - losses and every gradient equal within 1e-5 relative;
  - every collective of the nano-batched run was launched right before the compute op that the
    plan's slot names (the op name comes from the C++ kernel graph, via the plan's slot_op);
  - each rank's controller log holds exactly its stage's clock sequence, read independently from
    the plan JSON with Megatron's rank order (repeats collapsed), then a reset;
  - the controller process is gone after a normal stop, and after its training process is
    killed with SIGKILL (bounded wait; this driver is a child subreaper so it can reap it).

Usage (ctest runs it): functional_test.py --kareus BIN/kareus --workload tiny_tp2_pp2.yaml
                                          --workdir DIR
The module `kareus` must be importable (PYTHONPATH=<build>/python); KAREUS_FREQD may name the
controller binary.
"""

import argparse
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

TOLERANCE = 1e-5
F, B = "forward", "backward"
#: Interleaved 1F1B for 2 stages, 2 chunks, 4 micro-batches: (kind, chunk, micro-batch) per stage.
INTERLEAVED_P2_V2_M4 = [
    [(F, 0, 0), (F, 0, 1), (F, 1, 0), (F, 1, 1), (F, 0, 2), (B, 1, 0), (F, 0, 3), (B, 1, 1),
     (F, 1, 2), (B, 0, 0), (F, 1, 3), (B, 0, 1), (B, 1, 2), (B, 1, 3), (B, 0, 2), (B, 0, 3)],
    [(F, 0, 0), (F, 0, 1), (F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 0, 2), (B, 0, 0),
     (F, 0, 3), (B, 0, 1), (F, 1, 2), (B, 1, 2), (F, 1, 3), (B, 1, 3), (B, 0, 2), (B, 0, 3)],
]
SEED = 1234
BUDGET_S = 110.0  # all of the driver's waits together; ctest kills the test at 120 s
#: What every rank imports, loaded once in the process the ranks are forked from (run_ranks).
PRELOAD = ("torch", "torch.distributed", "kareus", "kareus.torch")


# ---------------------------------------------------------------------------------------------
# Shared with pipelining_test.py.


def start_rank(args):
    """Seeds, joins the gloo job and loads the plan: (torch, dist, kareus, kt, plan)."""
    import torch
    import torch.distributed as dist

    import kareus
    from kareus import torch as kt

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{args.workdir}/rendezvous",
                            rank=args.rank, world_size=args.world)
    return torch, dist, kareus, kt, kareus.Plan(args.plan, args.workload)


def embedding_and_head(torch, shape):
    """The full embedding and output-layer weights (every rank draws the same)."""
    g = torch.Generator().manual_seed(SEED)
    emb_full = torch.randn(shape.vocab, shape.hidden, generator=g) * 0.5
    head_full = torch.randn(shape.vocab, shape.hidden, generator=g) * shape.hidden ** -0.5
    return emb_full, head_full


def wait_for_locks(log_path: str, count: int, timeout_s: float = 10.0) -> None:
    """Stopping drops targets still queued (a stopping job wants its reset, not a backlog), so
    wait, bounded, until the controller has applied `count` clocks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log_path) as f:
            if sum('"event": "lock"' in line for line in f) >= count:
                return
        time.sleep(0.01)


def make_plan(kareus_bin: str, workload: str, path: str, timeout_s: float,
              method: str = "kareus") -> dict:
    # Clock switches free (the paper's model): this workload's instructions last well under a
    # switch, so with the catalogue's cost the plan would keep one clock, and a clock sequence is
    # what is tested here.
    how = ["--no-fallback"] if method == "kareus" else ["--method", method]
    r = subprocess.run([kareus_bin, "plan", workload, "--min-energy", *how,
                        "--clock-switch-ms", "0", "--noise-seed", "2", "--out", path],
                       capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        fail(f"kareus plan exited {r.returncode}: {r.stderr[-2000:]}")
    with open(path) as f:
        return json.load(f)


def make_mixed_plan(kareus_bin: str, workload: str, path: str, timeout_s: float) -> dict:
    """A plan that runs some instructions nano-batched and the others whole, both executor paths.

    On a 32-token model overlap never pays (each overlapped partition costs the host's stream
    join, tens of microseconds, against collectives of a few), so Kareus runs every instruction
    whole. The plan format lets an overlapped plan run any instruction whole (docs/formats.md,
    `execution: sequential`), so the test takes Nanobatching+Perseus's plan, where every
    instruction is overlapped, and runs the odd micro-batches whole.
    """
    plan = make_plan(kareus_bin, workload, path, timeout_s, "nanobatch_perseus")
    for stage in plan["stages"]:
        for ins in stage["instructions"]:
            if ins["microbatch"] % 2 == 1:
                ins["execution"] = "sequential"
                ins["partitions"] = {}
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)
    return plan


RANK_ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def run_ranks(script: str, world: int, plan: str, args, timeout_s: float,
              preload: Sequence[str] = ()) -> None:
    """Runs `script --rank r` for every rank (an argument vector each) and waits, bounded.

    With `preload` (module names, e.g. torch) the ranks are forked from one process that
    imported those modules once (multiprocessing's forkserver) instead of each rank importing
    them: torch with torch.distributed.pipelining costs about 5 s of CPU per process, so on two
    cores the imports of 8 ranks take longer than their training iterations."""
    if not preload:
        env = dict(os.environ, **RANK_ENV)
        procs = [subprocess.Popen([sys.executable, script, *rank_argv(r, world, plan, args)],
                                  env=env) for r in range(world)]
        wait_ranks(procs, timeout_s)
        return
    import multiprocessing

    os.environ.update(RANK_ENV)  # the fork server's environment is the ranks'
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    procs = [_Forked(ctx.Process(target=_run_script, args=(script, rank_argv(r, world, plan,
                                                                             args))))
             for r in range(world)]
    wait_ranks(procs, timeout_s)


def rank_argv(rank: int, world: int, plan: str, args) -> List[str]:
    return ["--rank", str(rank), "--world", str(world), "--plan", plan, "--workload",
            args.workload, "--workdir", args.workdir]


def _run_script(script: str, argv: List[str]) -> None:
    """A forked rank: runs `script argv` as the main module (its imports are the fork server's,
    already loaded)."""
    import runpy

    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


class _Forked:
    """A started multiprocessing.Process with the part of Popen's interface wait_ranks uses."""

    def __init__(self, process):
        self._p = process
        process.start()

    def wait(self, timeout: float) -> int:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired(str(self._p.name), timeout)
        return self._p.exitcode

    def kill(self) -> None:
        self._p.kill()

    @property
    def returncode(self) -> Optional[int]:
        return self._p.exitcode


def wait_ranks(procs, timeout_s: float) -> None:
    """Waits for every rank process, all within timeout_s; kills them all and fails past it or
    if one failed."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail(f"ranks did not finish within {timeout_s:.0f} s")
    if any(p.returncode != 0 for p in procs):
        fail(f"rank exit codes {[p.returncode for p in procs]}")


# ---------------------------------------------------------------------------------------------
# One rank (a child process).


def rank_main(args) -> None:
    import torch.nn.functional as F

    torch, dist, kareus, kt, plan = start_rank(args)
    rank, world = args.rank, args.world
    w = plan.workload
    tp, pp, mbs, chunks = w["tp"], w["pp"], w["micro_batches"], plan.chunks
    assert w["cp"] == 1 and w["dp"] == 1 and tp * pp == world, w
    assert chunks == w["virtual_pipeline"], (chunks, w)
    stage = plan.stage_for_rank(rank)
    stage_ranks = plan.ranks_of_stage(stage)
    tp_rank = stage_ranks.index(rank)
    groups = [dist.new_group(plan.ranks_of_stage(s)) for s in range(pp)]  # every rank, same order
    tp_group = groups[stage]
    shape = kt.ModelShape(w["layers"], w["hidden"], w["ffn_hidden"], w["heads"], w["kv_heads"],
                          w["head_dim"], w["vocab"])
    # Chunk c of the stage is virtual stage c * pp + stage; its layers come from the plan.
    vstages = pp * chunks
    chunk_layers = []
    params = {}
    for c in range(chunks):
        n, first_layer = plan.chunk_layers(stage, c)
        layers = [kt.TPTransformerLayer(shape, tp_rank, tp, tp_group,
                                        seed=SEED + 1 + first_layer + i, dtype=torch.float32)
                  for i in range(n)]
        chunk_layers.append(layers)
        params.update({f"layer{first_layer + i}.{name}": p for i, layer in enumerate(layers)
                       for name, p in layer.named_parameters()})
    first, last = stage == 0, stage == pp - 1  # hold the first / last virtual stage
    emb_full, head_full = embedding_and_head(torch, shape)
    vocab_local = shape.vocab // tp
    if first:  # vocab-parallel embedding (Megatron): each TP rank holds a slice of the rows
        emb = torch.nn.Parameter(emb_full[tp_rank * vocab_local:(tp_rank + 1) * vocab_local]
                                 .clone())
        params["embedding"] = emb
    if last:  # final norm and output layer, replicated over the TP group
        final_norm = torch.nn.Parameter(torch.ones(shape.hidden))
        head = torch.nn.Parameter(head_full.clone())
        params["final_norm"] = final_norm
        params["head"] = head
    tokens = torch.randint(0, shape.vocab, (mbs, w["micro_batch"], w["seq_len"] + 1),
                           generator=torch.Generator().manual_seed(SEED + 99))

    def embed(t):
        local = t - tp_rank * vocab_local
        inside = (local >= 0) & (local < vocab_local)
        x = F.embedding(local.clamp(0, vocab_local - 1), emb) * inside.unsqueeze(-1)
        return kt.reduce_from_tp(x, tp_group)

    def loss_of(x, labels):
        x = kt.rmsnorm(x, final_norm, shape.norm_eps)
        logits = F.linear(x, head)
        return F.cross_entropy(logits.reshape(-1, shape.vocab), labels.reshape(-1)) / mbs

    act_shape = (w["micro_batch"], w["seq_len"], shape.hidden)

    def peer(vs):
        """This TP rank's counterpart on the stage that holds virtual stage vs."""
        return plan.ranks_of_stage(vs % pp)[tp_rank]

    # Messages are tagged by kind, receiving virtual stage and micro-batch.
    def tag(backward, vs_to, m):
        return (int(backward) * vstages + vs_to) * mbs + m

    # The order from the C++ schedule (the one the plan was made and validated with).
    order = kareus.schedule_order(pp, chunks, mbs, stage)
    assert len(order) == 2 * chunks * mbs, order

    def iteration(stacks, hooks):
        """One iteration in the schedule's order; stacks[c] maps chunk c's input to its output."""
        for p in params.values():
            p.grad = None
        saved, losses, sends = {}, [], []
        for kind, c, m in order:
            vs = c * pp + stage
            if kind == "forward":
                if vs == 0:
                    x = None
                else:
                    x = torch.empty(act_shape)
                    dist.recv(x, src=peer(vs - 1), tag=tag(False, vs, m))
                    x.requires_grad_(True)
                hooks.on_instruction_begin("forward", m, c)
                h = stacks[c](embed(tokens[m, :, :-1]) if vs == 0 else x)
                out = loss_of(h, tokens[m, :, 1:]) if vs == vstages - 1 else h
                hooks.on_instruction_end("forward", m, c)
                if vs == vstages - 1:
                    losses.append(out.item())
                else:
                    sends.append(dist.isend(out.detach().contiguous(), dst=peer(vs + 1),
                                            tag=tag(False, vs + 1, m)))
                saved[(c, m)] = (x, out)
            else:
                x, out = saved.pop((c, m))
                grad = None
                if vs != vstages - 1:
                    grad = torch.empty(act_shape)
                    dist.recv(grad, src=peer(vs + 1), tag=tag(True, vs, m))
                hooks.on_instruction_begin("backward", m, c)
                torch.autograd.backward(out, grad)
                hooks.on_instruction_end("backward", m, c)
                if vs != 0:
                    sends.append(dist.isend(x.grad.contiguous(), dst=peer(vs - 1),
                                            tag=tag(True, vs - 1, m)))
        for s in sends:
            s.wait()
        return losses, {n: p.grad.detach().clone() for n, p in params.items()}

    def plain(layers):
        def run(x):
            for layer in layers:
                x = layer(x)
            return x
        return run

    # 1. Plain Megatron-style run.
    plain_losses, plain_grads = iteration([plain(layers) for layers in chunk_layers],
                                          kt.PipelineHooks(None, rank))

    # 2. Kareus: hooks with the plan and a dry-run controller; nano-batched stack.
    log_path = os.path.join(args.workdir, f"freqd_rank{rank}.jsonl")
    if os.path.exists(log_path):
        os.remove(log_path)
    trace = []
    controller = kareus.Controller(gpu_index=rank, dry_run=True, log_path=log_path)
    controller_pid = controller.pid
    with controller:
        hooks = kt.PipelineHooks(plan, rank, controller)
        assert hooks.stage == stage and hooks.chunks == chunks
        plan_order = hooks.order
        nano = [kt.NanoBatchedStack(layers, hooks, recompute=w["recompute"], trace=trace, chunk=c)
                for c, layers in enumerate(chunk_layers)]
        nano_losses, nano_grads = iteration(nano, hooks)
        wait_for_locks(log_path, len(plan.clock_sequence(stage)))

    def rel(a, b):
        return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)

    result = {
        "rank": rank, "stage": stage, "tp_rank": tp_rank,
        "plain_losses": plain_losses, "nano_losses": nano_losses,
        "grad_rel_err": {n: rel(nano_grads[n], plain_grads[n]) for n in params},
        "grad_norms": {n: plain_grads[n].norm().item() for n in params},
        "log": log_path, "controller_pid": controller_pid,
        "trace": [vars(e) for e in trace],
        "plan_slot_ops": {f"{i.kind}/{i.chunk}/{i.microbatch}/{k}": [p.slot_op, p.sms]
                          for i in plan.instructions(stage) for k, p in i.partitions.items()},
        "hook_order": [(i.kind, i.chunk, i.microbatch, i.sequential)
                       for i in plan.instructions(stage)],
        "plan_order": plan_order, "schedule_order": order, "chunks": chunks,
    }
    with open(os.path.join(args.workdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def victim_main(args) -> None:
    """A training process that starts a controller, runs two instructions, then hangs."""
    import kareus

    plan = kareus.Plan(args.plan, args.workload)
    ctl = kareus.Controller(gpu_index=0, dry_run=True, log_path=args.log)
    hooks = kareus.Hooks(plan, 0, ctl)
    for ins in plan.instructions(0)[:2]:
        hooks.on_instruction_begin(ins.kind, ins.microbatch, ins.chunk)
        hooks.on_instruction_end(ins.kind, ins.microbatch, ins.chunk)
    print(json.dumps({"controller_pid": ctl.pid}), flush=True)
    time.sleep(60)  # the driver kills it long before


# ---------------------------------------------------------------------------------------------
# The driver.


def fail(msg: str) -> None:
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except FileNotFoundError:
        return False
    return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:  # reap it if it became our child (we are a subreaper)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def read_log(path: str):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_clocks(plan_json: dict, rank: int):
    """The stage's collapsed clock sequence, from the JSON alone (Megatron order tp-cp-dp-pp)."""
    par = plan_json["parallel"]
    stage = rank // (par["tp"] * par["cp"] * par["dp"])
    seq = []
    for ins in plan_json["stages"][stage]["instructions"]:
        if not seq or seq[-1] != ins["freq_mhz"]:
            seq.append(ins["freq_mhz"])
    return stage, seq


def driver(args) -> None:
    t0 = time.monotonic()
    # Every wait below draws on one budget kept under ctest's 120 s limit, so a hang fails here
    # with a message instead of being killed by ctest.
    def left() -> float:
        return BUDGET_S - (time.monotonic() - t0)

    os.makedirs(args.workdir, exist_ok=True)
    for f in os.listdir(args.workdir):
        os.remove(os.path.join(args.workdir, f))
    # PR_SET_CHILD_SUBREAPER: orphaned controllers become our children, so we can reap them and
    # tell "exited" from "still running" without relying on the container's init.
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)

    plan = os.path.join(args.workdir, "plan.json")
    plan_json = make_mixed_plan(args.kareus, args.workload, plan, min(60.0, left()))
    world = plan_json["workload"]["gpus"]
    print(f"plan: {plan} ({plan_json['goal']}, {world} ranks) after {time.monotonic() - t0:.1f} s",
          flush=True)

    run_ranks(__file__, world, plan, args, min(args.timeout_s, left() - 30.0), preload=PRELOAD)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")  # for the victim
    print(f"4 ranks done after {time.monotonic() - t0:.1f} s", flush=True)

    results = []
    for rank in range(world):
        with open(os.path.join(args.workdir, f"rank{rank}.json")) as f:
            results.append(json.load(f))

    worst_grad = 0.0
    # The plan runs some instructions whole and the others nano-batched (make_mixed_plan): both
    # executor paths must be exercised.
    kinds = {bool(x[3]) for res in results for x in res["hook_order"]}
    if kinds != {False, True}:
        fail(f"the plan's instructions are all "
             f"{'sequential' if True in kinds else 'overlapped'}: the test needs both kinds")
    if not any(e["op_index"] >= 0 for res in results for e in res["trace"]):
        fail("the executor launched no overlapped collective on any rank")
    print(f"instructions: {'sequential ' if True in kinds else ''}"
          f"{'overlapped' if False in kinds else ''}", flush=True)
    for res in results:
        rank = res["rank"]
        # The plan's order is the schedule's, and for the interleaved workload both are the
        # hand-written list below (p = 2, v = 2, m = 4; tests/runtime/c_api_test.cc has the same).
        plan_order = [tuple(x) for x in res["plan_order"]]
        if plan_order != [tuple(x) for x in res["schedule_order"]]:
            fail(f"rank {rank}: plan order {plan_order} is not the schedule's "
                 f"{res['schedule_order']}")
        if res["chunks"] == 2 and plan_order != INTERLEAVED_P2_V2_M4[res["stage"]]:
            fail(f"rank {rank}: order {plan_order}, expected {INTERLEAVED_P2_V2_M4[res['stage']]}")
        # Losses (last stage computes them).
        pl, nl = res["plain_losses"], res["nano_losses"]
        if len(pl) != len(nl):
            fail(f"rank {rank}: {len(pl)} plain losses, {len(nl)} nano-batched")
        for m, (a, b) in enumerate(zip(pl, nl)):
            if abs(a - b) > TOLERANCE * abs(a):
                fail(f"rank {rank}: loss of micro-batch {m}: plain {a!r}, nano-batched {b!r}")
        # Gradients.
        for name, err in res["grad_rel_err"].items():
            worst_grad = max(worst_grad, err)
            if not err <= TOLERANCE:
                fail(f"rank {rank}: gradient of {name} differs by {err:.3e} relative")
            if not res["grad_norms"][name] > 0:
                fail(f"rank {rank}: gradient of {name} is zero (the test would prove nothing)")
        # Launch points: before the op the plan's slot names, in every partition instance. The
        # trace is split into instructions at each stack tail (key ""), in the plan's order.
        want_ops = res["plan_slot_ops"]
        launches = [e for e in res["trace"] if e["op_index"] >= 0]
        order = [tuple(x) for x in res["hook_order"]]
        chunks, cur = [], []
        for e in res["trace"]:
            cur.append(e)
            if e["key"] == "":
                chunks.append(cur)
                cur = []
        if cur or len(chunks) != len(order):
            fail(f"rank {rank}: trace has {len(chunks)} instructions, plan {len(order)}")
        for (kind, c, m, sequential), chunk in zip(order, chunks):
            overlapped = [e for e in chunk if e["op_index"] >= 0]
            if sequential and overlapped:
                fail(f"rank {rank}: {kind} {m} (chunk {c}) is sequential in the plan but "
                     f"overlapped {len(overlapped)} collectives")
            if not sequential and not overlapped:
                fail(f"rank {rank}: {kind} {m} (chunk {c}) is overlapped in the plan but ran in "
                     "sequence")
            for e in chunk:
                if e["direction"] != kind:
                    fail(f"rank {rank}: {kind} {m}: a {e['direction']} collective in its trace")
                if e["op_index"] < 0:
                    continue
                want, want_sms = want_ops[f"{kind}/{c}/{m}/{e['key']}"]
                if e["op"] != want:
                    fail(f"rank {rank}: {kind} {m} {e['key']}#{e['occurrence']}: collective "
                         f"launched before '{e['op']}', the plan's slot op is '{want}'")
                if e["sms"] != want_sms:
                    fail(f"rank {rank}: {kind} {m} {e['key']}: collective given {e['sms']} SMs, "
                         f"the plan says {want_sms}")
                if e["compute_nb"] == e["collective_nb"]:
                    fail(f"rank {rank}: a nano-batch overlapped its own collective")
        # Controller log: the stage's clock sequence, then a reset.
        stage, want = expected_clocks(plan_json, rank)
        if stage != res["stage"]:
            fail(f"rank {rank}: stage {res['stage']} from the module, {stage} from the JSON")
        log = read_log(res["log"])
        locks = [e["freq_mhz"] for e in log if e["event"] == "lock"]
        if locks != want:
            fail(f"rank {rank}: controller applied {locks}, plan's stage {stage} sequence {want}")
        # The whole log: the locks in order, then one final reset at end-of-file; no errors, no
        # reset in between (a plan clock is never 0).
        events = [(e["event"], e["freq_mhz"], e.get("reason")) for e in log]
        want_events = [("lock", f, None) for f in want] + [("reset", 0, "eof")]
        if events != want_events:
            fail(f"rank {rank}: controller log {events}, expected {want_events}")
        if any(e["gpu"] != rank for e in log):
            fail(f"rank {rank}: log names another GPU: {log}")
        if not wait_gone(res["controller_pid"], 5.0):
            fail(f"rank {rank}: controller pid {res['controller_pid']} still runs after stop")
        print(f"rank {rank} (stage {stage}): losses {nl}, max grad rel err "
              f"{max(res['grad_rel_err'].values()):.2e}, {len(launches)} overlapped launches, "
              f"clocks {locks}", flush=True)

    # SIGKILL of a training process leaves no controller behind.
    log = os.path.join(args.workdir, "victim.jsonl")
    victim = subprocess.Popen([sys.executable, __file__, "--victim", "--plan", plan, "--workload",
                               args.workload, "--log", log], env=env, stdout=subprocess.PIPE,
                              text=True)
    cpid = None
    try:
        # Bounded: a victim that hangs before its report must not outlast ctest's limit.
        ready, _, _ = select.select([victim.stdout], [], [], max(1.0, min(20.0, left())))
        line = victim.stdout.readline() if ready else ""
        if not line:
            fail(f"victim process (exit {victim.poll()}) never reported its controller")
        cpid = json.loads(line)["controller_pid"]
        if not alive(cpid):
            fail(f"victim's controller pid {cpid} is not running before the kill")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=5)
        if not wait_gone(cpid, 5.0):
            fail(f"controller pid {cpid} still runs 5 s after its training process was killed")
    finally:
        # Whatever failed above, leave no victim or controller behind.
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=5)
        if cpid is not None and alive(cpid):
            os.kill(cpid, signal.SIGKILL)
            wait_gone(cpid, 2.0)
    events = read_log(log)
    if not events or events[-1]["event"] != "reset":
        fail(f"the orphaned controller did not reset the clock: {events}")
    print(f"SIGKILL of the training process: controller {cpid} gone and reset; worst gradient "
          f"relative error {worst_grad:.2e}; total {time.monotonic() - t0:.1f} s", flush=True)
    print("PASS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kareus")
    ap.add_argument("--workload")
    ap.add_argument("--workdir")
    ap.add_argument("--timeout-s", type=float, default=75.0, help="for the 4 ranks")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--plan")
    ap.add_argument("--victim", action="store_true")
    ap.add_argument("--log")
    args = ap.parse_args()
    if args.victim:
        victim_main(args)
    elif args.rank is not None:
        rank_main(args)
    else:
        if not (args.kareus and args.workload and args.workdir):
            ap.error("--kareus, --workload and --workdir are required")
        args.workload = os.path.abspath(args.workload)
        args.workdir = os.path.abspath(args.workdir)
        driver(args)


if __name__ == "__main__":
    main()
