// Comma-separated files of src/emulator (calibration targets, stage profiles, the artifact
// extract): comment lines (#) and empty lines skipped, one header line, then data rows.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kareus::detail {

/// Calls fn(fields, line number) for every data row of a comma-separated file whose first
/// non-comment line must start with `header`; `what` names the file's kind in errors. Throws
/// InvalidInput naming the file (and the line, for a wrong header).
void for_each_csv_row(const std::string& csv_path, const std::string& header,
                      const std::string& what,
                      const std::function<void(const std::vector<std::string>&, int)>& fn);

}  // namespace kareus::detail
