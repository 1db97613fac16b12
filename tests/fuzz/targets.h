// The libFuzzer targets' bodies (tests/fuzz/targets.cc), shared by the fuzzers (tests/fuzz/main.cc)
// and by the unit tests, which replay every committed input (tests/fuzz/corpus_test.cc).
// Each takes arbitrary bytes, runs one parser on them and returns 0. Rejecting the input with
// kareus::InvalidInput is the expected outcome for bad input; any other exception, a crash or a
// sanitizer report is a finding.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kareus::fuzz {

/// Workload YAML (parse_workload), then the kernel graph of an accepted workload.
int workload_one_input(const std::uint8_t* data, std::size_t size);
/// Plan JSON (Plan::from_json), then validate_plan against the workload of kPlanWorkloadYaml.
int plan_one_input(const std::uint8_t* data, std::size_t size);
/// Trace CSV of the `trace` profiling backend (parse_trace_csv).
int trace_one_input(const std::uint8_t* data, std::size_t size);

/// The workload the plan target validates against; the seed plans in tests/fuzz/plan/ were
/// made for it (`kareus plan`), so mutated plans reach the checks behind the digest.
extern const char* const kPlanWorkloadYaml;

}  // namespace kareus::fuzz
