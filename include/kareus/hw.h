// Hardware catalogue: the GPUs Kareus can plan for, with the figures the emulator and the search
// space need. Every figure is cited in src/hw/catalogue.cc and docs/emulator.md.
#pragma once

#include <string>
#include <vector>

namespace kareus {

struct GpuSpec {
  std::string name;          ///< catalogue key, e.g. "a100-sxm4-40gb"
  std::string display_name;  ///< e.g. "NVIDIA A100 SXM4 40GB"
  int sm_count = 0;
  int min_freq_mhz = 0;         ///< lowest supported SM clock
  int max_freq_mhz = 0;         ///< highest supported SM clock
  int freq_step_mhz = 0;        ///< granularity of supported SM clocks
  int search_min_freq_mhz = 0;  ///< default search range (Kareus artifact defaults)
  int search_max_freq_mhz = 0;
  int search_step_mhz = 0;
  double bf16_peak_tflops = 0;  ///< dense bf16 tensor-core peak at max_freq_mhz
  double hbm_bandwidth_gbs = 0;
  double nvlink_bandwidth_gbs = 0;     ///< total bidirectional NVLink bandwidth per GPU
  double internode_bandwidth_gbs = 0;  ///< per-GPU network bandwidth (one NIC per GPU)
  double nccl_ring_busbw_gbs = 0;      ///< achievable NCCL ring bus bandwidth inside a node
  int nccl_default_channels = 0;       ///< NCCL's default CTA count for intra-node collectives
  double tdp_w = 0;
  double power_limit_w = 0;             ///< default board power limit
  double static_power_w = 0;            ///< power while blocked in a P2P receive (Kareus/Perseus)
  bool static_power_estimated = false;  ///< true where no measured figure is published
  double idle_power_w = 0;              ///< idle at the lowest clock
  /// Whether the emulator's power model for this GPU was fitted to or validated on measurements
  /// of this GPU (true) or is an estimate from published figures (false). Every output that
  /// shows emulated energy for an uncalibrated GPU carries power_caveat().
  bool power_calibrated = false;
  /// Where the power parameters come from, one line, e.g. "fitted to A100 stage profiles
  /// (Perseus, SOSP '24)" or "estimate: TDP and idle from the datasheet".
  std::string power_source;
  /// "" when power_calibrated, else one line a report prints next to emulated energies.
  std::string power_caveat() const;
  // The emulator's clock-power curve for this GPU (docs/emulator.md "Power"): dynamic SM power
  // P_SM = sm_power_w * (V(f)/V(f_max))^2 * f/f_max * activity, with V flat up to
  // voltage_knee_mhz and rising linearly to voltage_ratio times the floor at max_freq_mhz.
  double sm_power_w = 0;        ///< W, every SM fully active at max_freq_mhz and its voltage
  double voltage_ratio = 1;     ///< V(max_freq_mhz) / V_floor
  double voltage_knee_mhz = 0;  ///< MHz, highest clock at the voltage floor
  // Best-case kernel efficiencies: fractions of the bf16 peak at the running clock that the
  // library kernels reach on their best shapes (the emulator multiplies them by its
  // achieved_fraction, wave and tile quantization). kernel_source says where they come from.
  double gemm_best_efficiency = 0;
  double attn_fwd_best_efficiency = 0;
  double attn_bwd_best_efficiency = 0;
  std::string kernel_source;
  /// Time (s) from requesting a new locked SM clock until kernels run at it; the planner and
  /// the iteration replay charge it as a stall at static power per clock change.
  double clock_switch_s = 0;

  /// Every supported SM clock, ascending.
  std::vector<int> supported_freqs_mhz() const;
  /// The default search frequencies, descending from search_max_freq_mhz (artifact order).
  std::vector<int> candidate_freqs_mhz() const;
  bool supports_freq(int freq_mhz) const;
  /// "<name> supports <min>..<max> MHz in <step> MHz steps": the one wording of the clock rule.
  std::string supported_freqs_text() const;
  /// Throws InvalidInput "<what>: <supported_freqs_text()>" unless supports_freq(freq_mhz);
  /// `what` names the value and where it came from, e.g. "--freq 1234".
  void require_freq(int freq_mhz, const std::string& what) const;
  /// SM count (NCCL CTAs) of collectives that no search tunes (segments outside partitions,
  /// messages between pipeline stages, once-per-iteration reductions): NCCL's default. The
  /// emulator, the profilers and the planner all take it from here.
  int segment_collective_sms() const { return nccl_default_channels; }
  /// Clock of the messages between pipeline stages and the once-per-iteration reductions: the
  /// maximum, as in Perseus and the Kareus artifact.
  int p2p_reduction_freq_mhz() const { return max_freq_mhz; }
};

/// The catalogue entry for `name`. Throws InvalidInput listing the known names.
const GpuSpec& gpu_by_name(const std::string& name);
/// All catalogue names, in catalogue order.
std::vector<std::string> gpu_names();

}  // namespace kareus
