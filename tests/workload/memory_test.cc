// Per-GPU memory (src/workload/memory.cc) against figures worked out by hand from the models'
// published shapes, the what-if flag, the micro-batch-1 default and the workload warnings.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "kareus/error.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus {
namespace {

using test::kGiB;
using test::kSeventyBOnA40;

TEST(Memory, SeventyBOnEightA40IsRefusedWithTheFigures) {
  const Workload w = parse_workload(kSeventyBOnA40, "70b-a40.yaml");
  const MemoryEstimate m = estimate_memory(w);
  // Per layer: QKV 8192*(64+2*8)*128 + output 64*128*8192 + SwiGLU 3*8192*28672 = 855,638,016
  // matrix weights over tp 8, plus two RMSNorm vectors (2*8192) replicated; 80 layers; the
  // vocabulary-parallel embedding and the untied output layer (128256*8192/8 each) and the
  // final norm (8192) on the only stage.
  const double params = 80.0 * (855638016.0 / 8 + 16384) + 2 * 128256.0 * 8192 / 8 + 8192;
  EXPECT_DOUBLE_EQ(m.parameters, params);
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2 * params);
  EXPECT_DOUBLE_EQ(m.gradients_bytes, 2 * params);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 12 * params);
  EXPECT_DOUBLE_EQ(m.optimizer_distributed_bytes, 12 * params);  // dp = 1
  // Full recompute: each of 80 layers keeps its input, 2*s*b*h bytes, for the one micro-batch
  // in flight (pp = 1), plus one layer recomputed: s*b*h*(10 + 24/8) (Korthikanti et al.).
  const double sbh = 8192.0 * 8 * 8192;
  EXPECT_EQ(m.inflight_microbatches, 1);
  EXPECT_DOUBLE_EQ(m.activations_bytes, 80 * 2 * sbh + sbh * 13);
  EXPECT_DOUBLE_EQ(m.hbm_bytes, 48 * kGiB);
  EXPECT_FALSE(m.fits());
  try {
    require_memory_fit(w);
    FAIL() << "a 70B job on 8 A40 was accepted";
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("70b-a40.yaml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("{:.1f} GiB", 12 * params / kGiB)), std::string::npos) << msg;
    EXPECT_NE(msg.find("what_if: true"), std::string::npos) << msg;
  }
  // Marked as a what-if emulation, it loads and is planned.
  const Workload wi =
      parse_workload(std::string(kSeventyBOnA40) + "what_if: true\n", "70b-a40.yaml");
  EXPECT_TRUE(wi.what_if);
  EXPECT_NO_THROW(require_memory_fit(wi));
}

TEST(Memory, PaperLlama3bStageZeroFitsWithHandFigures) {
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const MemoryEstimate m = estimate_memory(w);
  // Stage 0 (15 layers, embedding) holds more than stage 1 (13 layers, output-layer copy).
  // Per layer: 3072*(24+16)*128 + 24*128*3072 + 3*3072*8192 = 100,663,296 over tp 8, + 6144.
  const double params = 15 * (100663296.0 / 8 + 6144) + 128256.0 * 3072 / 8;
  EXPECT_EQ(m.stage, 0);
  EXPECT_DOUBLE_EQ(m.parameters, params);
  // 1F1B keeps min(pp - 0, 8) = 2 micro-batches on stage 0; no sequence parallelism.
  const double sbh = 4096.0 * 8 * 3072;
  EXPECT_EQ(m.inflight_microbatches, 2);
  EXPECT_DOUBLE_EQ(m.activations_bytes, 2 * 15 * 2 * sbh + sbh * 13);
  EXPECT_DOUBLE_EQ(m.total_bytes(), 16 * params + 2 * 15 * 2 * sbh + sbh * 13);
  EXPECT_DOUBLE_EQ(m.hbm_bytes, 40 * kGiB);
  EXPECT_TRUE(m.fits());
}

TEST(Memory, DistributedOptimizerAndSequenceParallelShrinkTheRightTerms) {
  const Workload w =
      load_workload(test::source_path("workloads/examples/llama3.2-3b_h100_tp4_sp_dp2.yaml"));
  const MemoryEstimate m = estimate_memory(w);
  EXPECT_DOUBLE_EQ(m.optimizer_distributed_bytes, m.optimizer_bytes / 2);  // dp = 2
  EXPECT_DOUBLE_EQ(m.total_bytes() - m.total_distributed_bytes(), m.optimizer_bytes / 2);
  // Sequence parallel: inputs 2sbh/t, one recomputed layer 34sbh/t; stage 0 has 14 layers.
  const double sbh = 4096.0 * 8 * 3072;
  EXPECT_DOUBLE_EQ(m.activations_bytes, 2 * 14 * 2 * sbh / 4 + 34 * sbh / 4);
}

// Interleaving keeps more, smaller passes in flight: stage 0 of p = 8, v = 2, m = 32 runs
// (8 - 1) * 2 + (2 - 1) * 8 = 22 warm-up forwards, so it holds 23 chunk passes of 5 layers where
// 1F1B holds 8 micro-batches of 10: (1 + (p - 1) / (p v)) = 23/16 times the layer inputs.
TEST(Memory, InterleavingHoldsMoreChunkPassesInFlight) {
  const Workload w1 = load_workload(
      test::source_path("workloads/zoo/llama3.1-70b_h100_tp8_sp_pp8_seq4k_mb32.yaml"));
  const Workload w2 = load_workload(
      test::source_path("workloads/zoo/llama3.1-70b_h100_tp8_sp_pp8_vp2_seq4k_mb32.yaml"));
  const MemoryEstimate m1 = estimate_memory(w1), m2 = estimate_memory(w2);
  ASSERT_EQ(m1.stage, 0);
  ASSERT_EQ(m2.stage, 0);
  EXPECT_EQ(m1.inflight_microbatches, 8);
  EXPECT_EQ(m2.inflight_microbatches, 23);
  EXPECT_DOUBLE_EQ(m2.parameters, m1.parameters);  // the same layers, split into chunks
  // Full recompute keeps the in-flight layer inputs x plus one layer's activations a, the same
  // in both: 115 x + a against 80 x + a, so the difference gives x.
  const double inputs1 = m1.activations_bytes, inputs2 = m2.activations_bytes;
  const double x = (inputs2 - inputs1) / (23.0 * 5 - 8.0 * 10);
  EXPECT_GT(x, 0);
  EXPECT_NEAR(inputs2 - 23.0 * 5 * x, inputs1 - 8.0 * 10 * x, 1e-6 * inputs1);
  // x is one layer input: 2 bytes x s x b x h / tp under sequence parallelism.
  EXPECT_NEAR(x, 2.0 * 4096 * 2 * 8192 / 8, 1e-9 * x);
}

TEST(Memory, PaperSeventyBWorkloadsAreWhatIfEmulations) {
  for (const char* name : {"llama3.3-70b_tp8_mbs2_seq4096", "llama3.3-70b_tp8_mbs4_seq4096"}) {
    const Workload w = load_workload(test::paper_workload(name));
    EXPECT_TRUE(w.what_if) << name;
    const MemoryEstimate m = estimate_memory(w);
    EXPECT_FALSE(m.fits()) << name;
    // Weights, gradients and Adam state alone: 16 B x about 70.6e9 / 16 GPUs, over 40 GiB.
    EXPECT_GT(16 * m.parameters, 40 * kGiB) << name;
    Workload strict = w;
    strict.what_if = false;
    EXPECT_THROW(require_memory_fit(strict), InvalidInput) << name;
  }
}

TEST(Memory, EveryShippedWorkloadLoadsAndFitsOrIsWhatIf) {
  int n = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(test::source_path("workloads"))) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    const Workload w = load_workload(e.path().string());
    EXPECT_NO_THROW(require_memory_fit(w)) << e.path();
    EXPECT_EQ(estimate_memory(w).fits(), !w.what_if) << e.path();
  }
  // The paper suite (14), the examples (3) and the zoo (at least 24).
  EXPECT_GE(n, 14 + 3 + 24);
}

TEST(Memory, MicroBatchOneDefaultsToOneNanoBatch) {
  const std::string base = R"(model: qwen3-1.7b
gpu: a100-sxm4-40gb
cluster: {nodes: 1, gpus_per_node: 8}
parallel: {tp: 8}
)";
  const Workload w = parse_workload(
      base + "batch: {micro_batch: 1, seq_len: 4096, micro_batches: 4}\n", "mb1.yaml");
  EXPECT_EQ(w.batch.nano_batches, 1);
  const Workload two = parse_workload(
      base + "batch: {micro_batch: 2, seq_len: 4096, micro_batches: 4}\n", "mb2.yaml");
  EXPECT_EQ(two.batch.nano_batches, 2);
  try {
    parse_workload(base +
                       "batch: {micro_batch: 1, seq_len: 4096, micro_batches: 4, "
                       "nano_batches: 2}\n",
                   "mb1n2.yaml");
    FAIL() << "one sequence split in two nano-batches was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch of at least 2"), std::string::npos)
        << e.what();
  }
  bool warned = false;
  for (const auto& s : workload_warnings(w)) warned |= s.find("at least 2") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(Memory, WarnsWhenMicroBatchesBelowPipelineStages) {
  const Workload w = parse_workload(R"(model: llama3.2-3b
gpu: a100-sxm4-40gb
cluster: {nodes: 2, gpus_per_node: 8}
parallel: {tp: 8, pp: 2}
batch: {micro_batch: 8, seq_len: 4096, micro_batches: 1}
)",
                                    "mb-lt-pp.yaml");
  const auto warnings = workload_warnings(w);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("micro_batches (1) < parallel.pp (2)"), std::string::npos)
      << warnings[0];
  EXPECT_TRUE(workload_warnings(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")))
                  .empty());
}

}  // namespace
}  // namespace kareus
