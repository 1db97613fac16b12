// The cuda backend in a build without the CUDA toolkit (google/benchmark's habit for optional
// hardware features): the name stays registered so that `--backend cuda` explains itself
// instead of being an unknown backend.
#include <fmt/format.h>

#include "builtin.h"
#include "kareus/error.h"

namespace kareus {

std::unique_ptr<Profiler> make_cuda_profiler(const ProfilerOptions&) {
  throw NotSupported(
      "backend 'cuda': this build has no CUDA support (built without KAREUS_WITH_CUDA; install "
      "the CUDA toolkit with cuDNN and NCCL and reconfigure)");
}

}  // namespace kareus
