// Loads the MPI transport plugin (libkareus_mpi.so). `kareus` is not linked against libmpi:
// linking it measured 2.5x the start-up time of a trivial program (8 ms vs 3 ms, nine more
// shared libraries) and would make every run depend on the OpenMPI runtime. The plugin is
// loaded only for `--mpi`, RTLD_GLOBAL because OpenMPI 4 loads its own components with dlopen
// and they resolve libmpi's symbols globally.
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "kareus/distributed.h"
#include "kareus/error.h"

namespace kareus::distributed {

#ifdef KAREUS_WITH_MPI
namespace {

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("KAREUS_MPI_PLUGIN")) out.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / "../lib/libkareus_mpi.so").lexically_normal().string());
    out.push_back((exe.parent_path() / "libkareus_mpi.so").string());
  }
  out.push_back(KAREUS_MPI_PLUGIN_PATH);
  out.push_back("libkareus_mpi.so");  // the dynamic linker's search path
  return out;
}

}  // namespace

std::unique_ptr<Transport> open_mpi_transport(int& argc, char**& argv) {
  std::string errors;
  for (const auto& path : plugin_candidates()) {
    if (path.find('/') != std::string::npos && !std::filesystem::exists(path)) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      errors += fmt::format("\n  {}: {}", path, e ? e : "unknown dlopen error");
      continue;
    }
    using OpenFn = Transport* (*)(int*, char***, char*, unsigned long);
    auto open = reinterpret_cast<OpenFn>(dlsym(h, "kareus_mpi_open"));
    if (!open) throw InternalError(fmt::format("{}: no symbol kareus_mpi_open", path));
    char err[512] = {0};
    Transport* t = open(&argc, &argv, err, sizeof(err));
    if (!t) throw NotSupported(fmt::format("--mpi: {}", err));
    // The handle stays open for the life of the process: MPI cannot be unloaded.
    return std::unique_ptr<Transport>(t);
  }
  throw NotSupported(fmt::format(
      "--mpi: cannot load the MPI plugin libkareus_mpi.so (set KAREUS_MPI_PLUGIN to its path; "
      "it needs the OpenMPI runtime, Debian package openmpi-bin):{}",
      errors.empty() ? " not found" : errors));
}

#else

std::unique_ptr<Transport> open_mpi_transport(int&, char**&) {
  throw NotSupported(
      "--mpi: this build has no MPI support (install libopenmpi-dev and openmpi-bin, e.g. with "
      "scripts/install-deps, and reconfigure)");
}

#endif

}  // namespace kareus::distributed
