// What an infrastructure engineer reads off a plan: throughput (tokens per second, whole job and
// per GPU), model FLOPs utilization (MFU), energy per token and average power per GPU, computed
// in this one place for every report, table and --json output.
//
// Model FLOPs follow Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM" (SC '21), eq. 3 without the recompute term, written per token as
// in Chowdhery et al., "PaLM" (2022), appendix B: a training token costs 6 FLOPs per matmul
// weight (forward 2, backward 4) plus 12 * layers * seq_len * heads * head_dim for the attention
// score and value products. The matmul weights are Q, K, V (grouped-query K/V), the output
// projection, the SwiGLU MLP (three matrices) and the LM head; embeddings lookups cost none.
// Attention is counted over the full s x s square, not the causal half, as both papers do, so
// the figure is comparable with published MFU numbers (the kernel graph, which models the work
// the GPU really does, counts the causal half). MFU excludes recomputed forward passes by
// definition (PaLM appendix B; with recompute it would be the hardware FLOPs utilization).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kareus/workload.h"

namespace kareus {

/// Model FLOPs of one training iteration of the whole job (every data-parallel replica),
/// recompute excluded: KernelGraph::model_flops_per_iteration, the one count that `workload
/// show`, reports, `optimize --json` and frontier.json print. Per token, 6 FLOPs per matmul
/// weight it multiplies (QKV, output projection, the MLP or, in a MoE layer, the router and the
/// top-k experts, the LM head) and 6 * layers * seq_len * heads * head_dim for causal attention:
/// the causal half of the s x s scores, as FlashAttention's benchmarks count it
/// (Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py: "// (2 if causal else
/// 1)"). Narayanan et al. (SC '21, eq. 3), PaLM (Chowdhery et al., 2022, appendix B) and
/// Megatron-LM's num_floating_point_operations count the full square, 12 * layers * seq_len *
/// heads * head_dim, so their MFU is higher by that half (noticeable at long contexts).
double model_flops_per_iteration(const Workload& w);

/// The job figures the metrics need; job_shape(w) fills them from a workload.
struct JobShape {
  double tokens_per_iteration = 0;       ///< whole job
  double model_flops_per_iteration = 0;  ///< whole job, recompute excluded
  int gpus = 0;
  double peak_flops_per_gpu = 0;  ///< dense bf16 tensor peak (FLOP/s) from the GPU catalogue
};
JobShape job_shape(const Workload& w);

struct ThroughputMetrics {
  double tokens_per_s = 0;          ///< whole job
  double tokens_per_s_per_gpu = 0;  ///< tokens_per_s / gpus
  double mfu = 0;                   ///< fraction (0..1): model FLOP/s over gpus x peak
  double energy_per_token_j = 0;    ///< whole-job energy per iteration / tokens per iteration
  double avg_power_per_gpu_w = 0;   ///< energy / (iteration time x gpus), static power included
};

/// Metrics of one plan or frontier point: its iteration time (s) and whole-job energy per
/// iteration (J). Throws InvalidInput when the time, the energy or the shape is not positive.
ThroughputMetrics throughput_metrics(const JobShape& job, double iteration_time_s, double energy_j);

/// {"tokens_per_s", "tokens_per_s_per_gpu", "mfu", "energy_per_token_j", "avg_power_per_gpu_w"}.
nlohmann::json to_json(const ThroughputMetrics& m);
/// {"tokens_per_iteration", "model_flops_per_iteration", "gpus", "peak_flops_per_gpu"}.
nlohmann::json to_json(const JobShape& j);

/// One line for people, e.g. "12.4k tokens/s (776 per GPU), MFU 41.2%, 1.41 J/token, 218 W/GPU".
std::string metrics_line(const ThroughputMetrics& m);

/// An energy with the prefix that keeps 1..999 before the point and `significant` digits
/// (at least 3): 0.55 J -> "550 mJ", 5.5 J -> "5.50 J", 21840 J -> "21.8 kJ", 3.2e7 J -> "32.0 MJ".
std::string format_energy(double energy_j, int significant = 3);
/// The same for a count per second or any plain quantity: 12400 -> "12.4k", 776 -> "776".
std::string format_si(double value, int significant = 3);

}  // namespace kareus
