// Runs a matplotlib script through an argument vector (never a shell): the script and its data
// are written next to the picture, so a user can re-run or restyle it. Internal to src/eval.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kareus::detail {

/// Writes `script_text` to `script_name` and `data` to `data_name` in the picture's folder,
/// then runs `python3 SCRIPT DATA PNG`. Returns false, with the reason in `error` (the last
/// line the script printed, and a hint when matplotlib is missing), when no picture was made.
bool run_plot_script(const char* script_text, const std::string& script_name,
                     const nlohmann::json& data, const std::string& data_name,
                     const std::string& png_path, std::string& error);

}  // namespace kareus::detail
