// shipped_path (cli_util.h). The source and build folders are compiled into this file only, so
// that the rest of the CLI's objects do not depend on where the tree was checked out (ccache
// shares them between build folders).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"

namespace kareus::cli {

namespace fs = std::filesystem;

std::string shipped_path(const std::string& rel) {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("KAREUS_DATA_DIR"); env != nullptr && *env != '\0') {
    candidates.push_back(fs::path(env) / rel);
  }
  candidates.push_back(rel);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path().parent_path() / "share/kareus" / rel);
    // An installed copy must not read a source tree that may have moved on since.
    const fs::path build = fs::weakly_canonical(KAREUS_BINARY_DIR, ec);
    const bool in_build =
        !ec &&
        std::mismatch(build.begin(), build.end(), exe.begin(), exe.end()).first == build.end();
    if (in_build) candidates.push_back(fs::path(KAREUS_SOURCE_DIR) / rel);
  }
  for (const auto& c : candidates) {
    if (fs::exists(c, ec)) return c.string();
  }
  return candidates.back().string();
}

}  // namespace kareus::cli
