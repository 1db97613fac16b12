// frontier.json in compact form (include/kareus/frontier_file.h): option tables once per (stage,
// kind), points as choices of table rows, a hash over everything a plan is made from. Loading
// rebuilds each method's iteration DAG with build_iteration_dag, which is a pure function of the
// stored tables and the workload, so materialize_plan gives the plan a fresh run would.
#include "kareus/frontier_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kareus/error.h"
#include "kareus/hash.h"

namespace kareus {
namespace {

constexpr Method kMethods[] = {Method::kKareus,           Method::kKareusMaxClock,
                               Method::kNanobatchPerseus, Method::kNanobatch,
                               Method::kPerseus,          Method::kMegatron};

nlohmann::json option_to_json(const InstructionOption& o) {
  nlohmann::json j = {
      {"freq_mhz", o.freq_mhz}, {"time_s", o.time_s}, {"dynamic_energy_j", o.dynamic_energy_j}};
  if (o.sequential) j["sequential"] = true;
  if (!o.partitions.empty()) {
    for (const auto& [key, c] : o.partitions) j["partitions"][key] = {c.sms, c.slot};
  }
  for (const auto& [key, shares] : o.mixes) {
    for (const auto& sh : shares) {
      j["mixes"][key].push_back({sh.config.sms, sh.config.slot, sh.instances});
    }
  }
  return j;
}

// Choices of the instruction nodes, per stage in node order (execution order), run-length encoded
// as [option, count] pairs, options renumbered by `index` (per table: old index -> stored index);
// the other nodes have one option.
nlohmann::json choice_to_json(const MethodFrontier& f, const std::vector<int>& choice,
                              const std::vector<std::vector<int>>& index) {
  nlohmann::json per_stage = nlohmann::json::array();
  for (std::size_t i = 0; i < f.dag.nodes.size(); ++i) {
    const int t = f.node_table[i];
    if (t < 0) continue;
    const auto s = static_cast<std::size_t>(f.dag.nodes[i].stage);
    while (per_stage.size() <= s) per_stage.push_back(nlohmann::json::array());
    const int c = index[static_cast<std::size_t>(t)][static_cast<std::size_t>(choice[i])];
    auto& runs = per_stage[s];
    if (!runs.empty() && runs.back()[0].get<int>() == c) {
      runs.back()[1] = runs.back()[1].get<int>() + 1;
    } else {
      runs.push_back({c, 1});
    }
  }
  return per_stage;
}

std::string identity_text(const nlohmann::json& j) {
  std::string text;
  for (const char* key : {"workload_file", "planner", "methods", "points"}) {
    text += key;
    text += '=';
    text += j.contains(key) ? j[key].dump() : "null";
    text += '\n';
  }
  return text;
}

std::string inputs_hash(const nlohmann::json& j) {
  return fmt::format("{:016x}", fnv1a(identity_text(j)));
}

// Typed access that names the file and the JSON path of a bad field.
class Fields {
 public:
  explicit Fields(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw InvalidInput(fmt::format("{}: field '{}': {}", source_, path, what));
  }
  const nlohmann::json& at(const nlohmann::json& j, const std::string& key,
                           const std::string& path) const {
    const std::string p = path.empty() ? key : path + "." + key;
    if (!j.is_object() || !j.contains(key)) fail(p, "missing");
    return j[key];
  }
  template <typename T>
  T get(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const nlohmann::json& v = at(j, key, path);
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(path.empty() ? key : path + "." + key, "wrong type");
    }
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

InstructionOption option_from_json(const Fields& r, const nlohmann::json& j,
                                   const std::string& path) {
  InstructionOption o;
  o.freq_mhz = r.get<int>(j, "freq_mhz", path);
  o.time_s = r.get<double>(j, "time_s", path);
  o.dynamic_energy_j = r.get<double>(j, "dynamic_energy_j", path);
  if (j.contains("sequential")) o.sequential = r.get<bool>(j, "sequential", path);
  try {
    if (j.contains("partitions")) {
      for (const auto& [key, v] : j["partitions"].items()) {
        o.partitions[key] = {o.freq_mhz, v.at(0).get<int>(), v.at(1).get<std::string>()};
      }
    }
    if (j.contains("mixes")) {
      for (const auto& [key, shares] : j["mixes"].items()) {
        for (const auto& v : shares) {
          o.mixes[key].push_back(
              {{o.freq_mhz, v.at(0).get<int>(), v.at(1).get<std::string>()}, v.at(2).get<int>()});
        }
      }
    }
  } catch (const nlohmann::json::exception&) {
    r.fail(path, "partitions/mixes: expected [sms, slot] and [sms, slot, instances] entries");
  }
  return o;
}

std::vector<int> choice_from_json(const Fields& r, const MethodFrontier& f, const nlohmann::json& j,
                                  const std::string& path) {
  std::vector<int> choice(f.dag.nodes.size(), 0);
  // Per stage: the run being read and how many of its instructions are used up.
  std::vector<std::size_t> run, used, k_of;
  for (std::size_t i = 0; i < f.dag.nodes.size(); ++i) {
    const int t = f.node_table[i];
    if (t < 0) continue;
    const auto s = static_cast<std::size_t>(f.dag.nodes[i].stage);
    if (run.size() <= s) {
      run.resize(s + 1, 0);
      used.resize(s + 1, 0);
      k_of.resize(s + 1, 0);
    }
    const std::size_t k = k_of[s]++;
    auto entry_ok = [&](std::size_t r_) {
      return j.is_array() && s < j.size() && j[s].is_array() && r_ < j[s].size() &&
             j[s][r_].is_array() && j[s][r_].size() == 2 && j[s][r_][0].is_number_integer() &&
             j[s][r_][1].is_number_integer() && j[s][r_][1].get<int>() >= 1;
    };
    if (entry_ok(run[s]) && used[s] == static_cast<std::size_t>(j[s][run[s]][1].get<int>())) {
      ++run[s];
      used[s] = 0;
    }
    if (!entry_ok(run[s])) {
      r.fail(path, fmt::format("no [option, count] run covers instruction {} of stage {}", k, s));
    }
    const int c = j[s][run[s]][0].get<int>();
    ++used[s];
    if (c < 0 || static_cast<std::size_t>(c) >= f.tables[static_cast<std::size_t>(t)].size()) {
      r.fail(fmt::format("{}[{}][{}]", path, s, run[s]),
             fmt::format("{}: allowed 0..{}", c, f.tables[static_cast<std::size_t>(t)].size() - 1));
    }
    choice[i] = c;
  }
  for (std::size_t s = 0; s < run.size(); ++s) {
    const bool exact = j[s].size() == run[s] + 1 &&
                       used[s] == static_cast<std::size_t>(j[s][run[s]][1].get<int>());
    if (!exact)
      r.fail(fmt::format("{}[{}]", path, s),
             "the runs cover more instructions than "
             "the stage has");
  }
  return choice;
}

double avg_power(const MethodFrontier& f, const FrontierPoint& p) {
  return average_power_per_gpu_w(p.energy_j, p.time_s, f.dag.gpus);
}

// A point's stored power figure must be what its time, energy and options give: they are
// derived, so a file whose figures disagree was written by a build that computes them otherwise.
void check_power(const Fields& r, const nlohmann::json& point, const std::string& path,
                 const std::string& key, double expected) {
  const auto stored = r.get<double>(point, key, path);
  if (!(std::abs(stored - expected) <= 1e-9 * std::abs(expected))) {
    r.fail(path + "." + key,
           fmt::format("{}: the point's energy, time and options give {}: the frontier is stale; "
                       "rerun `kareus optimize`",
                       stored, expected));
  }
}

MethodFrontier method_frontier_from_json(const Fields& r, const nlohmann::json& j,
                                         const std::string& path, Method m, const Workload& w,
                                         const PartitionSet& ps) {
  MethodFrontier f;
  f.method = m;
  const auto ex = r.get<std::string>(j, "execution", path);
  if (ex != "overlapped" && ex != "sequential") {
    r.fail(path + ".execution", fmt::format("'{}': allowed: overlapped, sequential", ex));
  }
  f.execution = ex == "overlapped" ? ExecutionMode::kOverlapped : ExecutionMode::kSequential;
  f.dag.static_power_w = r.get<double>(j, "static_power_w", path);
  f.dag.gpus = r.get<int>(j, "gpus", path);
  f.clock_switch_s = r.get<double>(j, "clock_switch_s", path);
  f.min_clock_hold_s = r.get<double>(j, "min_clock_hold_s", path);
  const auto p2p = r.get<std::vector<double>>(j, "p2p", path);
  if (p2p.size() != 2) r.fail(path + ".p2p", "expected [time_s, dynamic_energy_j]");
  f.p2p = {p2p[0], p2p[1]};
  for (const char* key : {"reductions", "dp_grad", "dp_gather"}) {
    auto& runs = std::string_view(key) == "reductions" ? f.reductions
                 : std::string_view(key) == "dp_grad"  ? f.dp_grad
                                                       : f.dp_gather;
    for (const auto& v : r.get<std::vector<std::vector<double>>>(j, key, path)) {
      if (v.size() != 2) {
        r.fail(path + "." + key, "expected [time_s, dynamic_energy_j] entries");
      }
      runs.push_back({v[0], v[1]});
    }
  }
  if (f.dp_grad.size() != ps.dp_grad_overlaps.size() ||
      f.dp_gather.size() != ps.dp_param_gathers.size()) {
    r.fail(path + ".dp_grad",
           fmt::format("expected {} and {} data-parallel costs for the workload (dp_grad, "
                       "dp_gather)",
                       ps.dp_grad_overlaps.size(), ps.dp_param_gathers.size()));
  }
  const auto& tables = r.at(j, "tables", path);
  const int vstages = w.parallel.virtual_stages();
  if (!tables.is_array() || tables.size() != 2 * static_cast<std::size_t>(vstages) ||
      f.reductions.size() != ps.iteration_segments.size()) {
    r.fail(path + ".tables",
           fmt::format("expected 2 x pp x virtual_pipeline = {} option tables for the workload",
                       2 * vstages));
  }
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const std::string tp = fmt::format("{}.tables[{}]", path, t);
    if (!tables[t].is_array() || tables[t].empty()) r.fail(tp, "expected a non-empty array");
    f.tables.emplace_back();
    for (std::size_t k = 0; k < tables[t].size(); ++k) {
      f.tables.back().push_back(option_from_json(r, tables[t][k], fmt::format("{}[{}]", tp, k)));
    }
  }
  build_iteration_dag(w, ps, f);
  const auto& points = r.at(j, "points", path);
  for (std::size_t k = 0; k < points.size(); ++k) {
    const std::string pp = fmt::format("{}.points[{}]", path, k);
    FrontierPoint p;
    p.time_s = r.get<double>(points[k], "iteration_time_s", pp);
    p.energy_j = r.get<double>(points[k], "energy_j", pp);
    p.dynamic_energy_j = r.get<double>(points[k], "dynamic_energy_j", pp);
    p.choice = choice_from_json(r, f, r.at(points[k], "choice", pp), pp + ".choice");
    check_power(r, points[k], pp, "avg_power_per_gpu_w", avg_power(f, p));
    check_power(r, points[k], pp, "peak_instruction_power_w",
                peak_instruction_power_w(f, p.choice));
    f.points.push_back(std::move(p));
  }
  return f;
}

nlohmann::json planner_to_json(const PlannerOptions& o) {
  return {{"strategy", o.strategy},
          {"budget", o.search.budget},
          {"seed", o.search.seed},
          // The schedule and the stop rule decide which points were measured.
          {"initial_points", o.search.initial_points},
          {"batch_size", o.search.batch_size},
          {"stop_threshold", o.search.stop_threshold},
          {"stop_patience", o.search.stop_patience},
          {"unit_s", o.unit_s},
          {"per_layer", o.per_layer},
          {"freqs_mhz", o.freqs_mhz},
          {"clock_switch_s", o.clock_switch_s},
          {"min_clock_hold_s", o.min_clock_hold_s},
          // What the searches knew before measuring: a frontier planned with a warm start or
          // the emulator as prior is not the cold-start one.
          {"prior", o.search.prior ? o.search.prior->name() : std::string("none")},
          {"clock_completion", o.clock_completion},
          {"smooth_sweeps", o.smooth_sweeps},
          {"sweep_stride", o.sweep_stride},
          // Plan-directed profiling: the clocks focused on decide which points were measured.
          {"focus_rounds", o.focus_rounds},
          {"focus_points_per_clock", o.focus_points_per_clock},
          {"focus_clocks_mhz", o.focus_clocks_mhz}};
}

}  // namespace

nlohmann::json method_frontier_to_json(const MethodFrontier& f) {
  nlohmann::json j = {
      {"execution", f.execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential"},
      {"static_power_w", f.dag.static_power_w},
      {"gpus", f.dag.gpus},
      {"clock_switch_s", f.clock_switch_s},
      {"min_clock_hold_s", f.min_clock_hold_s},
      {"p2p", {f.p2p.time_s, f.p2p.dynamic_energy_j}},
      {"reductions", nlohmann::json::array()},
      {"dp_grad", nlohmann::json::array()},
      {"dp_gather", nlohmann::json::array()},
      {"tables", nlohmann::json::array()},
      {"points", nlohmann::json::array()}};
  for (const auto& r : f.reductions) j["reductions"].push_back({r.time_s, r.dynamic_energy_j});
  for (const auto& r : f.dp_grad) j["dp_grad"].push_back({r.time_s, r.dynamic_energy_j});
  for (const auto& r : f.dp_gather) j["dp_gather"].push_back({r.time_s, r.dynamic_energy_j});
  // Only the options some point uses, in table order; index[t][old] is the stored index.
  std::vector<std::vector<int>> index(f.tables.size());
  for (std::size_t t = 0; t < f.tables.size(); ++t) index[t].assign(f.tables[t].size(), -1);
  for (const auto& p : f.points) {
    for (std::size_t i = 0; i < p.choice.size(); ++i) {
      const int t = f.node_table[i];
      if (t >= 0) index[static_cast<std::size_t>(t)][static_cast<std::size_t>(p.choice[i])] = 0;
    }
  }
  for (std::size_t t = 0; t < f.tables.size(); ++t) {
    nlohmann::json table = nlohmann::json::array();
    int next = 0;
    for (std::size_t o = 0; o < f.tables[t].size(); ++o) {
      // A table nobody uses (no points) keeps its first option, so it is never empty.
      if (index[t][o] < 0 && !(o == 0 && f.points.empty())) continue;
      index[t][o] = next++;
      table.push_back(option_to_json(f.tables[t][o]));
    }
    j["tables"].push_back(std::move(table));
  }
  for (const auto& p : f.points) {
    j["points"].push_back({{"iteration_time_s", p.time_s},
                           {"energy_j", p.energy_j},
                           {"dynamic_energy_j", p.dynamic_energy_j},
                           {"avg_power_per_gpu_w", avg_power(f, p)},
                           {"peak_instruction_power_w", peak_instruction_power_w(f, p.choice)},
                           {"choice", choice_to_json(f, p.choice, index)}});
  }
  return j;
}

nlohmann::json frontiers_to_json(const std::map<Method, MethodFrontier>& f,
                                 const std::vector<FrontierRef>& merged) {
  nlohmann::json j;
  j["methods"] = nlohmann::json::object();
  // A method that plans exactly as another (one nano-batch: Kareus and Nanobatching+Perseus plan
  // as Perseus) is stored once; the others name it.
  std::vector<std::pair<std::string, nlohmann::json>> written;
  for (const auto& [m, mf] : f) {
    nlohmann::json mj = method_frontier_to_json(mf);
    std::string same;
    for (const auto& [name, other] : written) {
      if (other == mj) {
        same = name;
        break;
      }
    }
    if (same.empty()) {
      j["methods"][to_string(m)] = mj;
      written.emplace_back(to_string(m), std::move(mj));
    } else {
      j["methods"][to_string(m)] = {{"same_as", same}};
    }
  }
  j["points"] = nlohmann::json::array();
  for (const FrontierRef& r : merged) {
    const MethodFrontier& mf = f.at(r.method);
    const FrontierPoint& p = mf.points.at(r.index);
    j["points"].push_back({{"iteration_time_s", p.time_s},
                           {"energy_j", p.energy_j},
                           {"avg_power_per_gpu_w", avg_power(mf, p)},
                           {"peak_instruction_power_w", peak_instruction_power_w(mf, p.choice)},
                           {"method", to_string(r.method)},
                           {"index", r.index}});
  }
  return j;
}

void add_frontier_identity(nlohmann::json& j, const Workload& w, const std::string& workload_yaml,
                           const PlannerOptions& o) {
  j["format"] = kFrontierFormat;
  j["version"] = kFrontierVersion;
  j["workload_file"] = {
      {"source", w.source}, {"yaml", workload_yaml}, {"digest", workload_digest(w)}};
  j["planner"] = planner_to_json(o);
  j["inputs_hash"] = inputs_hash(j);
}

std::string frontier_file_text(const nlohmann::json& j) {
  if (!j.is_object()) return j.dump() + "\n";
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : j.items()) {
    out += first ? "\n" : ",\n";
    first = false;
    out += nlohmann::json(key).dump() + ": " + value.dump();
  }
  return out + "\n}\n";
}

const MethodFrontier& FrontierFile::method(Method m) const {
  auto it = methods.find(m);
  if (it != methods.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [k, v] : methods) names.push_back(to_string(k));
  throw InvalidInput(fmt::format("{}: has no frontier of method '{}'; it has {}", source,
                                 to_string(m), fmt::join(names, ", ")));
}

Plan FrontierFile::plan(Method m, std::size_t point, const std::string& goal) const {
  const MethodFrontier& f = method(m);
  return materialize_plan(workload, partitions, digest, f, f.points.at(point).choice, goal);
}

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open frontier file", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{}: not JSON ({})", path, e.what()));
  }
}

void check_identity(const Fields& r, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("format") || j["format"] != kFrontierFormat) {
    r.fail("format",
           fmt::format("expected '{}' (the frontier.json of `kareus optimize`)", kFrontierFormat));
  }
  const int version = r.get<int>(j, "version", "");
  if (version != kFrontierVersion) {
    r.fail(
        "version",
        fmt::format(
            "{} is not read by this build (it reads version {}): a frontier.json "
            "of another version stores its tables and choices differently; rerun `kareus optimize`",
            version, kFrontierVersion));
  }
  const auto stored = r.get<std::string>(j, "inputs_hash", "");
  const std::string actual = inputs_hash(j);
  if (stored != actual) {
    r.fail("inputs_hash",
           fmt::format("{} does not match the file's content ({}): it was edited, truncated or "
                       "assembled from several runs; rerun `kareus optimize`",
                       stored, actual));
  }
}

}  // namespace

FrontierFile load_frontier_file(const std::string& path) {
  const nlohmann::json j = read_json(path);
  const Fields r(path);
  check_identity(r, j);
  FrontierFile f;
  f.source = path;
  const auto& wf = r.at(j, "workload_file", "");
  f.workload = parse_workload(r.get<std::string>(wf, "yaml", "workload_file"),
                              r.get<std::string>(wf, "source", "workload_file"));
  f.partitions = partition_workload(f.workload);
  f.digest = workload_digest(f.workload, f.partitions);
  const auto stored_digest = r.get<std::string>(wf, "digest", "workload_file");
  if (stored_digest != f.digest) {
    r.fail("workload_file.digest",
           fmt::format("{}: this build partitions the stored workload differently (digest {}): "
                       "the frontier is stale; rerun `kareus optimize`",
                       stored_digest, f.digest));
  }
  f.planner = r.at(j, "planner", "");
  const auto& methods = r.at(j, "methods", "");
  for (Method m : kMethods) {
    if (!methods.contains(to_string(m)) || methods[to_string(m)].contains("same_as")) continue;
    f.methods.emplace(m, method_frontier_from_json(r, methods[to_string(m)],
                                                   std::string("methods.") + to_string(m), m,
                                                   f.workload, f.partitions));
  }
  for (Method m : kMethods) {
    if (!methods.contains(to_string(m)) || !methods[to_string(m)].contains("same_as")) continue;
    const std::string path = std::string("methods.") + to_string(m) + ".same_as";
    const auto& same = methods[to_string(m)]["same_as"];
    const auto it = std::find_if(f.methods.begin(), f.methods.end(), [&](const auto& kv) {
      return same.is_string() && to_string(kv.first) == same.get<std::string>();
    });
    if (it == f.methods.end()) {
      r.fail(path, "expected the name of a method stored in full in this file");
    }
    MethodFrontier copy = it->second;
    copy.method = m;
    f.methods.emplace(m, std::move(copy));
  }
  const auto& points = r.at(j, "points", "");
  for (std::size_t k = 0; k < points.size(); ++k) {
    const std::string pp = fmt::format("points[{}]", k);
    FrontierRef ref{method_from_string(r.get<std::string>(points[k], "method", pp)),
                    r.get<std::size_t>(points[k], "index", pp)};
    const std::size_t n = f.method(ref.method).points.size();
    if (ref.index >= n) {
      r.fail(pp + ".index", n == 0 ? fmt::format("{}: the {} frontier has no points", ref.index,
                                                 to_string(ref.method))
                                   : fmt::format("{}: allowed 0..{} (the {} frontier's points)",
                                                 ref.index, n - 1, to_string(ref.method)));
    }
    f.merged.push_back(ref);
  }
  return f;
}

void check_frontier_workload(const FrontierFile& f, const Workload& w) {
  const std::string digest = workload_digest(w);
  if (digest != f.digest) {
    throw InvalidInput(fmt::format(
        "{}: computed for workload '{}' (digest {}), not for {} (digest {}): the frontier is "
        "stale or belongs to another workload; rerun `kareus optimize {}`",
        f.source, f.workload.name, f.digest, w.source.empty() ? w.name : w.source, digest,
        w.source.empty() ? w.name : w.source));
  }
}

}  // namespace kareus
