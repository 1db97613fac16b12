#!/usr/bin/python3
"""The Python module `kareus` (pybind11 over the C API): plans, hooks, controller, energy
monitor, errors.

Plans are made by the CLI for the tiny TP=2, PP=2 workload and its interleaved counterpart
(tiny_tp2_pp2_vp2.yaml next to it: two model chunks per stage); expected values are read from the
plan JSON independently of the module, and the interleaved order is written out by hand. The
energy monitor reads the fake NVML's scripted counter (KAREUS_FAKE_NVML_ENERGY_MJ), so its
energies are the differences of the listed readings.

Usage: module_test.py --kareus BIN/kareus --workload tiny_tp2_pp2.yaml --workdir DIR
"""

import argparse
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import functional_test as ft  # noqa: E402  (the plan the runtime tests share)

ARGS = None


F, B = "forward", "backward"
#: Interleaved 1F1B for 2 stages, 2 chunks, 4 micro-batches: (kind, chunk, micro-batch) per stage.
INTERLEAVED_P2_V2_M4 = [
    [(F, 0, 0), (F, 0, 1), (F, 1, 0), (F, 1, 1), (F, 0, 2), (B, 1, 0), (F, 0, 3), (B, 1, 1),
     (F, 1, 2), (B, 0, 0), (F, 1, 3), (B, 0, 1), (B, 1, 2), (B, 1, 3), (B, 0, 2), (B, 0, 3)],
    [(F, 0, 0), (F, 0, 1), (F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 0, 2), (B, 0, 0),
     (F, 0, 3), (B, 0, 1), (F, 1, 2), (B, 1, 2), (F, 1, 3), (B, 1, 3), (B, 0, 2), (B, 0, 3)],
]


def make_plan(workload, out):
    # Instructions of both kinds, whole and nano-batched, which the tests below need
    # (functional_test.make_mixed_plan says how).
    return ft.make_mixed_plan(ARGS.kareus, workload, out, 60.0)


def setUpModule():
    global PLAN, PLAN_JSON, VP_WORKLOAD, VP_PLAN, VP_PLAN_JSON
    os.makedirs(ARGS.workdir, exist_ok=True)
    PLAN = os.path.join(ARGS.workdir, "plan.json")
    PLAN_JSON = make_plan(ARGS.workload, PLAN)
    VP_WORKLOAD = os.path.join(os.path.dirname(ARGS.workload), "tiny_tp2_pp2_vp2.yaml")
    VP_PLAN = os.path.join(ARGS.workdir, "plan_vp2.json")
    VP_PLAN_JSON = make_plan(VP_WORKLOAD, VP_PLAN)


class PlanTest(unittest.TestCase):
    def test_loads_and_matches_the_json(self):
        import kareus

        plan = kareus.Plan(PLAN, ARGS.workload)
        self.assertEqual(plan.num_stages, 2)
        self.assertEqual(plan.num_ranks, 4)
        self.assertEqual([plan.stage_for_rank(r) for r in range(4)], [0, 0, 1, 1])
        self.assertEqual(plan.ranks_of_stage(1), [2, 3])
        self.assertEqual(plan.workload["hidden"], 64)
        self.assertEqual(plan.workload["stage_layers"], [1, 1])
        for s in range(2):
            want = PLAN_JSON["stages"][s]["instructions"]
            got = plan.instructions(s)
            self.assertEqual(len(got), len(want))
            for g, w in zip(got, want):
                self.assertEqual((g.kind, g.microbatch, g.chunk, g.freq_mhz),
                                 (w["instruction"], w["microbatch"], w.get("chunk", 0),
                                  w["freq_mhz"]))
                self.assertEqual(sorted(g.partitions), sorted(w["partitions"]))
                # Sequential exactly where the JSON says so; such an instruction has no
                # partitions.
                self.assertEqual(g.sequential, w.get("execution") == "sequential")
                if g.sequential:
                    self.assertEqual(len(g.partitions), 0)
                for key, p in g.partitions.items():
                    wp = w["partitions"][key]
                    self.assertEqual((p.sms, p.slot, p.slot_op),
                                     (wp["sms"], wp["slot"], wp["launch_before"]["op"]))
                    self.assertEqual(p.recompute, g.kind == "backward" and key.startswith("fwd_"))
            seq = []
            for w in want:
                if not seq or seq[-1] != w["freq_mhz"]:
                    seq.append(w["freq_mhz"])
            self.assertEqual(plan.clock_sequence(s), seq)
            self.assertEqual(plan.clock_sequence(s, collapse=False),
                             [w["freq_mhz"] for w in want])
        s = plan.settings(1, "backward", 2)
        self.assertEqual((s.kind, s.microbatch), ("backward", 2))
        self.assertEqual((plan.chunks, plan.schedule), (1, "1f1b"))
        self.assertEqual(plan.workload["virtual_pipeline"], 1)
        self.assertEqual([plan.chunk_layers(s, 0) for s in range(2)], [(1, 0), (1, 1)])

    def test_errors_are_typed_exceptions_with_the_message(self):
        import kareus

        with self.assertRaises(kareus.InvalidInputError) as cm:
            kareus.Plan("/no/such/plan.json", ARGS.workload)
        self.assertIn("/no/such/plan.json", str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIsInstance(cm.exception, kareus.Error)
        bad = dict(PLAN_JSON)
        bad["stages"] = json.loads(json.dumps(PLAN_JSON["stages"]))
        # The first overlapped instruction.
        ins = next(i for s in bad["stages"] for i in s["instructions"] if i["partitions"])
        key = next(iter(ins["partitions"]))
        ins["partitions"][key]["slot"] = "nowhere"
        path = os.path.join(ARGS.workdir, "bad_slot.json")
        with open(path, "w") as f:
            json.dump(bad, f)
        with self.assertRaises(kareus.InvalidInputError) as cm:
            kareus.Plan(path, ARGS.workload)
        self.assertIn("slot", str(cm.exception))
        plan = kareus.Plan(PLAN, ARGS.workload)
        with self.assertRaises(kareus.InvalidInputError):
            plan.stage_for_rank(4)
        with self.assertRaises(kareus.ArgumentError):
            plan.settings(0, "forward", 9)
        with self.assertRaises(ValueError):
            plan.settings(0, "sideways", 0)


class HooksTest(unittest.TestCase):
    def test_order_is_enforced(self):
        import kareus

        plan = kareus.Plan(PLAN, ARGS.workload)
        hooks = kareus.Hooks(plan, 1)
        self.assertEqual((hooks.stage, hooks.rank), (0, 1))
        with self.assertRaises(kareus.OrderError) as cm:
            hooks.on_instruction_begin("backward", 0)
        self.assertIn("runs forward of micro-batch 0", str(cm.exception))
        ins = hooks.on_instruction_begin("forward", 0)
        self.assertEqual(ins.freq_mhz, PLAN_JSON["stages"][0]["instructions"][0]["freq_mhz"])
        self.assertEqual(hooks.position, (0, True))
        with self.assertRaises(kareus.OrderError):
            hooks.on_instruction_end("forward", 1)
        hooks.on_instruction_end("forward", 0)
        self.assertEqual(hooks.position, (1, False))
        hooks.reset()
        self.assertEqual(hooks.position, (0, False))
        # chunk=0 is the same instruction; another chunk does not exist in a 1F1B plan.
        self.assertEqual(hooks.on_instruction_begin("forward", 0, chunk=0).chunk, 0)
        hooks.on_instruction_end("forward", 0, chunk=0)
        with self.assertRaises(kareus.ArgumentError):
            hooks.on_instruction_begin("forward", 1, chunk=1)
        self.assertEqual(hooks.chunks, 1)

    def test_controller_gets_the_clocks_and_stops(self):
        import kareus

        plan = kareus.Plan(PLAN, ARGS.workload)
        log = os.path.join(ARGS.workdir, "hooks.jsonl")
        if os.path.exists(log):
            os.remove(log)
        with kareus.Controller(gpu_index=2, dry_run=True, log_path=log) as ctl:
            self.assertTrue(ctl.running)
            pid = ctl.pid
            hooks = kareus.Hooks(plan, 2, ctl)
            for ins in plan.instructions(1):
                hooks.on_instruction_begin(ins.kind, ins.microbatch)
                hooks.on_instruction_end(ins.kind, ins.microbatch)
            # Stopping drops targets still queued: wait until all were applied.
            want = len(plan.clock_sequence(1))
            self.assertTrue(wait_until(lambda: count_locks(log) >= want))
        self.assertFalse(ctl.running)
        with self.assertRaises(kareus.StateError):
            ctl.set_clock(1200)
        with self.assertRaises(kareus.StateError):
            hooks.on_instruction_begin("forward", 0)
        with open(log) as f:
            events = [json.loads(line) for line in f]
        self.assertEqual([e["freq_mhz"] for e in events if e["event"] == "lock"],
                         plan.clock_sequence(1))
        self.assertEqual(events[-1]["event"], "reset")
        self.assertTrue(all(e["gpu"] == 2 for e in events))
        # The process is gone (reaped by the client's stop).
        self.assertFalse(os.path.exists(f"/proc/{pid}") and
                         "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3])

    def test_controller_start_errors(self):
        import kareus

        with self.assertRaises(kareus.ArgumentError) as cm:
            kareus.Controller(dry_run=True)
        self.assertIn("log_path", str(cm.exception))
        with self.assertRaises(kareus.InvalidInputError) as cm:
            kareus.Controller(dry_run=True, log_path=os.path.join(ARGS.workdir, "x.jsonl"),
                              executable="/no/such/kareus-freqd")
        self.assertIn("/no/such/kareus-freqd", str(cm.exception))


    def test_exit_during_an_exception_keeps_the_exception(self):
        import signal
        import warnings

        import kareus

        log = os.path.join(ARGS.workdir, "exit.jsonl")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.assertRaises(ValueError):
                with kareus.Controller(dry_run=True, log_path=log) as ctl:
                    os.kill(ctl.pid, signal.SIGKILL)  # stop() will then fail
                    raise ValueError("the training step failed")
        self.assertTrue(any(issubclass(w.category, RuntimeWarning) and "did not exit cleanly"
                            in str(w.message) for w in caught), [str(w.message) for w in caught])
        # Without an exception in flight, the stop failure is raised.
        with self.assertRaises(kareus.InternalError):
            with kareus.Controller(dry_run=True, log_path=log) as ctl:
                os.kill(ctl.pid, signal.SIGKILL)

    def test_dead_controller_does_not_stop_training(self):
        import signal

        import kareus

        plan = kareus.Plan(PLAN, ARGS.workload)
        ctl = kareus.Controller(dry_run=True, log_path=os.path.join(ARGS.workdir, "dead.jsonl"))
        hooks = kareus.Hooks(plan, 2, ctl)
        os.kill(ctl.pid, signal.SIGKILL)
        self.assertTrue(wait_until(lambda: not process_alive(ctl.pid)))
        for _ in range(2):
            for ins in plan.instructions(1):
                hooks.on_instruction_begin(ins.kind, ins.microbatch)  # no exception
                hooks.on_instruction_end(ins.kind, ins.microbatch)

    def test_gpu_uuid_and_pci_bus_id_select_the_gpu(self):
        import kareus

        if not ARGS.fake_nvml:
            self.skipTest("no --fake-nvml")
        env = {"KAREUS_FAKE_NVML_DEVICES": "3"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            for kwargs, gpu in (({"gpu_uuid": "GPU-fake-0000-2"}, 2),
                                ({"pci_bus_id": "00000000:70:00.0"}, 1)):
                log = os.path.join(ARGS.workdir, f"select{gpu}.jsonl")
                if os.path.exists(log):
                    os.remove(log)
                with kareus.Controller(dry_run=True, log_path=log, nvml_library=ARGS.fake_nvml,
                                       **kwargs) as ctl:
                    ctl.set_clock(1200)
                    self.assertTrue(wait_until(lambda: count_locks(log) >= 1))
                with open(log) as f:
                    self.assertEqual({json.loads(line)["gpu"] for line in f}, {gpu}, kwargs)
            with self.assertRaises(kareus.InvalidInputError) as cm:
                kareus.Controller(dry_run=True, log_path=os.path.join(ARGS.workdir, "x.jsonl"),
                                  nvml_library=ARGS.fake_nvml, gpu_uuid="GPU-typo")
            self.assertIn("GPU-typo", str(cm.exception))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def wait_until(pred, timeout_s=15.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


def count_locks(log):
    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum(json.loads(line)["event"] == "lock" for line in f if line.strip())


def process_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gpu_energy_from_json(plan, stage):
    """The plan's energy for one GPU of `stage` per iteration (docs/formats.md, energy monitor)."""
    static_j = plan["static_power_w"] * plan["iteration_time_s"]
    rest, gpus, mine = plan["energy_j"], 0, 0.0
    for s, st in enumerate(plan["stages"]):
        dynamic = sum(i["dynamic_energy_j"] for i in st["instructions"])
        rest -= len(st["ranks"]) * (dynamic + static_j)
        gpus += len(st["ranks"])
        if s == stage:
            mine = dynamic + static_j
    return mine + max(0.0, rest) / gpus


class MonitorTest(unittest.TestCase):
    def setUp(self):
        if not ARGS.fake_nvml:
            self.skipTest("no --fake-nvml")
        self._old = os.environ.get("KAREUS_FAKE_NVML_ENERGY_MJ")

    def tearDown(self):
        if self._old is None:
            os.environ.pop("KAREUS_FAKE_NVML_ENERGY_MJ", None)
        else:
            os.environ["KAREUS_FAKE_NVML_ENERGY_MJ"] = self._old

    def test_totals_match_the_scripted_counter(self):
        import kareus

        # Two counter reads per iteration: 1200 - 1000, 1700 - 1300, 2000 - 1900 J.
        os.environ["KAREUS_FAKE_NVML_ENERGY_MJ"] = "1000000,1200000,1300000,1700000,1900000,2000000"
        plan = kareus.Plan(PLAN, ARGS.workload)
        path = os.path.join(ARGS.workdir, "monitor_rank2.jsonl")
        if os.path.exists(path):
            os.remove(path)
        ins = plan.instructions(1)
        with kareus.Monitor(2, 1, path=path, nvml_library=ARGS.fake_nvml, plan=plan,
                            tokens_per_iteration=256) as mon:
            self.assertTrue(mon.energy_available, mon.times_only_reason)
            hooks = kareus.Hooks(plan, 2, monitor=mon)
            with self.assertRaises(kareus.StateError) as cm:
                hooks.on_instruction_begin(ins[0].kind, ins[0].microbatch)
            self.assertIn("begin_iteration", str(cm.exception))
            self.assertEqual(hooks.position, (0, False))
            records = []
            for _ in range(3):
                mon.begin_iteration()
                for i in ins:
                    hooks.on_instruction_begin(i.kind, i.microbatch)
                    hooks.on_instruction_end(i.kind, i.microbatch)
                records.append(mon.end_iteration())
            self.assertEqual([r["energy_j"] for r in records], [200, 400, 100])
            for n, r in enumerate(records):
                self.assertEqual((r["record"], r["rank"], r["stage"], r["iteration"]),
                                 ("iteration", 2, 1, n))
                self.assertEqual(r["instructions"], len(ins))
                self.assertLessEqual(r["busy_time_s"], r["time_s"])
                self.assertAlmostEqual(r["avg_power_w"], r["energy_j"] / r["time_s"], places=9)
                self.assertEqual(r["gpu_uuid"], "GPU-fake-0000-0")
                self.assertNotIn("note", r)
            s = mon.summary()
            self.assertEqual((s["iterations"], s["instructions"]), (3, 3 * len(ins)))
            self.assertEqual(s["energy_j"], 700)
            self.assertAlmostEqual(s["energy_per_iteration_j"], 700 / 3)
            self.assertAlmostEqual(s["energy_per_token_j"], 700 / 3 / 256)
            self.assertAlmostEqual(s["time_s"], sum(r["time_s"] for r in records))
            predicted = gpu_energy_from_json(PLAN_JSON, 1)
            self.assertAlmostEqual(s["prediction"]["energy_per_iteration_j"], predicted)
            self.assertEqual(s["prediction"]["iteration_time_s"], PLAN_JSON["iteration_time_s"])
            self.assertAlmostEqual(s["error"]["energy_per_iteration"], 700 / 3 / predicted - 1)
            self.assertEqual(len(mon.records), 3)
        with open(path) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual([r["record"] for r in lines], ["iteration"] * 3 + ["summary"])
        self.assertEqual(lines[:3], records)
        self.assertEqual(lines[3]["energy_j"], 700)
        self.assertEqual(mon.records, lines)

    def test_times_only_per_instruction_and_errors(self):
        import kareus
        import kareus.torch as kt

        mon = kareus.Monitor(0, 0, nvml=False, per_instruction=True)
        self.assertFalse(mon.energy_available)
        self.assertIn("nvml = false", mon.times_only_reason)
        hooks = kt.PipelineHooks(None, 0, monitor=mon)  # a baseline without a plan, measured
        mon.begin_iteration()
        hooks.on_instruction_begin("forward", 0)
        with self.assertRaises(kareus.StateError):
            mon.end_instruction("backward", 0)
        hooks.on_instruction_end("forward", 0)
        r = mon.end_iteration()
        self.assertIsNone(r["energy_j"])
        self.assertIsNone(r["avg_power_w"])
        self.assertTrue(r["note"].startswith("times only: "), r["note"])
        self.assertEqual(r["instructions"], 1)
        self.assertEqual([x["record"] for x in mon.records], ["instruction", "iteration"])
        self.assertEqual(mon.records[0]["kind"], "forward")
        with self.assertRaises(kareus.StateError):
            mon.end_iteration()
        mon.close()
        self.assertIsNone(mon.summary()["energy_per_iteration_j"])
        with self.assertRaises(kareus.StateError):
            mon.begin_iteration()
        with self.assertRaises(kareus.InvalidInputError):
            kareus.Monitor(0, 0, gpu_uuid="GPU-fake-0000-0", pci_bus_id="00000000:80:00.0",
                           nvml_library=ARGS.fake_nvml)
        with self.assertRaises(kareus.InvalidInputError) as cm:
            kareus.Monitor(0, 0, gpu_uuid="GPU-typo", nvml_library=ARGS.fake_nvml)
        self.assertIn("GPU-typo", str(cm.exception))
        with self.assertRaises(kareus.ArgumentError):
            kareus.Monitor(0, 0, nvml=False, tokens_per_iteration=0)
        plan = kareus.Plan(PLAN, ARGS.workload)
        with self.assertRaises(kareus.ArgumentError) as cm:
            kareus.Monitor(0, 1, nvml=False, plan=plan)
        self.assertIn("rank 0 is in stage 0", str(cm.exception))
        with self.assertRaises(kareus.ArgumentError):
            kareus.Hooks(plan, 1, monitor=kareus.Monitor(0, 0, nvml=False))  # another rank's

    def test_job_figures_of_an_iteration(self):
        import kareus.torch as kt

        def rec(rank, stage, time_s, energy_j, busy_s, uuid):
            return {"record": "iteration", "rank": rank, "stage": stage, "iteration": 4,
                    "time_s": time_s, "energy_j": energy_j, "busy_time_s": busy_s,
                    "gpu_uuid": uuid}

        records = [rec(2, 1, 0.9, 200, 0.5, "c"), rec(0, 0, 1.0, 300, 0.8, "a"),
                   rec(1, 0, 1.2, 100, 0.9, "b")]
        job = kt.merge_iteration_records(records)
        self.assertEqual(job["iteration"], 4)
        self.assertEqual(job["ranks"], [0, 1, 2])
        self.assertEqual(job["time_s"], 1.2)
        self.assertEqual(job["energy_j"], 600)
        self.assertAlmostEqual(job["avg_power_per_gpu_w"], 600 / (1.2 * 3))
        self.assertEqual(job["stage_busy_time_s"], [0.9, 0.5])
        self.assertEqual(job["notes"], [])
        records[0]["energy_j"] = None
        job = kt.merge_iteration_records(records)
        self.assertIsNone(job["energy_j"])
        self.assertIsNone(job["avg_power_per_gpu_w"])
        self.assertIn("rank(s) 2 have no energy", job["notes"][0])
        with self.assertRaises(ValueError):
            kt.merge_iteration_records(records + [dict(records[1], rank=7, iteration=5)])
        with self.assertRaises(ValueError):
            kt.merge_iteration_records(records + [records[1]])
        with self.assertWarns(RuntimeWarning):
            shared = kt.merge_iteration_records([rec(0, 0, 1, 1, 1, "a"), rec(1, 0, 1, 1, 1, "a")])
        self.assertIn("same GPU a", shared["notes"][0])

        # Through a real process group (gloo, one process): the same figures.
        import torch.distributed as dist

        store = os.path.join(ARGS.workdir, "pg_store")
        if os.path.exists(store):
            os.remove(store)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            one = rec(0, 0, 1.5, 90, 1.0, "a")
            job = kt.aggregate_iteration(one)
            self.assertEqual(job, kt.merge_iteration_records([one]))
            self.assertEqual((job["time_s"], job["energy_j"], job["stage_busy_time_s"]),
                             (1.5, 90, [1.0]))
        finally:
            dist.destroy_process_group()


class StragglerRuleTest(unittest.TestCase):
    """kareus.replan.StragglerRule on hand-made busy times (predicted 1 s and 2 s per stage)."""

    def feed(self, rule, rows):
        out = []
        for it, busy in enumerate(rows):
            d = rule.observe(it, busy, [1.0, 2.0])
            if d is not None:
                out.append((it, d.stage_slowdown))
        return out

    def test_decides_after_k_iterations_with_the_median(self):
        from kareus.replan import StragglerRule
        # Iteration 0 skipped; 1..3 the reference (ratios 1.1 and 1.0: the prediction's own
        # error is no drift); stage 1 then runs 1.3x, 1.2x, 1.25x of its reference.
        rows = [[9, 9], [1.1, 2.0], [1.1, 2.0], [1.1, 2.0], [1.1, 2.0],
                [1.1, 2.6], [1.1, 2.4], [1.1, 2.5], [1.1, 2.5]]
        got = self.feed(StragglerRule(2, threshold=0.05, k=3, warmup=3), rows)
        self.assertEqual(got, [(7, [1.0, 1.25])])

    def test_noise_and_whole_job_slowdowns_are_not_stragglers(self):
        from kareus.replan import StragglerRule
        # One noisy iteration per stage in turn, then the whole job 20% slower: no re-plan.
        rows = [[1, 2]] * 4 + [[1.3, 2], [1, 2.6], [1.3, 2], [1, 2.6]] + [[1.2, 2.4]] * 5
        self.assertEqual(self.feed(StragglerRule(2, k=3), rows), [])

    def test_recovery_goes_back_to_the_modelled_speed(self):
        from kareus.replan import StragglerRule
        rule = StragglerRule(2, k=2, warmup=1, applied=[1.0, 1.5])
        # The plan assumes stage 1 at 1.5x; it runs at its reference again: back to 1.
        got = self.feed(rule, [[9, 9], [1, 2], [1, 2], [1, 2]])
        self.assertEqual(got, [(3, [1.0, 1.0])])

    def test_predicted_busy_divides_the_plans_slowdown(self):
        from kareus.replan import predicted_stage_busy_s
        plan = {"stage_slowdown": [1.0, 1.5], "stages": [
            {"instructions": [{"time_s": 0.5}, {"time_s": 0.25}]},
            {"instructions": [{"time_s": 1.5}, {"time_s": 3.0}]}]}
        self.assertEqual(predicted_stage_busy_s(plan), [0.75, 3.0])


class ScheduleTest(unittest.TestCase):
    def test_schedule_order_is_the_cpp_schedule(self):
        import kareus

        self.assertEqual(kareus.schedule_order(2, 2, 4, 0), INTERLEAVED_P2_V2_M4[0])
        self.assertEqual(kareus.schedule_order(2, 2, 4, 1), INTERLEAVED_P2_V2_M4[1])
        self.assertEqual(kareus.schedule_order(2, 1, 4, 1),
                         [(F, 0, 0), (B, 0, 0), (F, 0, 1), (B, 0, 1), (F, 0, 2), (B, 0, 2),
                          (F, 0, 3), (B, 0, 3)])
        self.assertEqual(kareus.schedule_name(2, 2, 4), "interleaved-1f1b")
        self.assertEqual(kareus.schedule_name(2, 1, 4), "1f1b")
        with self.assertRaises(kareus.InvalidInputError) as cm:
            kareus.schedule_order(2, 2, 3, 0)
        self.assertIn("multiple of the pipeline stages", str(cm.exception))
        with self.assertRaises(kareus.ArgumentError):
            kareus.schedule_order(2, 2, 4, 2)

    def test_torch_module_has_no_order_of_its_own(self):
        import kareus.torch as kt

        self.assertFalse(hasattr(kt, "one_f_one_b_order"))


class InterleavedTest(unittest.TestCase):
    def test_plan_holds_the_interleaved_order_with_chunks(self):
        import kareus

        plan = kareus.Plan(VP_PLAN, VP_WORKLOAD)
        self.assertEqual((plan.chunks, plan.schedule), (2, "interleaved-1f1b"))
        self.assertEqual(plan.workload["virtual_pipeline"], 2)
        self.assertEqual(plan.workload["stage_layers"], [2, 2])
        for s in range(2):
            got = [(i.kind, i.chunk, i.microbatch) for i in plan.instructions(s)]
            self.assertEqual(got, INTERLEAVED_P2_V2_M4[s])
            self.assertEqual(got, [(w["instruction"], w["chunk"], w["microbatch"])
                                   for w in VP_PLAN_JSON["stages"][s]["instructions"]])
            # One layer per virtual stage: chunk c of stage s is layer 2 c + s.
            self.assertEqual([plan.chunk_layers(s, c) for c in range(2)], [(1, s), (1, 2 + s)])
            ins = plan.settings(s, "backward", 1, chunk=1)
            self.assertEqual((ins.kind, ins.chunk, ins.microbatch), ("backward", 1, 1))
            self.assertEqual(ins.index, INTERLEAVED_P2_V2_M4[s].index((B, 1, 1)))
        with self.assertRaises(kareus.OrderError) as cm:
            plan.settings(0, "backward", 1)
        self.assertIn("kareus_plan_find_instruction_chunk", str(cm.exception))

    def test_hooks_follow_the_interleaved_order(self):
        import kareus
        import kareus.torch as kt

        plan = kareus.Plan(VP_PLAN, VP_WORKLOAD)
        hooks = kt.PipelineHooks(plan, 0)  # stage 0
        self.assertEqual(hooks.chunks, 2)
        self.assertEqual(hooks.order, INTERLEAVED_P2_V2_M4[0])
        with self.assertRaises(kareus.OrderError) as cm:
            hooks.on_instruction_begin("forward", 0)  # no chunk: ambiguous
        self.assertIn("kareus_instruction_begin_chunk", str(cm.exception))
        want = VP_PLAN_JSON["stages"][0]["instructions"]
        for n, (kind, c, m) in enumerate(INTERLEAVED_P2_V2_M4[0]):
            if n == 2:  # F(chunk 1, mb 0) is next: chunk 0 is refused, naming what is expected
                with self.assertRaises(kareus.OrderError) as cm:
                    hooks.on_instruction_begin("forward", 0, 0)
                self.assertIn("interleaved-1f1b order runs forward of micro-batch 0 (chunk 1)",
                              str(cm.exception))
            s = hooks.on_instruction_begin(kind, m, c)
            self.assertEqual((s.kind, s.chunk, s.microbatch), (kind, c, m))
            self.assertEqual(s.freq_mhz, want[n]["freq_mhz"])
            self.assertEqual(hooks.open_instruction, (kind, c, m))
            hooks.on_instruction_end(kind, m, c)
        self.assertEqual(hooks._hooks.position, (0, False))


class WorkloadPartitionsTest(unittest.TestCase):
    def test_tp_partitions_from_the_kernel_graph(self):
        """The graph's op lists and slots, against src/workload/kernel_graph.cc read by hand."""
        import kareus

        parts = {p["key"]: p for p in kareus.workload_partitions(ARGS.workload)}
        self.assertEqual(set(parts), {"fwd_attn", "fwd_mlp", "bwd_mlp", "bwd_attn"})
        a = parts["fwd_attn"]
        self.assertEqual(a["ops"], ["residual_add", "rmsnorm", "qkv_gemm", "rope", "attention",
                                    "out_proj"])
        self.assertEqual({s["name"]: s["op_index"] for s in a["slots"]},
                         {"norm": 0, "qkv": 2, "rope": 3, "attn": 4})
        self.assertEqual(a["collective"], {"name": "tp_allreduce", "kind": "allreduce",
                                           "group": "tp"})
        self.assertEqual(parts["bwd_mlp"]["direction"], "backward")
        self.assertEqual(parts["bwd_mlp"]["comm_tail"], [])

    def test_bad_workload(self):
        import kareus

        with self.assertRaises(kareus.InvalidInputError) as e:
            kareus.workload_partitions("/no/such/workload.yaml")
        self.assertIn("/no/such/workload.yaml", str(e.exception))


class PipeliningTest(unittest.TestCase):
    """kareus.pipelining without a job: stand-in stages and hooks."""

    class Stage:
        def __init__(self, index, num_stages):
            self.stage_index, self.num_stages, self.calls = index, num_stages, []

        def forward_one_chunk(self, mb, args=None, kwargs=None, save_forward_output=True):
            self.calls.append(("F", mb))
            return mb

        def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
            self.calls.append(("B", mb))

        def backward_weight_one_chunk(self, mb, last_backward=False):
            self.calls.append(("W", mb))

    class Hooks:
        def __init__(self):
            self.calls = []

        def on_instruction_begin(self, kind, mb, chunk=None):
            self.calls.append(("begin", kind, mb, chunk))

        def on_instruction_end(self, kind, mb, chunk=None):
            self.calls.append(("end", kind, mb, chunk))

    def test_hooks_around_every_action_with_the_chunk(self):
        import kareus.torch as kt

        # Rank 1 of pp = 2 with V = 2 holds virtual stages 1 and 3: chunks 0 and 1.
        stages, hooks, record = [self.Stage(1, 4), self.Stage(3, 4)], self.Hooks(), []
        kt.instrument_stages(stages, hooks, record=record)
        self.assertEqual(stages[1].forward_one_chunk(2, ()), 2)
        stages[0].backward_one_chunk(0, loss=None)
        self.assertEqual(hooks.calls, [("begin", "forward", 2, 1), ("end", "forward", 2, 1),
                                       ("begin", "backward", 0, 0), ("end", "backward", 0, 0)])
        self.assertEqual(record, [("forward", 1, 2), ("backward", 0, 0)])
        self.assertEqual(stages[1].calls + stages[0].calls, [("F", 2), ("B", 0)])
        with self.assertRaisesRegex(NotImplementedError, "full_backward"):
            stages[0].backward_one_chunk(1, full_backward=False)
        with self.assertRaisesRegex(NotImplementedError, "split"):
            stages[0].backward_weight_one_chunk(1)
        with self.assertRaisesRegex(RuntimeError, "already instrumented"):
            kt.instrument_stages(stages, hooks)

    def test_interleaved_order_is_kareus_where_torch_differs(self):
        import kareus
        import kareus.torch as kt
        from torch.distributed.pipelining import ScheduleInterleaved1F1B

        def order(cls, pp, v, m, rank):
            sched = cls.__new__(cls)
            sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, v, m
            sched.number_of_rounds = max(1, m // pp)
            sched.microbatches_per_round = m // sched.number_of_rounds
            return [("forward" if str(a.computation_type).endswith("FORWARD") else "backward",
                     a.stage_index // pp, a.microbatch_index)
                    for a in sched._calculate_single_rank_operations(rank) if a is not None]

        # With as many micro-batches as stages, Megatron (and Kareus) run every forward first.
        want = [("forward", 0, 0), ("forward", 0, 1), ("forward", 1, 0), ("forward", 1, 1),
                ("backward", 1, 0), ("backward", 1, 1), ("backward", 0, 0), ("backward", 0, 1)]
        self.assertEqual(kareus.schedule_order(2, 2, 2, 1), want)
        self.assertEqual(order(kt.KareusInterleaved1F1B, 2, 2, 2, 1), want)
        self.assertNotEqual(order(ScheduleInterleaved1F1B, 2, 2, 2, 1), want)


class DocTest(unittest.TestCase):
    def test_public_objects_are_documented(self):
        import kareus
        import kareus.torch as kt

        for name in ("Plan", "Controller", "Monitor", "Hooks", "Instruction", "Partition",
                     "MixEntry", "Error", "OrderError", "InvalidInputError"):
            self.assertTrue(getattr(kareus, name).__doc__, name)
        for name in ("PipelineHooks", "NanoBatchedStack", "TPTransformerLayer",
                     "InstructionSettings", "aggregate_iteration", "merge_iteration_records",
                     "SmGroups", "nccl_options", "instrument_stages", "KernelGraphBlocks",
                     "kareus_schedule"):
            self.assertTrue(getattr(kt, name).__doc__, name)
        self.assertTrue(kareus.__doc__)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--kareus", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--fake-nvml", default="", help="the fake libnvidia-ml.so.1 (tests/fakes)")
    ARGS, rest = ap.parse_known_args()
    ARGS.workload = os.path.abspath(ARGS.workload)
    ARGS.workdir = os.path.abspath(ARGS.workdir)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
