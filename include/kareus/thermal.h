// A thermal model of one GPU for the emulator, so that the thermally stable measurement protocol
// (include/kareus/protocol.h) can be exercised without hardware. First-order RC model of the die
// and heat sink (the lumped model of HotSpot, Skadron et al., ISCA 2003, reduced to one node):
//   dT/dt = (T_ambient + R_th * P(T) - T) / tau,   P(T) = P_dynamic + P_static(T),
// where static (leakage-dominated) power grows linearly with temperature around the temperature
// at which the catalogue's static power holds (the idle steady state). The GPU's boost
// controller steps the SM clock down while the temperature is above the throttle temperature
// and raises NVML's "SW thermal slowdown" reason; it restores the requested clock once the
// temperature falls a few degrees below it. Everything runs in simulated time. Parameters per
// GPU and their sources (most are estimates) are in docs/emulator.md ("Thermal model").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kareus/emulator.h"
#include "kareus/protocol.h"

namespace kareus {

struct ThermalParams {
  double ambient_c = 30;            ///< inlet air (deg C)
  double resistance_c_per_w = 0.1;  ///< R_th: steady-state rise per watt (deg C / W)
  double time_constant_s = 20;      ///< tau of the RC model (s)
  double leakage_per_c = 0.004;     ///< relative growth of static power per deg C
  double throttle_temp_c = 85;      ///< clocks step down above this (GPU Max Operating Temp)
  double recover_hysteresis_c = 3;  ///< the requested clock returns below throttle - this
  double control_period_s = 0.1;    ///< one clock step per period while too hot
  int throttle_step_mhz = 0;        ///< clock step per period; 0: the GPU's clock granularity

  /// Throws InvalidInput naming the field when a value is out of range (including a leakage
  /// so steep that the model has no steady state: R_th * P_static * leakage_per_c >= 1).
  void validate(double static_power_w) const;
};

/// The catalogue GPU's parameters (docs/emulator.md lists sources and estimates).
ThermalParams thermal_params_for(const GpuSpec& gpu);

/// Temperature at which the catalogue's static power holds: the idle steady state,
/// T_ambient + R_th * P_static (deg C).
double reference_temperature_c(const GpuSpec& gpu, const ThermalParams& t);
/// Static power at a temperature (W): P_static * (1 + leakage_per_c * (T - T_reference)).
double static_power_at_w(const GpuSpec& gpu, const ThermalParams& t, double temperature_c);

struct ThermalTargetOptions {
  int gpus = 1;  ///< identical GPUs of the group; counters are summed over them
  std::optional<double> initial_temperature_c;  ///< default: the idle steady state
};

/// One partition at one configuration on a group of identical emulated GPUs, as a
/// MeasurementTarget in simulated time. Each iteration takes the EmulatorModel's time at the
/// current (possibly throttled) clock and adds its dynamic energy; static energy follows the
/// temperature, which is integrated exactly between control steps. idle() advances simulated
/// time without sleeping. Not thread-safe; `model` and `partition` must outlive the target.
class ThermalTarget : public MeasurementTarget {
 public:
  ThermalTarget(const EmulatorModel& model, const Partition& partition,
                const PartitionConfig& config, const ThermalParams& params,
                const ThermalTargetOptions& o = {});

  double run(int iterations) override;
  double energy_j() override;
  double temperature_c() override { return temperature_c_; }
  int sm_clock_mhz() override { return clock_mhz_; }
  /// Reasons active now or raised since the previous call: NVML reports only the present
  /// state, the latch lets a test see an excursion that ended inside a window.
  std::uint64_t throttle_mask() override;
  std::string describe_throttle(std::uint64_t mask) const override;
  void idle(double seconds) override;
  int gpus() const override { return gpus_; }

  double now_s() const { return now_s_; }  ///< simulated time since construction
  const ThermalParams& params() const { return t_; }

 private:
  void advance(double dt_s, double dynamic_power_w);
  void control(double dt_s);
  const SimResult& at_clock(int freq_mhz);

  const EmulatorModel& model_;
  const Partition& part_;
  PartitionConfig config_;
  ThermalParams t_;
  int gpus_;
  int step_mhz_;
  double temperature_c_;
  double energy_per_gpu_j_ = 0;
  double now_s_ = 0;
  double since_control_s_ = 0;
  int clock_mhz_;
  bool throttling_ = false;
  std::uint64_t latched_ = 0;
  std::map<int, SimResult> sims_;
};

}  // namespace kareus
