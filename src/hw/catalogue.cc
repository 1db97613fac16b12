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
//  [PERSEUS-SP] Perseus (Chung et al., SOSP '24) per-clock A100 stage profiles,
//            data/calibration/perseus_stage-profile_*.csv: 475 W at 1410 MHz, flat time between
//            1410 and 1380 MHz (power limit), power linear in the clock below ~1080 MHz.
//  [KAREUS-IT] Kareus artifact whole-iteration A100 figures, data/calibration/a100-*.csv.
//  [H200-MEAS] Our measurement of one H200 (data/device/h200_2026-11-29_*.json, docs/cuda.md):
//            GEMM partitions at the 700 W limit (sw_power_cap, clock 1215-1770 MHz), attention
//            and small partitions 556-680 W at 1980 MHz, idle 78 W at 345 MHz, 99-114 W in P0.
//  [A100-KERN] cuBLAS best bf16 GEMM shape 271 of 312 TFLOP/s; FlashAttention-2 forward
//            230 TFLOP/s (Dao, "FlashAttention-2", 2023); backward about 80% of forward.
//  [H100-KERN] H100 SXM5 bf16: cuBLAS 794.5 TFLOP/s best shape (Bekman, ml-engineering,
//            "Maximum Achievable Matmul FLOPS"), 797.8 at 8192^3 (pranjalssh/fast.cu);
//            cuDNN 9.1 fused attention at 1830 MHz, head dim 128, 16k tokens: forward 539
//            (causal) / 595 TFLOP/s, backward 516 (FlashAttention-3 paper, Figs. 5-6).
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
  // [A100-KERN]. A40 (same Ampere tensor cores, no published figures) takes these too.
  a100.gemm_best_efficiency = 0.87;
  a100.attn_fwd_best_efficiency = 0.73;
  a100.attn_bwd_best_efficiency = 0.58;
  a100.kernel_source =
      "published A100 figures: cuBLAS 271 of 312 TFLOP/s, FlashAttention-2 forward 230 TFLOP/s, "
      "backward at about 80% of forward (estimate)";
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
  // [PERSEUS-SP] + [KAREUS-IT]: fitted by `kareus calibrate` (docs/emulator.md "Calibration").
  a100.sm_power_w = 537.165;
  a100.voltage_ratio = 1.37071;
  // [PERSEUS-SP]'s power alone suggests a floor near 1050-1100 MHz; the joint fit with
  // [KAREUS-IT] puts it lower (docs/emulator.md "Calibration").
  a100.voltage_knee_mhz = 900.067;
  a100.power_calibrated = true;
  a100.power_source =
      "fitted to Perseus A100 stage profiles (SOSP '24), the Kareus A100 iteration figures and "
      "the Kareus artifact's frontier ends";
  return a100;
}

// GPUs without published or measured kernel figures of their own take the A100's.
void take_a100_kernels(GpuSpec& g, const std::string& source) {
  const GpuSpec a100 = a100_sxm4_40gb();
  g.gemm_best_efficiency = a100.gemm_best_efficiency;
  g.attn_fwd_best_efficiency = a100.attn_fwd_best_efficiency;
  g.attn_bwd_best_efficiency = a100.attn_bwd_best_efficiency;
  g.kernel_source = source;
}

GpuSpec a100_sxm4_80gb() {
  GpuSpec a100_80 = a100_sxm4_40gb();
  a100_80.name = "a100-sxm4-80gb";
  a100_80.display_name = "NVIDIA A100 SXM4 80GB";
  a100_80.hbm_bandwidth_gbs = 2039;
  // Same GA100 die, clocks and 400 W limit: the 40GB fit applies (HBM2e traffic differs).
  a100_80.power_source =
      "the A100 SXM4 40GB fit (same die, clocks and 400 W limit); Perseus stage profiles are "
      "A100 SXM";
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
  take_a100_kernels(a40, "estimate: the A100's published figures (same Ampere tensor cores)");
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
  // Estimate, no per-clock measurement: the A100 fit scaled by the power budget above static
  // power, 537.165 x (300 - 70) / (400 - 85) ([A40-DS] 300 W), so that a dense GEMM at the top
  // clock is capped as on the A100; the knee at the A100's fraction of the maximum clock
  // (900.067 / 1410 of 1740) and the A100's voltage ratio.
  a40.sm_power_w = 392.22;
  a40.voltage_ratio = 1.37071;
  a40.voltage_knee_mhz = 1111;
  a40.power_calibrated = false;
  a40.power_source = "estimate from the 300 W TDP and the A100 curve shape";
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
  // Estimate: the A100's [A100-KERN], as before per-GPU values existed. The published H100
  // figures [H100-KERN] and the fit to [H200-MEAS] that `kareus calibrate` reports are not
  // adopted: the fit does not carry to the held-out runs (docs/emulator.md "H200").
  take_a100_kernels(h100,
                    "estimate: the A100's figures; neither the published H100 figures nor the "
                    "H200 fit carry to the held-out H200 runs");
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
  // [H200-MEAS]: sm_power_w fitted by `kareus calibrate` on H200 partitions measured at
  // 1980 MHz (same GH100 die, clocks and 700 W limit). Voltage ratio and knee: the A100's
  // fitted ratio, the knee at the A100's fraction of the maximum clock (estimates).
  h100.sm_power_w = 1041.1;
  h100.voltage_ratio = 1.37071;
  h100.voltage_knee_mhz = 1264;  // 900.067 / 1410 of 1980
  h100.power_calibrated = false;
  h100.power_source =
      "estimate: the H200 fit (same die, clocks and 700 W limit), no H100 measurement";
  return h100;
}

GpuSpec h200() {
  GpuSpec h200 = h100_sxm();
  h200.name = "h200";
  h200.display_name = "NVIDIA H200 SXM 141GB";
  h200.hbm_bandwidth_gbs = 4800;
  h200.nccl_ring_busbw_gbs = 475;
  // Only the maximum clock is measured; the clock-power slope below it, which frequency
  // planning relies on, is the estimate above, so the GPU stays marked uncalibrated.
  h200.power_calibrated = false;
  h200.power_source =
      "power at 1980 MHz fitted to partitions measured on one H200 (data/device, 2026-11-29); "
      "the curve below 1980 MHz is an estimate";
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

std::vector<int> GpuSpec::candidate_freqs_mhz() const {
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
