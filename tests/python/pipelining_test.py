#!/usr/bin/python3
"""A Kareus plan run through torch.distributed.pipelining on CPU (gloo): TP=2 PP=2 on 4
processes, and TP=2 CP=2 PP=2 on 8.

The tiny Llama-like model of functional_test.py (tests/runtime/data/tiny_tp2_pp2*.yaml,
tiny_tp2_cp2_pp2*.yaml) is trained for one iteration by torch's own pipeline runtime:
Schedule1F1B for a 1F1B workload, KareusInterleaved1F1B (torch's ScheduleInterleaved1F1B on
Kareus's order) for an interleaved one. Each rank runs
  1. plain: the stage's TPTransformerLayers in a loop, fp32, hooks without a plan;
  2. Kareus, fp32: the same layers in NanoBatchedStacks, PipelineHooks with the plan from
     `kareus plan` and a dry-run controller, put into the schedule by instrument_stages, and the
     collectives on SmGroups whose group factory is a recording stand-in (gloo groups; the
     ProcessGroupNCCL.Options each got are kept);
  3. Kareus, bf16: layers built in bf16 from the same seeds, as 2.
With a sequence-parallel workload (tiny_tp2_pp2_sp.yaml) 2 and 3 run sequence-parallel layers in
the NanoBatchedStacks (reduce-scatter, norm and all-gather chains); with a context-parallel one
(tiny_tp2_cp2_pp2*.yaml) context-parallel layers, each CP rank on its contiguous shard of every
sequence (K/V all-gathers and dK/dV reduce-scatters on SmGroups over the CP groups; the losses
and the weights' partial gradients summed over the CP group). The reference 1 stays plain TP
over the whole sequence (the same function; every CP rank runs it alike). Kareus's own plan of
these workloads keeps every instruction sequential (overlap does not pay at these shapes), so
the test plans them with --plan-method ...=nanobatch_perseus: every instruction overlapped, each
partition with its SM count, Perseus's clocks.
Checks (the driver):
  - the actions the schedule ran are the plan's order and kareus.schedule_order's, and torch's
    stock ScheduleInterleaved1F1B order equals Kareus's for this (pp, V, micro-batches);
  - losses and every gradient of 2 equal 1's within 1e-5 relative; 3 within BF16_TOLERANCE;
  - every overlapped collective ran on a group whose NCCL config has min_ctas = max_ctas = the
    plan's SM count of that partition (TP and CP collectives alike), and every other collective
    on the default group; under CP both the K/V all-gather and the dK/dV reduce-scatter
    overlapped;
  - each rank's controller log holds exactly its stage's clock sequence (from the plan JSON).

Usage: pipelining_test.py --kareus BIN/kareus --workload W.yaml [W2.yaml ...] --workdir DIR
(the workloads, all of one world size, run one after the other in the same rank processes,
forked from one that imported torch once).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import functional_test as ft  # noqa: E402  (driver helpers: plan, clocks, logs)

TOLERANCE = 1e-5
#: bf16 against the fp32 reference: 8-bit mantissas (relative rounding 2^-8 = 3.9e-3) through two
#: layers and the backward; the max-abs gradient error relative to the gradient's max-abs.
BF16_TOLERANCE = 5e-2
SEED = ft.SEED
PRELOAD = ft.PRELOAD + ("torch.distributed.pipelining",)


def rank_main(args) -> None:
    """Every workload's case in one process: torch's import and the job's start are most of a
    case's time on two cores."""
    plans, workloads = args.plan.split(os.pathsep), args.workload.split(os.pathsep)
    first = argparse.Namespace(**vars(args))
    first.plan, first.workload = plans[0], workloads[0]
    torch, dist, kareus, kt, plan = ft.start_rank(first)
    for case, (plan_path, workload) in enumerate(zip(plans, workloads)):
        if case:
            plan = kareus.Plan(plan_path, workload)
        run_case(args, case, torch, dist, kareus, kt, plan)
    dist.barrier()
    dist.destroy_process_group()


def run_case(args, case, torch, dist, kareus, kt, plan) -> None:
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    rank = args.rank
    w = plan.workload
    tp, cp, pp, mbs, chunks = w["tp"], w["cp"], w["pp"], w["micro_batches"], plan.chunks
    if w["dp"] != 1:
        raise ValueError("pipelining_test: data parallelism is not part of this test")
    stage = plan.stage_for_rank(rank)
    # Megatron's rank order tp-cp-dp-pp: rank = tp_rank + tp * (cp_rank + cp * stage).
    tp_rank, cp_rank = rank % tp, rank // tp % cp
    if plan.ranks_of_stage(stage)[tp_rank + tp * cp_rank] != rank:
        raise ValueError(f"pipelining_test: the plan's ranks of stage {stage} are "
                         f"{plan.ranks_of_stage(stage)}, not in the order tp-cp-dp-pp")

    def at(t, c, s):
        return t + tp * (c + cp * s)

    # Every group of the job, created by every rank in one order: TP groups (per stage and CP
    # rank), CP groups (per stage and TP rank), pipeline groups (a rank's counterparts on every
    # stage, per TP and CP rank).
    tp_groups = [[at(t, c, s) for t in range(tp)] for s in range(pp) for c in range(cp)]
    cp_groups = [[at(t, c, s) for c in range(cp)] for s in range(pp) for t in range(tp)]
    pp_groups = [[at(t, c, s) for s in range(pp)] for c in range(cp) for t in range(tp)]
    made = {tuple(g): dist.new_group(g) for g in tp_groups + (cp_groups if cp > 1 else [])}
    made.update({tuple(g): dist.new_group(g) for g in pp_groups})

    def mine(gs):
        return made[tuple(next(g for g in gs if rank in g))]

    tp_group, cp_group, pp_group = mine(tp_groups), mine(cp_groups) if cp > 1 else None, \
        mine(pp_groups)
    shape = kt.ModelShape(w["layers"], w["hidden"], w["ffn_hidden"], w["heads"], w["kv_heads"],
                          w["head_dim"], w["vocab"])
    vstages = pp * chunks
    # Sequence / context parallelism: the Kareus runs' layers are sequence-parallel or
    # context-parallel (the CP rank's contiguous shard of every sequence); the reference is
    # plain TP over the whole sequence (the same function), which every CP rank runs alike.
    sp, cpar = bool(w["sequence_parallel"]), cp > 1
    if sp and cpar:
        raise ValueError("pipelining_test: sequence and context parallelism together are not "
                         "part of this test")

    class GatherSplit(torch.autograd.Function):
        """All-gather along the sequence into a replicated consumer (the output layer): every
        TP rank computes the whole gradient, so each keeps its own slice (no sum)."""

        @staticmethod
        def forward(ctx, x):
            parts = [torch.empty_like(x) for _ in range(tp)]
            dist.all_gather(parts, x.contiguous(), group=tp_group)
            return torch.cat(parts, dim=1)

        @staticmethod
        def backward(ctx, g):
            return g.chunk(tp, dim=1)[tp_rank].contiguous()

    # Recording stand-in of dist.new_group for SmGroups: real gloo groups, the NCCL options kept.
    options_of = {}

    def recording_new_group(ranks, backend=None, pg_options=None):
        pg = dist.new_group(ranks, backend="gloo")
        options_of[id(pg)] = pg_options
        return pg

    sm_counts = kt.plan_sm_counts(plan)
    sm_groups = kt.SmGroups(tp_groups, rank, sm_counts, new_group=recording_new_group)
    cp_sm_groups = kt.SmGroups(cp_groups, rank, sm_counts, new_group=recording_new_group) \
        if cpar else None
    # Which SM count every collective's group carries, in launch order.
    collective_sms = []
    real_all_reduce, real_all_gather = dist.all_reduce, dist.all_gather

    def recording(real):
        """Under SP the reduce-scatter is an AllReduce on gloo, the all-gather its own call (CP's
        dK/dV reduce-scatter and K/V all-gather the same)."""
        def call(tensor, *a, group=None, **k):
            if id(group) in options_of:
                o = options_of[id(group)]
                collective_sms.append(None if o is None else
                                      [o.config.min_ctas, o.config.max_ctas])
            return real(tensor, *a, group=group, **k)
        return call

    emb_full, head_full = ft.embedding_and_head(torch, shape)
    vocab_local = shape.vocab // tp
    tokens = torch.randint(0, shape.vocab, (mbs * w["micro_batch"], w["seq_len"] + 1),
                           generator=torch.Generator().manual_seed(SEED + 99))

    class Stage(nn.Module):
        """Virtual stage vs: [embedding] + its layers + [final norm, output layer]."""

        def __init__(self, vs, body, dtype, seq_parallel=False):
            super().__init__()
            self.vs, self.body, self.dtype, self.sp = vs, body, dtype, seq_parallel
            if vs == 0:  # vocab-parallel embedding (Megatron)
                self.emb = nn.Parameter(emb_full[tp_rank * vocab_local:
                                                 (tp_rank + 1) * vocab_local].clone())
            if vs == vstages - 1:  # final norm and output layer, replicated over the TP group
                self.final_norm = nn.Parameter(torch.ones(shape.hidden))
                self.head = nn.Parameter(head_full.clone())

        def forward(self, x):
            if self.vs == 0:
                local = x - tp_rank * vocab_local
                inside = (local >= 0) & (local < vocab_local)
                x = F.embedding(local.clamp(0, vocab_local - 1), self.emb) * inside.unsqueeze(-1)
                # Megatron: the embedding's partial sums are reduce-scattered along the sequence
                # under sequence parallelism, AllReduced without it.
                x = (kt.scatter_along(x, 1, tp_group) if self.sp else
                     kt.reduce_from_tp(x, tp_group)).to(self.dtype)
            x = self.body(x)
            if self.vs == vstages - 1:
                if self.sp:
                    x = GatherSplit.apply(x)
                x = F.linear(kt.rmsnorm(x.float(), self.final_norm, shape.norm_eps), self.head)
            return x

    class Plain(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = nn.ModuleList(layers)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def make_layers(dtype, sharded=False):
        """The stage's layers per chunk; `sharded`: with the workload's SP or CP."""
        out = []
        for c in range(chunks):
            n, first_layer = plan.chunk_layers(stage, c)
            out.append([kt.TPTransformerLayer(shape, tp_rank, tp, tp_group,
                                              seed=SEED + 1 + first_layer + i, dtype=dtype,
                                              sequence_parallel=sharded and sp,
                                              cp_group=cp_group if sharded else None)
                        for i in range(n)])
        return out

    def iteration(bodies, hooks, dtype, sharded=False):
        """One training iteration through torch's pipeline runtime; (losses, grads, actions).
        `sharded`: the layers are the workload's SP or CP ones."""
        seq_parallel, context_parallel = sharded and sp, sharded and cpar
        # A CP rank sees its shard of each sequence: its loss is its tokens' share of the
        # micro-batch's mean (the CP group's losses sum to it), its gradients partial sums.
        shard = slice(None)
        if context_parallel:
            local = w["seq_len"] // cp
            shard = slice(cp_rank * local, (cp_rank + 1) * local)

        def loss_fn(logits, labels):
            return F.cross_entropy(logits.reshape(-1, shape.vocab), labels.reshape(-1)) / (
                mbs * (cp if context_parallel else 1))

        mods = [Stage(c * pp + stage, bodies[c], dtype, seq_parallel) for c in range(chunks)]
        for m in mods:  # the plain and Kareus runs share the layers' parameters
            for p in m.parameters():
                p.grad = None
        # Static shapes: torch's shape inference sends pickled metadata, which needs numpy.
        mb, seq = w["micro_batch"], w["seq_len"]
        # requires_grad: what tells the runtime that a gradient flows back across the boundary.
        seq = seq // cp if context_parallel else seq
        act = torch.empty(mb, seq // tp if seq_parallel else seq, shape.hidden, dtype=dtype,
                          requires_grad=True)

        def io(vs):
            inp = torch.zeros(mb, seq, dtype=torch.long) if vs == 0 else act
            out = torch.empty(mb, seq, shape.vocab) if vs == vstages - 1 else act
            return inp, out

        stages = [PipelineStage(m, m.vs, vstages, torch.device("cpu"), input_args=io(m.vs)[0],
                                output_args=io(m.vs)[1], group=pp_group) for m in mods]
        actions = []
        kt.instrument_stages(stages, hooks, record=actions)
        sched = kt.kareus_schedule(stages, mbs, loss_fn=loss_fn, scale_grads=False)
        losses = []
        holds_first, holds_last = stage == 0, (vstages - 1) % pp == stage
        step_args = (tokens[:, :-1][:, shard],) if holds_first else ()
        step_kwargs = {"target": tokens[:, 1:][:, shard], "losses": losses} if holds_last else {}
        sched.step(*step_args, **step_kwargs)
        if context_parallel and losses:  # the micro-batches' losses over the whole sequence
            total = torch.stack([x.detach().float() for x in losses])
            dist.all_reduce(total, group=cp_group)
            losses = list(total)
        grads = {}
        for c, m in enumerate(mods):
            for name, p in m.named_parameters():
                # Partial gradients are summed in fp32, as Megatron reduces its fp32 main grads.
                g = p.grad.detach().float().clone()
                if seq_parallel and ".norm" in name:  # saw this rank's sequence share only
                    dist.all_reduce(g, group=tp_group)
                if context_parallel:  # every weight saw this rank's sequence shard only
                    dist.all_reduce(g, group=cp_group)
                key = name.replace("body.", "")
                if key.startswith("layers."):  # model-wide layer index
                    i = int(key.split(".")[1])
                    key = f"layer{plan.chunk_layers(stage, c)[1] + i}." + key.split(".", 2)[2]
                grads[f"{key}@vs{m.vs}"] = g
        return [float(x.detach()) for x in losses], grads, actions

    fp32 = make_layers(torch.float32)
    plain_losses, plain_grads, plain_actions = iteration(
        [Plain(ls) for ls in fp32], kt.PipelineHooks(None, rank), torch.float32)

    log_path = os.path.join(args.workdir, f"freqd_rank{rank}_case{case}.jsonl")
    if os.path.exists(log_path):
        os.remove(log_path)
    trace = []
    dist.all_reduce, dist.all_gather = recording(real_all_reduce), recording(real_all_gather)
    try:
        with kareus.Controller(gpu_index=rank, dry_run=True, log_path=log_path) as ctl:
            hooks = kt.PipelineHooks(plan, rank, ctl)
            bodies = [kt.NanoBatchedStack(ls, hooks, recompute=w["recompute"], trace=trace,
                                          chunk=c, group_for_sms=sm_groups,
                                          cp_group_for_sms=cp_sm_groups)
                      for c, ls in enumerate(make_layers(torch.float32, True) if sp or cpar
                                             else fp32)]
            nano_losses, nano_grads, nano_actions = iteration(bodies, hooks, torch.float32, True)
            ft.wait_for_locks(log_path, len(plan.clock_sequence(stage)))
        kareus_collectives = list(collective_sms)
        bf16 = make_layers(torch.bfloat16, True)
        hooks16 = kt.PipelineHooks(plan, rank)
        bf_losses, bf_grads, _ = iteration(
            [kt.NanoBatchedStack(ls, hooks16, recompute=w["recompute"], chunk=c,
                                 group_for_sms=sm_groups, cp_group_for_sms=cp_sm_groups)
             for c, ls in enumerate(bf16)], hooks16, torch.bfloat16, True)
    finally:
        dist.all_reduce, dist.all_gather = real_all_reduce, real_all_gather

    def rel(a, b):
        return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)

    stock_order = None
    if chunks > 1:  # torch's own interleaved order, for comparison with Kareus's
        probe = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
        probe.pp_group_size, probe.n_local_stages, probe._n_microbatches = pp, chunks, mbs
        probe.number_of_rounds = max(1, mbs // pp)
        probe.microbatches_per_round = mbs // probe.number_of_rounds
        stock_order = [("forward" if str(a.computation_type).endswith("FORWARD") else "backward",
                        a.stage_index // pp, a.microbatch_index)
                       for a in probe._calculate_single_rank_operations(stage) if a is not None]
    result = {
        "rank": rank, "stage": stage, "log": log_path,
        "plain_losses": plain_losses, "nano_losses": nano_losses, "bf16_losses": bf_losses,
        "grad_rel_err": {n: rel(nano_grads[n], plain_grads[n]) for n in plain_grads},
        "bf16_grad_rel_err": {n: rel(bf_grads[n], plain_grads[n]) for n in plain_grads},
        "grad_norms": {n: plain_grads[n].norm().item() for n in plain_grads},
        "plain_actions": plain_actions, "nano_actions": nano_actions,
        "plan_order": [(i.kind, i.chunk, i.microbatch) for i in plan.instructions(stage)],
        "schedule_order": kareus.schedule_order(pp, chunks, mbs, stage),
        "stock_order": stock_order,
        "trace": [vars(e) for e in trace], "collective_sms": kareus_collectives,
        "sm_counts": sm_counts, "sequence_parallel": sp, "context_parallel": cpar,
        "plan_sms": {f"{i.kind}/{i.chunk}/{i.microbatch}/{k}": p.sms
                     for i in plan.instructions(stage) for k, p in i.partitions.items()},
    }
    with open(os.path.join(args.workdir, f"rank{rank}_case{case}.json"), "w") as f:
        json.dump(result, f)


def check_rank(res, plan_json) -> str:
    rank = res["rank"]
    order = [tuple(x) for x in res["plan_order"]]
    for what in ("schedule_order", "plain_actions", "nano_actions"):
        if [tuple(x) for x in res[what]] != order:
            ft.fail(f"rank {rank}: {what} {res[what]} is not the plan's order {order}")
    if res["stock_order"] is not None and [tuple(x) for x in res["stock_order"]] != order:
        ft.fail(f"rank {rank}: torch's ScheduleInterleaved1F1B order {res['stock_order']} is "
                f"not Kareus's {order}")
    for label, losses, tol in (("fp32", res["nano_losses"], TOLERANCE),
                               ("bf16", res["bf16_losses"], BF16_TOLERANCE)):
        if len(losses) != len(res["plain_losses"]):
            ft.fail(f"rank {rank}: {len(losses)} {label} losses, {len(res['plain_losses'])} plain")
        for m, (a, b) in enumerate(zip(res["plain_losses"], losses)):
            if abs(a - b) > tol * abs(a):
                ft.fail(f"rank {rank}: {label} loss of micro-batch {m}: plain {a!r}, Kareus {b!r}")
    for key, tol in (("grad_rel_err", TOLERANCE), ("bf16_grad_rel_err", BF16_TOLERANCE)):
        for name, err in res[key].items():
            if not err <= tol:
                ft.fail(f"rank {rank}: {key} of {name} is {err:.3e} (limit {tol})")
            if not res["grad_norms"][name] > 0:
                ft.fail(f"rank {rank}: gradient of {name} is zero (the test would prove nothing)")
    # Every collective's group: the plan's SM count for overlapped ones (the trace's op_index >=
    # 0 and its key name the partition), the default group (options None) otherwise.
    want = []
    seen = 0
    per_instr = []
    cur = []
    for e in res["trace"]:
        cur.append(e)
        if e["key"] == "":
            per_instr.append(cur)
            cur = []
    for (kind, c, m), events in zip(order, per_instr):
        for e in events:
            if e["op_index"] >= 0:
                sms = res["plan_sms"][f"{kind}/{c}/{m}/{e['key']}"]
                if e["sms"] != sms:
                    ft.fail(f"rank {rank}: {kind} {m} {e['key']}: traced {e['sms']} SMs, plan {sms}")
                want.append([sms, sms] if sms != 0 else None)
                seen += 1
            else:
                want.append(None)
    tails = sum(1 for e in res["trace"] if e["chain"])
    if res["sequence_parallel"] and not tails:
        ft.fail(f"rank {rank}: no reduce-scatter was followed by its norm and all-gather tail")
    cp_overlapped = [e for e in res["trace"] if e["collective"].startswith("cp_")
                     and e["op_index"] >= 0]
    if res["context_parallel"] and {e["collective"] for e in cp_overlapped} != {
            "cp_allgather_kv", "cp_reducescatter_dkv"}:
        ft.fail(f"rank {rank}: the overlapped CP collectives were "
                f"{sorted({e['collective'] for e in cp_overlapped})}, not the K/V all-gather and "
                f"the dK/dV reduce-scatter")
    # The recorded collectives include the embedding's AllReduce (first virtual stage), made on
    # the plain TP group, which is not an SmGroups group: the recorder skips it.
    if res["collective_sms"] != want:
        ft.fail(f"rank {rank}: the collectives' groups carried {res['collective_sms']}, the "
                f"plan's SM counts are {want}")
    _, clocks = ft.expected_clocks(plan_json, rank)
    locks = [e["freq_mhz"] for e in ft.read_log(res["log"]) if e["event"] == "lock"]
    if locks != clocks:
        ft.fail(f"rank {rank}: controller applied {locks}, the plan's clock sequence is {clocks}")
    mode = "nano-batched" + (", sequence parallel" if res["sequence_parallel"] else "") + (
        f", context parallel ({len(cp_overlapped)} CP collectives overlapped)"
        if res["context_parallel"] else "")
    return (f"rank {rank} (stage {res['stage']}, {mode}): {len(order)} actions in the plan's order, "
            f"fp32 max grad err {max(res['grad_rel_err'].values()):.1e}, bf16 "
            f"{max(res['bf16_grad_rel_err'].values()):.1e}, {seen} overlapped collectives on "
            f"SM groups {res['sm_counts']}, clocks {locks}")


def driver(args) -> None:
    t0 = time.monotonic()
    os.makedirs(args.workdir, exist_ok=True)
    for f in os.listdir(args.workdir):
        os.remove(os.path.join(args.workdir, f))
    plans, plan_jsons = [], []
    for case, workload in enumerate(args.workload):
        plans.append(os.path.join(args.workdir, f"plan{case}.json"))
        method = args.methods.get(os.path.basename(workload), "kareus")
        plan_jsons.append(ft.make_plan(args.kareus, workload, plans[-1], 60.0, method))
    worlds = {j["workload"]["gpus"] for j in plan_jsons}
    if len(worlds) != 1:
        ft.fail(f"the workloads need {sorted(worlds)} ranks; one job runs them all")
    world = worlds.pop()
    ranks_args = argparse.Namespace(workload=os.pathsep.join(args.workload), workdir=args.workdir)
    ft.run_ranks(__file__, world, os.pathsep.join(plans), ranks_args, args.timeout_s,
                 preload=PRELOAD)
    for case, workload in enumerate(args.workload):
        print(os.path.basename(workload), flush=True)
        for rank in range(world):
            with open(os.path.join(args.workdir, f"rank{rank}_case{case}.json")) as f:
                print("  " + check_rank(json.load(f), plan_jsons[case]), flush=True)
    print(f"total {time.monotonic() - t0:.1f} s\nPASS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kareus")
    ap.add_argument("--workload", nargs="+",
                    help="workload files, each run as one case by the same ranks")
    ap.add_argument("--workdir")
    ap.add_argument("--plan-method", action="append", default=[], metavar="WORKLOAD=METHOD",
                    help="plan the workload file of that name with `kareus plan --method "
                         "METHOD` (default kareus)")
    ap.add_argument("--timeout-s", type=float, default=150.0, help="for all the ranks")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--plan")
    args = ap.parse_args()
    if args.rank is not None:
        args.workload = args.workload[0]  # os.pathsep-joined, from the driver
        rank_main(args)
    else:
        if not (args.kareus and args.workload and args.workdir):
            ap.error("--kareus, --workload and --workdir are required")
        args.workload = [os.path.abspath(w) for w in args.workload]
        args.methods = dict(m.split("=", 1) for m in args.plan_method)
        args.workdir = os.path.abspath(args.workdir)
        driver(args)


if __name__ == "__main__":
    main()
