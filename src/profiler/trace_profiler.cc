// `trace` backend: replays measurements taken elsewhere (another cluster, an earlier CUDA run).
// CSV columns: partition,freq_mhz,sms,slot,time_s,energy_j. Segment rows use the segment name
// (optionally "name@stage/instruction") with sms 0 and slot "-". A point that is not in the
// file is an error naming the point, never a guess.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "builtin.h"
#include "kareus/error.h"
#include "kareus/hash.h"

namespace kareus {
namespace {

using PointKey = std::tuple<std::string, int, int, std::string>;
const char kHeader[] = "partition,freq_mhz,sms,slot,time_s,energy_j";

// A whole field as a number: "12x", "", " 1" and out-of-range values are errors, not a prefix.
bool parse_int(const std::string& text, int& out) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, out);
  return r.ec == std::errc() && r.ptr == end;
}

bool parse_double(const std::string& text, double& out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  try {
    std::size_t pos = 0;
    out = std::stod(text, &pos);
    return pos == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

// One data line: exactly six columns, integers where integers belong, finite positive time,
// finite non-negative energy.
void parse_row(const std::string& line, const std::string& where, TraceTable& t) {
  std::vector<std::string> cols;
  std::stringstream ss(line);
  for (std::string col; std::getline(ss, col, ',');) cols.push_back(col);
  if (!line.empty() && line.back() == ',') cols.emplace_back();
  if (cols.size() != 6) {
    throw InvalidInput(
        fmt::format("{}: expected 6 columns ({}), got {}", where, kHeader, cols.size()));
  }
  int freq_mhz = 0, sms = 0;
  double time_s = 0, energy_j = 0;
  if (!parse_int(cols[1], freq_mhz) || !parse_int(cols[2], sms) || freq_mhz <= 0 || sms < 0 ||
      !parse_double(cols[4], time_s) || !parse_double(cols[5], energy_j) ||
      !std::isfinite(time_s) || !std::isfinite(energy_j) || !(time_s > 0) || !(energy_j >= 0)) {
    throw InvalidInput(fmt::format(
        "{}: freq_mhz must be a positive integer, sms an integer >= 0, time_s a finite number "
        "> 0 and energy_j a finite number >= 0",
        where));
  }
  t.points[{cols[0], freq_mhz, sms, cols[3]}] = {time_s, energy_j};
}

}  // namespace

TraceTable parse_trace_csv(std::istream& in, const std::string& source) {
  TraceTable t;
  std::string line;
  int lineno = 0;
  std::uint64_t h = kFnvOffset;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    h = fnv1a(line, h);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      if (line != kHeader) {
        throw InvalidInput(
            fmt::format("{}:{}: header must be '{}', got '{}'", source, lineno, kHeader, line));
      }
      header = true;
      continue;
    }
    parse_row(line, fmt::format("{}:{}", source, lineno), t);
  }
  if (!header) throw InvalidInput(fmt::format("{}: empty trace file", source));
  t.hash = h;
  return t;
}

namespace {

class TraceProfiler : public Profiler {
 public:
  explicit TraceProfiler(const ProfilerOptions& o) : gpu_(gpu_by_name(o.gpu)), path_(o.trace_path) {
    if (path_.empty()) throw InvalidInput("backend 'trace' needs --trace FILE.csv");
    std::ifstream in(path_);
    if (!in) throw InvalidInput(fmt::format("{}: cannot open trace file", path_));
    TraceTable t = parse_trace_csv(in, path_);
    points_ = std::move(t.points);
    fingerprint_ = fmt::format("trace:{:016x}", t.hash);
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
