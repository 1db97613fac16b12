// Reading energy-monitor files back and merging the ranks of a job (include/kareus/monitor.h,
// `kareus monitor merge`). The reader checks every field the writer (monitor.cc) emits, so a
// damaged or foreign file fails with the file, the line and the field instead of a wrong total.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "kareus/monitor.h"

namespace kareus::runtime {
namespace {

/// One line of a monitor file, with the checks that name the file, the line and the field.
class Line {
 public:
  Line(const std::string& path, int number, nlohmann::json j)
      : path_(path), number_(number), j_(std::move(j)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InvalidInput(fmt::format("{}:{}: field '{}': {}", path_, number_, field, what));
  }

  const nlohmann::json& need(const std::string& field) const {
    if (!j_.contains(field)) fail(field, fmt::format("missing (every {} record has it)", kind()));
    return j_[field];
  }

  int integer(const std::string& field) const {
    const auto& v = need(field);
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > kMaxInt) {
      fail(field, fmt::format("{}: allowed an integer >= 0", v.dump()));
    }
    return v.get<int>();
  }

  double number(const std::string& field) const {
    const auto& v = need(field);
    if (!v.is_number() || !(v.get<double>() >= 0)) {
      fail(field, fmt::format("{}: allowed a number >= 0", v.dump()));
    }
    return v.get<double>();
  }

  std::optional<double> number_or_null(const std::string& field) const {
    if (need(field).is_null()) return std::nullopt;
    return number(field);
  }

  std::string string_or_empty(const std::string& field) const {
    if (!j_.contains(field) || j_[field].is_null()) return "";
    if (!j_[field].is_string()) fail(field, fmt::format("{}: allowed a string", j_[field].dump()));
    return j_[field].get<std::string>();
  }

  std::string kind() const {
    return j_.contains("record") && j_["record"].is_string() ? j_["record"].get<std::string>() : "";
  }
  int number() const { return number_; }

 private:
  static constexpr long long kMaxInt = 2147483647;
  const std::string& path_;
  int number_;
  nlohmann::json j_;
};

/// "0-2, 5": a sorted list of iterations as ranges.
std::string ranges(const std::vector<int>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t k = i;
    while (k + 1 < v.size() && v[k + 1] == v[k] + 1) ++k;
    if (!out.empty()) out += ", ";
    out += k == i ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[k]);
    i = k + 1;
  }
  return out;
}

IterationRecord parse_iteration(const Line& l) {
  IterationRecord r;
  r.rank = l.integer("rank");
  r.stage = l.integer("stage");
  r.iteration = l.integer("iteration");
  r.start_unix_s = l.number("start_unix_s");
  r.time_s = l.number("time_s");
  r.energy_j = l.number_or_null("energy_j");
  r.avg_power_w = l.number_or_null("avg_power_w");
  r.busy_time_s = l.number("busy_time_s");
  r.instructions = l.integer("instructions");
  r.gpu_uuid = l.string_or_empty("gpu_uuid");
  r.note = l.string_or_empty("note");
  return r;
}

void check_instruction(const Line& l) {
  l.integer("iteration");
  const std::string kind = l.string_or_empty("kind");
  if (kind != "forward" && kind != "backward") {
    l.fail("kind", fmt::format("'{}': allowed forward, backward", kind));
  }
  l.integer("microbatch");
  l.integer("chunk");
  l.number("time_s");
  l.number_or_null("energy_j");
}

}  // namespace

MonitorFile read_monitor_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open the monitor file: no such file", path));
  MonitorFile f;
  f.path = path;
  std::optional<std::pair<int, int>> owner;  // (rank, stage) of the first record
  int owner_line = 0;
  std::map<int, int> seen;  // iteration -> line
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (text.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw InvalidInput(
          fmt::format("{}:{}: not a JSON line ({}); a monitor file holds one JSON object a line",
                      path, number, e.what()));
    }
    if (!j.is_object()) {
      throw InvalidInput(fmt::format("{}:{}: not a JSON object", path, number));
    }
    const Line l(path, number, j);
    if (!j.contains("record") || !j["record"].is_string()) {
      l.fail("record",
             "missing: not a kareus energy-monitor record (every line of a monitor file has "
             "\"record\": \"iteration\", \"instruction\" or \"summary\")");
    }
    const std::string kind = j["record"].get<std::string>();
    if (kind != "iteration" && kind != "instruction" && kind != "summary") {
      l.fail("record", fmt::format("'{}': allowed iteration, instruction, summary", kind));
    }
    const std::pair<int, int> who = {l.integer("rank"), l.integer("stage")};
    if (!owner) {
      owner = who;
      owner_line = number;
    } else if (who != *owner) {
      l.fail(who.first != owner->first ? "rank" : "stage",
             fmt::format("rank {} stage {}, but line {} has rank {} stage {}: a monitor file "
                         "holds the records of one rank",
                         who.first, who.second, owner_line, owner->first, owner->second));
    }
    if (kind == "instruction") {
      check_instruction(l);
    } else if (kind == "summary") {
      if (f.gpu_uuid.empty()) f.gpu_uuid = l.string_or_empty("gpu_uuid");
    } else {
      IterationRecord r = parse_iteration(l);
      if (const auto [it, fresh] = seen.emplace(r.iteration, number); !fresh) {
        l.fail("iteration",
               fmt::format("{} appears twice (lines {} and {}): the file holds two runs; give "
                           "each run its own monitor file",
                           r.iteration, it->second, number));
      }
      if (!r.gpu_uuid.empty()) f.gpu_uuid = r.gpu_uuid;
      f.iterations.push_back(std::move(r));
      f.lines.push_back(number);
    }
  }
  if (f.iterations.empty()) {
    throw InvalidInput(
        fmt::format("{}: no iteration records (field 'record': \"iteration\" on "
                    "no line): not a monitor file of a run that ended an iteration",
                    path));
  }
  f.rank = owner->first;
  f.stage = owner->second;
  return f;
}

JobRun merge_monitor_files(const std::vector<std::string>& paths) {
  if (paths.empty()) throw InvalidInput("monitor merge: no monitor files given");
  JobRun run;
  for (const auto& p : paths) run.files.push_back(read_monitor_file(p));
  std::sort(run.files.begin(), run.files.end(),
            [](const MonitorFile& a, const MonitorFile& b) { return a.rank < b.rank; });
  std::map<std::string, const MonitorFile*> by_gpu;
  for (std::size_t i = 0; i < run.files.size(); ++i) {
    const MonitorFile& f = run.files[i];
    if (i > 0 && run.files[i - 1].rank == f.rank) {
      throw InvalidInput(
          fmt::format("{} and {}: field 'rank': both hold rank {}; give one file "
                      "per rank",
                      run.files[i - 1].path, f.path, f.rank));
    }
    if (f.gpu_uuid.empty()) continue;
    if (const auto [it, fresh] = by_gpu.emplace(f.gpu_uuid, &f); !fresh) {
      throw InvalidInput(fmt::format(
          "{} (rank {}) and {} (rank {}): field 'gpu_uuid': both measured GPU {}, whose energy "
          "would count twice; give each rank the GPU it computes on (gpu_uuid or pci_bus_id of "
          "its CUDA device, docs/runtime.md \"Which GPU\")",
          it->second->path, it->second->rank, f.path, f.rank, f.gpu_uuid));
    }
  }
  for (const auto& f : run.files) run.stages = std::max(run.stages, f.stage + 1);

  std::set<int> all, common;
  for (std::size_t i = 0; i < run.files.size(); ++i) {
    std::set<int> mine;
    for (const auto& r : run.files[i].iterations) mine.insert(r.iteration);
    all.insert(mine.begin(), mine.end());
    if (i == 0) {
      common = mine;
    } else {
      std::set<int> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.end()));
      common = std::move(both);
    }
  }
  for (const auto& f : run.files) {
    std::vector<int> missing;
    std::set<int> mine;
    for (const auto& r : f.iterations) mine.insert(r.iteration);
    std::set_difference(all.begin(), all.end(), mine.begin(), mine.end(),
                        std::back_inserter(missing));
    if (!missing.empty()) {
      run.notes.push_back(
          fmt::format("rank {} ({}) lacks iteration{} {}: left out of the job's "
                      "table and totals",
                      f.rank, f.path, missing.size() == 1 ? "" : "s", ranges(missing)));
    }
  }
  if (common.empty()) {
    throw InvalidInput(
        "monitor merge: no iteration is in every file (field 'iteration'), so "
        "no iteration of the job is complete");
  }
  const double ranks = static_cast<double>(run.files.size());
  for (const int it : common) {
    JobIteration job;
    job.iteration = it;
    job.stage_busy_time_s.assign(static_cast<std::size_t>(run.stages), std::nullopt);
    double energy = 0;
    bool all_energy = true;
    for (const auto& f : run.files) {
      const auto r = std::find_if(f.iterations.begin(), f.iterations.end(),
                                  [&](const IterationRecord& x) { return x.iteration == it; });
      job.time_s = std::max(job.time_s, r->time_s);
      all_energy = all_energy && r->energy_j.has_value();
      if (r->energy_j) energy += *r->energy_j;
      auto& busy = job.stage_busy_time_s[static_cast<std::size_t>(f.stage)];
      busy = std::max(busy.value_or(0.0), r->busy_time_s);
    }
    if (all_energy) {
      job.energy_j = energy;
      if (job.time_s > 0) job.avg_power_per_gpu_w = energy / (job.time_s * ranks);
    }
    run.iterations.push_back(std::move(job));
  }
  const int lacking = static_cast<int>(run.iterations.size()) - run.energy_iterations();
  if (lacking > 0) {
    run.notes.push_back(fmt::format(
        "{} of {} iterations lack some rank's energy (times only, or a counter problem: see the "
        "records' notes); energy totals are over the others",
        lacking, run.iterations.size()));
  }
  return run;
}

double JobRun::time_s() const {
  double t = 0;
  for (const auto& it : iterations) t += it.time_s;
  return t;
}

int JobRun::energy_iterations() const {
  return static_cast<int>(std::count_if(iterations.begin(), iterations.end(),
                                        [](const JobIteration& i) { return i.energy_j; }));
}

std::optional<double> JobRun::energy_j() const {
  if (energy_iterations() == 0) return std::nullopt;
  double e = 0;
  for (const auto& it : iterations) e += it.energy_j.value_or(0.0);
  return e;
}

std::optional<double> JobRun::time_per_iteration_s() const {
  if (iterations.empty()) return std::nullopt;
  return time_s() / static_cast<double>(iterations.size());
}

std::optional<double> JobRun::energy_per_iteration_j() const {
  const auto e = energy_j();
  if (!e) return std::nullopt;
  return *e / energy_iterations();
}

std::optional<double> JobRun::avg_power_per_gpu_w() const {
  const auto e = energy_j();
  double t = 0;
  for (const auto& it : iterations) {
    if (it.energy_j) t += it.time_s;
  }
  if (!e || !(t > 0)) return std::nullopt;
  return *e / (t * static_cast<double>(files.size()));
}

}  // namespace kareus::runtime
