// `trace` backend: replays measurements taken elsewhere (another cluster, an earlier CUDA run).
// CSV columns: partition,freq_mhz,sms,slot,time_s,energy_j. Segment rows use the segment name
// (optionally "name@stage/instruction") with sms 0 and slot "-". A point that is not in the
// file is an error naming the point, never a guess.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "builtin.h"
#include "kareus/error.h"
#include "kareus/hash.h"

namespace kareus {
namespace {

using PointKey = std::tuple<std::string, int, int, std::string>;

class TraceProfiler : public Profiler {
 public:
  explicit TraceProfiler(const ProfilerOptions& o) : gpu_(gpu_by_name(o.gpu)), path_(o.trace_path) {
    if (path_.empty()) throw InvalidInput("backend 'trace' needs --trace FILE.csv");
    std::ifstream in(path_);
    if (!in) throw InvalidInput(fmt::format("{}: cannot open trace file", path_));
    std::string line;
    int lineno = 0;
    std::uint64_t h = kFnvOffset;
    const std::string expect = "partition,freq_mhz,sms,slot,time_s,energy_j";
    bool header = false;
    while (std::getline(in, line)) {
      ++lineno;
      h = fnv1a(line, h);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      if (!header) {
        if (line != expect) {
          throw InvalidInput(
              fmt::format("{}:{}: header must be '{}', got '{}'", path_, lineno, expect, line));
        }
        header = true;
        continue;
      }
      std::stringstream ss(line);
      std::string part, f, sms, slot, t, e;
      if (!std::getline(ss, part, ',') || !std::getline(ss, f, ',') ||
          !std::getline(ss, sms, ',') || !std::getline(ss, slot, ',') ||
          !std::getline(ss, t, ',') || !std::getline(ss, e, ',')) {
        throw InvalidInput(fmt::format("{}:{}: expected 6 columns ({})", path_, lineno, expect));
      }
      try {
        std::size_t pos = 0;
        const double time_s = std::stod(t, &pos);
        const double energy_j = std::stod(e, &pos);
        if (!(time_s > 0) || !(energy_j >= 0)) throw std::invalid_argument("range");
        points_[{part, std::stoi(f), std::stoi(sms), slot}] = {time_s, energy_j};
      } catch (const std::exception&) {
        throw InvalidInput(
            fmt::format("{}:{}: freq_mhz and sms must be integers, time_s > 0 and energy_j >= 0",
                        path_, lineno));
      }
    }
    if (!header) throw InvalidInput(fmt::format("{}: empty trace file", path_));
    fingerprint_ = fmt::format("trace:{:016x}", h);
  }

  std::string name() const override { return "trace"; }
  std::string fingerprint() const override { return fingerprint_; }
  const GpuSpec& gpu() const override { return gpu_; }
  double static_power_w() const override { return gpu_.static_power_w; }

  Measurement measure(const Partition& p, const PartitionConfig& c) override {
    return lookup({p.key, c.freq_mhz, c.sms, c.slot});
  }

  bool can_measure(const Partition& p, const PartitionConfig& c) const override {
    return points_.count({p.key, c.freq_mhz, c.sms, c.slot}) > 0;
  }

  Measurement measure_segment(const Segment& s, int freq_mhz) override {
    const PointKey specific{fmt::format("{}@{}/{}", s.name, s.stage, s.instruction), freq_mhz, 0,
                            "-"};
    if (points_.count(specific)) return lookup(specific);
    return lookup({s.name, freq_mhz, 0, "-"});
  }

 private:
  Measurement lookup(const PointKey& k) {
    auto it = points_.find(k);
    if (it == points_.end()) {
      throw InvalidInput(fmt::format(
          "{}: no measurement for partition={} freq_mhz={} sms={} slot={}; profile that point "
          "or use another backend",
          path_, std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k)));
    }
    return make_measurement(it->second.first, it->second.second, gpu_.static_power_w);
  }

  const GpuSpec& gpu_;
  std::string path_;
  std::string fingerprint_;
  std::map<PointKey, std::pair<double, double>> points_;
};

}  // namespace

std::unique_ptr<Profiler> make_trace_profiler(const ProfilerOptions& o) {
  return std::make_unique<TraceProfiler>(o);
}

}  // namespace kareus
