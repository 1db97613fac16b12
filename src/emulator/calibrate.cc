// Calibration of the emulator: a deterministic pattern search (Hooke & Jeeves, JACM 1961) in
// log space over the fitted parameters, minimizing the sum of squared relative errors of
// iteration time and energy over the calibration targets. Bounds keep each parameter physical.
#include "kareus/calibrate.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kareus/error.h"

namespace kareus {

std::vector<CalibrationTarget> read_calibration_targets(const std::string& csv_path,
                                                        int max_freq_mhz, int slow_freq_mhz) {
  std::ifstream in(csv_path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open calibration file", csv_path));
  std::vector<std::pair<double, double>> perseus, nano;
  std::string line;
  bool header = false;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      if (line.rfind("method,iter_time_s,energy_j", 0) != 0) {
        throw InvalidInput(
            fmt::format("{}:{}: expected header method,iter_time_s,energy_j", csv_path, lineno));
      }
      header = true;
      continue;
    }
    std::stringstream ss(line);
    std::string method, t, e;
    std::getline(ss, method, ',');
    std::getline(ss, t, ',');
    std::getline(ss, e, ',');
    double time_s = 0, energy_j = 0;
    try {
      time_s = std::stod(t);
      energy_j = std::stod(e);
    } catch (const std::exception&) {
      throw InvalidInput(
          fmt::format("{}:{}: iter_time_s and energy_j must be numbers", csv_path, lineno));
    }
    if (method == "perseus") perseus.push_back({time_s, energy_j});
    if (method == "nanobatch_perseus") nano.push_back({time_s, energy_j});
  }
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
      {fmt::format("megatron@{}", slow_freq_mhz), "megatron", slow_freq_mhz, ps.first, ps.second},
  };
}

std::vector<Residual> evaluate_targets(const Workload& w, const EmulatorParams& p,
                                       const std::vector<CalibrationTarget>& targets) {
  const EmulatorModel m(w.gpu(), p);
  std::vector<Residual> out;
  for (const auto& t : targets) {
    const IterationResult r = emulate_schedule(w, m, t.schedule, t.freq_mhz);
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

namespace {

struct Knob {
  const char* name;
  double lo, hi;
};

// The fitted parameters and their physical bounds.
const Knob kKnobs[] = {
    {"achieved_fraction", 0.3, 1.0},  // of best-case microbenchmark efficiency
    {"overlap_slowdown", 0.0, 0.6},   // published interference 10-40%
    {"sm_power_w", 50, 600},
    {"voltage_ratio", 1.0, 1.8},
};

double objective(const std::vector<Residual>& rs) {
  double s = 0;
  for (const auto& r : rs) s += r.time_error * r.time_error + r.energy_error * r.energy_error;
  return s;
}

}  // namespace

EmulatorParams calibration_prior() {
  EmulatorParams p;
  p.achieved_fraction = 0.8;
  p.overlap_slowdown = 0.15;
  p.sm_power_w = 250;
  p.voltage_ratio = 1.25;
  return p;
}

CalibrationResult calibrate(const Workload& w, const std::vector<CalibrationTarget>& targets,
                            const EmulatorParams& start) {
  CalibrationResult res;
  EmulatorParams cur = start;
  auto fields = cur.fields();
  double best = objective(evaluate_targets(w, cur, targets));
  res.evaluations = 1;
  double step = 0.2;  // log-space step
  while (step > 1e-4 && res.evaluations < 2000) {
    bool improved = false;
    for (const auto& k : kKnobs) {
      double* v = fields.at(k.name);
      for (double dir : {+1.0, -1.0}) {
        const double old = *v;
        // overlap_slowdown may be 0: search it additively.
        double cand = std::string(k.name) == "overlap_slowdown" ? old + dir * step * 0.5
                                                                : old * std::exp(dir * step);
        cand = std::clamp(cand, k.lo, k.hi);
        if (cand == old) continue;
        *v = cand;
        const double obj = objective(evaluate_targets(w, cur, targets));
        ++res.evaluations;
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
  res.params = cur;
  for (const auto& k : kKnobs) res.fitted.push_back(k.name);
  res.residuals = evaluate_targets(w, cur, targets);
  res.rms_error = std::sqrt(best / (2.0 * static_cast<double>(targets.size())));
  return res;
}

}  // namespace kareus
