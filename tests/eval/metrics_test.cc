// Throughput, MFU, energy per token, power per GPU and the profiling-cost estimate, checked
// against hand computations; the model-FLOPs formula also against the kernel graph's own count.
#include "kareus/metrics.h"

#include <gtest/gtest.h>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"
#include "kareus/profiling_cost.h"
#include "test_util.h"

namespace kareus {
namespace {

// A toy model small enough to count by hand.
Workload toy_workload() {
  Workload w;
  w.name = "toy";
  w.model = {"custom",       /*layers=*/2,   /*hidden=*/4, /*ffn_hidden=*/8, /*heads=*/2,
             /*kv_heads=*/1, /*head_dim=*/2, /*vocab=*/10};
  w.gpu_name = "a100-sxm4-40gb";
  w.cluster = {1, 4};
  w.parallel.tp = 2;
  w.parallel.dp = 2;
  w.batch = {/*micro_batch=*/2, /*seq_len=*/16, /*micro_batches=*/3, /*nano_batches=*/2};
  w.parallel.stage_layers = {2};
  return w;
}

TEST(Metrics, ModelFlopsByHand) {
  const Workload w = toy_workload();
  // Matmul weights per layer: QKV 4*(2+2*1)*2 = 32, output projection 2*2*4 = 16, SwiGLU
  // 3*4*8 = 96 -> 144; two layers 288, LM head 10*4 = 40: 328.
  // Tokens: 2 sequences x 16 x 3 micro-batches x dp 2 = 192. Per token 6*328 = 1968 for the
  // matmuls and, for causal attention, 6 * 2 layers * 16 * 2 heads * 2 = 768 (half of the full
  // square's 12 * ... = 1536).
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(w), 192.0 * (1968 + 768));
  const JobShape j = job_shape(w);
  EXPECT_DOUBLE_EQ(j.tokens_per_iteration, 192.0);
  EXPECT_EQ(j.gpus, 4);
  EXPECT_DOUBLE_EQ(j.peak_flops_per_gpu, 312e12);  // A100 dense bf16
}

TEST(Metrics, NarayananFormulaForGptShapesWithTheCausalHalf) {
  // With a = heads, d = h/a, g = a (no GQA) and a 4h MLP counted as 3 matrices of f = 8h/3,
  // eq. 3 of Narayanan et al. without recompute is 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per
  // iteration for B sequences; its s/(6h) term is the full attention square, halved here.
  Workload w = toy_workload();
  const double h = 48, l = 3, s = 32, V = 100;
  w.model = {"custom", 3, 48, 128, 4, 4, 12, 100};
  w.batch = {1, 32, 1, 1};
  w.parallel.dp = 1;
  w.parallel.stage_layers = {3};
  const double B = 1;
  EXPECT_NEAR(model_flops_per_iteration(w),
              72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h)), 1e-6);
}

TEST(Metrics, PalmFormulaMinusTheCausalHalfOnAPaperWorkload) {
  // PaLM's per-token form (appendix B): 6 N + 12 L s a d with N the matmul weights (per layer
  // h(a+2g)d + a d h + 3 h f, plus the LM head V h); the model-FLOPs count is that less the
  // masked half of the attention square, 6 L s a d, and the same in every output.
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const ModelConfig& m = w.model;
  const double h = m.hidden, d = m.head_dim, a = m.heads, g = m.kv_heads;
  const double n =
      m.layers * (h * (a + 2 * g) * d + a * d * h + 3 * h * m.ffn_hidden) + m.vocab * h;
  const double palm =
      w.tokens_per_iteration() * (6 * n + 12.0 * m.layers * w.batch.seq_len * a * d);
  const double causal_half = w.tokens_per_iteration() * 6.0 * m.layers * w.batch.seq_len * a * d;
  EXPECT_NEAR(model_flops_per_iteration(w) / (palm - causal_half), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(job_shape(w).model_flops_per_iteration,
                   build_kernel_graph(w).model_flops_per_iteration);
}

TEST(Metrics, ThroughputByHand) {
  const JobShape job{192.0, 672768.0, 4, 1e6};
  const ThroughputMetrics m = throughput_metrics(job, 2.0, 800.0);
  EXPECT_DOUBLE_EQ(m.tokens_per_s, 96.0);
  EXPECT_DOUBLE_EQ(m.tokens_per_s_per_gpu, 24.0);
  EXPECT_DOUBLE_EQ(m.mfu, 672768.0 / (2.0 * 4 * 1e6));
  EXPECT_DOUBLE_EQ(m.energy_per_token_j, 800.0 / 192);
  EXPECT_DOUBLE_EQ(m.avg_power_per_gpu_w, 100.0);
  const auto j = to_json(m);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), 96.0);
  EXPECT_DOUBLE_EQ(j.at("avg_power_per_gpu_w").get<double>(), 100.0);
  EXPECT_EQ(j.size(), 5u);
  EXPECT_THROW(throughput_metrics(job, 0.0, 800.0), InvalidInput);
  EXPECT_THROW(throughput_metrics(job, 1.0, -1.0), InvalidInput);
  EXPECT_THROW(throughput_metrics(JobShape{}, 1.0, 1.0), InvalidInput);
}

TEST(Metrics, PaperWorkloadMfuByHand) {
  // Llama 3.2 3B (h 3072, 28 layers, 24 heads, 8 KV heads, d 128, f 8192, V 128256) on 16
  // A100s, 262144 tokens per iteration, at Megatron-LM's 5.278 s: about 21.3% MFU (23.4% if
  // the full attention square were counted).
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const double n =
      28 * (3072.0 * 40 * 128 + 24 * 128 * 3072.0 + 3 * 3072.0 * 8192) + 128256.0 * 3072;
  const double flops = 262144.0 * (6 * n + 6 * 28 * 4096.0 * 24 * 128);
  EXPECT_NEAR(model_flops_per_iteration(w) / flops, 1.0, 1e-12);
  const ThroughputMetrics m = throughput_metrics(job_shape(w), 5.278, 21840);
  EXPECT_NEAR(m.mfu, flops / (5.278 * 16 * 312e12), 1e-12);
  EXPECT_NEAR(m.mfu, 0.213, 0.001);
  EXPECT_NEAR(m.tokens_per_s_per_gpu, 262144 / 5.278 / 16, 1e-9);
}

TEST(Metrics, EnergyReadsWellSmallAndLarge) {
  EXPECT_EQ(format_energy(0.55), "550 mJ");
  EXPECT_EQ(format_energy(5.5), "5.50 J");
  EXPECT_EQ(format_energy(0.0833), "83.3 mJ");
  EXPECT_EQ(format_energy(551), "551 J");
  EXPECT_EQ(format_energy(21840), "21.8 kJ");
  EXPECT_EQ(format_energy(21840, 4), "21.84 kJ");
  EXPECT_EQ(format_energy(3.2e7), "32.0 MJ");
  EXPECT_EQ(format_energy(999.7), "1.00 kJ");
  EXPECT_EQ(format_si(12400), "12.4k");
  EXPECT_EQ(format_si(776), "776");
  EXPECT_EQ(format_si(3105.3), "3.11k");
  const std::string line = metrics_line(throughput_metrics({192.0, 672768.0, 4, 1e6}, 2, 800));
  EXPECT_EQ(line, "96.0 tokens/s (24.0 per GPU), MFU 8.4%, 4.17 J/token, 100 W/GPU");
}

TEST(ProfilingCost, EstimateByHand) {
  const ProfilingCostEstimate e = estimate_profiling_cost(248, 8);
  EXPECT_DOUBLE_EQ(e.wall_s(), 248 * 10.0);
  EXPECT_DOUBLE_EQ(e.gpu_hours(), 248 * 10.0 * 8 / 3600);
  EXPECT_EQ(e.describe(),
            "5.5 GPU-hours, 41m20s on one 8-GPU node (estimate: 248 configurations x (5 s "
            "window + 5 s cool-down), one node per measurement)");
  const auto j = e.to_json();
  EXPECT_TRUE(j.at("estimate").get<bool>());
  EXPECT_DOUBLE_EQ(j.at("gpu_hours").get<double>(), e.gpu_hours());
  EXPECT_EQ(j.at("gpus_per_measurement").get<int>(), 8);
  EXPECT_THROW(estimate_profiling_cost(1, 0), InvalidInput);
}

}  // namespace
}  // namespace kareus
