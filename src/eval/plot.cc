// Plots through Debian's python3-matplotlib, started with run_process (an argument vector).
#include "plot.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "kareus/process.h"

namespace kareus::detail {

bool run_plot_script(const char* script_text, const std::string& script_name,
                     const nlohmann::json& data, const std::string& data_name,
                     const std::string& png_path, std::string& error) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(png_path).parent_path().empty() ? fs::path(".") : fs::path(png_path).parent_path();
  const fs::path script = dir / script_name;
  const fs::path data_path = dir / data_name;
  std::ofstream(script) << script_text;
  std::ofstream(data_path) << data.dump() << "\n";
  // Debian's interpreter has python3-matplotlib; another python3 first on PATH may not.
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const fs::path log_path = dir / (fs::path(png_path).filename().string() + ".log");
  std::error_code ec;  // a stale picture must not pass for a new one
  fs::remove(log_path, ec);
  fs::remove(png_path, ec);
  const ProcessResult r =
      run_process({python, script.string(), data_path.string(), png_path}, log_path.string());
  if (!r.ok() || !fs::exists(png_path)) {
    std::ifstream log(log_path);
    std::string line, last;
    bool no_matplotlib = false;
    while (std::getline(log, line)) {
      if (!line.empty()) last = line;
      if (line.find("No module named 'matplotlib'") != std::string::npos) no_matplotlib = true;
    }
    const std::string why = r.ok() ? "it wrote no " + png_path : r.error;
    error = fmt::format("plotting with {} failed: {}{}{}", python, why,
                        last.empty() ? "" : " (last output: " + last + ")",
                        no_matplotlib ? "; install python3-matplotlib" : "");
    return false;
  }
  fs::remove(log_path, ec);
  return true;
}

}  // namespace kareus::detail
