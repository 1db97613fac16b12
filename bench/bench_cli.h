// What the truth-scored benchmark binaries (search_efficiency, frontier_truth) share at their
// boundary: flag values parsed with the flag named in the error, worker threads whose first
// exception reaches main, and main's mapping of errors to exit codes (InvalidInput 2, others 1,
// as include/kareus/error.h lays down). Why: an option the library refuses (a search option out
// of range) is thrown inside a worker thread, where an uncaught exception aborts the process.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kareus/error.h"

namespace kareus::bench {

/// `value` of `flag` as a number; anything else (empty, trailing text) is InvalidInput.
inline double flag_double(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw InvalidInput(fmt::format("{}: expected a number, got '{}'", flag, value));
  }
  return x;
}

/// `value` of `flag` as an integer; anything else is InvalidInput.
inline int flag_int(const std::string& flag, const std::string& value) {
  const double x = flag_double(flag, value);
  if (x != static_cast<int>(x)) {
    throw InvalidInput(fmt::format("{}: expected an integer, got '{}'", flag, value));
  }
  return static_cast<int>(x);
}

/// Runs `worker` on `threads` threads (at least one) and rethrows the first exception any of
/// them threw, after all have joined.
inline void run_workers(int threads, const std::function<void()>& worker) {
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) {
    pool.emplace_back([&] {
      try {
        worker();
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

/// `body`'s exit code, or the code of the error that ended it, with the error on stderr.
inline int guarded_main(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const InvalidInput& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace kareus::bench
