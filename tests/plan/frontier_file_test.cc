// frontier.json in compact form: the plans materialized from a stored frontier are the plans of
// the frontier it was written from, stale or edited files are refused, the frontier memory
// budget is enforced, hold_clocks_sequence continues shorter holds, and `plan --from` gives the
// plan a fresh `plan` gives.
#include "kareus/frontier_file.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/planner.h"
#include "test_util.h"

namespace kareus {
namespace {

constexpr const char* kQwen = "qwen3-1.7b_tp8_mbs8_seq4096";

struct Stored {
  Workload w;
  EmulatorProfiler prof;
  CachedProfiler cp;
  Planner planner;
  std::map<Method, MethodFrontier> f;
  nlohmann::json j;
  Stored()
      : w(load_workload(test::paper_workload(kQwen))),
        prof(test::emulator_options(w.gpu_name)),
        cp(prof, nullptr),
        planner(w, cp, PlannerOptions{}) {
    for (Method m : {Method::kKareus, Method::kPerseus}) f[m] = planner.frontier(m);
    j = frontiers_to_json(f, {{Method::kKareus, 0}, {Method::kPerseus, 1}});
    add_frontier_identity(j, w, test::read_file(test::paper_workload(kQwen)), PlannerOptions{});
  }
};

const Stored& stored() {
  static const Stored s;
  return s;
}

TEST(FrontierFile, StoredPointsMaterializeToTheSamePlans) {
  const Stored& s = stored();
  test::TempDir tmp;
  const std::string path = tmp.write("frontier.json", s.j.dump(1));
  const FrontierFile ff = load_frontier_file(path);
  ASSERT_EQ(ff.methods.size(), 2u);
  ASSERT_EQ(ff.merged.size(), 2u);
  EXPECT_EQ(ff.merged[1], (FrontierRef{Method::kPerseus, 1}));
  for (const auto& [m, f] : s.f) {
    const MethodFrontier& g = ff.method(m);
    ASSERT_EQ(g.points.size(), f.points.size()) << to_string(m);
    EXPECT_EQ(g.dag.nodes.size(), f.dag.nodes.size());
    EXPECT_EQ(g.dag.edges, f.dag.edges);
    for (std::size_t i = 0; i < f.points.size(); ++i) {
      // The file keeps only the options some point uses, renumbered: the same options chosen.
      ASSERT_EQ(g.points[i].choice.size(), f.points[i].choice.size());
      for (std::size_t n = 0; n < f.points[i].choice.size(); ++n) {
        const auto& want = f.dag.nodes[n].options[static_cast<std::size_t>(f.points[i].choice[n])];
        const auto& got = g.dag.nodes[n].options[static_cast<std::size_t>(g.points[i].choice[n])];
        EXPECT_EQ(got.time_s, want.time_s) << to_string(m) << " point " << i << " node " << n;
        EXPECT_EQ(got.energy_j, want.energy_j) << to_string(m) << " point " << i << " node " << n;
      }
      EXPECT_EQ(g.points[i].time_s, f.points[i].time_s);
      EXPECT_EQ(g.points[i].energy_j, f.points[i].energy_j);
      const nlohmann::json a = s.planner.make_plan(f, i, "goal").to_json();
      const nlohmann::json b = ff.plan(m, i, "goal").to_json();
      EXPECT_EQ(a.dump(), b.dump()) << to_string(m) << " point " << i;
    }
  }
  EXPECT_THROW(ff.method(Method::kMegatron), InvalidInput);
}

TEST(FrontierFile, CompactChoicesNotPlans) {
  const Stored& s = stored();
  // The file's text: one top-level key per line, values compact, the same JSON.
  const std::string file_text = frontier_file_text(s.j);
  EXPECT_EQ(nlohmann::json::parse(file_text), s.j);
  EXPECT_EQ(static_cast<std::size_t>(std::count(file_text.begin(), file_text.end(), '\n')),
            s.j.size() + 2);
  const std::string text = s.j.dump();
  EXPECT_EQ(text.find("\"stages\""), std::string::npos);  // no plan inside
  const auto& k = s.j["methods"]["kareus"];
  const int pp = s.w.parallel.pp, mbs = s.w.batch.micro_batches;
  ASSERT_EQ(k["tables"].size(), static_cast<std::size_t>(2 * pp));
  // A stage's runs cover its 1F1B order (F and B of every micro-batch) exactly, in fewer
  // entries than instructions (a steady phase repeats); the tables keep fewer options than the
  // planner's (only those the points use).
  std::size_t runs = 0, instructions = 0;
  for (const auto& p : k["points"]) {
    ASSERT_EQ(p["choice"].size(), static_cast<std::size_t>(pp));
    for (std::size_t st = 0; st < p["choice"].size(); ++st) {
      int covered = 0;
      for (const auto& run : p["choice"][st]) {
        ASSERT_EQ(run.size(), 2u);
        EXPECT_GE(run[1].get<int>(), 1);
        covered += run[1].get<int>();
        ++runs;
      }
      EXPECT_EQ(covered, 2 * mbs);
      instructions += 2u * static_cast<std::size_t>(mbs);
    }
  }
  EXPECT_LT(runs, instructions);
  const auto& full = s.f.at(Method::kKareus).tables;
  std::size_t stored_options = 0, planner_options = 0;
  for (std::size_t t = 0; t < full.size(); ++t) {
    stored_options += k["tables"][t].size();
    planner_options += full[t].size();
    EXPECT_LE(k["tables"][t].size(), full[t].size());
  }
  EXPECT_LT(stored_options, planner_options);
}

TEST(FrontierFile, EditedStaleOrForeignFilesAreRefused) {
  const Stored& s = stored();
  test::TempDir tmp;
  auto refused = [&](nlohmann::json j, const std::string& name, const std::string& field,
                     const std::string& why) {
    const std::string path = tmp.write(name, j.dump());
    try {
      load_frontier_file(path);
      ADD_FAILURE() << name << ": accepted";
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ": field '" + field + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
    }
  };
  nlohmann::json edited = s.j;
  edited["methods"]["kareus"]["tables"][0][0]["time_s"] = 1e-3;
  refused(edited, "edited.json", "inputs_hash", "does not match the file's content");
  nlohmann::json opts = s.j;
  opts["planner"]["unit_s"] = 0.002;
  refused(opts, "options.json", "inputs_hash", "rerun `kareus optimize`");
  nlohmann::json old = s.j;
  old["version"] = 1;
  refused(old, "old.json", "version", "stores its tables and choices differently");
  refused(nlohmann::json::object(), "empty.json", "format", "kareus-frontier");
  // Another workload beside the frontier.
  const std::string good = tmp.write("good.json", s.j.dump());
  const FrontierFile ff = load_frontier_file(good);
  EXPECT_NO_THROW(check_frontier_workload(ff, s.w));
  try {
    check_frontier_workload(ff,
                            load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs16_seq4096")));
    ADD_FAILURE() << "another workload was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("stale or belongs to another workload"), std::string::npos)
        << e.what();
  }
}

// The peak instruction power of a plan, from its instructions alone: the highest dynamic energy
// per GPU over time plus the static power per GPU.
double peak_from_instructions(const Plan& p) {
  double peak = 0;
  for (const auto& st : p.stages) {
    for (const auto& in : st.instructions) {
      peak = std::max(peak, in.dynamic_energy_j / in.time_s + p.static_power_w);
    }
  }
  return peak;
}

// Every stored point states its average and peak instruction power, which its plan reproduces
// from its own figures; the reader requires them and refuses figures its options contradict;
// a plan without them (older files) still loads.
TEST(FrontierFile, PowerFiguresPerPointAndPlan) {
  const Stored& s = stored();
  const int gpus = s.w.cluster.gpus();
  for (const auto& [m, f] : s.f) {
    const auto& pts = s.j["methods"][to_string(m)]["points"];
    ASSERT_EQ(pts.size(), f.points.size());
    for (std::size_t i = 0; i < f.points.size(); ++i) {
      const Plan p = s.planner.make_plan(f, i, "g");
      const double avg = p.energy_j / (p.iteration_time_s * gpus);
      EXPECT_NEAR(pts[i]["avg_power_per_gpu_w"].get<double>(), avg, 1e-9 * avg);
      EXPECT_NEAR(p.avg_power_per_gpu_w, avg, 1e-9 * avg);
      const double peak = peak_from_instructions(p);
      EXPECT_NEAR(pts[i]["peak_instruction_power_w"].get<double>(), peak, 1e-9 * peak);
      EXPECT_NEAR(p.peak_instruction_power_w, peak, 1e-9 * peak);
      EXPECT_GT(peak, avg);  // the average includes the bubbles and stalls at static power
    }
  }
  // The merged points repeat their method's figures.
  for (const auto& pt : s.j["points"]) {
    const auto& own =
        s.j["methods"][pt["method"].get<std::string>()]["points"][pt["index"].get<std::size_t>()];
    EXPECT_EQ(pt["avg_power_per_gpu_w"], own["avg_power_per_gpu_w"]);
    EXPECT_EQ(pt["peak_instruction_power_w"], own["peak_instruction_power_w"]);
  }
  // Missing or contradicted figures are refused even with a matching inputs_hash.
  test::TempDir tmp;
  auto refused = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                     const std::string& why) {
    nlohmann::json j = s.j;
    edit(j);
    add_frontier_identity(j, s.w, test::read_file(test::paper_workload(kQwen)), PlannerOptions{});
    const std::string path = tmp.write(name, j.dump());
    try {
      load_frontier_file(path);
      ADD_FAILURE() << name << ": accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(
      "missing.json",
      [](nlohmann::json& j) { j["methods"]["kareus"]["points"][0].erase("avg_power_per_gpu_w"); },
      "field 'methods.kareus.points[0].avg_power_per_gpu_w': missing");
  refused(
      "contradicted.json",
      [](nlohmann::json& j) {
        j["methods"]["kareus"]["points"][1]["peak_instruction_power_w"] = 1;
      },
      "field 'methods.kareus.points[1].peak_instruction_power_w': 1: the point's energy, time and "
      "options give");
  // Version 4 files lack the figures: refused by their version.
  nlohmann::json v4 = s.j;
  v4["version"] = 4;
  try {
    load_frontier_file(tmp.write("v4.json", v4.dump()));
    ADD_FAILURE() << "version 4 accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("4 is not read by this build (it reads version 5)"),
              std::string::npos)
        << e.what();
  }
  // A plan file without the figures loads, and its summary leaves them out.
  nlohmann::json pj = s.planner.make_plan(s.f.at(Method::kKareus), 0, "g").to_json();
  ASSERT_TRUE(pj.contains("avg_power_per_gpu_w") && pj.contains("peak_instruction_power_w"));
  EXPECT_NE(plan_summary_text(Plan::from_json(pj, "p.json")).find("peak instruction"),
            std::string::npos);
  pj.erase("avg_power_per_gpu_w");
  pj.erase("peak_instruction_power_w");
  const Plan old = Plan::from_json(pj, "old.json");
  EXPECT_LT(old.avg_power_per_gpu_w, 0);
  EXPECT_LT(old.peak_instruction_power_w, 0);
  EXPECT_FALSE(old.to_json().contains("peak_instruction_power_w"));
  EXPECT_EQ(plan_summary_text(old).find("peak instruction"), std::string::npos);
  EXPECT_FALSE(plan_summary_json(old).contains("avg_power_per_gpu_w"));
  pj["peak_instruction_power_w"] = -5;
  EXPECT_THROW(Plan::from_json(pj, "bad.json"), InvalidInput);
}

TEST(FrontierMemory, BudgetIsEnforcedWithTheLimitNamed) {
  const Stored& s = stored();
  const MethodFrontier& f = s.f.at(Method::kKareus);
  // The step bound by hand: all slowest options against all fastest, in units (by time: a
  // table keeps options past its Pareto-sorted part, so position says nothing).
  std::vector<int> fast(f.dag.nodes.size(), 0), slow(f.dag.nodes.size(), 0);
  bool unsorted = false;
  for (std::size_t i = 0; i < slow.size(); ++i) {
    const auto& o = f.dag.nodes[i].options;
    for (std::size_t j = 0; j < o.size(); ++j) {
      if (o[j].time_s < o[static_cast<std::size_t>(fast[i])].time_s) fast[i] = static_cast<int>(j);
      if (o[j].time_s > o[static_cast<std::size_t>(slow[i])].time_s) slow[i] = static_cast<int>(j);
    }
    unsorted |= slow[i] != static_cast<int>(o.size()) - 1;
  }
  EXPECT_TRUE(unsorted) << "no table keeps an option past its sorted part: the case is not tested";
  const double steps = (f.dag.makespan_s(slow) - f.dag.makespan_s(fast)) / 1e-3 + 1;
  const FrontierMemory m = frontier_memory(f, 1e-3);
  EXPECT_NEAR(m.solver_steps, steps, 1e-6 * steps);
  EXPECT_GT(m.bytes, steps * static_cast<double>(f.dag.nodes.size() * sizeof(int)));
  std::size_t options = 0;
  for (const auto& t : f.tables) options += t.size();
  EXPECT_EQ(m.options, options);

  PlannerOptions o;
  o.frontier_memory_mb = m.bytes / (1024.0 * 1024.0) / 2;  // half of what it needs
  EmulatorProfiler prof(test::emulator_options(s.w.gpu_name));
  CachedProfiler cp(prof, nullptr);
  Planner tight(s.w, cp, o);
  try {
    tight.frontier(Method::kKareus);
    ADD_FAILURE() << "over the budget, accepted";
  } catch (const InvalidInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("frontier memory budget of {:g} MiB", o.frontier_memory_mb)),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--frontier-memory-mb"), std::string::npos) << what;
  }
}

TEST(HoldClocks, SequenceContinuesShorterHolds) {
  const Stored& s = stored();
  const MethodFrontier& f = s.f.at(Method::kKareus);
  const std::vector<double> holds = {0, 0.01, 0.05, 0.2, 1e300};
  for (const FrontierPoint& p : f.points) {
    for (bool faster : {true, false}) {
      const auto seq = hold_clocks_sequence(f, p.choice, holds, faster);
      ASSERT_EQ(seq.size(), holds.size());
      EXPECT_EQ(seq[0], p.choice);
      int prev_changes = 1 << 30;
      for (std::size_t k = 0; k < holds.size(); ++k) {
        EXPECT_EQ(seq[k], hold_clocks(f, p.choice, holds[k], faster)) << "hold " << holds[k];
        int changes = 0;
        for (int c : schedule_with_switches(f, seq[k], 0.015).clock_changes) changes += c;
        EXPECT_LE(changes, prev_changes);
        prev_changes = changes;
      }
    }
  }
}

TEST(DagNodeKind, NamesAndCounts) {
  const Stored& s = stored();
  const MethodFrontier& f = s.f.at(Method::kKareus);
  std::map<DagNodeKind, int> n;
  for (const auto& node : f.dag.nodes) ++n[node.instruction];
  const int pp = s.w.parallel.pp, mbs = s.w.batch.micro_batches;
  EXPECT_EQ(n[DagNodeKind::kForward], pp * mbs);
  EXPECT_EQ(n[DagNodeKind::kBackward], pp * mbs);
  EXPECT_EQ(n[DagNodeKind::kP2p], 2 * (pp - 1) * mbs);
  EXPECT_STREQ(to_string(DagNodeKind::kIteration), "iteration");
  EXPECT_EQ(dag_node_kind(InstructionKind::kBackward), DagNodeKind::kBackward);
  EXPECT_EQ(dag_to_json(f.dag)["nodes"][0]["instruction"], "forward");
}

// Out-of-range fields are refused by the parser itself, so `plan show` without a workload
// refuses them too.
TEST(PlanFile, OutOfRangeFieldsAreRefusedWithoutAWorkload) {
  const Stored& s = stored();
  const nlohmann::json good = s.planner.make_plan(s.f.at(Method::kKareus), 0, "g").to_json();
  const auto& ins = good["stages"][1]["instructions"];
  const std::string key = ins[3]["partitions"].begin().key();
  const std::string part = "stages[1].instructions[3].partitions." + key;
  const std::vector<std::tuple<std::string, std::function<void(nlohmann::json&)>, std::string>>
      cases = {
          {part + ".sms",
           [&](nlohmann::json& j) {
             j["stages"][1]["instructions"][3]["partitions"][key]["sms"] = -1;
           },
           "-1: allowed 0 (the copy engines, where the collective allows them) or 1..32"},
          {part + ".sms",
           [&](nlohmann::json& j) {
             j["stages"][1]["instructions"][3]["partitions"][key]["sms"] = 1000;
           },
           "1000: allowed 0 (the copy engines, where the collective allows them) or 1..32"},
          {part + ".instances",
           [&](nlohmann::json& j) {
             j["stages"][1]["instructions"][3]["partitions"][key]["instances"] = -2;
           },
           "-2: must be >= 0"},
          {"stages[0].instructions[1].microbatch",
           [](nlohmann::json& j) { j["stages"][0]["instructions"][1]["microbatch"] = -1; },
           "-1: must be >= 0"},
          {"stages[0].clock_changes",
           [](nlohmann::json& j) { j["stages"][0]["clock_changes"] = -3; }, "-3: must be >= 0"},
          {"workload.gpus", [](nlohmann::json& j) { j["workload"]["gpus"] = 0; },
           "0: must be >= 1"},
          {"parallel.tp", [](nlohmann::json& j) { j["parallel"]["tp"] = 0; }, "0: must be >= 1"},
      };
  for (const auto& [field, edit, why] : cases) {
    nlohmann::json j = good;
    edit(j);
    try {
      Plan::from_json(j, "p.json");
      ADD_FAILURE() << field << ": accepted";
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("p.json: field '" + field + "': " + why), std::string::npos) << what;
    }
  }
}

// `plan --from` after `optimize` writes the plan a fresh `plan` writes, for every goal, and
// refuses a foreign workload and planning flags.
TEST(PlanFrom, SamePlanAsRecomputingAndClearErrors) {
  test::TempDir tmp;
  const std::string wl = test::paper_workload(kQwen);
  const std::string db = " --quiet --db " + tmp.file("p.db");
  const auto opt = test::run_cli("optimize " + wl + " --out " + tmp.file("out") + db);
  ASSERT_EQ(opt.exit_code, 0) << opt.err;
  const std::string fj = tmp.file("out") + "/frontier.json";
  const auto j = nlohmann::json::parse(test::read_file(fj));
  const auto& pts = j["methods"]["kareus"]["points"];
  const double mid = pts[pts.size() / 2]["iteration_time_s"].get<double>();
  const std::string goals[] = {"--max-throughput", "--min-energy",
                               fmt::format("--deadline {:.17g}", mid * 1.0001),
                               "--energy-budget 1e12", "--method perseus --min-energy"};
  int k = 0;
  for (const std::string& g : goals) {
    const std::string a = tmp.file(fmt::format("a{}.json", k)),
                      b = tmp.file(fmt::format("b{}.json", k));
    ++k;
    const auto fresh = test::run_cli("plan " + wl + " " + g + " --out " + a + db);
    ASSERT_EQ(fresh.exit_code, 0) << g << fresh.err;
    const auto from = test::run_cli("plan --from " + fj + " " + g + " --out " + b + " --quiet");
    ASSERT_EQ(from.exit_code, 0) << g << from.err;
    EXPECT_EQ(test::read_file(a), test::read_file(b)) << g;
    EXPECT_EQ(fresh.out.substr(fresh.out.find(':')), from.out.substr(from.out.find(':'))) << g;
  }
  // With the workload file beside it: checked, then the same plan.
  EXPECT_EQ(
      test::run_cli("plan " + wl + " --from " + fj + " --min-energy --out " + tmp.file("c.json"))
          .exit_code,
      0);
  const auto other = test::run_cli("plan " + test::paper_workload("qwen3-1.7b_tp8_mbs16_seq4096") +
                                   " --from " + fj + " --min-energy --out " + tmp.file("d.json"));
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_NE(other.err.find("stale or belongs to another workload"), std::string::npos) << other.err;
  const auto flag =
      test::run_cli("plan --from " + fj + " --min-energy --unit 0.002 --out " + tmp.file("e.json"));
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("--unit: not used with --from"), std::string::npos) << flag.err;
  const auto late =
      test::run_cli("plan --from " + fj + " --deadline 0.001 --out " + tmp.file("f.json"));
  EXPECT_EQ(late.exit_code, 2);
  EXPECT_NE(late.err.find("infeasible"), std::string::npos) << late.err;

  // Re-planning around a straggler: the plan records the slowdown, the emulator's replay with it
  // gives the plan's own prediction (to the replay's error), and a deadline that can no longer be
  // met takes the fastest plan with a warning, exit 0.
  const std::string r = tmp.file("r.json");
  const auto re = test::run_cli("plan --from " + fj + " --max-throughput --stage-slowdown 1=1.1" +
                                " --out " + r + " --json");
  ASSERT_EQ(re.exit_code, 0) << re.err;
  EXPECT_NE(re.err.find("re-planned for stage slowdown 1=1.100"), std::string::npos) << re.err;
  const auto rj = nlohmann::json::parse(test::read_file(r));
  EXPECT_EQ(rj["stage_slowdown"], nlohmann::json::parse("[1.0, 1.1]"));
  EXPECT_EQ(nlohmann::json::parse(re.out)["stage_slowdown"], rj["stage_slowdown"]);
  const auto rep =
      test::run_cli("emulate " + wl + " --plan " + r + " --stage-slowdown 1=1.1 --json");
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  EXPECT_NEAR(nlohmann::json::parse(rep.out)["iteration_time_s"].get<double>(),
              rj["iteration_time_s"].get<double>(), 0.005 * rj["iteration_time_s"].get<double>());
  const double fastest = pts[0]["iteration_time_s"].get<double>();
  const auto miss = test::run_cli(fmt::format(
      "plan --from {} --deadline {:.17g} --stage-slowdown 0=1.2 --out {}", fj, fastest * 1.01, r));
  EXPECT_EQ(miss.exit_code, 0) << miss.err;
  EXPECT_NE(miss.err.find("cannot be met under the slowdown"), std::string::npos) << miss.err;
  for (const std::string bad :
       {"--stage-slowdown 2=1.1", "--stage-slowdown 1=0.9", "--stage-slowdown 1"}) {
    const auto e = test::run_cli("plan --from " + fj + " --max-throughput " + bad + " --out " + r);
    EXPECT_EQ(e.exit_code, 2) << bad;
    EXPECT_NE(e.err.find("STAGE=FACTOR"), std::string::npos) << e.err;
  }
  const auto no_from =
      test::run_cli("plan " + wl + " --max-throughput --stage-slowdown 1=1.1 --out " + r + db);
  EXPECT_EQ(no_from.exit_code, 2);
  EXPECT_NE(no_from.err.find("needs --from"), std::string::npos) << no_from.err;
}

}  // namespace
}  // namespace kareus
