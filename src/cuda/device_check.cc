// Device check: see device_check.h. The emulator's prediction uses the catalogue entry of the
// card (catalogue_gpu_for_device) and the same configuration (clock snapped to the catalogue's
// grid, NCCL's default CTA count, collective launched at the partition start); it models a real
// TP AllReduce over NVLink where the check runs a local copy, so the two agree only as far as
// the compute dominates. The point of the check is that the backend runs end to end on a card.
#include "device_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_profiler.h"
#include "cudnn_sdpa.h"
#include "cudnn_sdpa_backend.h"
#include "executor.h"
#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/instruction_settings.h"
#include "kareus/nvml.h"
#include "kareus/partition.h"
#include "kareus/table.h"
#include "kareus/workload.h"
#include "op_plan.h"

namespace kareus::cuda {

namespace {

// cuDNN fused attention against the fallback kernel on small causal GQA shapes (top-left and
// bottom-right diagonal): the first numerical check of the fused graphs on a card. Adds
// "attention_cross_check" to `j`; returns the lines for the table output.
std::string cross_check_attention(int device, nlohmann::json& j) {
  std::string text;
  if (sdpa::attention_path().fused()) {
    for (const AttentionShape& s :
         {AttentionShape{2, 3, 256, 256, 128}, AttentionShape{2, 3, 128, 256, 128}}) {
      const sdpa::CrossCheck c = sdpa::cross_check_fused_attention(device, s);
      j["attention_cross_check"].push_back(
          {{"shape", {s.groups, s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim}},
           {"error", c.error},
           {"max_abs_diff",
            {{"o", c.o},
             {"lse", c.lse},
             {"dq", c.dq},
             {"dk", c.dk},
             {"dv", c.dv},
             {"row_sums", c.row_sums}}},
           {"max_abs_fused",
            {{"o", c.o_max},
             {"lse", c.lse_max},
             {"dq", c.dq_max},
             {"dk", c.dk_max},
             {"dv", c.dv_max}}},
           {"agree", c.agree()}});
      text += fmt::format("attention cross check q_len {} kv_len {}: {}\n", s.q_len, s.kv_len,
                          !c.error.empty()
                              ? "error: " + c.error
                              : fmt::format("max |fused - fallback| O {:.3g} LSE {:.3g} dQ {:.3g} "
                                            "dK {:.3g} dV {:.3g} rowsum {:.3g} -> {}",
                                            c.o, c.lse, c.dq, c.dk, c.dv, c.row_sums,
                                            c.agree() ? "agree" : "DISAGREE"));
    }
  }
  return text;
}

// Sample mean and coefficient of variation (s.d. with n - 1 over the mean) of `v`.
std::pair<double, double> mean_cv(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  if (v.size() < 2 || mean == 0) return {mean, 0.0};
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return {mean, std::sqrt(ss / static_cast<double>(v.size() - 1)) / mean};
}

// Iterations of the host-enqueue timing: few enough that their launches (about 10 per
// iteration, a few dozen for mixture-of-experts partitions) stay below the CUDA launch queue's
// depth (about 1024), so the host never waits.
constexpr int kHostEnqueueIterations = 8;

// What measure_partitions() measures: partitions, the SM counts of each, rounds, and how the
// JSON rows are filed.
struct PartitionRows {
  std::vector<const Partition*> partitions;
  std::function<std::vector<int>(const Partition&)> sms;
  int rounds = 1;
  std::string collective;  // every row's "collective" field
  std::string json_key;    // the rows' array in the JSON
};

// Measures every partition at the card's clock for each SM count and round, beside the
// emulator's prediction when the card is in the catalogue; adds the rows (one per measurement)
// under `rows.json_key` and, with several rounds, "repeatability" to `j`; returns the tables.
std::string measure_partitions(const PartitionRows& rows, CudaProfiler& prof,
                               const std::string& mapped, int clock, nlohmann::json& j) {
  const EmulatorModel model(prof.gpu());
  TextTable t({"partition", "sms", "round", "time_s", "host_s", "energy_j", "power_w",
               "clock_mhz min..max", "reasons", "temp_c", "emulator time_s", "emulator energy_j",
               "stable"});
  // (partition, SMs) -> the rounds' times, energies and lowest clocks, in first-seen order.
  struct Point {
    std::string partition;
    int sms = 0;
    std::vector<double> time_s, energy_j, clock_mhz;
  };
  std::vector<Point> points;
  for (int round = 0; round < rows.rounds; ++round) {
    std::size_t k = 0;
    for (const Partition* pp : rows.partitions) {
      const Partition& p = *pp;
      for (int sms : rows.sms(p)) {
        PartitionConfig c;
        c.freq_mhz = clock;
        c.sms = sms;
        c.slot = p.slots.at(0).name;
        const Measurement m = prof.measure(p, c);
        const ProtocolResult r = prof.last_result();
        // Whether the host keeps up: above the device time per iteration, the window measured
        // the host's launch rate rather than the partition (docs/cuda.md).
        const double host_s = prof.last_host_enqueue_s(kHostEnqueueIterations);
        if (round == 0) points.push_back({p.key, sms, {}, {}, {}});
        Point& pt = points.at(k++);
        pt.time_s.push_back(m.time_s);
        pt.energy_j.push_back(m.energy_j);
        pt.clock_mhz.push_back(r.clock_mhz);
        nlohmann::json row = {
            {"partition", p.key},
            {"round", round},
            {"collective", rows.collective},
            {"collective_kind", kareus::to_string(p.collective.collective)},
            {"sms", c.sms},
            {"slot", c.slot},
            {"time_s", m.time_s},
            {"energy_j", m.energy_j},
            {"clock_mhz", r.clock_mhz},
            {"clock_max_mhz", r.clock_max_mhz},
            {"clock_event_reasons", nvml::ClockEventReasons{r.throttle_mask}.describe()},
            {"temperature_before_c", r.temperature_before_c},
            {"temperature_after_c", r.temperature_after_c},
            {"iterations", r.iterations},
            {"attempts", r.attempts},
            {"stable", r.stable},
            {"attention", sdpa::attention_path().backend()},
            {"note", r.note},
            {"host_enqueue_s", host_s}};
        std::string pred_t = "-", pred_e = "-";
        if (!mapped.empty()) {
          const SimResult s = model.simulate_partition(p, c);
          const double e = s.dynamic_energy_j + prof.gpu().static_power_w * s.time_s;
          row["predicted_time_s"] = s.time_s;
          row["predicted_energy_j"] = e;
          pred_t = fmt::format("{:.5f}", s.time_s);
          pred_e = fmt::format("{:.3f}", e);
        }
        j[rows.json_key].push_back(row);
        t.add_row({p.key, std::to_string(c.sms), std::to_string(round),
                   fmt::format("{:.5f}", m.time_s), fmt::format("{:.5f}", host_s),
                   fmt::format("{:.3f}", m.energy_j), fmt::format("{:.0f}", m.energy_j / m.time_s),
                   fmt::format("{}..{}", r.clock_mhz, r.clock_max_mhz),
                   nvml::ClockEventReasons{r.throttle_mask}.describe(),
                   fmt::format("{:.0f}->{:.0f}", r.temperature_before_c, r.temperature_after_c),
                   pred_t, pred_e, r.stable ? (r.power_capped ? "capped" : "yes") : "no"});
      }
    }
  }
  std::string text = t.render();
  if (rows.rounds < 2) return text;
  TextTable rep({"partition", "sms", "rounds", "time_s mean", "time cv %", "energy_j mean",
                 "energy cv %", "lowest clock_mhz mean"});
  for (const Point& pt : points) {
    const auto [tm, tcv] = mean_cv(pt.time_s);
    const auto [em, ecv] = mean_cv(pt.energy_j);
    const double clk = mean_cv(pt.clock_mhz).first;
    j["repeatability"].push_back({{"partition", pt.partition},
                                  {"sms", pt.sms},
                                  {"rounds", pt.time_s.size()},
                                  {"time_s_mean", tm},
                                  {"time_cv", tcv},
                                  {"energy_j_mean", em},
                                  {"energy_cv", ecv},
                                  {"clock_mhz_mean", clk}});
    rep.add_row({pt.partition, std::to_string(pt.sms), std::to_string(pt.time_s.size()),
                 fmt::format("{:.5f}", tm), fmt::format("{:.2f}", 100 * tcv),
                 fmt::format("{:.3f}", em), fmt::format("{:.2f}", 100 * ecv),
                 fmt::format("{:.0f}", clk)});
  }
  return text + "repeatability (coefficient of variation over the rounds):\n" + rep.render();
}

// The mixture-of-experts partition of `o.moe_workload` (nullopt when it is empty): the first
// whose compute has a grouped GEMM (the local experts) and whose collective is a plain
// all-to-all (no communication chain). Throws InvalidInput when there is none.
std::optional<Partition> grouped_gemm_partition(const DeviceCheckOptions& o) {
  if (o.moe_workload.empty()) return std::nullopt;
  const PartitionSet ps = partition_workload(load_workload(o.moe_workload));
  for (const Partition& p : ps.partitions) {
    if (p.collective.collective != CollectiveKind::kAllToAll || !p.comm_tail.empty()) continue;
    for (const Kernel& k : p.compute_ops) {
      if (k.kind == OpKind::kGemm && k.groups > 1) return p;
    }
  }
  throw InvalidInput(
      fmt::format("--moe-workload {}: no partition with a grouped GEMM and an all-to-all (is it a "
                  "mixture-of-experts workload?)",
                  o.moe_workload));
}

// The MoE row: one grouped-GEMM partition of `o.moe_workload` with its all-to-all as the copy
// proxy of the bytes that leave the GPU, on NCCL's default CTAs and, where the partition
// allows it, on the copy engines (0 SMs). Adds "moe" and "moe_partitions" to `j`.
std::string measure_moe(const DeviceCheckOptions& o, const std::optional<Partition>& moe_partition,
                        CudaProfiler& prof, const DeviceInfo& dev, const std::string& mapped,
                        int clock, nlohmann::json& j) {
  if (!moe_partition) return "";
  const Partition* p = &*moe_partition;
  const EmulatorModel model(prof.gpu());
  PartitionRows moe;
  moe.partitions = {p};
  moe.sms = [&](const Partition& q) {
    std::vector<int> sms = {std::min(model.default_collective_sms(q.collective), dev.sm_count - 1)};
    if (copy_engine_eligible(q)) sms.push_back(kCopyEngineSms);
    return sms;
  };
  moe.collective = "copy proxy (one GPU)";
  moe.json_key = "moe_partitions";
  const CollectiveStep c = collective_step(p->collective);
  j["moe"] = {{"workload", o.moe_workload},
              {"partition", p->key},
              {"collective", c.name},
              {"group_size", c.group_size},
              {"payload_bytes", c.payload_bytes},
              {"proxy_bytes", c.proxy_bytes},
              {"proxy",
               "copy proxy (one GPU): the all-to-all's bytes that leave the GPU, "
               "(n-1)/n of its payload, copied on the GPU: on `sms` CTAs, or with "
               "cudaMemcpyBatchAsync (copy engines) for 0 SMs; nothing crosses NVLink"}};
  const std::string rows = measure_partitions(moe, prof, mapped, clock, j);
  return fmt::format(
      "mixture of experts ({}): partition {}, grouped GEMMs as strided batched cuBLASLt, {} "
      "({:.1f} MB of {:.1f} MB) as copy proxy (one GPU); sms 0 = copy engines\n{}",
      o.moe_workload, p->key, c.name, static_cast<double>(c.proxy_bytes) / 1e6,
      static_cast<double>(c.payload_bytes) / 1e6, rows);
}

// What NVML saw while `work` ran on this thread: the SM clock's range and mean, the mean power
// and the OR of the clock-event reasons, sampled about every millisecond from a second thread
// (the Device is used by that thread alone meanwhile). A kernel's efficiency is taken at the
// clock it actually ran at: under the power cap the card lowers its clock by itself.
struct Sampled {
  int clock_min_mhz = std::numeric_limits<int>::max();
  int clock_max_mhz = 0;
  double clock_sum_mhz = 0, power_sum_w = 0;
  std::uint64_t reasons = 0;
  int samples = 0;
  void add(int clock_mhz, double power_w, std::uint64_t mask) {
    clock_min_mhz = std::min(clock_min_mhz, clock_mhz);
    clock_max_mhz = std::max(clock_max_mhz, clock_mhz);
    clock_sum_mhz += clock_mhz;
    power_sum_w += power_w;
    reasons |= mask;
    ++samples;
  }
  void merge(const Sampled& o) {
    clock_min_mhz = std::min(clock_min_mhz, o.clock_min_mhz);
    clock_max_mhz = std::max(clock_max_mhz, o.clock_max_mhz);
    clock_sum_mhz += o.clock_sum_mhz;
    power_sum_w += o.power_sum_w;
    reasons |= o.reasons;
    samples += o.samples;
  }
  double clock_mean_mhz() const { return clock_sum_mhz / std::max(samples, 1); }
  double power_mean_w() const { return power_sum_w / std::max(samples, 1); }
};

template <class Work>
Sampled sample_while(nvml::Device& nv, Work&& work) {
  std::atomic<bool> done{false};
  Sampled s;
  std::exception_ptr failure;
  auto read = [&] { s.add(nv.sm_clock_mhz(), nv.power_w(), nv.clock_event_reasons().mask); };
  std::thread sampler([&] {
    try {
      while (!done.load()) {
        read();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  try {
    work();
  } catch (...) {
    done = true;
    sampler.join();
    throw;
  }
  done = true;
  sampler.join();
  if (failure) std::rethrow_exception(failure);
  if (s.samples == 0) read();  // work shorter than one sample: the clock right after it
  return s;
}

// Each kernel of the sweep is timed for about this long per repetition: long enough that the
// launch gaps between back-to-back iterations are a small share, short enough that a sweep of
// a few hundred shapes stays within a minute or two.
constexpr double kSweepRepetitionS = 0.02;
constexpr int kSweepRepetitions = 3;

// Times every shape of `shapes` alone on the whole GPU (CUDA events over back-to-back
// iterations, median of kSweepRepetitions), samples the clock during the timing, and adds the
// rows under "kernels" to `j`; prints one line per shape to `out` as it goes (a sweep cut short
// by a timeout still leaves its lines). `model` (the card's catalogue entry) gives the
// emulator's prediction of the same kernel at the clock it ran at.
void measure_kernels(const std::vector<KernelShape>& shapes, const DeviceInfo& dev,
                     const EmulatorModel* model, nlohmann::json& j, std::ostream& out) {
  const std::unique_ptr<nvml::Nvml> nv_lib = nvml::open();
  nvml::Device& nv = nv_lib->device_by_uuid(dev.uuid);
  GroupExecutor ex({dev.index});
  out << fmt::format(
      "kernel sweep: {} GEMM and attention shapes, each alone on the whole GPU, median of {} "
      "timings of about {} ms\nshape | iterations | time_s | host_s | tflops | clock_mhz "
      "min..max | power_w | reasons | emulator time_s\n",
      shapes.size(), kSweepRepetitions, kSweepRepetitionS * 1e3);
  j["kernels"] = nlohmann::json::array();
  for (const KernelShape& sh : shapes) {
    ExecutionPlan one;
    one.ops = {sh.op};
    one.slot_index = 1;
    ex.prepare(one, 1, true);
    ex.run(2);  // first launches: cuBLASLt's algorithm and cuDNN's plan are chosen here
    const double probe_s = ex.run(3) / 3;
    const int iterations = static_cast<int>(
        std::clamp(std::ceil(kSweepRepetitionS / std::max(probe_s, 1e-7)), 3.0, 20000.0));
    std::vector<double> times;
    Sampled all;
    for (int rep = 0; rep < kSweepRepetitions; ++rep) {
      double per_iteration_s = 0;
      all.merge(sample_while(nv, [&] { per_iteration_s = ex.run(iterations) / iterations; }));
      times.push_back(per_iteration_s);
    }
    std::sort(times.begin(), times.end());
    const double time_s = times[times.size() / 2];
    const double host_s = ex.host_enqueue_s(kHostEnqueueIterations);
    nlohmann::json row = {{"shape", sh.key},
                          {"type", to_string(sh.op.type)},
                          {"kernel", sh.kernel.name},
                          {"flops", sh.kernel.flops},
                          {"model_flops", sh.kernel.model_flops},
                          {"bytes", sh.kernel.bytes()},
                          {"iterations", iterations},
                          {"time_s", time_s},
                          {"time_s_repetitions", times},
                          {"host_enqueue_s", host_s},
                          {"clock_min_mhz", all.clock_min_mhz},
                          {"clock_max_mhz", all.clock_max_mhz},
                          {"clock_mean_mhz", all.clock_mean_mhz()},
                          {"power_mean_w", all.power_mean_w()},
                          {"clock_samples", all.samples},
                          {"clock_event_reasons", nvml::ClockEventReasons{all.reasons}.describe()},
                          {"attention", sdpa::attention_path().backend()},
                          {"uses", sh.uses}};
    if (sh.op.type == OpType::kGemm) {
      const GemmShape& g = sh.op.gemm;
      row["gemm"] = {{"m", g.m},           {"n", g.n},           {"k", g.k},
                     {"transa", g.transa}, {"transb", g.transb}, {"batch", g.batch}};
    } else {
      const AttentionShape& a = sh.op.attn;
      row["attention_shape"] = {{"groups", a.groups},
                                {"q_heads_per_group", a.q_heads_per_group},
                                {"q_len", a.q_len},
                                {"kv_len", a.kv_len},
                                {"head_dim", a.head_dim}};
    }
    std::string pred = "-";
    if (model) {
      const GpuSpec& g = model->gpu();
      const int steps =
          static_cast<int>(std::lround((all.clock_mean_mhz() - g.min_freq_mhz) / g.freq_step_mhz));
      const int clock =
          std::clamp(g.min_freq_mhz + steps * g.freq_step_mhz, g.min_freq_mhz, g.max_freq_mhz);
      const double p = model->simulate_sequence({sh.kernel}, clock, 0).time_s;
      row["predicted_time_s"] = p;
      row["predicted_at_mhz"] = clock;
      pred = fmt::format("{:.6f}", p);
    }
    j["kernels"].push_back(row);
    out << fmt::format("{} | {} | {:.6f} | {:.6f} | {:.1f} | {}..{} | {:.0f} | {} | {}\n", sh.key,
                       iterations, time_s, host_s, sh.kernel.flops / time_s / 1e12,
                       all.clock_min_mhz, all.clock_max_mhz, all.power_mean_w(),
                       nvml::ClockEventReasons{all.reasons}.describe(), pred)
        << std::flush;
  }
}

}  // namespace

std::vector<KernelShape> kernel_sweep_shapes(const std::vector<std::string>& workloads) {
  KernelShapeSet set;
  for (const std::string& file : workloads) {
    set.add(std::filesystem::path(file).stem().string(), partition_workload(load_workload(file)));
  }
  return set.shapes();
}

nlohmann::json run_device_check(const DeviceCheckOptions& o, std::ostream& table) {
  if (o.repeats < 1) {
    throw InvalidInput(fmt::format("--repeats: {} rounds; allowed: 1 or more", o.repeats));
  }
  const Workload w = load_workload(o.workload);
  const PartitionSet ps = partition_workload(w);
  const std::optional<Partition> moe_partition = grouped_gemm_partition(o);
  const std::vector<KernelShape> sweep = kernel_sweep_shapes(o.kernel_workloads);
  visible_device_count();  // NotSupported "no CUDA device visible" first, before anything else
  const DeviceInfo dev = device_info(o.device);
  const std::string mapped = catalogue_gpu_for_device(dev.name);
  for (int sms : o.sms) {
    if (sms < 1 || sms >= dev.sm_count) {
      throw InvalidInput(fmt::format("--sms: {} SMs for the collective; allowed on {}: 1..{}", sms,
                                     dev.name, dev.sm_count - 1));
    }
  }

  ProfilerOptions po;
  po.gpu = mapped.empty() ? w.gpu_name : mapped;
  po.devices = {o.device};
  po.window_s = o.window_s;
  po.cooldown_s = o.cooldown_s;
  po.allow_clock_control = false;  // read-only NVML: the check never changes a card setting
  CudaOptions co;
  co.proxy_collective = true;
  co.report_clock_drift = true;
  co.protocol.warmup_iterations = 5;
  co.protocol.calibration_iterations = 10;
  co.protocol.max_attempts = 2;
  CudaProfiler prof(po, co);
  const int clock = *prof.fixed_freq_mhz();

  nlohmann::json j = {
      {"device", dev.name},
      {"device_index", o.device},
      {"catalogue_gpu", mapped.empty() ? nlohmann::json() : nlohmann::json(mapped)},
      {"sm_count", dev.sm_count},
      {"observed_clock_mhz", prof.observed_clock_mhz()},
      {"clock_mhz", clock},
      {"window_s", o.window_s},
      {"cooldown_s", o.cooldown_s},
      {"rounds", o.repeats},
      {"nvml_access", "read-only"},
      {"collective", "proxy: device-to-device copy of the payload on the same CTAs"},
      {"attention", sdpa::attention_path().backend()},
      {"workload", o.workload},
      {"fingerprint", prof.fingerprint()}};
  const std::string attention_check = cross_check_attention(o.device, j);
  const EmulatorModel model(prof.gpu());
  PartitionRows rows;
  for (const Partition& p : ps.partitions) rows.partitions.push_back(&p);
  rows.sms = [&](const Partition& p) {
    if (!o.sms.empty()) return o.sms;
    return std::vector<int>{std::min(model.default_collective_sms(p.collective), dev.sm_count - 1)};
  };
  rows.rounds = o.repeats;
  rows.collective = "proxy";
  rows.json_key = "partitions";
  const std::string tables = measure_partitions(rows, prof, mapped, clock, j);
  const std::string moe_tables = measure_moe(o, moe_partition, prof, dev, mapped, clock, j);
  table << fmt::format(
      "device check on {} (GPU {}, catalogue {}), clock {} MHz as found (read-only NVML), "
      "collective = copy proxy on NCCL's default CTAs, attention = {}\n",
      dev.name, o.device, mapped.empty() ? "none" : mapped, clock,
      sdpa::attention_path().backend());
  table << tables;
  table << moe_tables;
  table << attention_check;
  if (!sweep.empty()) measure_kernels(sweep, dev, mapped.empty() ? nullptr : &model, j, table);
  j["attention"] = sdpa::attention_path().backend();
  return j;
}

}  // namespace kareus::cuda
