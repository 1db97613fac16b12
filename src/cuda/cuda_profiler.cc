// The `cuda` profiling backend (see cuda_profiler.h and docs/cuda.md). One point: the plan of the
// partition at the configuration's slot, the executor prepared with the configuration's CTA
// count, the clock locked through nvml::ClockGuard when clock control is allowed, then
// run_protocol() over a MeasurementTarget that runs the executor and reads NVML. Energy per GPU
// is the counter's difference over the window, summed over the group, divided by iterations and
// GPUs (the protocol does the division); time is the maximum over ranks of CUDA-event time.
// Static power follows the Kareus artifact: the group's GPUs blocked in a receive whose sender's
// host thread sleeps, power taken from the energy counter over a window.
#include "cuda_profiler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "builtin.h"
#include "cudnn_sdpa_backend.h"
#include "kareus/error.h"
#include "kareus/instruction_settings.h"

namespace kareus {
namespace cuda {
namespace {

void sleep_s(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

constexpr int kSamplePeriodMs = 50;  // NVML's clock and reason reads take well under 1 ms
// sw_power_cap (0x4, recorded) and the reasons that repeat a window; not idle or application
// clock settings, which say nothing about the measurement.
constexpr std::uint64_t kRecordedReasons = nvml::kBiasingReasons;

class GroupTarget : public MeasurementTarget {
 public:
  GroupTarget(GroupExecutor& ex, std::vector<nvml::Device*> devs)
      : ex_(ex), devs_(std::move(devs)) {}
  double run(int iterations) override { return ex_.run(iterations); }
  // NVML reports the instantaneous clock and reasons, so the window is sampled while it runs.
  // The sampler is its own thread rather than a poll loop after the launches: enqueueing a
  // window of small kernels blocks the host once the launch queue is full, which would leave
  // the poll loop only the window's tail. This thread alone uses devs_ until it is joined.
  WindowObservation run_window(int iterations) override {
    WindowObservation w;
    std::mutex m;
    std::condition_variable cv;
    bool stop = false;
    std::exception_ptr sampler_error;
    std::thread sampler([&] {
      try {
        // The first sample waits one period, so that it sees the window's kernels running
        // rather than the gap after the calibration run.
        std::unique_lock<std::mutex> lock(m);
        while (
            !cv.wait_for(lock, std::chrono::milliseconds(kSamplePeriodMs), [&] { return stop; })) {
          lock.unlock();
          int c = 1 << 30;
          std::uint64_t mask = 0;
          for (auto* d : devs_) {
            c = std::min(c, d->sm_clock_mhz());
            mask |= d->clock_event_reasons().mask & kRecordedReasons;
          }
          lock.lock();
          if (w.samples == 0) w.first_clock_mhz = w.min_clock_mhz = w.max_clock_mhz = c;
          w.min_clock_mhz = std::min(w.min_clock_mhz, c);
          w.max_clock_mhz = std::max(w.max_clock_mhz, c);
          w.throttle_mask |= mask;
          ++w.samples;
        }
      } catch (...) {
        sampler_error = std::current_exception();
      }
    });
    double elapsed_s = 0;
    try {
      elapsed_s = ex_.run(iterations);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(m);
        stop = true;
      }
      cv.notify_all();
      sampler.join();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv.notify_all();
    sampler.join();
    if (sampler_error) std::rethrow_exception(sampler_error);
    w.elapsed_s = elapsed_s;
    return w;
  }
  double energy_j() override {
    double e = 0;
    for (auto* d : devs_) e += d->total_energy_j();
    return e;
  }
  double temperature_c() override {
    double t = -1e9;
    for (auto* d : devs_) t = std::max(t, d->temperature_c());
    return t;
  }
  int sm_clock_mhz() override {
    int c = 1 << 30;
    for (auto* d : devs_) c = std::min(c, d->sm_clock_mhz());
    return c;
  }
  std::uint64_t throttle_mask() override {
    std::uint64_t m = 0;
    for (auto* d : devs_) m |= d->clock_event_reasons().mask & kRecordedReasons;
    return m;
  }
  std::string describe_throttle(std::uint64_t mask) const override {
    nvml::ClockEventReasons r;
    r.mask = mask;
    return r.describe();
  }
  void idle(double seconds) override { sleep_s(seconds); }
  int gpus() const override { return static_cast<int>(devs_.size()); }

 private:
  GroupExecutor& ex_;
  std::vector<nvml::Device*> devs_;
};

}  // namespace

CudaProfiler::CudaProfiler(const ProfilerOptions& o, CudaOptions c) : opt_(o), copt_(c) {
  if (!(o.window_s > 0)) {
    throw InvalidInput(fmt::format("--window-s must be > 0 (got {})", o.window_s));
  }
  if (!(o.cooldown_s >= 0)) {
    throw InvalidInput(fmt::format("--cooldown-s must be >= 0 (got {})", o.cooldown_s));
  }
  copt_.protocol.window_s = o.window_s;
  copt_.protocol.cooldown_s = o.cooldown_s;
  const int visible = visible_device_count();  // NotSupported: "no CUDA device visible"
  devices_ = o.devices;
  if (devices_.empty()) {
    for (int i = 0; i < visible; ++i) devices_.push_back(i);
  }
  for (int d : devices_) {
    if (d < 0 || d >= visible) {
      throw InvalidInput(fmt::format("--devices: GPU {} does not exist ({} visible: 0..{})", d,
                                     visible, visible - 1));
    }
  }
  for (int d : devices_) info_.push_back(device_info(d));
  const std::string mapped = catalogue_gpu_for_device(info_[0].name);
  const std::string wanted = o.gpu.empty() ? mapped : o.gpu;
  if (wanted.empty()) {
    throw InvalidInput(fmt::format(
        "GPU 0 is '{}', which is not in the catalogue; name a catalogue GPU in the workload ({})",
        info_[0].name, fmt::join(gpu_names(), ", ")));
  }
  gpu_ = gpu_by_name(wanted);
  if (!mapped.empty() && mapped != gpu_.name) {
    throw InvalidInput(fmt::format(
        "the workload's GPU is '{}' but GPU {} is '{}' (catalogue '{}'); measurements would be "
        "stored under the wrong GPU: set `gpu: {}` in the workload",
        gpu_.name, devices_[0], info_[0].name, mapped, mapped));
  }
  try {
    nvml::Options no;
    no.access = o.allow_clock_control ? nvml::Access::kClockControl : nvml::Access::kReadOnly;
    // A profiling run that locks clocks must not leave them locked when whatever started it
    // (a shell, a Slurm step) goes away.
    no.reset_on_parent_death = o.allow_clock_control;
    nvml_ = nvml::open(no);
    driver_version_ = nvml_->driver_version();
  } catch (const nvml::NvmlUnavailable& e) {
    throw NotSupported(fmt::format("backend 'cuda' reads energy through NVML: {}", e.what()));
  }
  const int n_nvml = nvml_->device_count();
  for (std::size_t r = 0; r < info_.size(); ++r) {
    int match = -1;
    for (int i = 0; i < n_nvml && match < 0; ++i) {
      if (nvml_->device(i).uuid() == info_[r].uuid) match = i;
    }
    if (match < 0) {
      throw InternalError(fmt::format("CUDA device {} ({}) has no NVML device with UUID {}",
                                      devices_[r], info_[r].name, info_[r].uuid));
    }
    nvml_index_.push_back(match);
  }
  if (o.allow_clock_control) guard_ = std::make_unique<nvml::ClockGuard>(*nvml_);
  // Settles cuDNN fused attention vs the fallback before the first fingerprint is read.
  sdpa::probe_fused_attention(devices_[0]);
}

CudaProfiler::~CudaProfiler() {
  executors_.clear();
  guard_.reset();  // resets every clock this profiler locked
}

std::string CudaProfiler::fingerprint() const {
  std::vector<std::string> names;
  for (const auto& d : info_) names.push_back(d.name);
  return fmt::format(
      "cuda;gpu={};devices={};driver={};cuda_runtime={};window_s={};cooldown_s={};warmup={};"
      "clocks={};{};proxy={}",
      fmt::join(names, "|"), fmt::join(devices_, ","), driver_version_, cuda_runtime_version(),
      copt_.protocol.window_s, copt_.protocol.cooldown_s, copt_.protocol.warmup_iterations,
      guard_ ? "locked" : "observed", attention_field(), copt_.proxy_collective ? 1 : 0);
}

std::string CudaProfiler::attention_field() const {
  const sdpa::AttentionPath& path = sdpa::attention_path();
  if (!path.fused()) return path.fingerprint_field();
  // The fused kernels differ between cuDNN releases: their version is part of the numbers.
  return fmt::format("{};cudnn={}", path.fingerprint_field(), cudnn().version());
}

GroupExecutor& CudaProfiler::executor_for(int ranks) const {
  auto it = executors_.find(ranks);
  if (it != executors_.end()) return *it->second;
  std::vector<int> devs(devices_.begin(), devices_.begin() + ranks);
  return *executors_.emplace(ranks, std::make_unique<GroupExecutor>(devs)).first->second;
}

std::vector<nvml::Device*> CudaProfiler::nvml_devices(int ranks) const {
  std::vector<nvml::Device*> d;
  d.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) d.push_back(&nvml_->device(nvml_index_[static_cast<size_t>(r)]));
  return d;
}

double CudaProfiler::nvml_temperature_c(int rank) {
  return nvml_->device(nvml_index_.at(static_cast<size_t>(rank))).temperature_c();
}

std::optional<int> CudaProfiler::fixed_freq_mhz() const {
  if (guard_) return std::nullopt;
  if (fixed_clock_) return fixed_clock_;
  // An idle card reports its idle clock; the clock that matters is the one under load.
  GroupExecutor& ex = executor_for(1);
  ex.start_busy(0.8);
  sleep_s(0.4);
  observed_raw_mhz_ = nvml_->device(nvml_index_[0]).sm_clock_mhz();
  ex.wait();
  fixed_clock_ = snap_to_clock_grid(gpu_, observed_raw_mhz_);
  return fixed_clock_;
}

ProtocolResult CudaProfiler::measure_plan(const std::string& what, const ExecutionPlan& plan,
                                          int sms, int freq_mhz) {
  const int group = plan.group_size();
  const bool proxy = copt_.proxy_collective || group == 1;
  const int ranks = proxy ? 1 : group;
  if (ranks > static_cast<int>(devices_.size())) {
    throw InvalidInput(fmt::format(
        "{}: its collective spans {} GPUs but this process drives {} (--devices {}); run one "
        "process per collective group on a node with {} GPUs (docs/cuda.md)",
        what, group, devices_.size(), fmt::join(devices_, ","), group));
  }
  // Every GPU of the group runs the collective on `sms` CTAs: the smallest one bounds it.
  const auto smallest = std::min_element(
      info_.begin(), info_.begin() + ranks,
      [](const DeviceInfo& a, const DeviceInfo& b) { return a.sm_count < b.sm_count; });
  if (sms >= smallest->sm_count) {
    throw InvalidInput(fmt::format("{}: --sms {} leaves no SM for compute (GPU {}, {}, has {} SMs)",
                                   what, sms, smallest->index, smallest->name, smallest->sm_count));
  }
  int expected = 0;
  if (guard_) {
    for (int r = 0; r < ranks; ++r) guard_->lock(nvml_index_[static_cast<size_t>(r)], freq_mhz);
    expected = freq_mhz;
  } else if (const auto fixed = fixed_freq_mhz(); fixed) {
    if (freq_mhz != *fixed) {
      throw InvalidInput(fmt::format(
          "{}: --freq {} MHz needs --allow-clock-control; without it the cuda backend measures "
          "at the card's clock under load ({} MHz, observed {} MHz)",
          what, freq_mhz, *fixed, observed_raw_mhz_));
    }
    // Points are stored under the clock observed at start-up: a window far from it is repeated.
    expected = *fixed;
  }
  GroupExecutor& ex = executor_for(ranks);
  const bool fused_before = sdpa::attention_path().fused();
  ex.prepare(plan, sms, proxy);
  GroupTarget target(ex, nvml_devices(ranks));
  last_ = run_protocol(target, copt_.protocol, expected);
  if (fused_before && !sdpa::attention_path().fused()) {
    // The fused path failed during this point (the warning names the step): measure it again,
    // all on the fallback kernel, so that no point mixes the two implementations.
    std::fprintf(stderr, "kareus: warning: %s measured again on the fallback attention kernel\n",
                 what.c_str());
    ex.prepare(plan, sms, proxy);
    last_ = run_protocol(target, copt_.protocol, expected);
  }
  last_proxy_ = proxy && (plan.overlap.has_value() || group > 1);
  last_ranks_ = ranks;
  if (!last_.stable) {
    std::fprintf(stderr,
                 "kareus: warning: %s measured UNSTABLE after %d attempts (kept as measured): "
                 "%s\n",
                 what.c_str(), last_.attempts, last_.note.c_str());
  }
  if (!guard_ && !copt_.report_clock_drift) check_observed_clock(what, last_);
  return last_;
}

void CudaProfiler::check_observed_clock(const std::string& what, const ProtocolResult& r) const {
  const int fixed = *fixed_clock_;
  // Under the power cap the point belongs to the setting that produced it (the card would run a
  // plan's kernels at that setting the same way); the clock range stays in the result.
  if (r.power_capped) return;
  const int window = snap_to_clock_grid(gpu_, r.clock_mhz);
  const int steps = clock_grid_steps(gpu_, fixed, r.clock_mhz);
  if (steps == 0) return;
  if (steps > kMaxClockGridSteps) {
    throw InternalError(fmt::format(
        "{}: the window ran at {} MHz (grid {} MHz) but points without --allow-clock-control are "
        "stored under the clock observed at start-up, {} MHz: {} grid steps apart (at most {} "
        "allowed). The card's clock changed under load (another process, a power limit, heat); "
        "restart the profile or use --allow-clock-control (docs/cuda.md)",
        what, r.clock_mhz, window, fixed, steps, kMaxClockGridSteps));
  }
  std::fprintf(stderr,
               "kareus: warning: %s ran at %d MHz (grid %d MHz) but is stored under the start-up "
               "clock %d MHz\n",
               what.c_str(), r.clock_mhz, window, fixed);
}

double CudaProfiler::last_host_enqueue_s(int iterations) {
  if (last_ranks_ == 0)
    throw InternalError("CudaProfiler::last_host_enqueue_s before a measurement");
  return executor_for(last_ranks_).host_enqueue_s(iterations);
}

Measurement CudaProfiler::measure(const Partition& p, const PartitionConfig& c) {
  if (c.sms == kCopyEngineSms && !copy_engine_eligible(p)) {
    throw InvalidInput(
        fmt::format("partition {}: sms {} (the copy engines) is not allowed for its "
                    "collective {}; allowed: {}",
                    p.key, c.sms, p.collective.name, allowed_sms_text(p)));
  }
  const ExecutionPlan plan = plan_partition(p, c.slot);
  const ProtocolResult r = measure_plan(
      fmt::format("partition {} (freq {} MHz, sms {}, slot {})", p.key, c.freq_mhz, c.sms, c.slot),
      plan, c.sms, c.freq_mhz);
  return make_measurement(r.time_s, r.energy_j, static_power_w());
}

Measurement CudaProfiler::measure_segment(const Segment& s, int freq_mhz) {
  const ExecutionPlan plan = plan_segment(s);
  const ProtocolResult r = measure_plan(fmt::format("segment {} (freq {} MHz)", s.name, freq_mhz),
                                        plan, std::max(1, gpu_.segment_collective_sms()), freq_mhz);
  return make_measurement(r.time_s, r.energy_j, static_power_w());
}

double CudaProfiler::measure_static_power_w() {
  if (copt_.protocol.window_s < kMinStaticPowerWindowS) {
    throw InvalidInput(fmt::format(
        "--static-power needs --window-s >= {} (got {}): NVML's energy counter updates about every "
        "100 ms, so a shorter window misses or double-counts a large share of the energy",
        kMinStaticPowerWindowS, copt_.protocol.window_s));
  }
  GroupExecutor& ex = executor_for(static_cast<int>(devices_.size()));
  const auto blocked = ex.blocked_ranks();
  const auto devs = nvml_devices(static_cast<int>(devices_.size()));
  auto energy = [&] {
    double e = 0;
    for (int r : blocked) e += devs[static_cast<size_t>(r)]->total_energy_j();
    return e;
  };
  ex.begin_blocked_receive();
  double power_w = 0;
  try {
    sleep_s(1.0);  // let the receive kernels and the power state settle
    const double e0 = energy();
    const auto t0 = std::chrono::steady_clock::now();
    sleep_s(copt_.protocol.window_s);  // the sender's host thread sleeps
    const double e1 = energy();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    power_w = (e1 - e0) / dt / static_cast<double>(blocked.size());
  } catch (...) {
    ex.end_blocked_receive();
    throw;
  }
  ex.end_blocked_receive();
  return power_w;
}

}  // namespace cuda

std::unique_ptr<Profiler> make_cuda_profiler(const ProfilerOptions& o) {
  return std::make_unique<cuda::CudaProfiler>(o);
}

}  // namespace kareus
