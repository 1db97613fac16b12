// Plan files, format version 2 (docs/formats.md): JSON with a format tag and version. Parsing
// checks the structure and names the JSON path of a bad field; validate_plan
// (src/plancheck/plan_check.cc) then checks every value against the workload (digest, rank
// layout, schedule order, clocks, partition keys, SM counts, slots, recompute flags), so that a
// plan that cannot run as written is refused before anything replays or applies it.
#include "kareus/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "kareus/error.h"
#include "kareus/table.h"

namespace kareus {

namespace {
constexpr const char* kFormat = "kareus-plan";

std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string index_path(const std::string& path, std::size_t i) {
  return fmt::format("{}[{}]", path, i);
}

// Reads typed fields and names the JSON path of the first one that is missing or mistyped.
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw_plan_field_error(source_, path, what);
  }
  const nlohmann::json& at(const nlohmann::json& j, const std::string& key,
                           const std::string& path) const {
    if (!j.is_object()) fail(path.empty() ? "<top level>" : path, "expected a JSON object");
    auto it = j.find(key);
    if (it == j.end()) fail(join_path(path, key), "missing");
    return *it;
  }
  const nlohmann::json& array(const nlohmann::json& j, const std::string& key,
                              const std::string& path) const {
    const auto& a = at(j, key, path);
    if (!a.is_array()) fail(join_path(path, key), "expected an array");
    return a;
  }
  int integer(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const auto& v = at(j, key, path);
    if (!v.is_number_integer()) fail(join_path(path, key), "expected an integer");
    return v.get<int>();
  }
  int integer_at_least(const nlohmann::json& j, const std::string& key, const std::string& path,
                       int lo) const {
    const int v = integer(j, key, path);
    if (v < lo) fail(join_path(path, key), fmt::format("{}: must be >= {}", v, lo));
    return v;
  }
  double number(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const auto& v = at(j, key, path);
    if (!v.is_number()) fail(join_path(path, key), "expected a number");
    return v.get<double>();
  }
  std::string text(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const auto& v = at(j, key, path);
    if (!v.is_string()) fail(join_path(path, key), "expected a string");
    return v.get<std::string>();
  }
  // Times, energies and powers: a tampered NaN/inf or a negative value would poison every sum
  // the replay and the controller compute from them.
  double non_negative(const nlohmann::json& j, const std::string& key,
                      const std::string& path) const {
    const double v = number(j, key, path);
    if (!std::isfinite(v) || v < 0)
      fail(join_path(path, key), fmt::format("{}: must be finite and >= 0", v));
    return v;
  }
  double positive(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const double v = number(j, key, path);
    if (!std::isfinite(v) || v <= 0)
      fail(join_path(path, key), fmt::format("{}: must be finite and > 0", v));
    return v;
  }
  bool boolean(const nlohmann::json& j, const std::string& key, const std::string& path) const {
    const auto& v = at(j, key, path);
    if (!v.is_boolean()) fail(join_path(path, key), "expected true or false");
    return v.get<bool>();
  }

 private:
  const std::string& source_;
};

// The optional power figures (docs/formats.md): predicted average and peak instruction power per
// GPU, and a power-cap goal's replayed average.
void add_power_fields(const Plan& p, nlohmann::json& j) {
  if (p.avg_power_per_gpu_w >= 0) j["avg_power_per_gpu_w"] = p.avg_power_per_gpu_w;
  if (p.peak_instruction_power_w >= 0) j["peak_instruction_power_w"] = p.peak_instruction_power_w;
  if (p.replayed_avg_power_per_gpu_w >= 0)
    j["replayed_avg_power_per_gpu_w"] = p.replayed_avg_power_per_gpu_w;
}

}  // namespace

int RankLayout::rank(const Coords& c) const {
  if (c.tp < 0 || c.tp >= tp || c.cp < 0 || c.cp >= cp || c.dp < 0 || c.dp >= dp || c.pp < 0 ||
      c.pp >= pp) {
    throw InvalidInput(fmt::format(
        "rank coordinates (tp {}, cp {}, dp {}, pp {}) outside the layout tp={} cp={} dp={} pp={}",
        c.tp, c.cp, c.dp, c.pp, tp, cp, dp, pp));
  }
  return c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp));
}

RankLayout::Coords RankLayout::coords(int r) const {
  if (r < 0 || r >= gpus()) {
    throw InvalidInput(fmt::format("rank {}: allowed 0..{}", r, gpus() - 1));
  }
  Coords c;
  c.tp = r % tp;
  r /= tp;
  c.cp = r % cp;
  r /= cp;
  c.dp = r % dp;
  c.pp = r / dp;
  return c;
}

std::vector<int> RankLayout::stage_ranks(int stage) const {
  if (stage < 0 || stage >= pp) {
    throw InvalidInput(fmt::format("stage {}: allowed 0..{}", stage, pp - 1));
  }
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(gpus_per_stage()));
  for (int i = 0; i < gpus_per_stage(); ++i) out.push_back(stage * gpus_per_stage() + i);
  return out;
}

std::vector<std::pair<int, int>> PlanStage::clock_runs() const {
  std::vector<std::pair<int, int>> runs;
  for (const auto& in : instructions) {
    if (!runs.empty() && runs.back().first == in.freq_mhz) {
      ++runs.back().second;
    } else {
      runs.push_back({in.freq_mhz, 1});
    }
  }
  return runs;
}

InstructionSettings PlanInstruction::settings() const {
  InstructionSettings s;
  s.freq_mhz = freq_mhz;
  s.sequential = sequential;
  for (const auto& [key, pp] : partitions) {
    s.partitions[key] = {freq_mhz, pp.sms, pp.slot};
    for (const auto& e : pp.mix) {
      s.mixes[key].push_back({{freq_mhz, e.sms, e.slot}, e.instances});
    }
  }
  return s;
}

int Plan::stage_of_rank(int rank) const { return layout.coords(rank).pp; }

int Plan::clock_changes() const {
  int n = 0;
  for (const auto& s : stages) n += s.clock_changes;
  return n;
}

double Plan::gpu_energy_j(int stage) const {
  if (stage < 0 || static_cast<std::size_t>(stage) >= stages.size()) {
    throw InvalidInput(fmt::format("plan stage {}: the plan has {} stages (0..{})", stage,
                                   stages.size(), static_cast<int>(stages.size()) - 1));
  }
  auto dynamic_of = [](const PlanStage& s) {
    double e = 0;
    for (const auto& in : s.instructions) e += in.dynamic_energy_j;
    return e;
  };
  const double static_j = static_power_w * iteration_time_s;
  double rest = energy_j - layout.gpus() * static_j;
  for (const auto& s : stages) rest -= layout.gpus_per_stage() * dynamic_of(s);
  return dynamic_of(stages[static_cast<std::size_t>(stage)]) + static_j +
         std::max(0.0, rest) / layout.gpus();
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["workload"] = {{"name", workload}, {"digest", workload_digest}, {"gpu", gpu}, {"gpus", gpus}};
  j["parallel"] = {{"tp", layout.tp},
                   {"cp", layout.cp},
                   {"dp", layout.dp},
                   {"pp", layout.pp},
                   {"virtual_pipeline", chunks},
                   {"rank_order", RankLayout::kOrder},
                   {"rank_formula", "tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))"}};
  j["method"] = method;
  j["label"] = label;
  j["power_model"] = {{"calibrated", power_calibrated}, {"source", power_source}};
  if (deadline_margin >= 0) j["deadline_margin"] = deadline_margin;
  if (replayed_time_s >= 0) j["replayed_time_s"] = replayed_time_s;
  if (!stage_slowdown.empty()) j["stage_slowdown"] = stage_slowdown;
  add_power_fields(*this, j);
  j["execution"] = execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential";
  j["goal"] = goal;
  j["iteration_time_s"] = iteration_time_s;
  j["energy_j"] = energy_j;
  j["static_power_w"] = static_power_w;
  j["clock_switch_s"] = clock_switch_s;
  j["min_clock_hold_s"] = min_clock_hold_s;
  j["stages"] = nlohmann::json::array();
  for (const auto& s : stages) {
    nlohmann::json sj = {{"stage", s.stage},
                         {"ranks", s.ranks},
                         {"clock_changes", s.clock_changes},
                         {"end_s", s.end_s},
                         {"instructions", nlohmann::json::array()}};
    for (const auto& d : s.dp_collectives) {
      sj["dp_collectives"].push_back({{"collective", d.collective},
                                      {"chunk", d.chunk},
                                      {"start_s", d.start_s},
                                      {"end_s", d.end_s}});
    }
    for (const auto& in : s.instructions) {
      nlohmann::json ij = {{"instruction", to_string(in.kind)},
                           {"microbatch", in.microbatch},
                           {"chunk", in.chunk},
                           {"freq_mhz", in.freq_mhz},
                           {"clock_switch", in.clock_switch},
                           {"start_s", in.start_s},
                           {"end_s", in.end_s},
                           {"time_s", in.time_s},
                           {"dynamic_energy_j", in.dynamic_energy_j},
                           {"partitions", nlohmann::json::object()}};
      // Only where it differs from the plan's execution (format v2 files stay as they were).
      if (execution == ExecutionMode::kOverlapped && in.sequential) ij["execution"] = "sequential";
      for (const auto& [key, c] : in.partitions) {
        nlohmann::json pj = {{"sms", c.sms},
                             {"slot", c.slot},
                             {"launch_before", {{"op", c.slot_op}, {"index", c.slot_op_index}}},
                             {"recompute", c.recompute},
                             {"instances", c.instances}};
        for (const auto& e : c.mix) {
          pj["mix"].push_back({{"sms", e.sms},
                               {"slot", e.slot},
                               {"launch_before", {{"op", e.slot_op}, {"index", e.slot_op_index}}},
                               {"first_instance", e.first_instance},
                               {"instances", e.instances}});
        }
        ij["partitions"][key] = std::move(pj);
      }
      sj["instructions"].push_back(std::move(ij));
    }
    j["stages"].push_back(std::move(sj));
  }
  return j;
}

namespace {

void check_format_and_version(const Reader& r, const nlohmann::json& j) {
  if (!j.is_object()) r.fail("<top level>", "expected a JSON object (a Kareus plan)");
  if (!j.contains("format") || !j["format"].is_string() || j["format"] != kFormat) {
    r.fail("format", fmt::format("expected '{}' (not a Kareus plan)", kFormat));
  }
  const int version = r.integer(j, "version", "");
  if (version == 1) {
    r.fail("version",
           "plan format 1 is no longer read: it has no rank mapping, slot semantics or predicted "
           "start times and was not validated; re-create it with `kareus plan WORKLOAD ... --out "
           "PLAN` (this build writes and reads version 2)");
  }
  if (version != Plan::kVersion) {
    r.fail("version", fmt::format("{} is not supported (this build reads version {})", version,
                                  Plan::kVersion));
  }
}

// The workload's identity and the parallel layout.
void parse_identity(const Reader& r, const nlohmann::json& j, Plan& p) {
  const auto& w = r.at(j, "workload", "");
  p.workload = r.text(w, "name", "workload");
  p.workload_digest = r.text(w, "digest", "workload");
  p.gpu = r.text(w, "gpu", "workload");
  p.gpus = r.integer_at_least(w, "gpus", "workload", 1);
  const auto& par = r.at(j, "parallel", "");
  p.layout.tp = r.integer_at_least(par, "tp", "parallel", 1);
  p.layout.cp = r.integer_at_least(par, "cp", "parallel", 1);
  p.layout.dp = r.integer_at_least(par, "dp", "parallel", 1);
  p.layout.pp = r.integer_at_least(par, "pp", "parallel", 1);
  // Written since interleaved schedules; older plans are synchronous 1F1B.
  p.chunks = par.contains("virtual_pipeline")
                 ? r.integer_at_least(par, "virtual_pipeline", "parallel", 1)
                 : 1;
  if (r.text(par, "rank_order", "parallel") != RankLayout::kOrder) {
    r.fail("parallel.rank_order",
           fmt::format("allowed: '{}' (Megatron-LM's default order)", RankLayout::kOrder));
  }
  p.method = r.text(j, "method", "");
  const std::string ex = r.text(j, "execution", "");
  if (ex == "overlapped") {
    p.execution = ExecutionMode::kOverlapped;
  } else if (ex == "sequential") {
    p.execution = ExecutionMode::kSequential;
  } else {
    r.fail("execution", fmt::format("'{}': allowed: overlapped, sequential", ex));
  }
}

// An SM count anywhere in a plan: kCopyEngineSms or 1..kMaxCollectiveSms (NCCL's channel
// limit), checked without a workload so that `plan show` refuses anything else; validate_plan
// applies the partition's own rule (sms_allowed).
int parse_sms(const Reader& r, const nlohmann::json& c, const std::string& path) {
  const int sms = r.integer(c, "sms", path);
  if (sms != kCopyEngineSms && (sms < 1 || sms > kMaxCollectiveSms)) {
    r.fail(join_path(path, "sms"),
           fmt::format("{}: allowed {} (the copy engines, where the collective allows them) or "
                       "1..{} (NCCL's channel limit)",
                       sms, kCopyEngineSms, kMaxCollectiveSms));
  }
  return sms;
}

// The collective's launch (SMs, slot, the compute op it is launched before), the same fields in
// a partition entry and in a per-layer mix entry.
template <class Launch>
void parse_launch(const Reader& r, const nlohmann::json& m, const std::string& mp, Launch& e) {
  e.sms = parse_sms(r, m, mp);
  e.slot = r.text(m, "slot", mp);
  const auto& lb = r.at(m, "launch_before", mp);
  e.slot_op = r.text(lb, "op", mp + ".launch_before");
  e.slot_op_index = r.integer_at_least(lb, "index", mp + ".launch_before", 0);
}

PlanMixEntry parse_mix_entry(const Reader& r, const nlohmann::json& m, const std::string& mp) {
  PlanMixEntry e;
  parse_launch(r, m, mp, e);
  e.first_instance = r.integer_at_least(m, "first_instance", mp, 0);
  e.instances = r.integer_at_least(m, "instances", mp, 1);
  return e;
}

PlanPartition parse_partition(const Reader& r, const nlohmann::json& c, const std::string& pp) {
  PlanPartition part;
  parse_launch(r, c, pp, part);
  part.recompute = r.boolean(c, "recompute", pp);
  part.instances = r.integer_at_least(c, "instances", pp, 0);
  if (c.contains("mix")) {
    const auto& mix = r.array(c, "mix", pp);
    for (std::size_t mi = 0; mi < mix.size(); ++mi) {
      part.mix.push_back(parse_mix_entry(r, mix[mi], index_path(pp + ".mix", mi)));
    }
  }
  return part;
}

// One instruction; `prev` is the stage's previous one (nullptr for the first).
PlanInstruction parse_instruction(const Reader& r, const nlohmann::json& ij, const std::string& ip,
                                  const PlanStage& s, const PlanInstruction* prev,
                                  double tolerance_s, int chunks) {
  PlanInstruction in;
  const std::string kind = r.text(ij, "instruction", ip);
  if (kind != "forward" && kind != "backward") {
    r.fail(ip + ".instruction", fmt::format("'{}': allowed: forward, backward", kind));
  }
  in.kind = kind == "forward" ? InstructionKind::kForward : InstructionKind::kBackward;
  in.microbatch = r.integer_at_least(ij, "microbatch", ip, 0);
  in.chunk = ij.contains("chunk") ? r.integer_at_least(ij, "chunk", ip, 0) : 0;
  if (in.chunk >= chunks) {
    r.fail(ip + ".chunk",
           fmt::format("{}: the plan's stages hold {} model chunks (parallel.virtual_pipeline): "
                       "allowed 0..{}",
                       in.chunk, chunks, chunks - 1));
  }
  in.freq_mhz = r.integer_at_least(ij, "freq_mhz", ip, 1);
  in.clock_switch = r.boolean(ij, "clock_switch", ip);
  in.start_s = r.non_negative(ij, "start_s", ip);
  in.end_s = r.non_negative(ij, "end_s", ip);
  in.time_s = r.non_negative(ij, "time_s", ip);
  in.dynamic_energy_j = r.non_negative(ij, "dynamic_energy_j", ip);
  if (in.end_s < in.start_s) {
    r.fail(ip + ".end_s", fmt::format("{}: must be >= start_s ({})", in.end_s, in.start_s));
  }
  if (in.end_s > s.end_s + tolerance_s) {
    r.fail(ip + ".end_s", fmt::format("{}: must be <= the stage's end_s ({})", in.end_s, s.end_s));
  }
  if (prev && in.start_s < prev->start_s) {
    r.fail(ip + ".start_s",
           fmt::format("{}: must be >= the previous instruction's start_s ({}): a stage runs "
                       "its instructions one after another",
                       in.start_s, prev->start_s));
  }
  if (ij.contains("execution")) {
    const std::string ex = r.text(ij, "execution", ip);
    if (ex != "sequential" && ex != "overlapped") {
      r.fail(ip + ".execution", fmt::format("'{}': allowed: overlapped, sequential", ex));
    }
    in.sequential = ex == "sequential";
  }
  const auto& parts = r.at(ij, "partitions", ip);
  if (!parts.is_object()) r.fail(ip + ".partitions", "expected an object keyed by partition");
  for (const auto& [key, c] : parts.items()) {
    in.partitions.emplace(key, parse_partition(r, c, ip + ".partitions." + key));
  }
  return in;
}

PlanStage parse_stage(const Reader& r, const nlohmann::json& sj, const std::string& sp,
                      const Plan& p, double tolerance_s) {
  PlanStage s;
  s.stage = r.integer_at_least(sj, "stage", sp, 0);
  for (std::size_t k = 0; k < r.array(sj, "ranks", sp).size(); ++k) {
    const auto& v = sj["ranks"][k];
    if (!v.is_number_integer()) r.fail(index_path(sp + ".ranks", k), "expected an integer");
    s.ranks.push_back(v.get<int>());
  }
  s.clock_changes = r.integer_at_least(sj, "clock_changes", sp, 0);
  s.end_s = r.non_negative(sj, "end_s", sp);
  if (s.end_s > p.iteration_time_s + tolerance_s) {
    r.fail(sp + ".end_s", fmt::format("{}: must be <= iteration_time_s ({}): the iteration ends "
                                      "when its last stage does",
                                      s.end_s, p.iteration_time_s));
  }
  if (sj.contains("dp_collectives")) {
    const auto& dps = r.array(sj, "dp_collectives", sp);
    for (std::size_t k = 0; k < dps.size(); ++k) {
      const std::string dp = index_path(sp + ".dp_collectives", k);
      PlanDpCollective d;
      d.collective = r.text(dps[k], "collective", dp);
      if (d.collective != "grad_reducescatter" && d.collective != "param_allgather") {
        r.fail(dp + ".collective",
               fmt::format("'{}': allowed: grad_reducescatter, param_allgather", d.collective));
      }
      d.chunk = r.integer_at_least(dps[k], "chunk", dp, 0);
      d.start_s = r.non_negative(dps[k], "start_s", dp);
      d.end_s = r.non_negative(dps[k], "end_s", dp);
      if (d.end_s < d.start_s || d.end_s > s.end_s + tolerance_s) {
        r.fail(dp + ".end_s", fmt::format("{}: must be >= start_s ({}) and <= the stage's end_s "
                                          "({})",
                                          d.end_s, d.start_s, s.end_s));
      }
      s.dp_collectives.push_back(std::move(d));
    }
  }
  const auto& instrs = r.array(sj, "instructions", sp);
  for (std::size_t ii = 0; ii < instrs.size(); ++ii) {
    const PlanInstruction* prev = ii == 0 ? nullptr : &s.instructions.back();
    s.instructions.push_back(parse_instruction(r, instrs[ii], index_path(sp + ".instructions", ii),
                                               s, prev, tolerance_s, p.chunks));
  }
  return s;
}

}  // namespace

Plan Plan::from_json(const nlohmann::json& j, const std::string& source) {
  const Reader r(source);
  check_format_and_version(r, j);
  Plan p;
  parse_identity(r, j, p);
  p.goal = j.contains("goal") ? r.text(j, "goal", "") : "";
  p.iteration_time_s = r.positive(j, "iteration_time_s", "");
  p.energy_j = r.positive(j, "energy_j", "");
  p.static_power_w = r.non_negative(j, "static_power_w", "");
  p.clock_switch_s = r.non_negative(j, "clock_switch_s", "");
  p.min_clock_hold_s = r.non_negative(j, "min_clock_hold_s", "");
  // Written since the honest-labels change; plans from before it lack them.
  p.label = j.contains("label") ? r.text(j, "label", "") : p.method;
  if (j.contains("power_model")) {
    const auto& pm = r.at(j, "power_model", "");
    p.power_calibrated = r.boolean(pm, "calibrated", "power_model");
    p.power_source = r.text(pm, "source", "power_model");
  }
  if (j.contains("deadline_margin")) p.deadline_margin = r.non_negative(j, "deadline_margin", "");
  if (j.contains("replayed_time_s")) p.replayed_time_s = r.positive(j, "replayed_time_s", "");
  if (j.contains("stage_slowdown")) {
    const auto& f = r.array(j, "stage_slowdown", "");
    if (f.size() != static_cast<std::size_t>(p.layout.pp)) {
      r.fail("stage_slowdown", fmt::format("{} factors: expected one per pipeline stage ({})",
                                           f.size(), p.layout.pp));
    }
    for (std::size_t k = 0; k < f.size(); ++k) {
      if (!f[k].is_number() || !(f[k].get<double>() > 0) || !std::isfinite(f[k].get<double>())) {
        r.fail(index_path("stage_slowdown", k), "expected a finite number > 0");
      }
      p.stage_slowdown.push_back(f[k].get<double>());
    }
  }
  // Written since the power-cap goal; plans from before it lack them.
  if (j.contains("avg_power_per_gpu_w"))
    p.avg_power_per_gpu_w = r.positive(j, "avg_power_per_gpu_w", "");
  if (j.contains("peak_instruction_power_w"))
    p.peak_instruction_power_w = r.non_negative(j, "peak_instruction_power_w", "");
  if (j.contains("replayed_avg_power_per_gpu_w"))
    p.replayed_avg_power_per_gpu_w = r.positive(j, "replayed_avg_power_per_gpu_w", "");
  // The planner writes each stage's end as the maximum of values whose maximum is
  // iteration_time_s, so they agree exactly; the slack only absorbs a rounding edit.
  const double tolerance_s = kTimeTolerance * p.iteration_time_s;
  const auto& stages = r.array(j, "stages", "");
  for (std::size_t si = 0; si < stages.size(); ++si) {
    p.stages.push_back(parse_stage(r, stages[si], index_path("stages", si), p, tolerance_s));
  }
  if (p.execution == ExecutionMode::kSequential) {
    for (auto& st : p.stages) {
      for (auto& in : st.instructions) in.sequential = true;
    }
  }
  return p;
}

InstructionSettings Plan::settings(int virtual_stage, InstructionKind kind, int microbatch) const {
  const int stage = virtual_stage % layout.pp, chunk = virtual_stage / layout.pp;
  for (const auto& s : stages) {
    if (s.stage != stage) continue;
    for (const auto& in : s.instructions) {
      if (in.kind == kind && in.microbatch == microbatch && in.chunk == chunk) {
        return in.settings();
      }
    }
  }
  throw InvalidInput(fmt::format("plan has no {} of micro-batch {} (chunk {}) on stage {}",
                                 to_string(kind), microbatch, chunk, stage));
}

void throw_plan_field_error(const std::string& source, const std::string& path,
                            const std::string& what) {
  throw InvalidInput(fmt::format("{}: field '{}': {}", source, path, what));
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

namespace {

std::string rank_ranges(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

// "24 SMs", or "copy engines" for kCopyEngineSms.
std::string sms_text(int sms) {
  return sms == kCopyEngineSms ? "copy engines" : fmt::format("{} SMs", sms);
}

// Distinct settings of each partition over a stage's instructions: key -> "setting" -> count.
std::map<std::string, std::map<std::string, int>> partition_choices(const PlanStage& st) {
  std::map<std::string, std::map<std::string, int>> out;
  for (const auto& in : st.instructions) {
    for (const auto& [key, c] : in.partitions) {
      const std::string name = key + (c.recompute ? " (recompute)" : "");
      if (c.mix.empty()) {
        out[name][fmt::format("{} @ {} (before {})", sms_text(c.sms), c.slot, c.slot_op)] +=
            c.instances;
      }
      for (const auto& e : c.mix) {
        out[name][fmt::format("{} @ {} (before {})", sms_text(e.sms), e.slot, e.slot_op)] +=
            e.instances;
      }
    }
  }
  return out;
}

}  // namespace

std::string plan_power_text(const Plan& p) {
  std::vector<std::string> parts;
  if (p.avg_power_per_gpu_w >= 0)
    parts.push_back(fmt::format("average {:.1f} W over the iteration", p.avg_power_per_gpu_w));
  if (p.peak_instruction_power_w >= 0) {
    parts.push_back(fmt::format("peak instruction {:.1f} W (reported, not capped)",
                                p.peak_instruction_power_w));
  }
  if (p.replayed_avg_power_per_gpu_w >= 0) {
    parts.push_back(fmt::format(
        "emulator replay {:.1f} W average{}", p.replayed_avg_power_per_gpu_w,
        p.replayed_time_s >= 0 ? fmt::format(" in {:.4f} s", p.replayed_time_s) : std::string()));
  }
  if (parts.empty()) return "";
  return fmt::format("power per GPU: {}\n", fmt::join(parts, ", "));
}

nlohmann::json plan_summary_json(const Plan& p) {
  nlohmann::json j = {
      {"workload", p.workload},
      {"method", p.method},
      {"execution", p.execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential"},
      {"goal", p.goal},
      {"gpu", p.gpu},
      {"gpus", p.gpus},
      {"rank_order", RankLayout::kOrder},
      {"iteration_time_s", p.iteration_time_s},
      {"energy_j", p.energy_j},
      {"clock_switch_s", p.clock_switch_s},
      {"min_clock_hold_s", p.min_clock_hold_s},
      {"clock_changes", p.clock_changes()},
      {"schedule", p.chunks > 1 ? "interleaved-1f1b" : "1f1b"},
      {"virtual_pipeline", p.chunks},
      {"label", p.label},
      {"power_model", {{"calibrated", p.power_calibrated}, {"source", p.power_source}}},
      {"stages", nlohmann::json::array()}};
  if (p.deadline_margin >= 0) j["deadline_margin"] = p.deadline_margin;
  if (p.replayed_time_s >= 0) j["replayed_time_s"] = p.replayed_time_s;
  if (!p.stage_slowdown.empty()) j["stage_slowdown"] = p.stage_slowdown;
  add_power_fields(p, j);
  for (const auto& st : p.stages) {
    nlohmann::json sj = {{"stage", st.stage},
                         {"ranks", st.ranks},
                         {"clock_changes", st.clock_changes},
                         {"end_s", st.end_s},
                         {"clock_runs", nlohmann::json::array()},
                         {"partitions", nlohmann::json::object()}};
    double busy = 0, dyn = 0;
    for (const auto& in : st.instructions) {
      busy += in.time_s;
      dyn += in.dynamic_energy_j;
    }
    sj["busy_s"] = busy;
    sj["dynamic_energy_j_per_gpu"] = dyn;
    for (const auto& [f, n] : st.clock_runs())
      sj["clock_runs"].push_back({{"freq_mhz", f}, {"instructions", n}});
    for (const auto& [key, settings] : partition_choices(st)) {
      for (const auto& [what, n] : settings) sj["partitions"][key][what] = n;
    }
    j["stages"].push_back(std::move(sj));
  }
  return j;
}

std::string plan_summary_text(const Plan& p) {
  std::string out = fmt::format(
      "plan for {} ({} GPUs, {}): {}, method {} ({}), goal: {}\n"
      "predicted: iteration {:.4f} s, energy {:.1f} J (whole job), {} clock changes "
      "(each a {:.1f} ms stall; clocks held >= {:.1f} ms)\n"
      "ranks: order {} (rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))), tp={} cp={} "
      "dp={} pp={}\n",
      p.workload, p.gpus, p.gpu, p.label, p.method,
      p.execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential", p.goal,
      p.iteration_time_s, p.energy_j, p.clock_changes(), p.clock_switch_s * 1e3,
      p.min_clock_hold_s * 1e3, RankLayout::kOrder, p.layout.tp, p.layout.cp, p.layout.dp,
      p.layout.pp);
  if (p.deadline_margin >= 0) {
    out += fmt::format("deadline margin: {:.2f}%{}\n", 100 * p.deadline_margin,
                       p.replayed_time_s >= 0
                           ? fmt::format(", emulator replay {:.4f} s", p.replayed_time_s)
                           : std::string());
  }
  if (!p.stage_slowdown.empty()) {
    out += "re-planned for stage slowdown (instruction time factors):";
    for (std::size_t k = 0; k < p.stage_slowdown.size(); ++k) {
      out += fmt::format(" {}={:.3f}", k, p.stage_slowdown[k]);
    }
    out += "\n";
  }
  out += plan_power_text(p);
  out += p.power_calibrated
             ? fmt::format("power model: calibrated ({})\n", p.power_source)
             : fmt::format("power model: NOT calibrated for {} ({}): its energies are estimates\n",
                           p.gpu, p.power_source.empty() ? "no source recorded" : p.power_source);
  if (p.chunks > 1) {
    out += fmt::format(
        "schedule: interleaved 1F1B, {} model chunks per stage (chunk c of stage s is virtual "
        "stage c*pp+s); F3c1 = forward of micro-batch 3 through chunk 1\n",
        p.chunks);
  }
  for (const auto& st : p.stages) {
    double busy = 0, dyn = 0;
    for (const auto& in : st.instructions) {
      busy += in.time_s;
      dyn += in.dynamic_energy_j;
    }
    std::vector<std::string> runs;
    for (const auto& [f, n] : st.clock_runs())
      runs.push_back(n == 1 ? std::to_string(f) : fmt::format("{}x{}", f, n));
    out += fmt::format(
        "\nstage {} (ranks {}): {} instructions, busy {:.4f} s, ends at {:.4f} s, dynamic "
        "energy {:.1f} J per GPU\n  clocks (MHz x instructions): {}\n  clock changes: {}\n",
        st.stage, rank_ranges(st.ranks), st.instructions.size(), busy, st.end_s, dyn,
        fmt::join(runs, " "), st.clock_changes);
    if (p.chunks > 1) {
      // The interleaved order is what a reader checks against Megatron-LM: its start in full.
      constexpr std::size_t kShown = 24;
      std::vector<std::string> order;
      for (std::size_t i = 0; i < std::min(kShown, st.instructions.size()); ++i) {
        const auto& in = st.instructions[i];
        order.push_back(fmt::format("{}{}c{}", in.kind == InstructionKind::kForward ? 'F' : 'B',
                                    in.microbatch, in.chunk));
      }
      out += fmt::format("  order: {}{}\n", fmt::join(order, " "),
                         st.instructions.size() > kShown ? " ..." : "");
    }
    const auto choices = partition_choices(st);
    if (choices.empty()) continue;
    TextTable t({"partition", "SMs @ slot (launch before op)", "instances (all instructions)"});
    for (const auto& [key, settings] : choices) {
      for (const auto& [what, n] : settings) t.add_row({key, what, std::to_string(n)});
    }
    std::string table = t.render();
    std::string indented;
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) indented += "  " + line + "\n";
    out += indented;
  }
  return out;
}
}  // namespace kareus
