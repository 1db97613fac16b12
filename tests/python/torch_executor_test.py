#!/usr/bin/python3
"""kareus.torch's nano-batched executor against the plain Megatron-style layers (CPU, gloo).

Two processes form one TP group of 2. A 2-layer stack runs a forward and a backward plainly and
then nano-batched under several settings: no plan (every collective at the partition start),
every slot of every partition (chosen by a seeded generator, per instruction), per-layer mixes,
and with and without full recompute. Every run must give the plain run's output and gradients
(input and all parameters) within 1e-5 relative, and must launch each collective right before the
op its setting names. Sequence-parallel (TP=2) and context-parallel (CP=2) stacks run the same
way on their workloads' partitions (tiny_tp2_sp.yaml, tiny_cp2.yaml) against the plain SP and
CP layers, each collective (SP's tail all-gathers included) on the group of its SM count, and
the CP stack once more under a `kareus plan` plan through PipelineHooks and SmGroups. Bad
settings (unknown slot, odd micro-batch, a backward under forward settings) must raise with a
message naming what is allowed.

Usage: torch_executor_test.py --workdir DIR   (kareus must be importable)
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

TOLERANCE = 1e-5


class Settable:
    """Stands in for PipelineHooks: the layer reads `current`."""

    current = None


def rank_main(rank: int, workdir: str) -> None:
    import torch
    import torch.distributed as dist

    from kareus import torch as kt

    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                            world_size=2)
    group = dist.new_group([0, 1])
    shape = kt.ModelShape(layers=2, hidden=32, ffn_hidden=64, heads=4, kv_heads=2, head_dim=8,
                          vocab=16)
    layers = [kt.TPTransformerLayer(shape, rank, 2, group, seed=7 + i,
                                    dtype=torch.float32) for i in range(2)]
    params = [p for layer in layers for p in layer.params()]
    x0 = torch.randn(4, 12, shape.hidden, generator=torch.Generator().manual_seed(3))
    weight = torch.randn(4, 12, shape.hidden, generator=torch.Generator().manual_seed(4))

    def run(stack_fn, hooks=None, fwd=None, bwd=None):
        for p in params:
            p.grad = None
        x = x0.clone().requires_grad_(True)
        if hooks is not None:
            hooks.current = fwd
        y = stack_fn(x)
        if hooks is not None:
            hooks.current = bwd
        (y * weight).sum().backward()
        if hooks is not None:
            hooks.current = None
        return y.detach(), [x.grad] + [p.grad.clone() for p in params]

    def plain(x):
        for layer in layers:
            x = layer(x)
        return x

    ref_y, ref_g = run(plain)
    # Op lists and slots from the C++ kernel graph of a TP workload (the shapes do not matter).
    graph = kt.KernelGraphBlocks.of_workload(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "data", "tiny_tp2_pp2.yaml"))

    def rel(a, b):
        return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)

    rng = random.Random(11)
    fwd_keys, bwd_keys = ["fwd_attn", "fwd_mlp"], ["bwd_attn", "bwd_mlp"]

    def pick(kind, keys, mb, mix, g=graph):
        parts, mixes = {}, {}
        for k in keys:
            slots = sorted(g.slots[k])
            parts[k] = kt.PartitionChoice(rng.choice([3, 6, 12]), rng.choice(slots))
            if mix:
                mixes[k] = [(kt.PartitionChoice(3, rng.choice(slots)), 1),
                            (kt.PartitionChoice(6, rng.choice(slots)), 99)]
        return kt.InstructionSettings(kind, mb, 1410, parts, mixes)

    def check_slots(name, trace, fwd, bwd, g):
        """Every launch is before the op its setting names (occurrence-aware for mixes)."""
        for e in trace:
            if e.op_index < 0 or e.chain:
                continue
            s = fwd if e.direction == "forward" else bwd
            occ = e.occurrence
            if s is None or s.sequential:
                want_slot = g.default_slot(e.key)
            elif s.mixes.get(e.key):
                upto, want_slot = 0, s.mixes[e.key][-1][0].slot
                for choice, n in s.mixes[e.key]:
                    upto += n
                    if occ < upto:
                        want_slot = choice.slot
                        break
            else:
                want_slot = s.partitions[e.key].slot
            if g.slots[e.key][want_slot] != e.op_index:
                raise AssertionError(f"{name}: {e.key}#{occ} launched at op {e.op_index} "
                                     f"({e.op}), setting says slot {want_slot}")

    cases = [("no plan, recompute", None, None, True, False)]
    for i in range(6):
        recompute, mix = i % 2 == 0, i >= 4
        cases.append((f"random slots #{i}{' with mixes' if mix else ''}, "
                      f"{'recompute' if recompute else 'no recompute'}",
                      pick("forward", fwd_keys, 0, mix),
                      pick("backward", bwd_keys + (fwd_keys if recompute else []), 0, mix),
                      recompute, mix))
    report = []
    for name, fwd, bwd, recompute, _ in cases:
        trace = []
        hooks = Settable()
        stack = kt.NanoBatchedStack(layers, hooks, recompute=recompute, trace=trace,
                                    graph=graph)
        y, grads = run(stack, hooks, fwd, bwd)
        errs = [rel(y, ref_y)] + [rel(a, b) for a, b in zip(grads, ref_g)]
        check_slots(name, trace, fwd, bwd, graph)
        n_fwd = sum(1 for e in trace if e.direction == "forward" and e.op_index >= 0)
        n_bwd = sum(1 for e in trace if e.direction == "backward" and e.op_index >= 0)
        # 2 layers x 2 blocks: 2*4-1 overlapped launches in forward; backward adds the recompute.
        want_bwd = 2 * (8 if recompute else 4) - 1
        if (n_fwd, n_bwd) != (7, want_bwd):
            raise AssertionError(f"{name}: {n_fwd} forward / {n_bwd} backward launches, "
                                 f"expected 7 / {want_bwd}")
        report.append((name, max(errs)))
        if max(errs) > TOLERANCE:
            raise AssertionError(f"{name}: relative error {max(errs):.3e} "
                                 f"(output, input grad, params: {errs})")

    # The sharded weights: every TP layout of one seed is one function (each rank draws only
    # its shard), so TP=1 on one rank gives the TP=2 output.
    singles = [dist.new_group([0]), dist.new_group([1])]
    full = [kt.TPTransformerLayer(shape, 0, 1, singles[rank], seed=7 + i, dtype=torch.float32)
            for i in range(2)]
    with torch.no_grad():
        y1 = x0
        for layer in full:
            y1 = layer(y1)
    if rel(y1, ref_y) > TOLERANCE:
        raise AssertionError(f"TP=1 and TP=2 layers of one seed differ by {rel(y1, ref_y):.3e}")
    # Sequence parallelism (TP=2, each rank a half of the sequence) and context parallelism
    # (CP=2, TP=1) compute the same function: outputs and input gradients are the reference's
    # rows; the weights of the norms (SP) and all weights (CP) get partial gradients that the
    # job reduces over the group, as Megatron does; summed here, they are the reference's.
    half = slice(rank * 6, (rank + 1) * 6)

    def run_layers(ls, x_in):
        for p in [q for layer in ls for q in layer.params()]:
            p.grad = None
        x = x_in.clone().requires_grad_(True)
        y = x
        for layer in ls:
            y = layer(y)
        (y * weight[:, half if x_in.shape[1] == 6 else slice(None)]).sum().backward()
        return y.detach(), x.grad, [q.grad.clone() for layer in ls for q in layer.params()]

    full_y, full_gx, full_gp = run_layers(full, x0)
    sp = [kt.TPTransformerLayer(shape, rank, 2, group, seed=7 + i, dtype=torch.float32,
                                sequence_parallel=True) for i in range(2)]
    cp = [kt.TPTransformerLayer(shape, 0, 1, singles[rank], seed=7 + i, dtype=torch.float32,
                                cp_group=group) for i in range(2)]
    plain_runs = {}
    for label, ls, ref_params, reduced in (
            ("sequence parallel", sp, ref_g[1:], {0, 3}),
            ("context parallel", cp, full_gp, {0, 1, 2, 3, 4, 5})):
        y, gx, gp = run_layers(ls, x0[:, half])
        plain_runs[label] = (y, [gx] + [g.clone() for g in gp])
        errs = {"output": rel(y, ref_y[:, half]), "input grad": rel(gx, ref_g[0][:, half])}
        for j, (g, want) in enumerate(zip(gp, ref_params)):
            if j % 6 in reduced:
                dist.all_reduce(g, group=group)
            errs[f"param {j}"] = rel(g, want)
        if max(errs.values()) > TOLERANCE:
            raise AssertionError(f"{label}: relative errors {errs}")
        report.append((label, max(errs.values())))
    if rel(full_y, ref_y) > TOLERANCE:
        raise AssertionError("the TP=1 reference with gradients differs from the TP=2 output")

    # The nano-batched stack on the SP and CP layers against their plain runs, with the SP and
    # CP kernel graphs' partitions; every collective's group is the one of its partition's SM
    # count (recorded per call: gloo groups standing in for SmGroups' communicators).
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "data")
    sms_of_group, calls = {}, []
    real = {n: getattr(dist, n) for n in ("all_reduce", "all_gather")}

    def recording(name):
        def call(*a, group=None, **k):
            if id(group) in sms_of_group:
                calls.append(sms_of_group[id(group)])
            return real[name](*a, group=group, **k)
        return call

    by_sms = {sms: dist.new_group([0, 1]) for sms in (None, 3, 6, 12)}
    sms_of_group.update({id(g): sms for sms, g in by_sms.items()})
    for label, ls, workload in (("sequence parallel", sp, "tiny_tp2_sp.yaml"),
                                ("context parallel", cp, "tiny_cp2.yaml")):
        g = kt.KernelGraphBlocks.of_workload(os.path.join(data, workload))
        fwd_k = [k for k in g.ops if k.startswith("fwd_")]
        bwd_k = [k for k in g.ops if k.startswith("bwd_")]
        plain_y, plain_g = plain_runs[label]
        sp_case = label == "sequence parallel"
        picks = [("no plan", None, None, True),
                 ("random slots, recompute", pick("forward", fwd_k, 0, False, g),
                  pick("backward", bwd_k + fwd_k, 0, False, g), True),
                 # The SP graph plans full recompute: without it the backward would open with
                 # a norm block the graph has no partition for (refused below).
                 (f"random slots with mixes, {'recompute' if sp_case else 'no recompute'}",
                  pick("forward", fwd_k, 0, True, g),
                  pick("backward", bwd_k + (fwd_k if sp_case else []), 0, True, g), sp_case),
                 ("sequential forward, recompute", kt.InstructionSettings(
                     "forward", 0, sequential=True), pick("backward", bwd_k + fwd_k, 0, False, g),
                  True)]
        for name, fwd, bwd, recompute in picks:
            trace, hooks = [], Settable()
            stack = kt.NanoBatchedStack(
                ls, hooks, recompute=recompute, trace=trace, graph=g,
                group_for_sms=(lambda sms: by_sms[sms]) if sp_case else None,
                cp_group_for_sms=None if sp_case else (lambda sms: by_sms[sms]))
            for p in [q for layer in ls for q in layer.params()]:
                p.grad = None
            x = x0[:, half].clone().requires_grad_(True)
            del calls[:]
            dist.all_reduce, dist.all_gather = recording("all_reduce"), recording("all_gather")
            try:
                hooks.current = fwd
                y = stack(x)
                hooks.current = bwd
                (y * weight[:, half]).sum().backward()
                hooks.current = None
            finally:
                dist.all_reduce, dist.all_gather = real["all_reduce"], real["all_gather"]
            grads = [x.grad] + [q.grad for layer in ls for q in layer.params()]
            errs = [rel(y, plain_y)] + [rel(a, b) for a, b in zip(grads, plain_g)]
            case = f"{label} nano-batched, {name}"
            if max(errs) > TOLERANCE:
                raise AssertionError(f"{case}: relative error {max(errs):.3e} ({errs})")
            check_slots(case, trace, fwd, bwd, g)
            # SP: every collective is a TP one; CP: the CP ones are recorded (TP is size 1).
            mine = [e for e in trace if sp_case or e.collective.startswith("cp_")]
            want = [e.sms for e in mine]
            if calls != want:
                raise AssertionError(f"{case}: the collectives ran on the groups of SM counts "
                                     f"{calls}, the partitions' are {want}")
            tails = sum(1 for e in trace if e.chain)
            if sp_case and (fwd is None or not fwd.sequential) and not tails:
                raise AssertionError(f"{case}: no communication tail ran")
            if fwd is not None and fwd.sequential and any(
                    e.op_index >= 0 for e in trace if e.direction == "forward"):
                raise AssertionError(f"{case}: a sequential forward overlapped a collective")
            if fwd is not None and not fwd.sequential and not any(e.sms for e in mine):
                raise AssertionError(f"{case}: no collective on an SM-count group")
            report.append((f"{case} ({len(mine)} collectives, {tails} in tails)", max(errs)))
        if sp_case:
            try:
                kt.NanoBatchedStack(ls, Settable(), recompute=False, graph=g)
            except ValueError as e:
                if "no partition 'bwd_mlp' overlapping tp_allgather" not in str(e):
                    raise
            else:
                raise AssertionError("an SP stack without recompute accepted a recompute graph")

    # The CP stack under a plan from `kareus plan` (Nanobatching+Perseus: Kareus keeps this tiny
    # workload sequential) through PipelineHooks, its CP collectives on SmGroups over the CP
    # group: each group is a stand-in whose ProcessGroupNCCL.Options are kept, and each
    # collective's must hold the plan's SM count of its partition.
    import kareus

    plan = kareus.Plan(os.path.join(workdir, "cp_plan.json"), os.path.join(data, "tiny_cp2.yaml"))
    options_of = {}

    def recording_new_group(ranks, backend=None, pg_options=None):
        pg = dist.new_group(ranks, backend="gloo")
        options_of[id(pg)] = pg_options
        sms_of_group[id(pg)] = None if pg_options is None else (
            pg_options.config.min_ctas, pg_options.config.max_ctas)
        return pg

    cp_groups = kt.SmGroups([[0, 1]], rank, kt.plan_sm_counts(plan),
                            new_group=recording_new_group)
    hooks = kt.PipelineHooks(plan, rank)
    trace = []
    stack = kt.NanoBatchedStack(cp, hooks, trace=trace, cp_group_for_sms=cp_groups)
    (kind_f, _, mb), (kind_b, _, mb_b) = hooks.order[:2]
    if (kind_f, kind_b, mb_b) != ("forward", "backward", mb):
        raise AssertionError(f"the CP plan's order starts {hooks.order[:2]}")
    for p in [q for layer in cp for q in layer.params()]:
        p.grad = None
    x = x0[:, half].clone().requires_grad_(True)
    del calls[:]
    dist.all_reduce, dist.all_gather = recording("all_reduce"), recording("all_gather")
    settings = {}
    try:
        settings["forward"] = hooks.on_instruction_begin("forward", mb)
        y = stack(x)
        hooks.on_instruction_end("forward", mb)
        settings["backward"] = hooks.on_instruction_begin("backward", mb)
        (y * weight[:, half]).sum().backward()
        hooks.on_instruction_end("backward", mb)
    finally:
        dist.all_reduce, dist.all_gather = real["all_reduce"], real["all_gather"]
    plain_y, plain_g = plain_runs["context parallel"]
    grads = [x.grad] + [q.grad for layer in cp for q in layer.params()]
    errs = [rel(y, plain_y)] + [rel(a, b) for a, b in zip(grads, plain_g)]
    if max(errs) > TOLERANCE:
        raise AssertionError(f"context parallel with the plan: relative error {max(errs):.3e}")
    check_slots("context parallel with the plan", trace, settings["forward"],
                settings["backward"], stack.graph)
    mine = [e for e in trace if e.collective.startswith("cp_")]
    want = [None if e.sms is None else (e.sms, e.sms) for e in mine]
    for e in mine:
        if e.op_index >= 0 and e.sms != settings[e.direction].partitions[e.key].sms:
            raise AssertionError(f"CP plan: {e.direction} {e.key} ran with {e.sms} SMs, the "
                                 f"plan's {settings[e.direction].partitions[e.key].sms}")
    if calls != want or not any(w for w in want):
        raise AssertionError(f"CP plan: the collectives' groups carried {calls}, the plan's SM "
                             f"counts are {want}")
    report.append((f"context parallel with the plan ({sum(1 for w in want if w)} CP collectives "
                   f"on SM groups {cp_groups.sm_counts})", max(errs)))

    if kt.TPTransformerLayer(shape, 0, 1, None, seed=7).wqkv.dtype != torch.bfloat16:
        raise AssertionError("the layer's default dtype is not bf16")

    # SmGroups: every rank creates every (SM count, TP group) in one order, options per count.
    calls = []

    def new_group(ranks, backend=None, pg_options=None):
        calls.append((tuple(ranks), backend, None if pg_options is None else pg_options["sms"]))
        return ("group", tuple(ranks), None if pg_options is None else pg_options["sms"])

    groups = kt.SmGroups([[0, 2], [1, 3]], 3, [18, 3, 18, 0], new_group=new_group,
                         options=lambda sms: {"sms": sms})
    want_calls = [((0, 2), "nccl", None), ((1, 3), "nccl", None), ((0, 2), "nccl", 3),
                  ((1, 3), "nccl", 3), ((0, 2), "nccl", 18), ((1, 3), "nccl", 18)]
    if calls != want_calls:
        raise AssertionError(f"SmGroups created {calls}, expected {want_calls}")
    picked = [groups(s) for s in (3, 18, None, 0)]
    if picked != [("group", (1, 3), 3), ("group", (1, 3), 18), ("group", (1, 3), None),
                  ("group", (1, 3), None)]:
        raise AssertionError(f"SmGroups picked {picked}")
    for bad_call, text in ((lambda: groups(6), "no communicator for 6 SMs; created for [3, 18]"),
                           (lambda: kt.SmGroups([[0, 1]], 2, [3], new_group=new_group),
                            "rank 2 is in 0 of the TP groups")):
        try:
            bad_call()
        except ValueError as e:
            if text not in str(e):
                raise AssertionError(f"SmGroups error {e!r} lacks {text!r}")
        else:
            raise AssertionError(f"SmGroups accepted a bad call (expected {text!r})")
    if hasattr(dist, "ProcessGroupNCCL"):  # the real options object: what reaches NCCL
        o = kt.nccl_options(12)
        if (o.config.min_ctas, o.config.max_ctas) != (12, 12):
            raise AssertionError(f"nccl_options(12) gave {o.config.min_ctas}/{o.config.max_ctas}")

    # Bad settings raise with a message saying what is allowed.
    errors = {}
    hooks = Settable()
    stack = kt.NanoBatchedStack(layers, hooks, graph=graph)
    try:
        kt.NanoBatchedStack(layers, hooks)
    except ValueError as e:
        errors["no graph"] = str(e)
    changed = kt.KernelGraphBlocks([{"key": k, "ops": list(v), "slots": [
        {"name": n, "op_index": i} for n, i in graph.slots[k].items()]}
        for k, v in graph.ops.items()])
    changed.ops["fwd_mlp"] = changed.ops["fwd_mlp"][::-1]
    try:
        kt.NanoBatchedStack(layers, hooks, graph=changed)
    except ValueError as e:
        errors["graph mismatch"] = str(e)
    bad = kt.InstructionSettings("forward", 0, 1410,
                                 {"fwd_attn": kt.PartitionChoice(3, "nowhere"),
                                  "fwd_mlp": kt.PartitionChoice(3, "norm")})
    hooks.current = bad
    try:
        stack(x0)
    except ValueError as e:
        errors["unknown slot"] = str(e)
    hooks.current = None
    try:
        stack(x0[:3])
    except ValueError as e:
        errors["odd micro-batch"] = str(e)
    hooks.current = kt.InstructionSettings("backward", 0)
    try:
        stack(x0)
    except RuntimeError as e:
        errors["wrong kind"] = str(e)
    hooks.current = kt.InstructionSettings("forward", 0, chunk=1)
    try:
        stack(x0)  # the stack is chunk 0's
    except RuntimeError as e:
        errors["wrong chunk"] = str(e)
    hooks.current = None
    want = {"unknown slot": "allowed: norm, qkv, rope, attn", "odd micro-batch": "even",
            "no graph": "graph=KernelGraphBlocks.of_workload",
            "graph mismatch": "partition 'fwd_mlp': the kernel graph's ops are ['fc2', 'swiglu'",
            "wrong kind": "ran its forward",
            "wrong chunk": "stack of chunk 0 ran its forward while the hooks' open instruction "
                           "is forward of micro-batch 0 (chunk 1)"}
    for k, text in want.items():
        if text not in errors.get(k, ""):
            raise AssertionError(f"{k}: expected an error containing '{text}', got "
                                 f"{errors.get(k)!r}")
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump({"cases": report, "errors": errors}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rank", type=int)
    args = ap.parse_args()
    workdir = os.path.abspath(args.workdir)
    if args.rank is not None:
        rank_main(args.rank, workdir)
        return
    t0 = time.monotonic()
    # local_gpu_pci_bus_id asks the CUDA driver; without one it must say so, not crash.
    from kareus import torch as kt

    try:
        kt.local_gpu_pci_bus_id(0, driver_library="/no/such/libcuda.so.1")
        print("FAIL: local_gpu_pci_bus_id without a driver returned")
        sys.exit(1)
    except RuntimeError as e:
        if "/no/such/libcuda.so.1" not in str(e):
            print(f"FAIL: local_gpu_pci_bus_id error does not name the library: {e}")
            sys.exit(1)
    os.makedirs(workdir, exist_ok=True)
    for f in os.listdir(workdir):
        os.remove(os.path.join(workdir, f))
    from kareus.replan import find_cli

    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "data")
    r = subprocess.run([find_cli(), "plan", os.path.join(data, "tiny_cp2.yaml"), "--min-energy",
                        "--method", "nanobatch_perseus", "--clock-switch-ms", "0", "--out",
                        os.path.join(workdir, "cp_plan.json")], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        print(f"FAIL: kareus plan exited {r.returncode}: {r.stderr[-2000:]}")
        sys.exit(1)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, __file__, "--workdir", workdir, "--rank", str(r)],
                              env=env) for r in range(2)]
    rc = []
    for p in procs:
        try:
            rc.append(p.wait(timeout=90))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("FAIL: timeout")
            sys.exit(1)
    if any(rc):
        print(f"FAIL: rank exit codes {rc}")
        sys.exit(1)
    with open(os.path.join(workdir, "rank0.json")) as f:
        res = json.load(f)
    for name, err in res["cases"]:
        print(f"  {name}: max relative error {err:.2e}")
    for k, msg in res["errors"].items():
        print(f"  {k}: {msg}")
    print(f"PASS ({time.monotonic() - t0:.1f} s)")


if __name__ == "__main__":
    main()
