// Calibration of the emulator: a deterministic pattern search (Hooke & Jeeves, JACM 1961) in
// log space over the fitted parameters, minimizing squared relative errors against two kinds of
// measurement: whole-iteration time and energy of one A100 workload (Kareus artifact), and the
// per-clock time and energy of real A100 pipeline stages (Perseus, Chung et al., SOSP '24,
// data/calibration/). Bounds keep each parameter physical. The overlap interference is not
// fitted: it is set so that the emulated mean compute slowdown under a concurrent collective
// equals the published 18.9% (arXiv 2507.03114), which the three iteration targets cannot
// identify.
#include "kareus/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "csv_rows.h"
#include "kareus/error.h"

namespace kareus {

namespace detail {

void for_each_csv_row(const std::string& csv_path, const std::string& header,
                      const std::string& what,
                      const std::function<void(const std::vector<std::string>&, int)>& fn) {
  std::ifstream in(csv_path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open {}", csv_path, what));
  std::string line;
  bool seen_header = false;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    if (!seen_header) {
      if (line.rfind(header, 0) != 0) {
        throw InvalidInput(fmt::format("{}:{}: expected header {}", csv_path, lineno, header));
      }
      seen_header = true;
      continue;
    }
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) fields.push_back(x);
    fn(fields, lineno);
  }
}

}  // namespace detail

using detail::for_each_csv_row;

std::vector<CalibrationTarget> read_calibration_targets(const std::string& csv_path,
                                                        int max_freq_mhz) {
  std::vector<std::pair<double, double>> perseus, nano;
  for_each_csv_row(csv_path, "method,iter_time_s,energy_j", "calibration file",
                   [&](const std::vector<std::string>& f, int lineno) {
                     double time_s = 0, energy_j = 0;
                     try {
                       time_s = std::stod(f.at(1));
                       energy_j = std::stod(f.at(2));
                     } catch (const std::exception&) {
                       throw InvalidInput(fmt::format(
                           "{}:{}: iter_time_s and energy_j must be numbers", csv_path, lineno));
                     }
                     if (f[0] == "perseus") perseus.push_back({time_s, energy_j});
                     if (f[0] == "nanobatch_perseus") nano.push_back({time_s, energy_j});
                   });
  if (perseus.empty() || nano.empty()) {
    throw InvalidInput(fmt::format("{}: needs perseus and nanobatch_perseus rows", csv_path));
  }
  auto fastest = [](const auto& v) {
    auto best = v.front();
    for (const auto& x : v) best = x.first < best.first ? x : best;
    return best;
  };
  auto slowest = [](const auto& v) {
    auto best = v.front();
    for (const auto& x : v) best = x.first > best.first ? x : best;
    return best;
  };
  const auto pf = fastest(perseus), nf = fastest(nano), ps = slowest(perseus);
  return {
      {fmt::format("megatron@{}", max_freq_mhz), "megatron", max_freq_mhz, pf.first, pf.second},
      {fmt::format("nanobatch@{}", max_freq_mhz), "nanobatch", max_freq_mhz, nf.first, nf.second},
      {"perseus-slowest", "perseus-slowest", 0, ps.first, ps.second},
  };
}

std::vector<int> perseus_slowest_clocks(const Workload& w, const EmulatorModel& m) {
  Workload sequential = w;
  sequential.batch.nano_batches = 1;  // Megatron's kernels: one nano-batch per micro-batch
  const PartitionSet ps = partition_workload(sequential);
  const double static_w = m.gpu().static_power_w;
  std::vector<int> clocks;
  for (int s = 0; s < w.parallel.pp; ++s) {
    for (InstructionKind kind : {InstructionKind::kForward, InstructionKind::kBackward}) {
      int best_f = m.gpu().max_freq_mhz;
      double best_j = std::numeric_limits<double>::infinity();
      for (int f : m.gpu().candidate_freqs_mhz()) {
        InstructionSettings st;
        st.freq_mhz = f;
        const InstructionCost c =
            emulate_instruction(ps, m, ExecutionMode::kSequential, s, kind, st);
        const double j = c.dynamic_energy_j + static_w * c.time_s;
        // Ties go to the faster clock, as a frontier's slow end would not pay time for nothing.
        if (j < best_j || (j == best_j && f > best_f)) {
          best_j = j;
          best_f = f;
        }
      }
      clocks.push_back(best_f);
    }
  }
  return clocks;
}

std::vector<Residual> evaluate_targets(const Workload& w, const EmulatorParams& p,
                                       const std::vector<CalibrationTarget>& targets) {
  const EmulatorModel m(w.gpu(), p);
  std::vector<Residual> out;
  for (const auto& t : targets) {
    IterationResult r;
    if (t.schedule == "perseus-slowest") {
      const std::vector<int> clocks = perseus_slowest_clocks(w, m);
      r = emulate_iteration(w, m, ExecutionMode::kSequential,
                            [&clocks](int stage, InstructionKind kind, int) {
                              InstructionSettings st;
                              st.freq_mhz = clocks[static_cast<std::size_t>(stage) * 2 +
                                                   (kind == InstructionKind::kBackward ? 1 : 0)];
                              return st;
                            });
    } else {
      r = emulate_schedule(w, m, t.schedule, t.freq_mhz);
    }
    Residual res;
    res.target = t;
    res.time_s = r.iteration_time_s;
    res.energy_j = r.energy_j_per_gpu_sum_over_stages();
    res.time_error = res.time_s / t.time_s - 1.0;
    res.energy_error = res.energy_j / t.energy_j - 1.0;
    out.push_back(res);
  }
  return out;
}

// ---- Perseus stage profiles.

std::vector<StageProfilePoint> read_stage_profile(const std::string& csv_path) {
  std::vector<StageProfilePoint> out;
  for_each_csv_row(
      csv_path, "stage,instruction,frequency,time,energy", "stage profile",
      [&](std::vector<std::string> f, int lineno) {
        f.resize(5);
        StageProfilePoint pt;
        if (f[1] == "forward") {
          pt.kind = InstructionKind::kForward;
        } else if (f[1] == "backward") {
          pt.kind = InstructionKind::kBackward;
        } else {
          throw InvalidInput(fmt::format("{}:{}: instruction must be forward or backward, got '{}'",
                                         csv_path, lineno, f[1]));
        }
        try {
          pt.stage = std::stoi(f[0]);
          pt.freq_mhz = std::stoi(f[2]);
          pt.time_s = std::stod(f[3]);
          pt.energy_j = std::stod(f[4]);
        } catch (const std::exception&) {
          throw InvalidInput(fmt::format("{}:{}: stage, frequency, time and energy must be numbers",
                                         csv_path, lineno));
        }
        if (pt.stage < 0 || pt.freq_mhz <= 0 || !(pt.time_s > 0) || !(pt.energy_j > 0)) {
          throw InvalidInput(fmt::format(
              "{}:{}: stage must be >= 0 and frequency, time, energy > 0", csv_path, lineno));
        }
        out.push_back(pt);
      });
  if (out.empty()) throw InvalidInput(fmt::format("{}: no stage profile rows", csv_path));
  return out;
}

std::vector<std::string> perseus_stage_models() { return {"gpt3-175b", "bloom-176b"}; }

Workload perseus_stage_workload(const std::string& model) {
  // Shapes: GPT-3 175B (Brown et al., NeurIPS 2020, Table 2.1: 96 layers, d_model 12288, 96
  // heads of 128, context 2048) and BLOOM 176B (BigScience, arXiv 2211.05100, Table 3: 70
  // layers, hidden 14336, 112 heads of 128, vocabulary 250880, sequence 2048). Both have a
  // 4h GELU MLP; the kernel graph builds a SwiGLU MLP, so ffn_hidden = 8h/3 gives the same
  // FLOPs (2 x 4h x h x 2 = 3 x f x h x 2) with slightly different GEMM shapes. Parallelism
  // (an assumption, docs/emulator.md): 8 stages as in the files, TP 8 inside a node, micro-batch
  // 1, no recomputation (backward / forward is 1.85-1.95 in the profiles, not about 3).
  Workload w;
  w.name = "perseus-" + model;
  w.gpu_name = "a100-sxm4-80gb";
  w.cluster.nodes = 8;
  w.cluster.gpus_per_node = 8;
  w.parallel.tp = 8;
  w.parallel.pp = 8;
  w.batch.micro_batch = 1;
  w.batch.seq_len = 2048;
  w.batch.micro_batches = 1;
  w.batch.nano_batches = 1;
  w.recompute = Recompute::kNone;
  ModelConfig& m = w.model;
  m.name = model;
  m.head_dim = 128;
  if (model == "gpt3-175b") {
    m.layers = 96;
    m.hidden = 12288;
    m.heads = 96;
    m.vocab = 50257;
    w.parallel.stage_layers = std::vector<int>(8, 12);
  } else if (model == "bloom-176b") {
    m.layers = 70;
    m.hidden = 14336;
    m.heads = 112;
    m.vocab = 250880;
    // Stages 0-6 of the profile are identical and stage 7 is lighter: 7 x 9 + 7 layers.
    w.parallel.stage_layers = {9, 9, 9, 9, 9, 9, 9, 7};
  } else {
    throw InvalidInput(
        fmt::format("unknown stage-profile model '{}'; known: gpt3-175b, bloom-176b", model));
  }
  m.kv_heads = m.heads;
  m.ffn_hidden = m.hidden * 8 / 3;
  return w;
}

StageProfileResult evaluate_stage_profile(const std::string& model,
                                          const std::vector<StageProfilePoint>& points,
                                          const EmulatorParams& p, double power_limit_w) {
  // The partition set depends only on the shape: built once per model.
  static const std::map<std::string, PartitionSet> sets = [] {
    std::map<std::string, PartitionSet> m;
    for (const auto& name : perseus_stage_models()) {
      m.emplace(name, partition_workload(perseus_stage_workload(name)));
    }
    return m;
  }();
  const auto it = sets.find(model);
  if (it == sets.end()) perseus_stage_workload(model);  // throws the error naming the models
  const PartitionSet& ps = it->second;
  const Workload w = perseus_stage_workload(model);
  EmulatorParams q = p;
  q.power_limit_w = power_limit_w;
  const EmulatorModel em(w.gpu(), q);
  const int stages = w.parallel.pp;
  std::map<std::pair<int, int>, double> top_measured, top_emulated;  // (stage, kind) -> time
  int top_freq = 0;
  for (const auto& pt : points) top_freq = std::max(top_freq, pt.freq_mhz);
  StageProfileResult res;
  res.model = model;
  for (const auto& pt : points) {
    if (pt.stage >= stages) {
      throw InvalidInput(fmt::format("{} stage profile: stage {} beyond the {} stages assumed",
                                     model, pt.stage, stages));
    }
    InstructionSettings st;
    st.freq_mhz = pt.freq_mhz;
    const InstructionCost c =
        emulate_instruction(ps, em, ExecutionMode::kSequential, pt.stage, pt.kind, st);
    StageProfileRow row;
    row.measured = pt;
    row.emulated_time_s = c.time_s;
    row.measured_power_w = pt.energy_j / pt.time_s;
    row.emulated_power_w = c.dynamic_energy_j / c.time_s + w.gpu().static_power_w;
    row.power_error = row.emulated_power_w / row.measured_power_w - 1.0;
    res.rows.push_back(row);
    if (pt.freq_mhz == top_freq) {
      const std::pair<int, int> key{pt.stage, static_cast<int>(pt.kind)};
      top_measured[key] = pt.time_s;
      top_emulated[key] = c.time_s;
    }
  }
  double st2 = 0, sp2 = 0;
  for (auto& row : res.rows) {
    const std::pair<int, int> key{row.measured.stage, static_cast<int>(row.measured.kind)};
    if (!top_measured.count(key)) {
      throw InvalidInput(fmt::format("{} stage profile: stage {} {} has no row at {} MHz", model,
                                     key.first, to_string(row.measured.kind), top_freq));
    }
    row.measured_norm_time = row.measured.time_s / top_measured[key];
    row.emulated_norm_time = row.emulated_time_s / top_emulated[key];
    row.norm_time_error = row.emulated_norm_time / row.measured_norm_time - 1.0;
    st2 += row.norm_time_error * row.norm_time_error;
    sp2 += row.power_error * row.power_error;
  }
  const double n = static_cast<double>(res.rows.size());
  res.norm_time_rms = std::sqrt(st2 / n);
  res.power_rms = std::sqrt(sp2 / n);
  return res;
}

// ---- Overlap interference.

double mean_overlap_compute_slowdown(const Workload& w, const EmulatorParams& p) {
  Workload wl = w;
  wl.batch.nano_batches = 2;
  const PartitionSet ps = partition_workload(wl);
  const EmulatorModel m(w.gpu(), p);
  const int f = w.gpu().max_freq_mhz;
  double sum = 0;
  int n = 0;
  for (const auto& part : ps.partitions) {
    if (part.collective.wire_bytes() <= 0 || part.compute_ops.empty()) continue;
    const double alone = m.simulate_overlap(part.compute_ops, nullptr, 0, 0, f).time_s;
    const SimResult with =
        m.simulate_overlap(part.compute_ops, &part.collective, 0,
                           m.default_collective_sms(part.collective), f, part.comm_tail);
    sum += with.compute_end_s / alone - 1.0;
    ++n;
  }
  return n > 0 ? sum / n : 0.0;
}

double fit_overlap_slowdown(const Workload& w, EmulatorParams p, double target) {
  p.overlap_slowdown = 0;
  if (mean_overlap_compute_slowdown(w, p) >= target) return 0.0;
  double lo = 0, hi = 0.6;
  p.overlap_slowdown = hi;
  if (mean_overlap_compute_slowdown(w, p) <= target) return hi;
  for (int i = 0; i < 40; ++i) {  // monotone in overlap_slowdown
    const double mid = 0.5 * (lo + hi);
    p.overlap_slowdown = mid;
    (mean_overlap_compute_slowdown(w, p) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// ---- Device runs.

std::vector<DeviceRow> evaluate_device_run(const std::string& json_path, const std::string& root,
                                           const EmulatorParams& p) {
  std::ifstream in(json_path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open device run", json_path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{}: not JSON: {}", json_path, e.what()));
  }
  std::vector<DeviceRow> out;
  try {
    std::string wpath = j.at("workload").get<std::string>();
    if (!wpath.empty() && wpath[0] != '/' && !root.empty()) wpath = root + "/" + wpath;
    Workload w = load_workload(wpath);
    w.gpu_name = j.at("catalogue_gpu").get<std::string>();
    const PartitionSet ps = partition_workload(w);
    const EmulatorModel m(w.gpu(), p);
    const int requested = j.at("clock_mhz").get<int>();
    for (const auto& row : j.at("partitions")) {
      DeviceRow d;
      d.workload = w.name;
      d.partition = row.at("partition").get<std::string>();
      d.slot = row.at("slot").get<std::string>();
      d.reasons = row.value("clock_event_reasons", std::string());
      d.sms = row.at("sms").get<int>();
      d.freq_mhz = requested;
      d.measured_min_freq_mhz = row.value("clock_mhz", requested);
      d.measured_time_s = row.at("time_s").get<double>();
      d.measured_power_w = row.at("energy_j").get<double>() / d.measured_time_s;
      PartitionConfig c;
      c.freq_mhz = requested;
      c.sms = d.sms;
      c.slot = d.slot;
      const Partition& part = ps.partition(d.partition);
      const SimResult r = m.simulate_partition(part, c);
      d.emulated_time_s = r.time_s;
      d.emulated_power_w = r.dynamic_energy_j / r.time_s + w.gpu().static_power_w;
      d.collective_dominated = r.collective_end_s > 0.8 * r.compute_end_s;
      d.time_error = d.emulated_time_s / d.measured_time_s - 1.0;
      d.power_error = d.emulated_power_w / d.measured_power_w - 1.0;
      out.push_back(d);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{}: missing or malformed field: {}", json_path, e.what()));
  }
  return out;
}

double fit_device_sm_power(const std::vector<std::string>& json_paths, const std::string& root,
                           const EmulatorParams& p) {
  auto rms = [&](double sm_power_w) {
    EmulatorParams q = p;
    q.sm_power_w = sm_power_w;
    double s = 0;
    int n = 0;
    for (const auto& path : json_paths) {
      for (const auto& d : evaluate_device_run(path, root, q)) {
        if (d.collective_dominated) continue;
        // Power alone cannot place sm_power_w once a row sits at the cap (any larger value
        // gives the limit); how far the cap lowers the clock, and so the time, can.
        s += d.power_error * d.power_error + d.time_error * d.time_error;
        ++n;
      }
    }
    return n > 0 ? s / n : 0.0;
  };
  // Golden-section search: the error is unimodal in sm_power_w (power grows with it until the
  // cap, then the capped clock falls).
  const double g = (std::sqrt(5.0) - 1) / 2;
  double a = 100, b = 2000;
  double x1 = b - g * (b - a), x2 = a + g * (b - a);
  double f1 = rms(x1), f2 = rms(x2);
  while (b - a > 0.5) {
    if (f1 < f2) {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - g * (b - a);
      f1 = rms(x1);
    } else {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + g * (b - a);
      f2 = rms(x2);
    }
  }
  return 0.5 * (a + b);
}

namespace {

struct Knob {
  const char* name;
  double lo, hi;
};

// The fitted parameters and their physical bounds.
const Knob kKnobs[] = {
    {"achieved_fraction", 0.3, 1.0},  // of best-case microbenchmark efficiency
    {"sm_power_w", 50, 1000},
    {"voltage_ratio", 1.0, 1.8},
    // A knee below the lowest profiled clock (855 MHz) could not be told apart from one at it.
    {"voltage_knee_mhz", 855, 1300},
    {"idle_activity", 0.02, 0.6},  // resident but stalled SMs, as a fraction of a busy SM
    // NCCL runs 24 channels (one CTA each) on 8 A100s to reach its 230 GB/s: no more needed.
    {"nccl_sms_to_saturate", 8, 24},
};

double iteration_sq(const std::vector<Residual>& rs) {
  double s = 0;
  for (const auto& r : rs) s += r.time_error * r.time_error + r.energy_error * r.energy_error;
  return s;
}

double profile_sq(const StageProfileResult& r) {
  return r.norm_time_rms * r.norm_time_rms + r.power_rms * r.power_rms;
}

}  // namespace

EmulatorParams calibration_prior() {
  EmulatorParams p;
  p.achieved_fraction = 0.8;
  p.sm_power_w = 250;
  p.voltage_ratio = 1.25;
  p.voltage_knee_mhz = 1080;
  p.idle_activity = 0.3;
  p.nccl_sms_to_saturate = 16;
  return p;
}

CalibrationResult calibrate(const Workload& w, const std::vector<CalibrationTarget>& targets,
                            const EmulatorParams& start, const StageProfiles& fit,
                            const StageProfiles& held_out) {
  CalibrationResult res;
  EmulatorParams cur = EmulatorModel(w.gpu(), start).params();  // the GPU's curve resolved
  double limit = fit.empty() ? 0.0 : kStagePowerLimitPriorW;
  auto fields = cur.fields();
  // Mean squared error of the iteration targets plus, per fitted profile, its mean squared
  // normalized-time and power errors: each kind of measurement weighs the same.
  auto objective = [&]() {
    cur.overlap_slowdown = fit_overlap_slowdown(w, cur, kPublishedOverlapSlowdown);
    double obj = iteration_sq(evaluate_targets(w, cur, targets)) /
                 (2.0 * static_cast<double>(std::max<std::size_t>(1, targets.size())));
    for (const auto& [model, points] : fit) {
      obj += profile_sq(evaluate_stage_profile(model, points, cur, limit));
    }
    ++res.evaluations;
    return obj;
  };
  double best = objective();
  std::vector<std::pair<const char*, double*>> knobs;
  std::vector<std::pair<double, double>> bounds;
  for (const auto& k : kKnobs) {
    knobs.push_back({k.name, fields.at(k.name)});
    bounds.push_back({k.lo, k.hi});
  }
  if (!fit.empty()) {
    knobs.push_back({"stage_power_limit_w", &limit});
    bounds.push_back({400, 600});  // A100 SXM boards ship at 400 W; some HGX boards at 500 W
  }
  double step = 0.2;  // log-space step
  while (step > 1e-4 && res.evaluations < 3000) {
    bool improved = false;
    for (std::size_t i = 0; i < knobs.size(); ++i) {
      double* v = knobs[i].second;
      for (double dir : {+1.0, -1.0}) {
        const double old = *v;
        const double cand =
            std::clamp(old * std::exp(dir * step), bounds[i].first, bounds[i].second);
        if (cand == old) continue;
        *v = cand;
        const double obj = objective();
        if (obj < best - 1e-12) {
          best = obj;
          improved = true;
          break;
        }
        *v = old;
      }
    }
    if (!improved) step *= 0.5;
  }
  cur.overlap_slowdown = fit_overlap_slowdown(w, cur, kPublishedOverlapSlowdown);
  CalibrationResult out = evaluate_calibration(
      w, targets, cur, fit.empty() ? kStagePowerLimitPriorW : limit, fit, held_out);
  out.evaluations = res.evaluations;
  out.stage_power_limit_w = fit.empty() ? 0.0 : limit;
  return out;
}

CalibrationResult evaluate_calibration(const Workload& w,
                                       const std::vector<CalibrationTarget>& targets,
                                       const EmulatorParams& params, double stage_power_limit_w,
                                       const StageProfiles& fit, const StageProfiles& held_out) {
  CalibrationResult res;
  res.params = EmulatorModel(w.gpu(), params).params();
  for (const auto& k : kKnobs) res.fitted.push_back(k.name);
  res.fitted.push_back("overlap_slowdown");
  res.residuals = evaluate_targets(w, res.params, targets);
  res.rms_error =
      std::sqrt(iteration_sq(res.residuals) / (2.0 * static_cast<double>(targets.size())));
  res.stage_power_limit_w = stage_power_limit_w;
  for (const auto& [model, points] : fit) {
    res.fit_part.push_back(evaluate_stage_profile(model, points, res.params, stage_power_limit_w));
  }
  for (const auto& [model, points] : held_out) {
    res.held_out.push_back(evaluate_stage_profile(model, points, res.params, stage_power_limit_w));
  }
  return res;
}

}  // namespace kareus
