// Fitting the emulator to measured whole-iteration figures (data/calibration). The fit
// changes only the parameters marked "fitted" in EmulatorParams, on one workload; every other
// workload is a prediction. docs/emulator.md records the procedure and the residuals.
#pragma once

#include <string>
#include <vector>

#include "kareus/emulator.h"

namespace kareus {

struct CalibrationTarget {
  std::string label;     ///< e.g. "megatron@1410"
  std::string schedule;  ///< megatron or nanobatch
  int freq_mhz = 0;
  double time_s = 0;
  double energy_j = 0;  ///< per GPU, summed over stages, static included
};

/// Reads the calibration CSV (method,iter_time_s,energy_j) and maps its rows to targets: the
/// fastest perseus row is Megatron at the maximum clock, the fastest nanobatch_perseus row is
/// Nanobatching at the maximum clock, and the slowest perseus row is Megatron at `slow_freq_mhz`.
std::vector<CalibrationTarget> read_calibration_targets(const std::string& csv_path,
                                                        int max_freq_mhz, int slow_freq_mhz);

struct Residual {
  CalibrationTarget target;
  double time_s = 0;
  double energy_j = 0;
  double time_error = 0;  ///< relative: predicted / measured - 1
  double energy_error = 0;
};

std::vector<Residual> evaluate_targets(const Workload& w, const EmulatorParams& p,
                                       const std::vector<CalibrationTarget>& targets);

struct CalibrationResult {
  EmulatorParams params;
  std::vector<std::string> fitted;  ///< names of the fitted parameters
  std::vector<Residual> residuals;
  double rms_error = 0;  ///< over all times and energies
  int evaluations = 0;
};

/// The starting point of the fit: the defaults with the fitted parameters reset to prior
/// guesses (achieved_fraction 0.8, overlap_slowdown 0.15, sm_power_w 250, voltage_ratio 1.25),
/// so that `kareus calibrate` reproduces the committed defaults from scratch.
EmulatorParams calibration_prior();

/// Deterministic coordinate search (multiplicative steps, halved when no step improves) that
/// minimizes the squared relative errors of every target's time and energy.
CalibrationResult calibrate(const Workload& w, const std::vector<CalibrationTarget>& targets,
                            const EmulatorParams& start);

}  // namespace kareus
