// Thermal model of an emulated GPU (see include/kareus/thermal.h for the equations).
//
// One lumped RC node (HotSpot's compact model, Skadron et al., ISCA 2003, reduced to one node)
// with static power linear in temperature. With P_static(T) = P0 (1 + c (T - T_ref)) the ODE
//   tau dT/dt = T_amb + R (P_dyn + P_static(T)) - T
// is linear, tau dT/dt = A - k T with k = 1 - R P0 c and A = T_amb + R (P_dyn + P0 (1 - c T_ref)),
// so over a step of constant dynamic power the temperature and the static energy have closed
// forms: T(t) = T_inf + (T0 - T_inf) exp(-k t / tau), T_inf = A / k. The simulation is exact
// between control steps; only the boost controller is discrete (one clock step per period),
// as the driver's is.
#include "kareus/thermal.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kareus/error.h"
#include "kareus/nvml.h"

namespace kareus {

void ThermalParams::validate(double static_power_w) const {
  auto bad = [](const std::string& field, const std::string& allowed, double v) {
    throw InvalidInput(fmt::format("thermal model: {} must be {}, got {}", field, allowed, v));
  };
  if (!(resistance_c_per_w > 0)) bad("resistance_c_per_w", "> 0", resistance_c_per_w);
  if (!(time_constant_s > 0)) bad("time_constant_s", "> 0", time_constant_s);
  if (!(leakage_per_c >= 0)) bad("leakage_per_c", ">= 0", leakage_per_c);
  if (!(control_period_s > 0)) bad("control_period_s", "> 0", control_period_s);
  if (!(recover_hysteresis_c >= 0)) bad("recover_hysteresis_c", ">= 0", recover_hysteresis_c);
  if (throttle_step_mhz < 0) bad("throttle_step_mhz", ">= 0", throttle_step_mhz);
  if (!(resistance_c_per_w * static_power_w * leakage_per_c < 1)) {
    bad("resistance_c_per_w * static_power_w * leakage_per_c", "< 1 (else thermal runaway)",
        resistance_c_per_w * static_power_w * leakage_per_c);
  }
}

ThermalParams thermal_params_for(const GpuSpec& gpu) {
  // Throttle temperatures are nvidia-smi's "GPU Max Operating Temp" (where the driver starts
  // lowering clocks); resistances put the steady state at the board power limit near 75 deg C
  // with 30 deg C inlet air (estimates); docs/emulator.md gives sources.
  ThermalParams t;
  t.ambient_c = 30;
  t.time_constant_s = 20;
  t.leakage_per_c = 0.004;
  if (gpu.name == "a100-sxm4-40gb" || gpu.name == "a100-sxm4-80gb") {
    t.throttle_temp_c = 85;
    t.resistance_c_per_w = 45.0 / 400;
  } else if (gpu.name == "a40") {
    t.throttle_temp_c = 88;
    t.resistance_c_per_w = 45.0 / 300;
  } else if (gpu.name == "h100-sxm" || gpu.name == "h200") {
    t.throttle_temp_c = 87;
    t.resistance_c_per_w = 45.0 / 700;
  } else {
    t.throttle_temp_c = 85;
    t.resistance_c_per_w = 45.0 / std::max(1.0, gpu.power_limit_w);
  }
  return t;
}

double reference_temperature_c(const GpuSpec& gpu, const ThermalParams& t) {
  return t.ambient_c + t.resistance_c_per_w * gpu.static_power_w;
}

double static_power_at_w(const GpuSpec& gpu, const ThermalParams& t, double temperature_c) {
  return gpu.static_power_w *
         (1.0 + t.leakage_per_c * (temperature_c - reference_temperature_c(gpu, t)));
}

ThermalTarget::ThermalTarget(const EmulatorModel& model, const Partition& partition,
                             const PartitionConfig& config, const ThermalParams& params,
                             const ThermalTargetOptions& o)
    : model_(model),
      part_(partition),
      config_(config),
      t_(params),
      gpus_(o.gpus),
      step_mhz_(params.throttle_step_mhz > 0 ? params.throttle_step_mhz
                                             : model.gpu().freq_step_mhz),
      temperature_c_(
          o.initial_temperature_c.value_or(reference_temperature_c(model.gpu(), params))),
      clock_mhz_(config.freq_mhz) {
  t_.validate(model.gpu().static_power_w);
  if (o.gpus < 1)
    throw InvalidInput(fmt::format("thermal target: gpus must be >= 1, got {}", o.gpus));
  model.gpu().require_freq(config.freq_mhz,
                           fmt::format("thermal target: clock {} MHz", config.freq_mhz));
}

const SimResult& ThermalTarget::at_clock(int freq_mhz) {
  auto it = sims_.find(freq_mhz);
  if (it != sims_.end()) return it->second;
  PartitionConfig c = config_;
  c.freq_mhz = freq_mhz;
  return sims_.emplace(freq_mhz, model_.simulate_partition(part_, c)).first->second;
}

void ThermalTarget::advance(double dt_s, double dynamic_power_w) {
  if (dt_s <= 0) return;
  const GpuSpec& g = model_.gpu();
  const double p0 = g.static_power_w, c = t_.leakage_per_c, r = t_.resistance_c_per_w;
  const double t_ref = reference_temperature_c(g, t_);
  const double k = 1.0 - r * p0 * c;
  const double a = t_.ambient_c + r * (dynamic_power_w + p0 * (1.0 - c * t_ref));
  const double t_inf = a / k;
  const double decay = std::exp(-k * dt_s / t_.time_constant_s);
  // Integral of T over the step, then static energy = P0 (1 - c T_ref) dt + P0 c integral(T).
  const double integral_t =
      t_inf * dt_s + (temperature_c_ - t_inf) * t_.time_constant_s / k * (1.0 - decay);
  energy_per_gpu_j_ += dynamic_power_w * dt_s + p0 * (1.0 - c * t_ref) * dt_s + p0 * c * integral_t;
  temperature_c_ = t_inf + (temperature_c_ - t_inf) * decay;
  now_s_ += dt_s;
}

void ThermalTarget::control(double dt_s) {
  since_control_s_ += dt_s;
  while (since_control_s_ >= t_.control_period_s) {
    since_control_s_ -= t_.control_period_s;
    if (temperature_c_ > t_.throttle_temp_c) {
      clock_mhz_ = std::max(model_.gpu().min_freq_mhz, clock_mhz_ - step_mhz_);
      throttling_ = true;
      latched_ |= nvml::kReasonSwThermalSlowdown;
    } else if (temperature_c_ < t_.throttle_temp_c - t_.recover_hysteresis_c) {
      clock_mhz_ = config_.freq_mhz;
      throttling_ = false;
    }
  }
}

double ThermalTarget::run(int iterations) {
  if (iterations < 1) {
    throw InvalidInput(fmt::format("thermal target: iterations must be >= 1, got {}", iterations));
  }
  double elapsed = 0;
  for (int i = 0; i < iterations; ++i) {
    const SimResult& s = at_clock(clock_mhz_);
    advance(s.time_s, s.dynamic_energy_j / s.time_s);
    elapsed += s.time_s;
    control(s.time_s);
  }
  return elapsed;
}

double ThermalTarget::energy_j() { return energy_per_gpu_j_ * gpus_; }

std::uint64_t ThermalTarget::throttle_mask() {
  const std::uint64_t m = latched_ | (throttling_ ? nvml::kReasonSwThermalSlowdown : 0);
  latched_ = 0;
  return m;
}

std::string ThermalTarget::describe_throttle(std::uint64_t mask) const {
  return nvml::ClockEventReasons{mask}.describe();
}

void ThermalTarget::idle(double seconds) {
  if (!(seconds >= 0)) {
    throw InvalidInput(fmt::format("thermal target: idle seconds must be >= 0, got {}", seconds));
  }
  double left = seconds;
  while (left > 0) {
    const double dt = std::min(left, t_.control_period_s);
    advance(dt, 0.0);
    control(dt);
    left -= dt;
  }
}

}  // namespace kareus
