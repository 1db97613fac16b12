// Reader of the Kareus artifact's frontier files and of the CSV extracted from them
// (artifact.h, data/calibration/artifact_frontiers.csv).
#include "kareus/artifact.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <sstream>
#include <tuple>

#include "csv_rows.h"
#include "kareus/error.h"

namespace kareus {

namespace {

namespace fs = std::filesystem;

/// A whole field as a finite number, or nothing (trailing blanks allowed).
std::optional<double> parse_number(const std::string& s) {
  const char* begin = s.c_str();
  while (*begin == ' ' || *begin == '\t') ++begin;
  if (*begin == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  while (*end == ' ' || *end == '\t' || *end == '\r') ++end;
  if (*end != '\0') return std::nullopt;
  return v;
}

int method_rank(const std::string& m) {
  const auto& ms = artifact_methods();
  return static_cast<int>(std::find(ms.begin(), ms.end(), m) - ms.begin());
}

void sort_frontiers(std::vector<ArtifactFrontier>& v) {
  for (auto& f : v) {
    std::stable_sort(f.points.begin(), f.points.end(),
                     [](const ArtifactPoint& a, const ArtifactPoint& b) {
                       return std::tie(a.time_s, a.energy_j) < std::tie(b.time_s, b.energy_j);
                     });
  }
  std::sort(v.begin(), v.end(), [](const ArtifactFrontier& a, const ArtifactFrontier& b) {
    return std::make_pair(a.workload, method_rank(a.method)) <
           std::make_pair(b.workload, method_rank(b.method));
  });
}

// The issue's fit set; every other workload is held out.
const char* const kFitSet[] = {"llama3.2-3b_tp8_mbs8_seq4096", "llama3.2-3b_cp2tp4_mbs8_seq4096",
                               "llama3.2-3b_cp2tp4_mbs16_seq4096", "qwen3-1.7b_tp8_mbs8_seq4096",
                               "qwen3-1.7b_cp2tp4_mbs8_seq4096"};

}  // namespace

const std::vector<std::string>& artifact_methods() {
  static const std::vector<std::string> m = {"perseus", "nanobatch_perseus", "kareus"};
  return m;
}

std::string artifact_set(const std::string& workload) {
  for (const char* w : kFitSet) {
    if (workload == w) return "fit";
  }
  return "held-out";
}

std::string artifact_workload_name(const std::string& model_dir, const std::string& config_dir) {
  static const std::regex model_re(R"(megatron_(.+)_([0-9.]+b))");
  static const std::regex config_re(R"(cp([0-9]+)_tp([0-9]+)_(mbs[0-9]+_seq[0-9]+))");
  std::smatch m, c;
  if (!std::regex_match(model_dir, m, model_re)) {
    throw InvalidInput(fmt::format(
        "artifact model folder '{}': expected megatron_<model>_<size>b, e.g. megatron_llama3.2_3b",
        model_dir));
  }
  if (!std::regex_match(config_dir, c, config_re)) {
    throw InvalidInput(fmt::format(
        "artifact configuration folder '{}': expected cp<C>_tp<T>_mbs<M>_seq<S>", config_dir));
  }
  const std::string parallel = c[1].str() == "1" ? fmt::format("tp{}", c[2].str())
                                                 : fmt::format("cp{}tp{}", c[1].str(), c[2].str());
  return fmt::format("{}-{}_{}_{}", m[1].str(), m[2].str(), parallel, c[3].str());
}

ArtifactPoint parse_artifact_point(const std::string& text, const std::string& path) {
  // "# Iteration N total cost: X" and "# Iteration N total cost with P2P: Y".
  static const std::regex line_re(R"(#\s*Iteration\s+(\S+)\s+total cost( with P2P)?:(.*))");
  std::optional<double> total, with_p2p;
  std::string iteration;
  int lineno = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::smatch m;
    if (!std::regex_match(line, m, line_re)) {
      if (line.find("total cost") != std::string::npos && line.rfind('#', 0) == 0) {
        throw InvalidInput(fmt::format(
            "{}:{}: malformed cost line '{}': expected '# Iteration N total cost: X' or "
            "'# Iteration N total cost with P2P: Y'",
            path, lineno, line));
      }
      continue;
    }
    const bool p2p = m[2].matched;
    const auto v = parse_number(m[3].str());
    if (!v || *v <= 0) {
      throw InvalidInput(fmt::format("{}:{}: total cost{} '{}' is not a positive number", path,
                                     lineno, p2p ? " with P2P" : "", m[3].str()));
    }
    if (!iteration.empty() && m[1].str() != iteration) {
      throw InvalidInput(fmt::format("{}:{}: iteration {} differs from the other cost line's {}",
                                     path, lineno, m[1].str(), iteration));
    }
    iteration = m[1].str();
    auto& slot = p2p ? with_p2p : total;
    if (slot) {
      throw InvalidInput(
          fmt::format("{}:{}: second 'total cost{}' line", path, lineno, p2p ? " with P2P" : ""));
    }
    slot = v;
  }
  if (!total) throw InvalidInput(fmt::format("{}: no '# Iteration N total cost: X' line", path));
  if (!with_p2p) {
    throw InvalidInput(fmt::format("{}: no '# Iteration N total cost with P2P: Y' line", path));
  }
  if (!(*with_p2p > *total)) {
    throw InvalidInput(fmt::format(
        "{}: total cost with P2P ({}) must exceed total cost ({}): their difference is the "
        "blocking energy",
        path, *with_p2p, *total));
  }
  ArtifactPoint p;
  p.energy_j = *with_p2p;
  p.time_s = (*with_p2p - *total) / (kArtifactStages * kArtifactStaticPowerW);
  return p;
}

std::vector<ArtifactFrontier> read_artifact_frontiers(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InvalidInput(fmt::format("--artifact {}: no such folder", dir));
  }
  const fs::path root =
      fs::is_directory(fs::path(dir) / "tests", ec) ? fs::path(dir) / "tests" : fs::path(dir);
  // A Kareus point has both files, the clocks (freqs_) and the schedule (scheds_), with the same
  // number and the same cost lines: one point.
  static const std::regex file_re(R"((freqs|scheds)_pipeline_([0-9]+)\.py)");
  std::map<std::pair<std::string, std::string>, ArtifactFrontier> by_key;
  std::map<std::pair<std::string, std::string>, ArtifactPoint> seen;  // (folder, number)
  for (const std::string& method : artifact_methods()) {
    const fs::path schedules = root / method / "schedules";
    if (!fs::is_directory(schedules, ec)) continue;
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(schedules, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const fs::path& p = it->path();
      if (!it->is_regular_file(ec) || p.parent_path().filename() != "frontier") continue;
      if (!std::regex_match(p.filename().string(), file_re)) continue;
      files.push_back(p);
    }
    if (ec)
      throw InvalidInput(fmt::format("{}: cannot list ({})", schedules.string(), ec.message()));
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      // .../schedules/<model>/<config>/frontier/<file>
      const fs::path config = p.parent_path().parent_path();
      const fs::path model = config.parent_path();
      if (model.parent_path() != schedules) {
        throw InvalidInput(fmt::format("{}: expected {}/<model>/<config>/frontier/<file>",
                                       p.string(), schedules.string()));
      }
      std::string name;
      try {
        name = artifact_workload_name(model.filename().string(), config.filename().string());
      } catch (const InvalidInput& e) {
        throw InvalidInput(fmt::format("{}: {}", p.string(), e.what()));
      }
      std::ifstream in(p);
      if (!in) throw InvalidInput(fmt::format("{}: cannot read", p.string()));
      std::ostringstream text;
      text << in.rdbuf();
      const ArtifactPoint point = parse_artifact_point(text.str(), p.string());
      std::smatch m;
      const std::string file = p.filename().string();
      std::regex_match(file, m, file_re);
      const auto [it, fresh] = seen.try_emplace({p.parent_path().string(), m[2].str()}, point);
      if (!fresh) {
        if (it->second.time_s != point.time_s || it->second.energy_j != point.energy_j) {
          throw InvalidInput(fmt::format(
              "{}: its cost lines differ from those of the other file of point {} in {}",
              p.string(), m[2].str(), p.parent_path().string()));
        }
        continue;
      }
      auto& f = by_key[{name, method}];
      f.workload = name;
      f.method = method;
      f.points.push_back(point);
    }
  }
  if (by_key.empty()) {
    throw InvalidInput(fmt::format(
        "--artifact {}: no frontier file (tests/<method>/schedules/<model>/<config>/frontier/"
        "*_pipeline_NNNNN.py for method perseus, nanobatch_perseus or kareus)",
        dir));
  }
  std::vector<ArtifactFrontier> out;
  out.reserve(by_key.size());
  for (auto& [key, f] : by_key) out.push_back(std::move(f));
  sort_frontiers(out);
  return out;
}

void write_artifact_csv(std::ostream& out, const std::vector<ArtifactFrontier>& frontiers,
                        const std::vector<std::string>& comment) {
  for (const auto& c : comment) out << (c.empty() ? "#" : "# " + c) << "\n";
  out << "workload,method,iter_time_s,energy_j\n";
  for (const auto& f : frontiers) {
    for (const auto& p : f.points) {
      out << fmt::format("{},{},{:.6f},{:.3f}\n", f.workload, f.method, p.time_s, p.energy_j);
    }
  }
}

std::vector<ArtifactFrontier> read_artifact_csv(const std::string& path) {
  std::map<std::pair<std::string, std::string>, ArtifactFrontier> by_key;
  detail::for_each_csv_row(
      path, "workload,method,iter_time_s,energy_j", "artifact CSV",
      [&](const std::vector<std::string>& f, int lineno) {
        const auto positive = [&](std::size_t i) {
          const auto v = f.size() == 4 ? parse_number(f[i]) : std::nullopt;
          if (!v || *v <= 0) {
            throw InvalidInput(fmt::format(
                "{}:{}: expected workload,method,iter_time_s,energy_j with positive numbers", path,
                lineno));
          }
          return *v;
        };
        const double t = positive(2), e = positive(3);
        if (method_rank(f[1]) == static_cast<int>(artifact_methods().size())) {
          throw InvalidInput(
              fmt::format("{}:{}: method '{}': allowed values: perseus, nanobatch_perseus, kareus",
                          path, lineno, f[1]));
        }
        auto& fr = by_key[{f[0], f[1]}];
        fr.workload = f[0];
        fr.method = f[1];
        fr.points.push_back({t, e});
      });
  if (by_key.empty()) throw InvalidInput(fmt::format("{}: no data row", path));
  std::vector<ArtifactFrontier> out;
  out.reserve(by_key.size());
  for (auto& [key, f] : by_key) out.push_back(std::move(f));
  sort_frontiers(out);
  return out;
}

}  // namespace kareus
