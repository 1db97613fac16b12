// Throughput, MFU, energy per token and power per GPU. Model FLOPs are the kernel graph's count
// (src/workload/kernel_graph.cc), the one count every output uses; include/kareus/metrics.h
// states the convention.
#include "kareus/metrics.h"

#include <fmt/format.h>

#include <cmath>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"

namespace kareus {

double model_flops_per_iteration(const Workload& w) {
  return build_kernel_graph(w).model_flops_per_iteration;
}

JobShape job_shape(const Workload& w) {
  JobShape j;
  j.tokens_per_iteration = w.tokens_per_iteration();
  j.model_flops_per_iteration = model_flops_per_iteration(w);
  j.gpus = w.cluster.gpus();
  j.peak_flops_per_gpu = w.gpu().bf16_peak_tflops * 1e12;
  return j;
}

ThroughputMetrics throughput_metrics(const JobShape& job, double iteration_time_s,
                                     double energy_j) {
  if (!(iteration_time_s > 0) || !(energy_j > 0) || !std::isfinite(iteration_time_s) ||
      !std::isfinite(energy_j)) {
    throw InvalidInput(
        fmt::format("metrics: iteration time {} s and energy {} J must be finite and > 0",
                    iteration_time_s, energy_j));
  }
  if (job.gpus < 1 || !(job.tokens_per_iteration > 0) || !(job.peak_flops_per_gpu > 0)) {
    throw InvalidInput(fmt::format(
        "metrics: job shape needs gpus >= 1, tokens and peak FLOP/s > 0 (got {}, {}, {})", job.gpus,
        job.tokens_per_iteration, job.peak_flops_per_gpu));
  }
  ThroughputMetrics m;
  m.tokens_per_s = job.tokens_per_iteration / iteration_time_s;
  m.tokens_per_s_per_gpu = m.tokens_per_s / job.gpus;
  m.mfu = job.model_flops_per_iteration / (iteration_time_s * job.gpus * job.peak_flops_per_gpu);
  m.energy_per_token_j = energy_j / job.tokens_per_iteration;
  m.avg_power_per_gpu_w = energy_j / (iteration_time_s * job.gpus);
  return m;
}

nlohmann::json to_json(const ThroughputMetrics& m) {
  return {{"tokens_per_s", m.tokens_per_s},
          {"tokens_per_s_per_gpu", m.tokens_per_s_per_gpu},
          {"mfu", m.mfu},
          {"energy_per_token_j", m.energy_per_token_j},
          {"avg_power_per_gpu_w", m.avg_power_per_gpu_w}};
}

nlohmann::json to_json(const JobShape& j) {
  return {{"tokens_per_iteration", j.tokens_per_iteration},
          {"model_flops_per_iteration", j.model_flops_per_iteration},
          {"gpus", j.gpus},
          {"peak_flops_per_gpu", j.peak_flops_per_gpu}};
}

namespace {

// `value` with a prefix from `prefixes` (powers of 1000 from 10^-3 on, index 1 = none) and
// `significant` digits.
std::string with_prefix(double value, const char* const (&prefixes)[6], const char* unit,
                        int significant) {
  significant = std::max(3, significant);
  if (value == 0 || !std::isfinite(value)) return fmt::format("{:.{}f} {}", value, 0, unit);
  int i = 1;
  double v = value;
  while (std::abs(v) < 1.0 && i > 0) {
    v *= 1000.0;
    --i;
  }
  while (std::abs(v) >= 999.5 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  // Digits after the point so that the whole number has `significant` digits; rounding may
  // carry to the next decade (999.6 -> "1000"), which still reads well.
  const int before = std::abs(v) >= 100 ? 3 : std::abs(v) >= 10 ? 2 : 1;
  const int after = std::max(0, significant - before);
  return fmt::format("{:.{}f} {}{}", v, after, prefixes[i], unit);
}

}  // namespace

std::string format_energy(double energy_j, int significant) {
  static const char* const prefixes[6] = {"m", "", "k", "M", "G", "T"};
  return with_prefix(energy_j, prefixes, "J", significant);
}

std::string format_si(double value, int significant) {
  static const char* const prefixes[6] = {"m", "", "k", "M", "G", "T"};
  std::string s = with_prefix(value, prefixes, "", significant);
  // "12.4 k" -> "12.4k", "776 " -> "776": a bare count reads better without the space.
  if (!s.empty() && s.back() == ' ') s.pop_back();
  const auto sp = s.rfind(' ');
  if (sp != std::string::npos) s.erase(sp, 1);
  return s;
}

std::string metrics_line(const ThroughputMetrics& m) {
  return fmt::format("{} tokens/s ({} per GPU), MFU {:.1f}%, {}/token, {:.0f} W/GPU",
                     format_si(m.tokens_per_s), format_si(m.tokens_per_s_per_gpu), 100 * m.mfu,
                     format_energy(m.energy_per_token_j), m.avg_power_per_gpu_w);
}

}  // namespace kareus
