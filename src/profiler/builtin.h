// Factories of the built-in profiling backends (internal).
#pragma once

#include <memory>

#include "kareus/profiler.h"

namespace kareus {

std::unique_ptr<Profiler> make_emulator_profiler(const ProfilerOptions& o);
std::unique_ptr<Profiler> make_trace_profiler(const ProfilerOptions& o);
/// Real GPUs (src/cuda); without KAREUS_WITH_CUDA a stub that throws NotSupported.
std::unique_ptr<Profiler> make_cuda_profiler(const ProfilerOptions& o);

}  // namespace kareus
