// The Kareus authors' artifact (github.com/ml-energy/kareus, Apache-2.0): the frontier plans
// their solver produced from profiles of real A100 runs, one Python file per frontier point,
// tests/{perseus,nanobatch_perseus,kareus}/schedules/megatron_<model>/cp<C>_tp<T>_mbs<M>_seq<S>/
// frontier/{freqs,scheds}_pipeline_NNNNN.py. Each file's comment lines
//   # Iteration N total cost: X
//   # Iteration N total cost with P2P: Y
// give one point: energy_j = Y (one GPU of each of the 2 pipeline stages, summed over the stages,
// static energy included) and iter_time_s = (Y - X) / (2 x 85 W), the blocking energy at the
// static power of each stage's GPU (data/calibration/README.md). The reader only reads files.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kareus {

/// Static (blocking) power of one A100 in the artifact's cost model (W).
constexpr double kArtifactStaticPowerW = 85;
/// Pipeline stages of every artifact workload.
constexpr int kArtifactStages = 2;

struct ArtifactPoint {
  double time_s = 0;    ///< iteration time
  double energy_j = 0;  ///< one GPU per stage, summed over the stages, static included
};

/// One method's measured frontier on one workload, fastest point first.
struct ArtifactFrontier {
  std::string workload;  ///< Kareus's workload name, e.g. "llama3.2-3b_cp2tp4_mbs8_seq4096"
  std::string method;    ///< perseus, nanobatch_perseus or kareus (the artifact's folder)
  std::vector<ArtifactPoint> points;
};

/// The artifact's methods in the order every output lists them.
const std::vector<std::string>& artifact_methods();

/// Kareus's workload name (workloads/paper/<name>.yaml) of an artifact folder pair:
/// ("megatron_llama3.2_3b", "cp2_tp4_mbs8_seq4096") -> "llama3.2-3b_cp2tp4_mbs8_seq4096",
/// ("megatron_qwen3_1.7b", "cp1_tp8_mbs8_seq4096") -> "qwen3-1.7b_tp8_mbs8_seq4096". Throws
/// InvalidInput for names of another shape.
std::string artifact_workload_name(const std::string& model_dir, const std::string& config_dir);

/// The point of one frontier file's text (`path` names it in errors). Throws InvalidInput naming
/// the file and the line when a cost line is malformed, and the file and the missing line when
/// one of the two is absent.
ArtifactPoint parse_artifact_point(const std::string& text, const std::string& path);

/// Every frontier of an artifact checkout `dir` (its root, holding tests/, or tests/ itself),
/// sorted by workload then method (artifact_methods order), each frontier fastest first. Throws
/// InvalidInput when `dir` holds no frontier file, or for the first malformed file.
std::vector<ArtifactFrontier> read_artifact_frontiers(const std::string& dir);

/// The CSV `kareus calibrate --artifact DIR --csv FILE` writes: `comment` lines (each prefixed
/// "# "), then `workload,method,iter_time_s,energy_j` rows (time to 1 us, energy to 1 mJ).
void write_artifact_csv(std::ostream& out, const std::vector<ArtifactFrontier>& frontiers,
                        const std::vector<std::string>& comment);
/// Reads that CSV back into frontiers (same order and sorting as read_artifact_frontiers).
/// Throws InvalidInput naming the file and the line of a malformed row.
std::vector<ArtifactFrontier> read_artifact_csv(const std::string& path);

/// The split of issue 28: "fit" for the five workloads a refit may use, "held-out" for the
/// other five (and for any other workload).
std::string artifact_set(const std::string& workload);

}  // namespace kareus
