// Plan files: JSON with a format tag and version, validated on load so that a plan from another
// workload or a damaged file is refused with a message naming the file and the field.
#include "kareus/plan.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "kareus/error.h"
#include "kareus/hash.h"
#include "kareus/partition.h"

namespace kareus {

namespace {
constexpr const char* kFormat = "kareus-plan";

}  // namespace

std::string workload_digest(const Workload& w) { return workload_digest(w, partition_workload(w)); }

std::string workload_digest(const Workload& w, const PartitionSet& ps) {
  std::string text =
      fmt::format("{}|{}|{}|{}|{}|{}", w.gpu_name, w.parallel.pp, w.batch.micro_batches,
                  w.cluster.gpus(), w.parallel.dp, w.batch.nano_batches);
  for (int l : w.parallel.stage_layers) text += fmt::format("|{}", l);
  for (const auto& p : ps.partitions) text += "|" + p.key + ":" + p.signature;
  return fmt::format("{:016x}", fnv1a(text));
}

std::string Goal::describe() const {
  switch (kind) {
    case GoalKind::kDeadline:
      return fmt::format("deadline {:.4f} s", value);
    case GoalKind::kEnergyBudget:
      return fmt::format("energy budget {:.1f} J", value);
    case GoalKind::kMaxThroughput:
      return "max-throughput";
    case GoalKind::kMinEnergy:
      return "min-energy";
  }
  return "?";
}

std::optional<std::size_t> select_point(const std::vector<FrontierPoint>& f, const Goal& g) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const auto& p = f[i];
    bool better = false;
    switch (g.kind) {
      case GoalKind::kDeadline:
        better = p.time_s <= g.value && (!best || p.energy_j < f[*best].energy_j);
        break;
      case GoalKind::kEnergyBudget:
        better = p.energy_j <= g.value && (!best || p.time_s < f[*best].time_s);
        break;
      case GoalKind::kMaxThroughput:
        better = !best || p.time_s < f[*best].time_s ||
                 (p.time_s == f[*best].time_s && p.energy_j < f[*best].energy_j);
        break;
      case GoalKind::kMinEnergy:
        better = !best || p.energy_j < f[*best].energy_j;
        break;
    }
    if (better) best = i;
  }
  return best;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["workload"] = {{"name", workload}, {"digest", workload_digest}, {"gpu", gpu}, {"gpus", gpus}};
  j["method"] = method;
  j["execution"] = execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential";
  j["goal"] = goal;
  j["iteration_time_s"] = iteration_time_s;
  j["energy_j"] = energy_j;
  j["static_power_w"] = static_power_w;
  j["stages"] = nlohmann::json::array();
  for (const auto& s : stages) {
    nlohmann::json sj = {{"stage", s.stage}, {"instructions", nlohmann::json::array()}};
    for (const auto& in : s.instructions) {
      nlohmann::json ij = {{"instruction", to_string(in.kind)},
                           {"microbatch", in.microbatch},
                           {"freq_mhz", in.freq_mhz},
                           {"time_s", in.time_s},
                           {"dynamic_energy_j", in.dynamic_energy_j},
                           {"partitions", nlohmann::json::object()}};
      for (const auto& [key, c] : in.partitions) {
        ij["partitions"][key] = {{"sms", c.sms}, {"slot", c.slot}};
        auto mix = in.mixes.find(key);
        if (mix == in.mixes.end()) continue;
        // Per-layer choice: the first `instances` occurrences use the first entry, and so on.
        for (const auto& sh : mix->second) {
          ij["partitions"][key]["mix"].push_back(
              {{"sms", sh.config.sms}, {"slot", sh.config.slot}, {"instances", sh.instances}});
        }
      }
      sj["instructions"].push_back(ij);
    }
    j["stages"].push_back(sj);
  }
  return j;
}

Plan Plan::from_json(const nlohmann::json& j, const std::string& source) {
  auto fail = [&](const std::string& field, const std::string& what) -> void {
    throw InvalidInput(fmt::format("{}: field '{}': {}", source, field, what));
  };
  Plan p;
  try {
    if (!j.is_object()) fail("<top level>", "expected a JSON object (a Kareus plan)");
    if (j.value("format", "") != kFormat) fail("format", fmt::format("expected '{}'", kFormat));
    if (j.at("version").get<int>() != kVersion) {
      fail("version", fmt::format("{} is not supported (this build reads version {})",
                                  j.at("version").dump(), kVersion));
    }
    const auto& w = j.at("workload");
    p.workload = w.at("name").get<std::string>();
    p.workload_digest = w.at("digest").get<std::string>();
    p.gpu = w.at("gpu").get<std::string>();
    p.gpus = w.at("gpus").get<int>();
    p.method = j.at("method").get<std::string>();
    const std::string ex = j.at("execution").get<std::string>();
    if (ex == "overlapped") {
      p.execution = ExecutionMode::kOverlapped;
    } else if (ex == "sequential") {
      p.execution = ExecutionMode::kSequential;
    } else {
      fail("execution", "allowed: overlapped, sequential");
    }
    p.goal = j.value("goal", "");
    p.iteration_time_s = j.at("iteration_time_s").get<double>();
    p.energy_j = j.at("energy_j").get<double>();
    p.static_power_w = j.at("static_power_w").get<double>();
    for (const auto& sj : j.at("stages")) {
      PlanStage s;
      s.stage = sj.at("stage").get<int>();
      for (const auto& ij : sj.at("instructions")) {
        PlanInstruction in;
        const std::string kind = ij.at("instruction").get<std::string>();
        if (kind != "forward" && kind != "backward") {
          fail("stages[].instructions[].instruction", "allowed: forward, backward");
        }
        in.kind = kind == "forward" ? InstructionKind::kForward : InstructionKind::kBackward;
        in.microbatch = ij.at("microbatch").get<int>();
        in.freq_mhz = ij.at("freq_mhz").get<int>();
        in.time_s = ij.value("time_s", 0.0);
        in.dynamic_energy_j = ij.value("dynamic_energy_j", 0.0);
        for (const auto& [key, c] : ij.at("partitions").items()) {
          in.partitions[key] = {in.freq_mhz, c.at("sms").get<int>(),
                                c.at("slot").get<std::string>()};
          if (!c.contains("mix")) continue;
          for (const auto& sh : c.at("mix")) {
            in.mixes[key].push_back(
                {{in.freq_mhz, sh.at("sms").get<int>(), sh.at("slot").get<std::string>()},
                 sh.at("instances").get<int>()});
          }
        }
        s.instructions.push_back(std::move(in));
      }
      p.stages.push_back(std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{}: not a valid Kareus plan ({})", source, e.what()));
  }
  return p;
}

InstructionSettings Plan::settings(int stage, InstructionKind kind, int microbatch) const {
  for (const auto& s : stages) {
    if (s.stage != stage) continue;
    for (const auto& in : s.instructions) {
      if (in.kind == kind && in.microbatch == microbatch) {
        return {in.freq_mhz, in.partitions, in.mixes};
      }
    }
  }
  throw InvalidInput(fmt::format("plan has no {} of micro-batch {} on stage {}", to_string(kind),
                                 microbatch, stage));
}

Plan load_plan(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open plan file", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{}: not JSON ({})", path, e.what()));
  }
  return Plan::from_json(j, path);
}

void save_plan(const Plan& p, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw InvalidInput(fmt::format("{}: cannot write plan file", path));
  out << p.to_json().dump(2) << "\n";
}

}  // namespace kareus
