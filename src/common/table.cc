#include "kareus/table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace kareus {
namespace {

bool numeric(const std::string& s) {
  if (s.empty()) return false;
  const char c = s.front();
  return std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.';
}

std::string scaled(double v, const char* unit, const char* const* prefixes, int n) {
  int i = 0;
  while (std::abs(v) >= 1000.0 && i + 1 < n) {
    v /= 1000.0;
    ++i;
  }
  return fmt::format("{:.2f} {}{}", v, prefixes[i], unit);
}

}  // namespace

std::string TextTable::render() const {
  const std::size_t cols = header_.size();
  std::vector<std::size_t> width(cols, 0);
  std::vector<bool> right(cols, true);
  for (std::size_t c = 0; c < cols; ++c) width[c] = header_[c].size();
  for (const auto& r : rows_) {
    for (std::size_t c = 0; c < cols && c < r.size(); ++c) {
      width[c] = std::max(width[c], r[c].size());
      if (!numeric(r[c])) right[c] = false;
    }
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const bool last = c + 1 == cols;
      if (right[c]) {
        out += fmt::format("{:>{}}", cell, width[c]);
      } else {
        out += last ? cell : fmt::format("{:<{}}", cell, width[c]);
      }
      out += last ? "\n" : "  ";
    }
  };
  line(header_);
  std::vector<std::string> rule;
  for (std::size_t c = 0; c < cols; ++c) rule.push_back(std::string(width[c], '-'));
  line(rule);
  for (const auto& r : rows_) line(r);
  return out;
}

std::string human_bytes(double bytes) {
  static const char* const p[] = {"", "k", "M", "G", "T"};
  return scaled(bytes, "B", p, 5);
}

std::string human_flops(double flops) {
  static const char* const p[] = {"", "k", "M", "G", "T", "P", "E"};
  return scaled(flops, "FLOP", p, 7);
}

}  // namespace kareus
