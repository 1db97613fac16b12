// docs/formats.md documents every machine-readable output key by key: each output has a table
// after a `<!-- keys: NAME -->` marker whose first column is the key path (`a.b` a nested key,
// `a[].b` a key of every element of array `a`, `*` any key of a map whose keys are names such
// as partition keys). A row whose unit column reads `see NAME` holds a value documented by table
// NAME (a plan inside frontier --json). This test runs the real binary on small inputs and checks
// that the documented key paths are exactly the emitted ones, recursively; a row whose meaning
// starts with "Only" may be absent from these runs (it appears only with some flags).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "fakes/fake_nvml_util.h"
#include "kareus/monitor.h"
#include "kareus/plan.h"
#include "test_util.h"

namespace kareus {
namespace {

struct Row {
  std::string ref;  ///< "see NAME" target, or empty
  bool optional = false;
};
using Table = std::map<std::string, Row>;  // key path -> row

std::map<std::string, Table> documented_tables() {
  const std::string doc = test::read_file(test::source_path("docs/formats.md"));
  std::map<std::string, Table> tables;
  std::stringstream ss(doc);
  std::string line, current;
  bool in_table = false;
  const std::regex marker("^<!-- keys: (.+) -->$");
  const std::regex row("^\\| (`[^|]+) \\| ([^|]*) \\| (.*)\\|$");
  while (std::getline(ss, line)) {
    std::smatch m;
    if (std::regex_match(line, m, marker)) {
      current = m[1];
      EXPECT_FALSE(tables.count(current)) << "two tables named " << current;
      tables[current];
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty() || line[0] != '|') {
      if (!tables[current].empty()) in_table = false;
      continue;
    }
    if (std::regex_match(line, m, row)) {
      Row r;
      const std::string unit = m[2];
      if (unit.rfind("see ", 0) == 0) r.ref = unit.substr(4, unit.find_last_not_of(' ') - 3);
      r.optional = std::string(m[3]).rfind("Only", 0) == 0;
      // A cell may list several keys: `a`, `b`.
      const std::string cell = line.substr(2, line.find(" | ") - 2);
      const std::regex key("`([^`]+)`");
      for (auto it = std::sregex_iterator(cell.begin(), cell.end(), key);
           it != std::sregex_iterator(); ++it) {
        tables[current][(*it)[1]] = r;
      }
    }
  }
  return tables;
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  std::stringstream ss(p);
  for (std::string s; std::getline(ss, s, '.');) parts.push_back(s);
  return parts;
}

/// Whether a documented path (with `*` segments) matches an emitted one.
bool matches(const std::string& pattern, const std::string& path) {
  const auto a = split_path(pattern), b = split_path(path);
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (a[i] == "*" && b[i].find("[]") == std::string::npos) continue;
    if (a[i] == "*[]" && b[i].size() > 2 && b[i].substr(b[i].size() - 2) == "[]") continue;
    return false;
  }
  return true;
}

class KeyChecker {
 public:
  explicit KeyChecker(std::map<std::string, Table> tables) : tables_(std::move(tables)) {}

  /// Collects the key paths of `j` under table `name`.
  void add(const std::string& name, const nlohmann::json& j) {
    ASSERT_TRUE(tables_.count(name))
        << "docs/formats.md has no table <!-- keys: " << name << " -->";
    checked_.insert(name);
    walk(name, j, "");
  }

  /// Compares what was collected with the tables.
  void verify() const {
    for (const auto& name : checked_) {
      const Table& t = tables_.at(name);
      std::set<std::string> used;
      const auto it = emitted_.find(name);
      for (const auto& path : it == emitted_.end() ? std::set<std::string>{} : it->second) {
        const std::string* pattern = find(t, path);
        if (!pattern) {
          ADD_FAILURE() << name << ": emitted key '" << path
                        << "' is not documented in docs/formats.md";
        } else {
          used.insert(*pattern);
        }
      }
      for (const auto& [pattern, row] : t) {
        if (!used.count(pattern) && !row.optional) {
          ADD_FAILURE() << name << ": documented key '" << pattern << "' was not emitted";
        }
      }
    }
  }

 private:
  static const std::string* find(const Table& t, const std::string& path) {
    if (t.count(path)) return &t.find(path)->first;
    for (const auto& [pattern, row] : t) {
      if (matches(pattern, path)) return &pattern;
    }
    return nullptr;
  }

  void walk(const std::string& name, const nlohmann::json& j, const std::string& prefix) {
    if (j.is_array()) {
      for (const auto& e : j) walk(name, e, prefix + "[]");
      return;
    }
    if (!j.is_object()) return;
    for (const auto& [k, v] : j.items()) {
      const std::string path = prefix.empty() ? k : prefix + "." + k;
      emitted_[name].insert(path);
      const Table& t = tables_.at(name);
      const std::string* pattern = find(t, path);
      if (pattern && !t.at(*pattern).ref.empty()) {
        const std::string ref = t.at(*pattern).ref;
        if (v.is_array()) {
          for (const auto& e : v) add(ref, e);
        } else {
          add(ref, v);
        }
        continue;
      }
      walk(name, v, path);
    }
  }

  std::map<std::string, Table> tables_;
  std::map<std::string, std::set<std::string>> emitted_;
  std::set<std::string> checked_;
};

nlohmann::json run_json(const std::string& args) {
  const auto r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << args << ": not JSON: " << e.what() << "\n" << r.out.substr(0, 500);
    return nullptr;
  }
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(test::read_file(path));
}

TEST(Formats, DocumentedKeysAreExactlyTheEmittedOnes) {
  const std::string llama = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const std::string qwen = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  test::TempDir tmp;
  const std::string fast = " --budget 16 --quiet";
  KeyChecker c(documented_tables());

  c.add("workload show --json", run_json("workload show " + llama + " --json"));
  // A mixture of experts adds grouped GEMMs and all-to-alls.
  c.add("workload show --json",
        run_json("workload show " +
                 test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml") + " --json"));
  c.add("profile --json", run_json("profile " + llama +
                                   " --partition fwd_attn --freq 1410 --sms 24 --slot norm "
                                   "--json"));
  c.add("profile --sweep --json",
        run_json("profile " + llama + " --sweep --partition fwd_mlp --quiet --json --db " +
                 tmp.file("s.db")));
  const std::string points =
      tmp.write("points.csv", "partition,freq_mhz,sms,slot\nfwd_mlp,1410,9,norm\n");
  for (const auto& row : run_json("profile " + llama + " --points " + points + " --json")) {
    c.add("profile --points --json", row);  // an array of rows
  }
  c.add("profile --points --append --json",
        run_json("profile " + llama + " --points " + points + " --append " + tmp.file("trace.csv") +
                 " --json"));
  c.add("profile --static-power --json", run_json("profile " + llama + " --static-power --json"));
  c.add("search --json", run_json("search " + llama + " --partition fwd_mlp --json" + fast));
  c.add("search --json",
        run_json("search " + llama + " --partition fwd_mlp --json --screen-window-s 2" + fast));
  c.add("frontier --json",
        run_json("frontier " + qwen + " --json" + fast + " --dump-dag " + tmp.file("dag.json")));
  c.add("frontier --dump-dag", read_json(tmp.file("dag.json")));
  c.add("plan --json", run_json("plan " + qwen + " --max-throughput --json --out " +
                                tmp.file("plan.json") + fast));
  c.add("plan", read_json(tmp.file("plan.json")));
  c.add("plan show --json", run_json("plan show " + tmp.file("plan.json") + " --json"));
  // Data-parallel collectives appear in plans of jobs with dp > 1.
  const std::string dp = test::source_path("workloads/examples/llama3.2-3b_h100_tp4_sp_dp2.yaml");
  run_json("plan " + dp + " --max-throughput --json --out " + tmp.file("dp.json") + fast);
  c.add("plan", read_json(tmp.file("dp.json")));
  c.add("emulate --json", run_json("emulate " + qwen + " --schedule nanobatch --json"));
  c.add("emulate --json",
        run_json("emulate " + qwen + " --plan " + tmp.file("plan.json") + " --json"));
  c.add("calibrate --json", run_json("calibrate --no-fit --json"));  // a fit emits the same keys
  c.add("calibrate --artifact --json",
        run_json("calibrate --artifact-csv " +
                 test::source_path("data/calibration/artifact_frontiers.csv") +
                 " --only qwen3-1.7b_tp8_mbs8_seq4096 --quiet --json"));
  // eval --json is an array of evaluations; optimize --json and frontier.json are an
  // evaluation with more keys, documented in their own tables.
  const auto suite = tmp.path() + "/suite";
  std::filesystem::create_directories(suite);
  std::filesystem::copy_file(qwen, suite + "/q.yaml");
  const nlohmann::json ev = run_json("eval --suite " + suite + " --json" + fast);
  ASSERT_TRUE(ev.is_array() && ev.size() == 1u) << ev.dump().substr(0, 200);
  c.add("evaluation", ev[0]);
  // Screening, clock completion and focus rounds add per-partition counts.
  const nlohmann::json screened = run_json(
      "eval --suite " + suite +
      " --json --screen-window-s 2 --complete-clocks --focus-rounds 1 --focus-points 1" + fast);
  if (screened.is_array() && !screened.empty()) c.add("evaluation", screened[0]);
  auto add_evaluation = [&](const std::string& name, nlohmann::json j) {
    nlohmann::json extra = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end();) {
      if (ev[0].contains(it.key())) {
        ++it;
      } else {
        extra[it.key()] = it.value();
        it = j.erase(it);
      }
    }
    c.add("evaluation", j);
    c.add(name, extra);
  };
  add_evaluation("optimize --json",
                 run_json("optimize " + qwen + " --json --out " + tmp.file("opt") + fast));
  add_evaluation("frontier.json", read_json(tmp.file("opt/frontier.json")));
  // A re-plan around a straggler: the plan records the slowdown; a deadline the slowed frontier
  // cannot meet adds the re-plan's note.
  const std::string fj = tmp.file("opt/frontier.json");
  c.add("plan --json", run_json("plan --from " + fj + " --max-throughput --stage-slowdown 1=1.1" +
                                " --json --out " + tmp.file("re.json")));
  c.add("plan", read_json(tmp.file("re.json")));
  c.add("plan show --json", run_json("plan show " + tmp.file("re.json") + " --json"));
  c.add("plan --json", run_json("plan --from " + fj + " --deadline 0.5 --stage-slowdown 1=1.5" +
                                " --json --out " + tmp.file("re2.json")));
  c.verify();
}

TEST(Formats, MonitorRecordsAndMergeAreDocumentedKeyByKey) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "5000000,1000,3000,3500,9000,9100,9800,12000");
  KeyChecker c(documented_tables());
  test::TempDir tmp;
  const std::string wl = test::source_path("tests/runtime/data/tiny_tp2_pp2.yaml");
  const std::string plan = tmp.file("plan.json");
  ASSERT_EQ(test::run_cli("plan " + wl + " --max-throughput --quiet --out " + plan).exit_code, 0);
  // Rank 0 with energy, a plan, tokens and per-instruction records (the first iteration's
  // counter goes down: a note); rank 1 times only.
  for (const int rank : {0, 1}) {
    runtime::MonitorOptions o;
    o.rank = rank;
    o.nvml = rank == 0;
    o.nvml_library = env.library();
    o.per_instruction = true;
    o.out_path = tmp.file(fmt::format("rank{}.jsonl", rank));
    if (rank == 0) {
      o.prediction = runtime::MonitorPrediction::from_plan(load_plan(plan), 0, plan);
      o.tokens_per_iteration = 256;
    }
    runtime::EnergyMonitor m(o);
    for (int i = 0; i < 2; ++i) {
      m.begin_iteration();
      m.begin_instruction(InstructionKind::kForward, 0);
      m.end_instruction(InstructionKind::kForward, 0);
      m.end_iteration();
    }
    m.close();
    const std::map<std::string, std::string> tables = {
        {"iteration", "monitor iteration record"},
        {"instruction", "monitor instruction record"},
        {"summary", "monitor summary record"}};
    for (const auto& line : m.records()) {
      const auto j = nlohmann::json::parse(line);
      c.add(tables.at(j["record"]), j);
    }
  }
  const std::string files = tmp.file("rank0.jsonl") + " " + tmp.file("rank1.jsonl");
  c.add("monitor merge --json", run_json("monitor merge " + files + " --json"));
  c.add("monitor merge --json",
        run_json("monitor merge " + files + " --json --plan " + plan + " --workload " + wl));
  c.verify();
}

}  // namespace
}  // namespace kareus
