// Factories of the built-in profiling backends (internal).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kareus/profiler.h"

namespace kareus {

std::unique_ptr<Profiler> make_emulator_profiler(const ProfilerOptions& o);
std::unique_ptr<Profiler> make_trace_profiler(const ProfilerOptions& o);
/// Real GPUs (src/cuda); without KAREUS_WITH_CUDA a stub that throws NotSupported.
std::unique_ptr<Profiler> make_cuda_profiler(const ProfilerOptions& o);

/// The measurements of a `trace` CSV (src/profiler/trace_profiler.cc): points keyed by
/// (partition, freq_mhz, sms, slot), valued (time_s, energy_j), and an FNV-1a hash of the text.
struct TraceTable {
  std::map<std::tuple<std::string, int, int, std::string>, std::pair<double, double>> points;
  std::uint64_t hash = 0;
};
/// Parses a trace CSV; `source` names the file in errors. Throws InvalidInput on any bad line.
TraceTable parse_trace_csv(std::istream& in, const std::string& source);

}  // namespace kareus
