// Name registry of profiling backends (the XGBoost/DuckDB pattern: an abstract class plus a
// registry whose error lists every registered name). Its own library (kareus_backends) because
// it knows every built-in backend: the emulator, the trace replay and the cuda backend.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "builtin.h"
#include "kareus/error.h"
#include "kareus/profiler.h"

namespace kareus {
namespace {

std::map<std::string, ProfilerFactory>& registry() {
  static std::map<std::string, ProfilerFactory> r;
  return r;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// Built-ins are registered on first use rather than by static initialisers, which a static
// library's linker may drop.
void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_profiler("emulator", make_emulator_profiler);
    register_profiler("trace", make_trace_profiler);
    register_profiler("cuda", make_cuda_profiler);
  });
}

}  // namespace

bool register_profiler(const std::string& name, ProfilerFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(factory);
  return true;
}

std::vector<std::string> profiler_names() {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

std::unique_ptr<Profiler> create_profiler(const std::string& name, const ProfilerOptions& o) {
  ensure_builtins();
  ProfilerFactory f;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) f = it->second;
  }
  if (!f) {
    throw InvalidInput(fmt::format("unknown profiling backend '{}'; available: {}", name,
                                   fmt::join(profiler_names(), ", ")));
  }
  return f(o);
}

}  // namespace kareus
