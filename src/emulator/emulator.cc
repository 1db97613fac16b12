// Event-driven emulation of one partition on one GPU.
//
// Between events (a compute kernel ends, the collective starts or ends) every activity runs at
// a constant rate, so the simulation advances from event to event and integrates power exactly.
// - Compute kernels: a roofline with frequency (Williams, Waterman, Patterson, "Roofline",
//   CACM 2009). The compute roof scales with SMs x clock x achievable efficiency; GEMM
//   efficiency includes wave quantization of CTA tiles over the available SMs (NVIDIA, "Matrix
//   Multiplication Background User's Guide", 2023) and a short-K penalty. The memory roof is the
//   achievable HBM bandwidth, weakly dependent on the SM clock and on the SMs that issue loads.
// - The collective is a ring (Patarasuk & Yuan, JPDC 2009): each GPU moves 2(n-1)/n of an
//   AllReduce buffer, at min(link bandwidth, CTAs x per-CTA copy rate(clock)). While it runs it
//   holds its SMs, competes for HBM bandwidth and slows the overlapped compute (measured
//   interference: Rashidi et al. / arXiv 2507.03114, 10-40%).
// - Power: static power + C V(f)^2 f x activity per active SM (CMOS dynamic power) + HBM and
//   link energy per bit. V(f) has a floor below a knee clock (A100: ~0.71 V near 1080 MHz).
//   When a partition's (or a sequential kernel's) average power exceeds the board power limit,
//   it runs at the highest supported clock that fits, as the GPU's power capping does.
// - An all-to-all (mixture-of-experts dispatch and combine) moves (n-1)/n of its buffer over
//   NVLink at NCCL's achievable bus bandwidth, or its inter-node share over the NIC; with 0 SMs
//   it runs on the copy engines (NCCL 2.28 CE collectives): the same links, no SMs, no clock
//   dependence, and the chain's small kernels then take the whole GPU in turn with the compute.
// - A grouped GEMM (the local experts) quantizes tiles per group, so few rows per expert waste
//   most of each tile.
#include "kareus/emulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "kareus/error.h"

namespace kareus {

namespace {

// Precision (MHz) of the power-capped effective clock.
constexpr double kCapResolutionMhz = 0.25;

// Rate of a copy-engine collective as a share of its links' achievable rate. Estimate: no
// published CE all-to-all figure exists; the copy engines drive the same NVLink links whose
// effective rate NCCL reaches (docs/emulator.md, "All-to-all").
constexpr double kCopyEngineShareOfLink = 1.0;

// The calibrated parameters by name (calibration files, fingerprints), one table for both the
// mutable and the const view.
constexpr std::pair<const char*, double EmulatorParams::*> kParamFields[] = {
    {"gemm_best_efficiency", &EmulatorParams::gemm_best_efficiency},
    {"attn_fwd_best_efficiency", &EmulatorParams::attn_fwd_best_efficiency},
    {"attn_bwd_best_efficiency", &EmulatorParams::attn_bwd_best_efficiency},
    {"achieved_fraction", &EmulatorParams::achieved_fraction},
    {"gemm_tile_m", &EmulatorParams::gemm_tile_m},
    {"gemm_tile_n", &EmulatorParams::gemm_tile_n},
    {"gemm_k_half", &EmulatorParams::gemm_k_half},
    {"attn_tile_q", &EmulatorParams::attn_tile_q},
    {"attn_kv_half", &EmulatorParams::attn_kv_half},
    {"cuda_core_fraction", &EmulatorParams::cuda_core_fraction},
    {"launch_overhead_s", &EmulatorParams::launch_overhead_s},
    {"cp_step_s", &EmulatorParams::cp_step_s},
    {"partition_sync_s", &EmulatorParams::partition_sync_s},
    {"hbm_efficiency", &EmulatorParams::hbm_efficiency},
    {"hbm_clock_sensitivity", &EmulatorParams::hbm_clock_sensitivity},
    {"hbm_saturation_sm_fraction", &EmulatorParams::hbm_saturation_sm_fraction},
    {"nccl_sms_to_saturate", &EmulatorParams::nccl_sms_to_saturate},
    {"collective_latency_s", &EmulatorParams::collective_latency_s},
    {"collective_hbm_factor", &EmulatorParams::collective_hbm_factor},
    {"internode_efficiency", &EmulatorParams::internode_efficiency},
    {"overlap_slowdown", &EmulatorParams::overlap_slowdown},
    {"sm_power_w", &EmulatorParams::sm_power_w},
    {"voltage_ratio", &EmulatorParams::voltage_ratio},
    {"voltage_knee_mhz", &EmulatorParams::voltage_knee_mhz},
    {"power_limit_w", &EmulatorParams::power_limit_w},
    {"idle_activity", &EmulatorParams::idle_activity},
    {"collective_activity", &EmulatorParams::collective_activity},
    {"hbm_pj_per_bit", &EmulatorParams::hbm_pj_per_bit},
    {"link_pj_per_bit", &EmulatorParams::link_pj_per_bit},
};

// Fraction of the bf16 peak (at the running clock, on n SMs) a kernel reaches: best-case
// microbenchmark efficiency x achieved_fraction x wave quantization (and, for GEMMs, tile
// quantization and the main loop's ramp in K); CUDA-core kernels run at cuda_core_fraction.
double kernel_efficiency(const Kernel& op, double n, const EmulatorParams& p) {
  switch (op.kind) {
    case OpKind::kGemm: {
      // A grouped GEMM tiles every group on its own.
      const double groups = std::max(1, op.groups);
      const double tiles =
          groups * std::ceil(op.m / p.gemm_tile_m) * std::ceil(op.n / p.gemm_tile_n);
      const double waves = std::ceil(tiles / n);
      const double k = static_cast<double>(op.k);
      // Tile quantization: partial edge tiles compute their whole tile (NVIDIA guide).
      const double tile_use = groups * static_cast<double>(op.m) * static_cast<double>(op.n) /
                              (tiles * p.gemm_tile_m * p.gemm_tile_n);
      return p.gemm_best_efficiency * p.achieved_fraction * (tiles / (waves * n)) * tile_use *
             (k / (k + p.gemm_k_half));
    }
    case OpKind::kAttention: {
      const double tiles = std::ceil(op.m / p.attn_tile_q);
      const double waves = std::ceil(tiles / n);
      const bool bwd = op.name == "attention_bwd";
      const double keys = static_cast<double>(op.n) / std::max(1, op.kv_calls);
      return (bwd ? p.attn_bwd_best_efficiency : p.attn_fwd_best_efficiency) * p.achieved_fraction *
             (tiles / (waves * n)) * (keys / (keys + p.attn_kv_half));
    }
    default:
      return p.cuda_core_fraction;
  }
}

}  // namespace

std::map<std::string, double*> EmulatorParams::fields() {
  std::map<std::string, double*> out;
  for (const auto& [name, member] : kParamFields) out[name] = &(this->*member);
  return out;
}

std::string EmulatorParams::to_string() const {
  // Sorted by name, as fields() is: the string feeds fingerprints stored in profile databases.
  std::map<std::string, double> values;
  for (const auto& [name, member] : kParamFields) values[name] = this->*member;
  std::string s;
  for (const auto& [name, value] : values) {
    // Off, the host floor changes nothing: left out so that fingerprints taken before it
    // existed still match.
    if ((name == "attn_kv_half" || name == "partition_sync_s" || name == "cp_step_s") && value == 0)
      continue;
    s += fmt::format("{}={:.9g};", name, value);
  }
  return s;
}

struct EmulatorModel::Rates {
  double op_time_s = std::numeric_limits<double>::infinity();  ///< whole op at this rate
  double coll_bytes_per_s = 0;                                 ///< wire bytes per second
  double power_w = 0;                                          ///< dynamic power
};

EmulatorModel::EmulatorModel(const GpuSpec& gpu, EmulatorParams params) : gpu_(gpu), p_(params) {
  // The clock-power curve, the power limit and the kernel efficiencies are the GPU's unless
  // overridden.
  if (p_.sm_power_w <= 0) p_.sm_power_w = gpu_.sm_power_w;
  if (p_.voltage_ratio <= 0) p_.voltage_ratio = gpu_.voltage_ratio;
  if (p_.voltage_knee_mhz <= 0) p_.voltage_knee_mhz = gpu_.voltage_knee_mhz;
  if (p_.power_limit_w <= 0) p_.power_limit_w = gpu_.power_limit_w;
  if (p_.gemm_best_efficiency <= 0) p_.gemm_best_efficiency = gpu_.gemm_best_efficiency;
  if (p_.attn_fwd_best_efficiency <= 0) p_.attn_fwd_best_efficiency = gpu_.attn_fwd_best_efficiency;
  if (p_.attn_bwd_best_efficiency <= 0) p_.attn_bwd_best_efficiency = gpu_.attn_bwd_best_efficiency;
  if (!(p_.sm_power_w > 0) || !(p_.voltage_ratio >= 1) || !(p_.power_limit_w > 0) ||
      !(p_.gemm_best_efficiency > 0) || !(p_.attn_fwd_best_efficiency > 0) ||
      !(p_.attn_bwd_best_efficiency > 0)) {
    throw InvalidInput(fmt::format(
        "{}: the emulator needs sm_power_w > 0, voltage_ratio >= 1, power_limit_w > 0 and "
        "kernel efficiencies > 0 (got {}, {}, {}; gemm {}, attention forward {}, backward {})",
        gpu_.name, p_.sm_power_w, p_.voltage_ratio, p_.power_limit_w, p_.gemm_best_efficiency,
        p_.attn_fwd_best_efficiency, p_.attn_bwd_best_efficiency));
  }
}

double EmulatorModel::relative_voltage(double f) const {
  const double fmax = gpu_.max_freq_mhz;
  const double knee = std::min(p_.voltage_knee_mhz, fmax);
  if (f <= knee || fmax <= knee) return 1.0;
  return 1.0 + (p_.voltage_ratio - 1.0) * (f - knee) / (fmax - knee);
}

int EmulatorModel::default_collective_sms(const Kernel& /*collective*/) const {
  return gpu_.nccl_default_channels;
}

EmulatorModel::Rates EmulatorModel::rates(const Kernel* op, int op_sms, const Kernel* coll,
                                          int coll_sms, double f) const {
  const double N = gpu_.sm_count;
  const double fr = f / gpu_.max_freq_mhz;
  const double vmax = relative_voltage(gpu_.max_freq_mhz);
  const double v = relative_voltage(f);
  const double sm_w_per_sm = p_.sm_power_w / N * (v * v) / (vmax * vmax) * fr;
  const double hbm_full = gpu_.hbm_bandwidth_gbs * 1e9 * p_.hbm_efficiency *
                          (1.0 - p_.hbm_clock_sensitivity * (1.0 - fr));
  Rates r;
  double op_hbm_rate = 0, coll_hbm_rate = 0, t_c = 0, t_m = 0;
  double coll_share = 0;  // the collective's traffic over what its links carry
  if (coll) {
    const double link = link_bandwidth(*coll);
    const double per_cta = gpu_.nccl_ring_busbw_gbs * 1e9 / p_.nccl_sms_to_saturate * fr;
    r.coll_bytes_per_s = coll_sms == 0 && coll->copy_engine ? link * kCopyEngineShareOfLink
                                                            : std::min(link, coll_sms * per_cta);
    coll_hbm_rate = r.coll_bytes_per_s * p_.collective_hbm_factor;
    coll_share = r.coll_bytes_per_s / link;
  }
  if (op) {
    const double n = std::max(1, op_sms);
    const double peak = gpu_.bf16_peak_tflops * 1e12 * fr * (n / N);
    const double eff = kernel_efficiency(*op, n, p_);
    t_c = op->flops > 0 ? op->flops / (peak * eff) : 0.0;
    const double bw = hbm_full * std::min(1.0, n / (p_.hbm_saturation_sm_fraction * N));
    t_m = op->bytes() / bw;
    if (coll) {
      // HBM shared with the collective: both slow down in proportion when demand exceeds it.
      const double demand = op->bytes() / std::max(t_c, t_m) + coll_hbm_rate;
      const double squeeze = std::max(1.0, demand / hbm_full);
      t_m *= squeeze;
      r.coll_bytes_per_s /= squeeze;
      coll_hbm_rate /= squeeze;
    }
    double t = std::max(t_c, t_m);
    // The interference (L2, memory pipeline, issue slots) grows with the collective's traffic:
    // full at the link rate (NCCL's default CTAs), less for a collective starved of CTAs.
    if (coll) t *= 1.0 + p_.overlap_slowdown * coll_share;
    // Context parallelism's ring exchanges the next step's keys and values while the current
    // step's attention runs, so a step costs the longer of the two (Liu, Zaharia, Abbeel, "Ring
    // Attention with Blockwise Transformers", ICLR 2024, Sec. 3: the exchange is hidden once a
    // block's compute outlasts it).
    if (op->kind == OpKind::kAttention && op->kv_calls > 1)
      t = std::max(t, op->kv_calls * p_.cp_step_s);
    r.op_time_s = t + p_.launch_overhead_s;
    op_hbm_rate = op->bytes() / r.op_time_s;
    // Dynamic power follows the work done per second (Hong & Kim, ISCA 2010: component power =
    // maximum power x access rate). Tensor-core kernels: achieved FLOP rate over the best-shape
    // GEMM rate on these SMs, so a small or stalled GEMM draws less than a large one. Other
    // kernels: the fraction of time the CUDA cores are busy.
    double util = 0;
    if (r.op_time_s > 0) {
      const bool tensor = op->kind == OpKind::kGemm || op->kind == OpKind::kAttention;
      util =
          tensor ? op->flops / r.op_time_s / (peak * p_.gemm_best_efficiency) : t_c / r.op_time_s;
      util = std::min(1.0, util);
    }
    const double activity = p_.idle_activity + (1.0 - p_.idle_activity) * util;
    r.power_w += sm_w_per_sm * n * activity;
  }
  if (coll) {
    r.power_w += sm_w_per_sm * coll_sms * p_.collective_activity;
    r.power_w += p_.link_pj_per_bit * 8e-12 * r.coll_bytes_per_s;
  }
  r.power_w += p_.hbm_pj_per_bit * 8e-12 * (op_hbm_rate + coll_hbm_rate);
  return r;
}

SimResult EmulatorModel::simulate_at(const std::vector<Kernel>& ops, const Kernel* coll,
                                     const std::vector<Kernel>& tail, int slot_index, int sms,
                                     double freq_mhz) const {
  SimResult res;
  const int N = gpu_.sm_count;
  // The communication stream's chain: the collective, then its tail (small kernels on the
  // collective's SMs while compute runs, on the whole GPU after; further collectives).
  std::vector<const Kernel*> chain;
  if (coll) chain.push_back(coll);
  for (const auto& k : tail) chain.push_back(&k);
  std::size_t i = 0, c = 0;
  double op_left = 1.0;  // fraction of the current op still to run
  double c_left = 0;     // the current chain step: bytes (collective) or fraction (kernel) left
  enum { kWaiting, kActive, kDone } cs = chain.empty() ? kDone : kWaiting;
  // Moves to chain step c (or past the end); NCCL returns at once for an empty buffer, so such
  // a collective neither runs nor holds SMs.
  auto enter_step = [&](double t_now) {
    while (c < chain.size() && chain[c]->is_collective() && !(chain[c]->wire_bytes() > 0)) ++c;
    if (c == chain.size()) {
      if (cs == kActive) res.collective_end_s = t_now;
      cs = kDone;
      return;
    }
    const Kernel& k = *chain[c];
    c_left = k.is_collective() ? k.wire_bytes() + p_.collective_latency_s * link_bandwidth(k) : 1.0;
  };
  double t = 0, e = 0;
  while (i < ops.size() || cs != kDone) {
    if (cs == kWaiting && static_cast<int>(i) >= slot_index) {
      cs = kActive;
      enter_step(t);
      continue;
    }
    const Kernel* op = i < ops.size() ? &ops[i] : nullptr;
    const bool comm_on = cs == kActive;
    if (!op && !comm_on) {
      cs = kActive;  // slot beyond the last op: launch at the end
      enter_step(t);
      continue;
    }
    const Kernel* step = comm_on ? chain[c] : nullptr;
    const Kernel* step_coll = step && step->is_collective() ? step : nullptr;
    const Kernel* step_kernel = step && !step_coll ? step : nullptr;
    // Without SMs of its own (copy engines) a tail kernel takes the whole GPU and the compute
    // waits for it.
    const bool preempts = step_kernel && sms == 0 && op;
    const Rates r = preempts ? Rates{} : rates(op, comm_on ? N - sms : N, step_coll, sms, freq_mhz);
    Rates rk;
    if (step_kernel) rk = rates(step_kernel, op && !preempts ? sms : N, nullptr, 0, freq_mhz);
    const double inf = std::numeric_limits<double>::infinity();
    const double dt_op = op && !preempts ? op_left * r.op_time_s : inf;
    if (step_coll && !(r.coll_bytes_per_s > 0)) {
      throw InvalidInput(
          fmt::format("collective '{}' needs at least one SM, got {}", step_coll->name, sms));
    }
    const double dt_step = step_coll     ? c_left / r.coll_bytes_per_s
                           : step_kernel ? c_left * rk.op_time_s
                                         : inf;
    const bool op_ends = dt_op <= dt_step;
    const double dt = op_ends ? dt_op : dt_step;
    t += dt;
    e += (r.power_w + rk.power_w) * dt;
    if (op && !preempts) {
      if (op_ends) {
        ++i;
        op_left = 1.0;
        res.compute_end_s = t;
      } else {
        op_left -= dt / r.op_time_s;
      }
    }
    if (step) {
      if (!op_ends || dt_step <= dt_op) {
        ++c;
        enter_step(t);
      } else {
        c_left -= step_coll ? dt * r.coll_bytes_per_s : dt / rk.op_time_s;
      }
    }
  }
  res.time_s = t;
  res.dynamic_energy_j = e;
  return res;
}

SimResult EmulatorModel::simulate_overlap(const std::vector<Kernel>& ops, const Kernel* coll,
                                          int slot_index, int sms, int freq_mhz,
                                          const std::vector<Kernel>& tail) const {
  // Power capping over the whole call (one partition, or one kernel of a sequence): the
  // firmware holds the board's power averaged over a window of milliseconds, about one
  // partition, by lowering the clock, alternating between adjacent clock steps so that the
  // average sits at the limit. The call runs at the effective clock min(requested, C), C the
  // (continuous) clock at which its average power equals the limit. Power rises with the
  // clock, so C does not depend on the request and a higher request can never make the call
  // slower.
  const double headroom = p_.power_limit_w - gpu_.static_power_w;
  auto fits = [&](const SimResult& x) {
    return !(x.time_s > 0) || x.dynamic_energy_j <= headroom * x.time_s;
  };
  SimResult r = simulate_at(ops, coll, tail, slot_index, sms, freq_mhz);
  if (fits(r)) return r;
  // Bisection over the whole clock range, not up to the request, so that C is the same for
  // every request above it.
  double lo = gpu_.min_freq_mhz, hi = gpu_.max_freq_mhz;
  SimResult at_lo = simulate_at(ops, coll, tail, slot_index, sms, lo);
  if (!fits(at_lo)) return at_lo;  // the firmware cannot go lower
  while (hi - lo > kCapResolutionMhz) {
    const double mid = 0.5 * (lo + hi);
    if (mid >= freq_mhz) {  // the request does not fit, so no higher clock does
      hi = mid;
      continue;
    }
    SimResult x = simulate_at(ops, coll, tail, slot_index, sms, mid);
    if (fits(x)) {
      lo = mid;
      at_lo = x;
    } else {
      hi = mid;
    }
  }
  // A supported clock inside the last bisection step that fits must not run slower than
  // requested directly: take it when it fits (the same for every request above it).
  const double step = gpu_.freq_step_mhz > 0 ? gpu_.freq_step_mhz : 1;
  const double s = gpu_.min_freq_mhz + std::ceil((lo - gpu_.min_freq_mhz) / step) * step;
  if (s > lo && s < hi && s < freq_mhz) {
    SimResult x = simulate_at(ops, coll, tail, slot_index, sms, s);
    if (fits(x)) return x;
  }
  return at_lo;
}

SimResult EmulatorModel::simulate_partition(const Partition& part, const PartitionConfig& c) const {
  const Slot& slot = part.slot(c.slot);
  SimResult r = simulate_overlap(part.compute_ops, &part.collective, slot.op_index, c.sms,
                                 c.freq_mhz, part.comm_tail);
  r.time_s += p_.partition_sync_s;  // idle: static power only
  return r;
}

SimResult EmulatorModel::simulate_sequence(const std::vector<Kernel>& kernels, int freq_mhz,
                                           int collective_sms) const {
  SimResult total;
  std::vector<Kernel> one(1);
  for (const auto& k : kernels) {
    SimResult r;
    if (k.is_collective()) {
      r = simulate_overlap({}, &k, 0, collective_sms, freq_mhz);
    } else {
      one[0] = k;
      r = simulate_overlap(one, nullptr, 0, 0, freq_mhz);
    }
    total.time_s += r.time_s;
    total.dynamic_energy_j += r.dynamic_energy_j;
  }
  total.compute_end_s = total.time_s;
  return total;
}

double EmulatorModel::link_bandwidth(const Kernel& coll) const {
  if (coll.inter_node) return gpu_.internode_bandwidth_gbs * 1e9 * p_.internode_efficiency;
  // A point-to-point copy uses one direction of NVLink; a ring collective and an all-to-all
  // reach the bus bandwidth NCCL reports (for every collective but AllReduce NCCL's busBw is
  // the per-GPU link rate: Jeaugey, NVIDIA/nccl-tests#212).
  if (coll.collective == CollectiveKind::kP2P) {
    return gpu_.nvlink_bandwidth_gbs / 2 * 1e9 * p_.internode_efficiency;
  }
  return gpu_.nccl_ring_busbw_gbs * 1e9;
}

}  // namespace kareus
