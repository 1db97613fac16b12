// Plan format v2 (docs/formats.md) and the clock-switch cost (issue 10, items 1 and 2): round
// trip, validation of every field class through the CLI, the rank mapping, predicted start/end
// times, the emulator's switch stalls against a hand-derived critical path, and the
// minimum-clock-hold post-processing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <tuple>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/planner.h"
#include "test_util.h"

namespace kareus {
namespace {

constexpr const char* kQwen = "qwen3-1.7b_tp8_mbs8_seq4096";

// One planner (and frontier) per test binary: planning is the slow part.
struct Planned {
  Workload w;
  EmulatorProfiler prof;
  CachedProfiler cp;
  Planner planner;
  MethodFrontier f;
  explicit Planned(PlannerOptions o = {})
      : w(load_workload(test::paper_workload(kQwen))),
        prof(test::emulator_options(w.gpu_name)),
        cp(prof, nullptr),
        planner(w, cp, o),
        f(planner.frontier(Method::kKareus)) {}
};

const Planned& planned() {
  static const Planned p;
  return p;
}

int total_changes(const ClockSchedule& s) {
  int n = 0;
  for (int c : s.clock_changes) n += c;
  return n;
}

TEST(PlanV2, RoundTripAndContent) {
  const auto& pl = planned();
  test::TempDir tmp;
  // The point with the most clock changes exercises every per-instruction field.
  std::size_t busiest = 0;
  int most = -1;
  for (std::size_t i = 0; i < pl.f.points.size(); ++i) {
    const int n = total_changes(schedule_with_switches(pl.f, pl.f.points[i].choice, 0.015));
    if (n > most) most = n, busiest = i;
  }
  const Plan p = pl.planner.make_plan(pl.f, busiest, "test");
  save_plan(p, tmp.file("p.json"));
  const Plan q = load_plan(tmp.file("p.json"), pl.w);  // validates against the workload
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(p.to_json().at("version").get<int>(), 2);
  EXPECT_EQ(Plan::kVersion, 2);
  EXPECT_DOUBLE_EQ(p.clock_switch_s, 0.015);  // the A100 catalogue value
  // Rank mapping: tp = 8, pp = 2 -> stage 0 is ranks 0..7, stage 1 ranks 8..15.
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.stages[1].ranks, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(p.stage_of_rank(7), 0);
  EXPECT_EQ(p.stage_of_rank(8), 1);
  // Partition entries: forward blocks inside a backward are recompute; slot ops name the op at
  // the slot's index; instance counts are the partitioner's occurrences (qwen3-1.7b: 14
  // layers per stage, one attention and one MLP block per layer and nano-batch).
  const PartitionSet ps = partition_workload(pl.w);
  int recompute = 0, overlapped = 0;
  for (const auto& st : p.stages) {
    for (const auto& in : st.instructions) {
      // Kareus runs an instruction whole where overlap does not pay (no partitions then).
      EXPECT_EQ(in.partitions.empty(), in.sequential);
      if (in.sequential) continue;
      ++overlapped;
      for (const auto& [key, c] : in.partitions) {
        const Partition& part = ps.partition(key);
        EXPECT_EQ(c.recompute, in.kind == InstructionKind::kBackward && key.rfind("fwd_", 0) == 0)
            << key;
        recompute += c.recompute;
        const Slot& sl = part.slot(c.slot);
        EXPECT_EQ(c.slot_op_index, sl.op_index);
        EXPECT_EQ(c.slot_op, part.compute_ops[static_cast<std::size_t>(sl.op_index)].name);
        int expected = 0;  // the partitioner's own count for this stage and instruction
        for (const auto& o : part.occurrences) {
          if (o.stage == st.stage && o.instruction == in.kind) expected += o.count;
        }
        EXPECT_EQ(c.instances, expected) << key;
        EXPECT_GE(c.instances, 25) << key;  // two nano-batches x 14 layers, less the segments
      }
    }
  }
  EXPECT_GT(overlapped, 0);
  EXPECT_GT(recompute, 0);
  // clock_changes agrees with the clock sequence.
  for (const auto& st : p.stages) {
    EXPECT_EQ(st.clock_changes, static_cast<int>(st.clock_runs().size()) - 1);
    int flagged = 0;
    for (const auto& in : st.instructions) flagged += in.clock_switch;
    EXPECT_EQ(flagged, st.clock_changes);
  }
}

TEST(PlanV2, StartEndMonotoneAndLastEndIsIterationTime) {
  const auto& pl = planned();
  for (std::size_t i : {std::size_t{0}, pl.f.points.size() / 2, pl.f.points.size() - 1}) {
    const Plan p = pl.planner.make_plan(pl.f, i, "test");
    double last = 0;
    for (const auto& st : p.stages) {
      double prev_end = 0;
      for (const auto& in : st.instructions) {
        EXPECT_GE(in.start_s, prev_end - 1e-12);
        EXPECT_NEAR(in.end_s - in.start_s, in.time_s + (in.clock_switch ? p.clock_switch_s : 0),
                    1e-9);
        prev_end = in.end_s;
      }
      EXPECT_LE(prev_end, st.end_s + 1e-12);
      last = std::max(last, st.end_s);
    }
    EXPECT_NEAR(last, p.iteration_time_s, 1e-9);
    // The emulator's replay of the same plan puts every instruction at nearly the same time
    // (the composition error), and its stall count per stage is the plan's.
    const EmulatorModel model(pl.w.gpu());
    const IterationResult r = emulate_iteration(
        pl.w, model, p.execution,
        [&](int s, InstructionKind k, int mb) { return p.settings(s, k, mb); }, p.clock_switch_s);
    for (std::size_t s = 0; s < p.stages.size(); ++s) {
      EXPECT_EQ(r.stages[s].clock_changes, p.stages[s].clock_changes);
      ASSERT_EQ(r.stages[s].instructions.size(), p.stages[s].instructions.size());
      for (std::size_t k = 0; k < p.stages[s].instructions.size(); ++k) {
        EXPECT_NEAR(r.stages[s].instructions[k].end_s, p.stages[s].instructions[k].end_s,
                    0.03 * p.iteration_time_s);
      }
    }
  }
}

// Megatron-LM's RankGenerator default order "tp-cp-ep-dp-pp" (ep = 1): tp varies fastest.
TEST(PlanV2, RankMappingHandComputed) {
  const RankLayout tp8pp2{8, 1, 1, 2};
  EXPECT_EQ(tp8pp2.gpus(), 16);
  EXPECT_EQ(tp8pp2.stage_ranks(1), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(tp8pp2.coords(13), (RankLayout::Coords{5, 0, 0, 1}));
  EXPECT_EQ(tp8pp2.rank({5, 0, 0, 1}), 13);
  // cp2tp4 (pp = 2): rank = tp + 4 * (cp + 2 * pp).
  const RankLayout cp2tp4{4, 2, 1, 2};
  EXPECT_EQ(cp2tp4.rank({3, 1, 0, 1}), 3 + 4 * (1 + 2 * 1));  // 15
  EXPECT_EQ(cp2tp4.rank({2, 1, 0, 0}), 6);
  EXPECT_EQ(cp2tp4.coords(6), (RankLayout::Coords{2, 1, 0, 0}));
  EXPECT_EQ(cp2tp4.coords(9), (RankLayout::Coords{1, 0, 0, 1}));
  EXPECT_EQ(cp2tp4.stage_ranks(0), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // With data parallelism: rank = tp + 2 * (cp + 2 * (dp + 2 * pp)).
  const RankLayout all2{2, 2, 2, 2};
  EXPECT_EQ(all2.rank({1, 0, 1, 1}), 1 + 2 * (0 + 2 * (1 + 2 * 1)));  // 13
  EXPECT_EQ(all2.coords(13), (RankLayout::Coords{1, 0, 1, 1}));
  for (int r = 0; r < all2.gpus(); ++r) EXPECT_EQ(all2.rank(all2.coords(r)), r);
  EXPECT_THROW(all2.coords(16), InvalidInput);
  EXPECT_THROW(all2.stage_ranks(2), InvalidInput);
  // The plan of a cp2tp4 workload carries that layout.
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_cp2tp4_mbs8_seq4096"));
  EXPECT_EQ(w.parallel.tp, 4);
  EXPECT_EQ(w.parallel.cp, 2);
  EXPECT_EQ(w.parallel.pp, 2);
}

// Every validation class through the CLI: `emulate --plan` and `plan show --workload` exit 2
// and name the field.
TEST(PlanV2, ValidationNamesTheField) {
  test::TempDir tmp;
  const std::string wl = test::paper_workload(kQwen);
  const auto made = test::run_cli("plan " + wl + " --max-throughput --quiet --db " +
                                  tmp.file("p.db") + " --out " + tmp.file("good.json"));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const nlohmann::json good = nlohmann::json::parse(test::read_file(tmp.file("good.json")));
  // The valid plan passes both verbs.
  EXPECT_EQ(test::run_cli("emulate " + wl + " --plan " + tmp.file("good.json")).exit_code, 0);
  const auto shown = test::run_cli("plan show " + tmp.file("good.json") + " --workload " + wl);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("clock changes"), std::string::npos);
  EXPECT_NE(shown.out.find("ranks 8-15"), std::string::npos) << shown.out;

  const auto& ins = good["stages"][1]["instructions"];
  const std::string key = ins[3]["partitions"].begin().key();
  const bool ins0_2_switch = good["stages"][0]["instructions"][2]["clock_switch"].get<bool>();
  // Stage 1's clock changes recomputed here from its freq_mhz sequence.
  int changes1 = 0;
  for (std::size_t i = 1; i < ins.size(); ++i) {
    changes1 += ins[i]["freq_mhz"].get<int>() != ins[i - 1]["freq_mhz"].get<int>();
  }
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string field;
    std::string allowed;
    std::string workload;  // empty: the plan's own
  };
  const std::vector<Case> cases = {
      {"sms99",
       [&](nlohmann::json& j) { j["stages"][1]["instructions"][3]["partitions"][key]["sms"] = 99; },
       "stages[1].instructions[3].partitions." + key + ".sms", "1..32 (NCCL's channel limit)", ""},
      // The copy engines (0 SMs) only where every collective of the chain is an all-to-all
      // inside one node: never in this dense job.
      {"sms0",
       [&](nlohmann::json& j) { j["stages"][1]["instructions"][3]["partitions"][key]["sms"] = 0; },
       "stages[1].instructions[3].partitions." + key + ".sms",
       "0: partition " + key + " allows 1..32 (NCCL's channel limit)", ""},
      {"slot",
       [&](nlohmann::json& j) {
         j["stages"][1]["instructions"][3]["partitions"][key]["slot"] = "nowhere";
       },
       "stages[1].instructions[3].partitions." + key + ".slot", "has launch slots", ""},
      {"clock", [](nlohmann::json& j) { j["stages"][0]["instructions"][2]["freq_mhz"] = 1413; },
       "stages[0].instructions[2].freq_mhz", "supports 210..1410 MHz in 15 MHz steps", ""},
      {"other", [](nlohmann::json&) {}, "workload.digest", "was made for workload",
       test::paper_workload("qwen3-1.7b_tp8_mbs16_seq4096")},
      {"v1", [](nlohmann::json& j) { j["version"] = 1; }, "version", "re-create it with", ""},
      {"count", [](nlohmann::json& j) { j["stages"][0]["instructions"].erase(15); },
       "stages[0].instructions", "has 16", ""},
      {"order", [](nlohmann::json& j) { j["stages"][0]["instructions"][1]["microbatch"] = 5; },
       "stages[0].instructions[1]", "1f1b schedule runs forward of micro-batch 1 (chunk 0)", ""},
      {"partition",
       [&](nlohmann::json& j) {
         auto& parts = j["stages"][1]["instructions"][3]["partitions"];
         parts["fwd_nothing"] = parts[key];
       },
       "stages[1].instructions[3].partitions.fwd_nothing", "unknown partition", ""},
      {"recompute",
       [&](nlohmann::json& j) {
         auto& c = j["stages"][1]["instructions"][3]["partitions"][key]["recompute"];
         c = !c.get<bool>();
       },
       "stages[1].instructions[3].partitions." + key + ".recompute", "", ""},
      {"ranks", [](nlohmann::json& j) { j["stages"][1]["ranks"][0] = 0; }, "stages[1].ranks",
       "order tp-cp-dp-pp", ""},
      {"type", [](nlohmann::json& j) { j["stages"][0]["instructions"][0]["freq_mhz"] = "fast"; },
       "stages[0].instructions[0].freq_mhz", "expected an integer", ""},
      // Times, energies and powers (a JSON file cannot hold NaN or inf: the parser refuses an
      // overflowing literal, so the non-finite cases are checked in-process below).
      {"hold", [](nlohmann::json& j) { j["min_clock_hold_s"] = -0.001; }, "min_clock_hold_s",
       "-0.001: must be finite and >= 0", ""},
      {"iter", [](nlohmann::json& j) { j["iteration_time_s"] = 0.0; }, "iteration_time_s",
       "0: must be finite and > 0", ""},
      {"energy", [](nlohmann::json& j) { j["energy_j"] = -5.0; }, "energy_j",
       "-5: must be finite and > 0", ""},
      {"static", [](nlohmann::json& j) { j["static_power_w"] = -85.0; }, "static_power_w",
       "must be finite and >= 0", ""},
      {"start", [](nlohmann::json& j) { j["stages"][0]["instructions"][0]["start_s"] = -0.5; },
       "stages[0].instructions[0].start_s", "-0.5: must be finite and >= 0", ""},
      {"time", [](nlohmann::json& j) { j["stages"][1]["instructions"][2]["time_s"] = -0.1; },
       "stages[1].instructions[2].time_s", "must be finite and >= 0", ""},
      {"dynamic",
       [](nlohmann::json& j) { j["stages"][1]["instructions"][2]["dynamic_energy_j"] = -1.0; },
       "stages[1].instructions[2].dynamic_energy_j", "must be finite and >= 0", ""},
      {"backwards",
       [](nlohmann::json& j) {
         auto& in = j["stages"][1]["instructions"][4];
         in["end_s"] = in["start_s"].get<double>() / 2;
       },
       "stages[1].instructions[4].end_s", "must be >= start_s", ""},
      {"starts",
       [](nlohmann::json& j) {
         auto& ins = j["stages"][1]["instructions"];
         ins[5]["start_s"] = ins[4]["start_s"].get<double>() / 2;
       },
       "stages[1].instructions[5].start_s", "must be >= the previous instruction's start_s", ""},
      {"late",
       [](nlohmann::json& j) {
         j["stages"][0]["end_s"] = j["iteration_time_s"].get<double>() * 1.01;
       },
       "stages[0].end_s", "must be <= iteration_time_s", ""},
      {"overrun",
       [](nlohmann::json& j) {
         auto& st = j["stages"][0];
         st["instructions"][3]["end_s"] = st["end_s"].get<double>() + 0.5;
       },
       "stages[0].instructions[3].end_s", "must be <= the stage's end_s", ""},
      // Derived fields must equal what the freq_mhz sequence gives.
      {"flag",
       [](nlohmann::json& j) {
         auto& f = j["stages"][0]["instructions"][2]["clock_switch"];
         f = !f.get<bool>();
       },
       "stages[0].instructions[2].clock_switch",
       std::string("expected ") + (ins0_2_switch ? "true" : "false"), ""},
      {"retune",
       [](nlohmann::json& j) {
         auto& in = j["stages"][0]["instructions"];
         in[5]["freq_mhz"] = in[4]["freq_mhz"].get<int>() == 1200 ? 1215 : 1200;
         in[6]["freq_mhz"] = in[4]["freq_mhz"];
       },
       "stages[0].instructions[5].clock_switch", "differs from the previous instruction's", ""},
      {"first", [](nlohmann::json& j) { j["stages"][1]["instructions"][0]["clock_switch"] = true; },
       "stages[1].instructions[0].clock_switch",
       "the stage's first instruction never switches: expected false", ""},
      {"changes",
       [](nlohmann::json& j) {
         auto& c = j["stages"][1]["clock_changes"];
         c = c.get<int>() + 1;
       },
       "stages[1].clock_changes", fmt::format("changes {} times: expected {}", changes1, changes1),
       ""},
  };
  for (const auto& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    const std::string path = tmp.write(c.name + ".json", j.dump());
    const std::string w = c.workload.empty() ? wl : c.workload;
    for (const std::string& cmd :
         {"emulate " + w + " --plan " + path, "plan show " + path + " --workload " + w}) {
      const auto r = test::run_cli(cmd);
      EXPECT_EQ(r.exit_code, 2) << c.name << ": " << cmd << "\n" << r.err;
      EXPECT_NE(r.err.find(c.name + ".json"), std::string::npos) << c.name << ": " << r.err;
      EXPECT_NE(r.err.find("field '" + c.field + "'"), std::string::npos)
          << c.name << ": " << r.err;
      EXPECT_NE(r.err.find(c.allowed), std::string::npos) << c.name << ": " << r.err;
    }
  }
  // Non-finite values reach Plan::from_json only from a JSON built in memory (a caller of the
  // library, not a file); they are refused the same way.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> non_finite = {
      {"clock_switch_s", [&](nlohmann::json& j) { j["clock_switch_s"] = nan; }},
      {"min_clock_hold_s", [&](nlohmann::json& j) { j["min_clock_hold_s"] = inf; }},
      {"iteration_time_s", [&](nlohmann::json& j) { j["iteration_time_s"] = inf; }},
      {"energy_j", [&](nlohmann::json& j) { j["energy_j"] = nan; }},
      {"stages[0].end_s", [&](nlohmann::json& j) { j["stages"][0]["end_s"] = nan; }},
      {"stages[1].instructions[6].end_s",
       [&](nlohmann::json& j) { j["stages"][1]["instructions"][6]["end_s"] = inf; }},
      {"stages[0].instructions[1].dynamic_energy_j",
       [&](nlohmann::json& j) { j["stages"][0]["instructions"][1]["dynamic_energy_j"] = nan; }},
  };
  for (const auto& [field, edit] : non_finite) {
    nlohmann::json j = good;
    edit(j);
    try {
      Plan::from_json(j, "inmemory.json");
      ADD_FAILURE() << field << ": a non-finite value was accepted";
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("inmemory.json: field '" + field + "': "), std::string::npos) << what;
      EXPECT_NE(what.find("must be finite and"), std::string::npos) << what;
    }
  }
  // Without a workload, `plan show` checks the structure only: the v1 file still fails.
  nlohmann::json v1 = good;
  v1["version"] = 1;
  const auto r = test::run_cli("plan show " + tmp.write("v1b.json", v1.dump()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("plan format 1"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_cli("plan show " + tmp.file("good.json") + " --json").exit_code, 0);
}

// The emulator's switch stall, against a critical path read off the timeline by hand. Every
// instruction runs forward at 1410 MHz and backward at 1200 MHz (kernels in sequence), on the
// 2-stage calibration workload with 8 micro-batches. Stage 1 runs F0 B0 F1 B1 ... F7 B7 (15
// changes); stage 0 runs F0 F1 B0 F2 B1 ... F7 B6 B7 (13 changes). With free changes the
// critical path is s0F0 > s1F0 > s1B0 > s0B0 > s0F2 > s0B1 > s0F3 > s0B2 > s0F4 > s0B3 > s0F5 >
// s0B4 > s0F6 > s0B5 > s0F7 > s1F7 > s1B7 > s0B7 (each starts when the previous ends, plus the
// message between stages: stage 0 runs without a gap from B0 to F7); 15 of these instructions
// change clock (all but s0F0, s1F0 and s0B7). So the iteration grows by exactly
// 15 x clock_switch_s.
TEST(ClockSwitch, ReplayGrowsByChangesOnTheCriticalPath) {
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const EmulatorModel m(w.gpu());
  auto settings = [](int, InstructionKind k, int) {
    InstructionSettings s;
    s.freq_mhz = k == InstructionKind::kForward ? 1410 : 1200;
    return s;
  };
  const double cs = 0.004;
  const IterationResult free_r = emulate_iteration(w, m, ExecutionMode::kSequential, settings, 0);
  const IterationResult paid = emulate_iteration(w, m, ExecutionMode::kSequential, settings, cs);
  using K = InstructionKind;
  const K F = K::kForward, B = K::kBackward;
  const std::vector<std::tuple<int, K, int>> path = {
      {0, F, 0}, {1, F, 0}, {1, B, 0}, {0, B, 0}, {0, F, 2}, {0, B, 1},
      {0, F, 3}, {0, B, 2}, {0, F, 4}, {0, B, 3}, {0, F, 5}, {0, B, 4},
      {0, F, 6}, {0, B, 5}, {0, F, 7}, {1, F, 7}, {1, B, 7}, {0, B, 7}};
  for (const IterationResult* r : {&free_r, &paid}) {
    ASSERT_EQ(r->stages.size(), 2u);
    auto find = [&](int s, K k, int mb) {
      for (const auto& t : r->stages[static_cast<std::size_t>(s)].instructions) {
        if (t.kind == k && t.microbatch == mb) return t;
      }
      ADD_FAILURE() << "missing instruction";
      return InstructionTiming{};
    };
    const double p2p = find(1, F, 0).start_s - find(0, F, 0).end_s;
    EXPECT_GT(p2p, 0);
    int switches = 0;
    for (std::size_t i = 1; i < path.size(); ++i) {
      const auto [s0, k0, m0] = path[i - 1];
      const auto [s1, k1, m1] = path[i];
      const InstructionTiming a = find(s0, k0, m0), b = find(s1, k1, m1);
      EXPECT_NEAR(b.start_s, a.end_s + (s0 != s1 ? p2p : 0.0), 1e-9) << "path step " << i;
      switches += b.clock_switch;
    }
    EXPECT_EQ(switches, 15);
  }
  EXPECT_EQ(paid.stages[1].clock_changes, 15);
  EXPECT_EQ(paid.stages[0].clock_changes, 13);
  EXPECT_EQ(free_r.stages[1].clock_changes, 15);  // counted either way; free when cs = 0
  EXPECT_NEAR(paid.iteration_time_s - free_r.iteration_time_s, 15 * cs, 1e-9);
  // A stall burns static power only: dynamic energy is unchanged, static grows with time.
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_NEAR(paid.stages[s].dynamic_energy_j_per_gpu, free_r.stages[s].dynamic_energy_j_per_gpu,
                1e-9);
  }
  EXPECT_NEAR(paid.energy_j - free_r.energy_j, 16 * w.gpu().static_power_w * 15 * cs, 1e-6);
  // A uniform clock never switches: the catalogue overload changes nothing.
  auto uniform = [](int, InstructionKind, int) { return InstructionSettings{1305, {}, {}}; };
  EXPECT_DOUBLE_EQ(
      emulate_iteration(w, m, ExecutionMode::kSequential, uniform).iteration_time_s,
      emulate_iteration(w, m, ExecutionMode::kSequential, uniform, 0).iteration_time_s);
}

// The planner's schedule applies the same rule as the emulator: with the solver's choice fixed,
// switching costs exactly the changes on the DAG's critical path.
TEST(ClockSwitch, ScheduleChargesStallsAndHoldMonotone) {
  const auto& pl = planned();
  ASSERT_GT(pl.f.clock_switch_s, 0);
  // The solver's own point with the most changes (before any hold).
  std::size_t busiest = 0;
  int most = -1;
  for (std::size_t i = 0; i < pl.f.points_without_switch_cost.size(); ++i) {
    const int n = total_changes(
        schedule_with_switches(pl.f, pl.f.points_without_switch_cost[i].choice, 0.015));
    if (n > most) most = n, busiest = i;
  }
  ASSERT_GT(most, 4);
  const auto& choice = pl.f.points_without_switch_cost[busiest].choice;
  const ClockSchedule free_s = schedule_with_switches(pl.f, choice, 0);
  EXPECT_NEAR(free_s.makespan_s, pl.f.dag.makespan_s(choice), 1e-12);
  const ClockSchedule paid = schedule_with_switches(pl.f, choice, 0.015);
  EXPECT_GE(paid.makespan_s, free_s.makespan_s);
  EXPECT_LE(paid.makespan_s, free_s.makespan_s + most * 0.015 + 1e-12);
  // Holding: the change count never grows with the hold, and a huge hold leaves one clock per
  // stage.
  int prev = most;
  for (double hold_s : {0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 1e9}) {
    const auto held = hold_clocks(pl.f, choice, hold_s);
    const ClockSchedule s = schedule_with_switches(pl.f, held, 0.015);
    const int n = total_changes(s);
    EXPECT_LE(n, prev) << "hold " << hold_s;
    prev = n;
    if (hold_s >= 1e9) {
      for (int c : s.clock_changes) EXPECT_EQ(c, 0);
    }
    if (hold_s == 0.0) {
      EXPECT_EQ(held, choice);
    }
  }
  EXPECT_LT(prev, most);
  // Every frontier point is its schedule with stalls, and the frontier moved: no point is
  // faster than the free solver's fastest.
  for (const auto& p : pl.f.points) {
    const ClockSchedule s = schedule_with_switches(pl.f, p.choice, pl.f.clock_switch_s);
    EXPECT_NEAR(s.makespan_s, p.time_s, 1e-12);
    EXPECT_NEAR(s.energy_j, p.energy_j, 1e-6);
    EXPECT_GE(p.time_s, pl.f.points_without_switch_cost.front().time_s - 1e-12);
  }
}

TEST(ClockSwitch, MinClockHoldOptionAndCli) {
  PlannerOptions o;
  o.min_clock_hold_s = 1e6;
  const Planned held(o);
  for (std::size_t i = 0; i < held.f.points.size(); ++i) {
    const Plan p = held.planner.make_plan(held.f, i, "test");
    EXPECT_DOUBLE_EQ(p.min_clock_hold_s, 1e6);
    for (const auto& st : p.stages) {
      EXPECT_EQ(st.clock_changes, 0);
      EXPECT_EQ(st.clock_runs().size(), 1u);
    }
  }
  // Free switches and no hold reproduce the solver's frontier exactly.
  PlannerOptions free_o;
  free_o.clock_switch_s = 0;
  const Planned free_p(free_o);
  ASSERT_EQ(free_p.f.points.size(), free_p.f.points_without_switch_cost.size());
  for (std::size_t i = 0; i < free_p.f.points.size(); ++i) {
    EXPECT_EQ(free_p.f.points[i].time_s, free_p.f.points_without_switch_cost[i].time_s);
  }
  // Through the CLI.
  test::TempDir tmp;
  const std::string wl = test::paper_workload(kQwen);
  const auto r =
      test::run_cli("plan " + wl + " --min-energy --quiet --min-clock-hold-ms 1e6 --out " +
                    tmp.file("h.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("clock_changes").get<int>(), 0);
  const auto show = test::run_cli("plan show " + tmp.file("h.json") + " --json --workload " + wl);
  ASSERT_EQ(show.exit_code, 0) << show.err;
  const auto shown = nlohmann::json::parse(show.out);
  for (const auto& st : shown.at("stages")) {
    EXPECT_EQ(st.at("clock_runs").size(), 1u);
  }
  EXPECT_EQ(
      test::run_cli("plan " + wl + " --min-energy --min-clock-hold-ms -5 --out x.json").exit_code,
      2);
}

// A search measures each partition at the clocks it chose, so a stage's forward and backward
// tables need not share every clock. Hand-built case: stage 0's forward options exist at clocks
// {A, C} only and its backward options at {B, C}; forwards run at A and backwards at B, so
// neither run can take its neighbour's clock, and holding one clock per stage must move both to
// C, the only clock they share.
TEST(HoldClocks, RunsWithoutASharedNeighbourClockMeetAtACommonOne) {
  MethodFrontier f = planned().f;
  auto clocks = [](const std::vector<InstructionOption>& t) {
    std::set<int> c;
    for (const auto& o : t) c.insert(o.freq_mhz);
    return c;
  };
  const std::set<int> fwd = clocks(f.tables[0]), bwd = clocks(f.tables[1]);
  std::vector<int> common;
  for (int c : fwd) {
    if (bwd.count(c)) common.push_back(c);
  }
  ASSERT_GE(common.size(), 3u);
  const int a = common.back(), b = common[common.size() - 2], c = common.front();
  auto keep = [](std::vector<InstructionOption>& t, std::set<int> allowed) {
    std::erase_if(t, [&](const InstructionOption& o) { return allowed.count(o.freq_mhz) == 0; });
  };
  keep(f.tables[0], {a, c});
  keep(f.tables[1], {b, c});
  const Workload& w = planned().w;
  build_iteration_dag(w, partition_workload(w), f);
  std::vector<int> choice(f.dag.nodes.size(), 0);
  int stage0_nodes = 0;
  for (std::size_t i = 0; i < choice.size(); ++i) {
    const int t = f.node_table[i];
    if (t != 0 && t != 1) continue;
    ++stage0_nodes;
    const int want = t == 0 ? a : b;
    const auto& opts = f.node_options(i);
    for (std::size_t j = 0; j < opts.size(); ++j) {
      if (opts[j].freq_mhz == want) choice[i] = static_cast<int>(j);
    }
  }
  ASSERT_GT(stage0_nodes, 2);
  EXPECT_GT(schedule_with_switches(f, choice, 0.015).clock_changes[0], 0);
  for (bool faster : {true, false}) {
    const std::vector<int> held = hold_clocks(f, choice, 1e300, faster);
    EXPECT_EQ(schedule_with_switches(f, held, 0.015).clock_changes[0], 0) << faster;
    for (std::size_t i = 0; i < held.size(); ++i) {
      if (f.node_table[i] == 0 || f.node_table[i] == 1) {
        EXPECT_EQ(f.node_options(i)[static_cast<std::size_t>(held[i])].freq_mhz, c) << i;
      }
    }
  }
}

}  // namespace
}  // namespace kareus
