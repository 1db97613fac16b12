// Stable hashing for identities that outlive a process (partition signatures, store keys,
// fingerprints): FNV-1a, 64 bit (Fowler, Noll, Vo). std::hash is not stable across runs or builds.
#pragma once

#include <cstdint>
#include <string_view>

namespace kareus {

inline constexpr std::uint64_t kFnvOffset = 1469598103934665603ULL;

/// Continues an FNV-1a hash `h` over `text`.
inline std::uint64_t fnv1a(std::string_view text, std::uint64_t h = kFnvOffset) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace kareus
