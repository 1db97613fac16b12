// The cuda backend's host-side planning (src/cuda/op_plan.h), checked against shapes computed by
// hand from the model (Llama 3.2 3B: hidden 3072, FFN 8192, 24 query / 8 KV heads of 128) and the
// parallel layout, independently of the kernel graph's code.
#include "cuda/op_plan.h"

#include <gtest/gtest.h>

#include "kareus/error.h"
#include "kareus/partition.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus::cuda {
namespace {

const PartitionSet& llama_tp8() {
  static const PartitionSet ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  return ps;
}

// TP=8, micro-batch 8 split in 2 nano-batches: 4 sequences x 4096 = 16384 tokens per GPU.
constexpr std::int64_t kTokens = 4 * 4096;
constexpr std::int64_t kHidden = 3072;
constexpr std::size_t kBf16 = 2;

TEST(CudaOpPlan, ForwardAttentionOpsShapesAndSlot) {
  const Partition& p = llama_tp8().partition("fwd_attn");
  const ExecutionPlan plan = plan_partition(p, "rope");
  ASSERT_EQ(plan.ops.size(), 6u);
  const std::vector<OpType> types = {OpType::kAdd,  OpType::kRmsNorm,          OpType::kGemm,
                                     OpType::kRope, OpType::kAttentionForward, OpType::kGemm};
  for (std::size_t i = 0; i < types.size(); ++i) EXPECT_EQ(plan.ops[i].type, types[i]) << i;
  // Residual add and RMSNorm over tokens x hidden.
  EXPECT_EQ(plan.ops[0].elements, kTokens * kHidden);
  EXPECT_EQ(plan.ops[0].input_bytes,
            (std::vector<std::size_t>{kTokens * kHidden * kBf16, kTokens * kHidden * kBf16}));
  EXPECT_EQ(plan.ops[1].rows, kTokens);
  EXPECT_EQ(plan.ops[1].cols, kHidden);
  // QKV: 3 local query heads + 2 x 1 local KV head, 128 wide: n = 640.
  EXPECT_EQ(plan.ops[2].gemm, (GemmShape{kTokens, 640, kHidden}));
  EXPECT_EQ(plan.ops[2].input_bytes,
            (std::vector<std::size_t>{kTokens * kHidden * kBf16, kHidden * 640 * kBf16}));
  EXPECT_EQ(plan.ops[2].output_bytes, (std::vector<std::size_t>{kTokens * 640 * kBf16}));
  // RoPE on Q and K (3 + 1 heads of 128) per token.
  EXPECT_EQ(plan.ops[3].cols, 128);
  EXPECT_EQ(plan.ops[3].rows, kTokens * 4);
  // Attention: 4 sequences x 1 KV head, 3 query heads each, causal over 4096.
  EXPECT_EQ(plan.ops[4].attn, (AttentionShape{4, 3, 4096, 4096, 128}));
  EXPECT_EQ(plan.ops[4].input_bytes,
            (std::vector<std::size_t>{kTokens * 384 * kBf16, kTokens * 128 * kBf16,
                                      kTokens * 128 * kBf16}));
  EXPECT_EQ(plan.ops[5].gemm, (GemmShape{kTokens, kHidden, 384}));
  // The other nano-batch's AllReduce of tokens x hidden bf16.
  ASSERT_TRUE(plan.overlap.has_value());
  EXPECT_EQ(plan.overlap->kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(plan.overlap->group_size, 8);
  EXPECT_EQ(plan.overlap->payload_bytes, 100663296u);
  EXPECT_EQ(plan.overlap->nccl_count, 50331648u);
  EXPECT_EQ(plan.overlap->send_bytes, 100663296u);
  EXPECT_EQ(plan.overlap->recv_bytes, 100663296u);
  EXPECT_EQ(plan.group_size(), 8);
  // Slots: before residual add (0), QKV GEMM (2), RoPE (3), attention (4).
  EXPECT_EQ(plan.slot_index, 3);
  EXPECT_EQ(plan_partition(p, "norm").slot_index, 0);
  EXPECT_EQ(plan_partition(p, "qkv").slot_index, 2);
  EXPECT_EQ(plan_partition(p, "attn").slot_index, 4);
  EXPECT_THROW(plan_partition(p, "fc1"), InvalidInput);
}

TEST(CudaOpPlan, MlpAndBackwardBuffers) {
  const ExecutionPlan fwd = plan_partition(llama_tp8().partition("fwd_mlp"), "activation");
  ASSERT_EQ(fwd.ops.size(), 5u);
  EXPECT_EQ(fwd.ops[2].gemm, (GemmShape{kTokens, 2048, kHidden}));  // gate+up: 2 x 8192 / 8
  EXPECT_EQ(fwd.ops[3].type, OpType::kSwiglu);
  EXPECT_EQ(fwd.ops[3].elements, kTokens * 1024);
  EXPECT_EQ(fwd.ops[4].gemm, (GemmShape{kTokens, kHidden, 1024}));
  EXPECT_EQ(fwd.slot_index, 3);

  const ExecutionPlan bwd = plan_partition(llama_tp8().partition("bwd_attn"), "attn");
  const OpStep* attn = nullptr;
  for (const auto& op : bwd.ops)
    if (op.type == OpType::kAttentionBackward) attn = &op;
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->attn, (AttentionShape{4, 3, 4096, 4096, 128}));
  const std::size_t q = kTokens * 384 * kBf16, kv = kTokens * 128 * kBf16, stats = kTokens * 3 * 4;
  EXPECT_EQ(attn->input_bytes, (std::vector<std::size_t>{q, kv, kv, q, q, stats}));
  EXPECT_EQ(attn->output_bytes, (std::vector<std::size_t>{q, kv, kv, stats}));
  const ExecutionPlan mlp = plan_partition(llama_tp8().partition("bwd_mlp"), "norm");
  EXPECT_EQ(mlp.ops[0].type, OpType::kRmsNormBackward);
  EXPECT_EQ(mlp.ops[0].cols, kHidden);
  for (const auto& p : llama_tp8().partitions) EXPECT_EQ(infer_hidden(p.compute_ops), kHidden);
}

// fc2 forward is y[T,3072] = x[T,1024] W[1024,3072] (FFN 8192 / TP 8). Its dgrad
// dx[T,1024] = dy[T,3072] W^T reads W as stored, [1024,3072]: B transposed, row length 3072.
// Its wgrad dW[1024,3072] = x^T dy reads x as stored, [T,1024]: A transposed, row length 1024.
TEST(CudaOpPlan, BackwardGemmsAreTransposed) {
  const ExecutionPlan mlp = plan_partition(llama_tp8().partition("bwd_mlp"), "norm");
  const OpStep* dgrad = nullptr;
  const OpStep* wgrad = nullptr;
  for (const auto& op : mlp.ops) {
    if (op.name == "fc2_dgrad") dgrad = &op;
    if (op.name == "fc2_wgrad") wgrad = &op;
  }
  ASSERT_NE(dgrad, nullptr);
  ASSERT_NE(wgrad, nullptr);
  EXPECT_EQ(dgrad->gemm, (GemmShape{kTokens, 1024, kHidden, false, true}));
  EXPECT_EQ(dgrad->gemm.lda(), kHidden);  // dy [T,3072]
  EXPECT_EQ(dgrad->gemm.ldb(), kHidden);  // W stored [1024,3072]
  EXPECT_EQ(dgrad->gemm.ldc(), 1024);     // dx [T,1024]
  EXPECT_EQ(wgrad->gemm, (GemmShape{1024, kHidden, kTokens, true, false}));
  EXPECT_EQ(wgrad->gemm.lda(), 1024);     // x stored [T,1024]
  EXPECT_EQ(wgrad->gemm.ldb(), kHidden);  // dy [T,3072]
  EXPECT_EQ(wgrad->gemm.ldc(), kHidden);  // dW [1024,3072]
  // The stored buffers keep their sizes: m x k and k x n elements whatever the transposes.
  EXPECT_EQ(wgrad->input_bytes,
            (std::vector<std::size_t>{1024 * kTokens * kBf16, kTokens * kHidden * kBf16}));
  // Forward GEMMs stay NN.
  const ExecutionPlan fwd = plan_partition(llama_tp8().partition("fwd_mlp"), "activation");
  EXPECT_FALSE(fwd.ops[4].gemm.transa);
  EXPECT_FALSE(fwd.ops[4].gemm.transb);
  EXPECT_EQ(fwd.ops[4].gemm.lda(), 1024);
  EXPECT_EQ(fwd.ops[4].gemm.ldb(), kHidden);
}

TEST(CudaOpPlan, ContextParallelAllGatherAndAttention) {
  const PartitionSet ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_cp2tp4_mbs8_seq4096")));
  const Partition& p = ps.partition("fwd_ao_ag");
  // Collective of fwd_ao_* is the other nano-batch's K,V AllGather over CP=2: the full K,V of
  // 4 sequences x 4096 tokens x 2 local KV heads x 128 x (K and V) in bf16.
  const ExecutionPlan plan = plan_partition(p, p.slots.front().name);
  ASSERT_TRUE(plan.overlap.has_value());
  EXPECT_EQ(plan.overlap->kind, CollectiveKind::kAllGather);
  const std::size_t payload = 4u * 4096 * 2 * 128 * 2 * kBf16;
  EXPECT_EQ(plan.overlap->payload_bytes, payload);
  EXPECT_EQ(plan.overlap->send_bytes, payload / 2);
  EXPECT_EQ(plan.overlap->recv_bytes, payload);
  EXPECT_EQ(plan.overlap->nccl_count, payload / 2 / kBf16);
  // Attention on this CP rank: 2048 query rows per sequence, 6 local query heads over 2 KV heads.
  const OpStep& attn = plan.ops.front();
  ASSERT_EQ(attn.type, OpType::kAttentionForward);
  EXPECT_EQ(attn.attn, (AttentionShape{8, 3, 2048, 4096, 128}));
}

TEST(CudaOpPlan, SegmentsCarryTheirCollectives) {
  const auto& ps = llama_tp8();
  const Segment* emb = nullptr;
  for (const auto& s : ps.segments)
    if (s.name == "embedding") emb = &s;
  ASSERT_NE(emb, nullptr);
  const ExecutionPlan plan = plan_segment(*emb);
  ASSERT_EQ(plan.ops.size(), 2u);
  EXPECT_EQ(plan.ops[0].type, OpType::kStream);
  // Micro-batch (8 x 4096 tokens) x hidden rows gathered, plus the int32 token ids.
  EXPECT_EQ(plan.ops[0].input_bytes[0], 8u * 4096 * 3072 * kBf16 + 8u * 4096 * 4);
  EXPECT_EQ(plan.ops[1].type, OpType::kCollective);
  EXPECT_EQ(plan.ops[1].collective.payload_bytes, 8u * 4096 * 3072 * kBf16);
  EXPECT_EQ(plan.group_size(), 8);
  EXPECT_FALSE(plan.overlap.has_value());
}

TEST(CudaCommCache, OneSetPerCtaCountWithLruEviction) {
  int created = 0;
  std::vector<int> destroyed;
  {
    CommCache<int> cache(
        [&](int sms) {
          ++created;
          return sms * 100;
        },
        [&](int& c) { destroyed.push_back(c); }, 2);
    EXPECT_EQ(cache.get(6), 600);
    EXPECT_EQ(cache.get(6), 600);
    EXPECT_EQ(created, 1);
    EXPECT_EQ(cache.get(12), 1200);
    EXPECT_EQ(cache.get(6), 600);  // 6 is now the most recently used
    EXPECT_EQ(cache.get(24), 2400);
    EXPECT_EQ(created, 3);
    EXPECT_EQ(destroyed, std::vector<int>{1200});  // 12 was the least recently used
    EXPECT_TRUE(cache.contains(6));
    EXPECT_FALSE(cache.contains(12));
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_THROW(cache.get(0), InvalidInput);
  }
  EXPECT_EQ(destroyed.size(), 3u);  // the destructor destroys what is left
}

// Without clock control a window's clock is compared with the start-up clock in grid steps: the
// nearest supported clock, the lower one on a tie.
TEST(CudaClockGrid, SnapAndSteps) {
  const GpuSpec& g = gpu_by_name("h100-sxm");
  const std::vector<int> c = g.supported_freqs_mhz();
  ASSERT_GT(c.size(), 10u);
  const int step = c[6] - c[5];
  ASSERT_GT(step, 1);
  EXPECT_EQ(snap_to_clock_grid(g, c[5]), c[5]);
  EXPECT_EQ(snap_to_clock_grid(g, c[5] + (step - 1) / 2), c[5]);
  if (step % 2 == 0) {
    EXPECT_EQ(snap_to_clock_grid(g, c[5] + step / 2), c[5]);  // tie: the lower clock
  }
  EXPECT_EQ(snap_to_clock_grid(g, c[6] - 1), c[6]);
  EXPECT_EQ(snap_to_clock_grid(g, c.back() + 500), c.back());
  EXPECT_EQ(clock_grid_steps(g, c[5], c[5] + 1), 0);
  EXPECT_EQ(clock_grid_steps(g, c[5], c[7]), 2);
  EXPECT_EQ(clock_grid_steps(g, c[8], c[5] + 1), 3);
  EXPECT_EQ(clock_grid_steps(g, c[9], c[9] - 2 * step), 2);
}

TEST(CudaDeviceNames, MapToCatalogue) {
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA H200"), "h200");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA A100-SXM4-80GB"), "a100-sxm4-80gb");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA A100-SXM4-40GB"), "a100-sxm4-40gb");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA A40"), "a40");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA H100 PCIe"), "");
  EXPECT_EQ(catalogue_gpu_for_device("NVIDIA GeForce RTX 4090"), "");
}

}  // namespace
}  // namespace kareus::cuda
