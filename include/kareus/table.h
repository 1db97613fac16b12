// A plain-text table for human-readable CLI output. The same result objects also render to JSON,
// so a person and a script read the same numbers.
#pragma once

#include <string>
#include <vector>

namespace kareus {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  /// Columns whose cells all look numeric are right-aligned.
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// 1234567 -> "1.23 MB" style (decimal units, as NCCL and nvidia-smi report).
std::string human_bytes(double bytes);
/// 1.2e12 -> "1.20 TFLOP".
std::string human_flops(double flops);

}  // namespace kareus
