// GPU catalogue. Sources (full list with links in docs/emulator.md):
//  [A100-DS] NVIDIA A100 datasheet: 108 SMs, 1410 MHz boost, 312 TFLOP/s bf16 dense,
//            1555 GB/s (40GB) / 2039 GB/s (80GB) HBM2e, 600 GB/s NVLink, 400 W.
//  [A40-DS]  NVIDIA A40 datasheet: 84 SMs, 1740 MHz, 149.7 TFLOP/s bf16 dense, 696 GB/s GDDR6,
//            112.5 GB/s NVLink bridge, 300 W.
//  [H100-DS] NVIDIA H100 SXM5 datasheet: 132 SMs, 1980 MHz, 989 TFLOP/s bf16 dense, 3350 GB/s,
//            900 GB/s NVLink, 700 W.  [H200-DS] H200 SXM: as H100 with 4800 GB/s HBM3e.
//  [KAREUS]  Kareus artifact / Perseus: static (blocking) power A100 85 W, A40 70 W; A100 idle
//            at 210 MHz about 52 W; search range 900..max in 30 MHz steps.
//  [NCCL]    NCCL tuning model and nccl-tests: A100 ring bus bandwidth about 230 GB/s with 24
//            channels; H100 about 370 GB/s; H200 about 475 GB/s (NVLS).
//  [SWITCH]  Clock-change latency: nvmlDeviceSetGpuLockedClocks calls are reported at 10-20 ms
//            (Perseus applies clocks asynchronously for this reason, Chung et al.,
//            SOSP '24); Velicka, Vysocky, Riha, "Methodology for GPU Frequency Switching
//            Latency Measurement" (arXiv 2502.20075, 2025) measure it on A100 and GH200 and
//            find it depends mostly on the target clock. We use 15 ms, the middle of that
//            range, for every GPU (an estimate; `--clock-switch-ms` overrides it).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/hw.h"

namespace kareus {
namespace {

GpuSpec a100_sxm4_40gb() {
  GpuSpec a100;
  a100.name = "a100-sxm4-40gb";
  a100.display_name = "NVIDIA A100 SXM4 40GB";
  a100.sm_count = 108;
  a100.min_freq_mhz = 210;
  a100.max_freq_mhz = 1410;
  a100.freq_step_mhz = 15;
  a100.search_min_freq_mhz = 900;
  a100.search_max_freq_mhz = 1410;
  a100.search_step_mhz = 30;
  a100.bf16_peak_tflops = 312;
  a100.hbm_bandwidth_gbs = 1555;
  a100.nvlink_bandwidth_gbs = 600;
  a100.internode_bandwidth_gbs = 25;  // one 200 Gb/s HDR InfiniBand NIC per GPU (DGX A100)
  a100.nccl_ring_busbw_gbs = 230;
  a100.nccl_default_channels = 24;
  a100.tdp_w = 400;
  a100.power_limit_w = 400;
  a100.static_power_w = 85;
  a100.idle_power_w = 52;
  a100.clock_switch_s = 15e-3;  // [SWITCH]
  // The emulator's one clock-power curve was fitted on this GPU's measured iterations.
  a100.power_calibrated = true;
  a100.power_source = "fitted to measured A100 SXM4 40GB iterations (data/calibration)";
  return a100;
}

GpuSpec a100_sxm4_80gb() {
  GpuSpec a100_80 = a100_sxm4_40gb();
  a100_80.name = "a100-sxm4-80gb";
  a100_80.display_name = "NVIDIA A100 SXM4 80GB";
  a100_80.hbm_bandwidth_gbs = 2039;
  a100_80.power_calibrated = false;
  a100_80.power_source = "the A100 40GB fit reused (same SMs and clocks, other HBM); not measured";
  return a100_80;
}

GpuSpec a40() {
  GpuSpec a40;
  a40.name = "a40";
  a40.display_name = "NVIDIA A40";
  a40.sm_count = 84;
  a40.min_freq_mhz = 210;
  a40.max_freq_mhz = 1740;
  a40.freq_step_mhz = 15;
  a40.search_min_freq_mhz = 900;
  a40.search_max_freq_mhz = 1740;
  a40.search_step_mhz = 30;
  a40.bf16_peak_tflops = 149.7;
  a40.hbm_bandwidth_gbs = 696;
  a40.nvlink_bandwidth_gbs = 112.5;
  a40.internode_bandwidth_gbs = 25;  // estimate: one 200 Gb/s NIC per GPU
  a40.nccl_ring_busbw_gbs = 20;      // estimate: rings cross PCIe Gen4 between NVLink pairs
  a40.nccl_default_channels = 8;     // estimate
  a40.tdp_w = 300;
  a40.power_limit_w = 300;
  a40.static_power_w = 70;
  a40.idle_power_w = 30;       // estimate
  a40.clock_switch_s = 15e-3;  // [SWITCH]
  a40.power_calibrated = false;
  a40.power_source = "the A100 40GB fit reused; not measured on this GPU";
  return a40;
}

GpuSpec h100_sxm() {
  GpuSpec h100;
  h100.name = "h100-sxm";
  h100.display_name = "NVIDIA H100 SXM5 80GB";
  h100.sm_count = 132;
  h100.min_freq_mhz = 345;
  h100.max_freq_mhz = 1980;
  h100.freq_step_mhz = 15;
  h100.search_min_freq_mhz = 900;
  h100.search_max_freq_mhz = 1980;
  h100.search_step_mhz = 30;
  h100.bf16_peak_tflops = 989;
  h100.hbm_bandwidth_gbs = 3350;
  h100.nvlink_bandwidth_gbs = 900;
  h100.internode_bandwidth_gbs = 50;  // one 400 Gb/s NDR NIC per GPU (DGX H100)
  h100.nccl_ring_busbw_gbs = 370;
  h100.nccl_default_channels = 32;  // estimate: NCCL's maximum channel count on NVSwitch systems
  h100.tdp_w = 700;
  h100.power_limit_w = 700;
  h100.static_power_w = 110;  // estimate: no published blocking-power figure
  h100.static_power_estimated = true;
  h100.idle_power_w = 70;       // estimate
  h100.clock_switch_s = 15e-3;  // [SWITCH]
  h100.power_calibrated = false;
  h100.power_source = "the A100 40GB fit reused; not measured on this GPU";
  return h100;
}

GpuSpec h200() {
  GpuSpec h200 = h100_sxm();
  h200.name = "h200";
  h200.display_name = "NVIDIA H200 SXM 141GB";
  h200.hbm_bandwidth_gbs = 4800;
  h200.nccl_ring_busbw_gbs = 475;
  // docs/cuda.md: partitions at 1980 MHz drew 556-700 W where this reused curve gives ~410 W.
  h200.power_source =
      "the A100 40GB fit reused; a measured H200 drew 556-700 W where it predicts about 410 W";
  return h200;
}

std::vector<GpuSpec> make_catalogue() {
  return {a100_sxm4_40gb(), a100_sxm4_80gb(), a40(), h100_sxm(), h200()};
}

const std::vector<GpuSpec>& catalogue() {
  static const std::vector<GpuSpec> c = make_catalogue();
  return c;
}

}  // namespace

std::vector<int> GpuSpec::supported_freqs_mhz() const {
  std::vector<int> out;
  for (int f = min_freq_mhz; f <= max_freq_mhz; f += freq_step_mhz) out.push_back(f);
  return out;
}

std::vector<int> GpuSpec::search_freqs_mhz() const {
  std::vector<int> out;
  for (int f = search_max_freq_mhz; f >= search_min_freq_mhz; f -= search_step_mhz) {
    out.push_back(f);
  }
  return out;
}

bool GpuSpec::supports_freq(int freq_mhz) const {
  return freq_mhz >= min_freq_mhz && freq_mhz <= max_freq_mhz &&
         (freq_mhz - min_freq_mhz) % freq_step_mhz == 0;
}

std::string GpuSpec::power_caveat() const {
  if (power_calibrated) return "";
  return fmt::format(
      "{}: the emulator's power model is not calibrated on this GPU ({}); emulated energies are "
      "estimates",
      display_name, power_source.empty() ? "no measurements" : power_source);
}

std::string GpuSpec::supported_freqs_text() const {
  return fmt::format("{} supports {}..{} MHz in {} MHz steps", name, min_freq_mhz, max_freq_mhz,
                     freq_step_mhz);
}

void GpuSpec::require_freq(int freq_mhz, const std::string& what) const {
  if (!supports_freq(freq_mhz)) {
    throw InvalidInput(fmt::format("{}: {}", what, supported_freqs_text()));
  }
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const auto& g : catalogue()) names.push_back(g.name);
  return names;
}

const GpuSpec& gpu_by_name(const std::string& name) {
  for (const auto& g : catalogue()) {
    if (g.name == name) return g;
  }
  throw InvalidInput(
      fmt::format("unknown gpu '{}'; known gpus: {}", name, fmt::join(gpu_names(), ", ")));
}

}  // namespace kareus
