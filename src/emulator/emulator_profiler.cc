// The emulator as a profiling backend: exact model numbers plus seeded measurement noise.
// Noise is a pure function of (seed, partition signature, configuration, window), so a point
// measured twice, in any order or after a crash, reads the same: the same seed gives the same
// result. Its size follows the window (noise_at_window, fitted to an H200's repeatability).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "builtin.h"
#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/hash.h"

namespace kareus {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Two independent standard normals (Box-Muller) from a key.
std::pair<double, double> normals(std::uint64_t seed, const std::string& key) {
  std::uint64_t s = splitmix64(seed ^ fnv1a(key));
  const std::uint64_t a = splitmix64(s), b = splitmix64(a);
  const double u1 = (static_cast<double>(a >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(b >> 11) + 0.5) / 9007199254740992.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  return {r * std::cos(2 * M_PI * u2), r * std::sin(2 * M_PI * u2)};
}

}  // namespace

EmulatorProfiler::EmulatorProfiler(const ProfilerOptions& o, EmulatorParams params)
    : model_(gpu_by_name(o.gpu), params),
      opt_(o),
      noise_(noise_with_time_share(o.noise, o.time_noise)) {
  if (!(o.window_s > 0) || !std::isfinite(o.window_s)) {
    throw InvalidInput(fmt::format("--window-s must be > 0, got {}", o.window_s));
  }
  if (!(o.noise >= 0 && o.noise <= 0.5)) {
    throw InvalidInput(fmt::format("--noise must be in [0, 0.5], got {}", o.noise));
  }
  if (!(o.time_noise >= 0 && o.time_noise <= 0.5) && o.time_noise != -1) {
    throw InvalidInput(fmt::format("--time-noise must be in [0, 0.5] or -1 ({} x --noise), got {}",
                                   kTimeNoiseShare, o.time_noise));
  }
  if (o.delay_ms < 0) {
    throw InvalidInput(
        fmt::format("--emulate-profiling-delay-ms must be >= 0, got {}", o.delay_ms));
  }
  // --noise is the repeatability of a reference-window measurement; a shorter window is
  // noisier. The fingerprint carries the scaled noise, so the store keeps the two apart.
  noise_ = noise_at_window(noise_, o.window_s);
  // The reference window adds nothing, so stores profiled before windows mattered stay valid;
  // another window is another measurement, in the store and in its noise draw.
  if (o.window_s != kReferenceWindowS) window_tag_ = fmt::format(":window_s={}", o.window_s);
}

std::string EmulatorProfiler::fingerprint() const {
  return fmt::format("emulator:{:016x}:noise={}:time_noise={}:seed={}{}",
                     fnv1a(model_.params().to_string()), noise_.energy, noise_.time, opt_.seed,
                     window_tag_);
}

Measurement EmulatorProfiler::finish(double time_s, double dyn_j, const std::string& noise_key) {
  if (opt_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.delay_ms));
  const double ps = model_.gpu().static_power_w;
  double energy = dyn_j + ps * time_s;
  if (noise_.time > 0 || noise_.energy > 0) {
    const auto [z1, z2] = normals(opt_.seed, noise_key + window_tag_);
    time_s *= std::max(0.5, 1.0 + noise_.time * z1);
    energy *= std::max(0.5, 1.0 + noise_.energy * z2);
  }
  return make_measurement(time_s, energy, ps);
}

Measurement EmulatorProfiler::measure(const Partition& p, const PartitionConfig& c) {
  const SimResult r = model_.simulate_partition(p, c);
  return finish(r.time_s, r.dynamic_energy_j,
                fmt::format("{}|{}|{}|{}", p.signature, c.freq_mhz, c.sms, c.slot));
}

Measurement EmulatorProfiler::measure_segment(const Segment& s, int freq_mhz) {
  const SimResult r =
      model_.simulate_sequence(s.kernels, freq_mhz, model_.gpu().segment_collective_sms());
  return finish(r.time_s, r.dynamic_energy_j,
                fmt::format("segment|{}|{}|{}|{}", s.name, s.stage, s.instruction, freq_mhz));
}

std::unique_ptr<Profiler> make_emulator_profiler(const ProfilerOptions& o) {
  return std::make_unique<EmulatorProfiler>(o);
}

}  // namespace kareus
