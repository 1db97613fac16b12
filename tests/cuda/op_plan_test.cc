// The cuda backend's host-side planning (src/cuda/op_plan.h), checked against shapes computed by
// hand from the model (Llama 3.2 3B: hidden 3072, FFN 8192, 24 query / 8 KV heads of 128) and the
// parallel layout, independently of the kernel graph's code.
#include "cuda/op_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

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

// The collective of a plan as NCCL runs it: kind, group, payload, count and buffers per rank.
void expect_collective(const std::optional<CollectiveStep>& c, CollectiveKind kind, int group,
                       std::size_t payload, std::size_t nccl_count, std::size_t send,
                       std::size_t recv) {
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->kind, kind);
  EXPECT_EQ(c->group_size, group);
  EXPECT_EQ(c->payload_bytes, payload);
  EXPECT_EQ(c->nccl_count, nccl_count);
  EXPECT_EQ(c->send_bytes, send);
  EXPECT_EQ(c->recv_bytes, recv);
}

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
  expect_collective(plan.overlap, CollectiveKind::kAllReduce, 8, 100663296u, 50331648u, 100663296u,
                    100663296u);
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

// Qwen3-30B-A3B with EP 8 inside one node: hidden 2048, 128 routed experts of FFN 768, top 8, so
// 16 local experts per GPU. A nano-batch is one sequence of 4096 tokens (micro-batch 2 in 2
// nano-batches, TP 1, no sequence parallelism): 4096 x 8 = 32768 routed rows, 2048 per expert.
const PartitionSet& qwen3_moe_ep8() {
  static const PartitionSet ps = partition_workload(
      load_workload(test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml")));
  return ps;
}
constexpr std::int64_t kMoeHidden = 2048, kExpertFfn = 768, kLocalExperts = 16;
constexpr std::int64_t kMoeTokens = 4096, kRoutedRows = kMoeTokens * 8;
constexpr std::int64_t kRowsPerExpert = kRoutedRows / kLocalExperts;  // 2048

TEST(CudaOpPlan, GroupedExpertGemmsAreStridedBatched) {
  static_assert(kRowsPerExpert == 2048);
  const Partition& p = qwen3_moe_ep8().partition("fwd_moe_experts_a2a");
  const ExecutionPlan plan = plan_partition(p, "linear");
  ASSERT_EQ(plan.ops.size(), 3u);
  // FC1 (gate + up) of every local expert: 16 x [2048 x 2048] x [2048 x 1536] in one matmul.
  const OpStep& fc1 = plan.ops[0];
  EXPECT_EQ(fc1.name, "expert_fc1");
  EXPECT_EQ(fc1.type, OpType::kGemm);
  EXPECT_EQ(fc1.gemm,
            (GemmShape{kRowsPerExpert, 2 * kExpertFfn, kMoeHidden, false, false, kLocalExperts}));
  EXPECT_EQ(fc1.gemm.batch, 16);
  EXPECT_EQ(fc1.gemm.stride_a(), 2048 * 2048);
  EXPECT_EQ(fc1.gemm.stride_b(), 2048 * 1536);
  EXPECT_EQ(fc1.gemm.stride_c(), 2048 * 1536);
  // Buffers hold every group: 16 x 2048 x 2048 x 2 B = 128 MiB of routed rows, 96 MiB of
  // weights, 96 MiB out.
  EXPECT_EQ(fc1.input_bytes, (std::vector<std::size_t>{134217728u, 100663296u}));
  EXPECT_EQ(fc1.output_bytes, (std::vector<std::size_t>{100663296u}));
  // The experts' SwiGLU runs the dense kernel over all 32768 x 768 routed elements.
  EXPECT_EQ(plan.ops[1].type, OpType::kSwiglu);
  EXPECT_EQ(plan.ops[1].elements, kRoutedRows * kExpertFfn);
  const OpStep& fc2 = plan.ops[2];
  EXPECT_EQ(fc2.gemm,
            (GemmShape{kRowsPerExpert, kMoeHidden, kExpertFfn, false, false, kLocalExperts}));
  EXPECT_EQ(fc2.input_bytes, (std::vector<std::size_t>{50331648u, 50331648u}));
  EXPECT_EQ(fc2.output_bytes, (std::vector<std::size_t>{134217728u}));
  // The other nano-batch's dispatch: 32768 routed rows x 2048 x 2 B over EP 8, equal splits of
  // 1/8 to every rank; 7/8 of it leaves the GPU (what the one-GPU proxy copies).
  // 8388608 elements to and from every peer.
  expect_collective(plan.overlap, CollectiveKind::kAllToAll, 8, 134217728u, 8388608u, 134217728u,
                    134217728u);
  ASSERT_TRUE(plan.overlap.has_value());
  EXPECT_EQ(plan.overlap->proxy_bytes, 117440512u);
  EXPECT_TRUE(plan.overlap->copy_engine);
  // 320 MiB (FC1) + 144 MiB (SwiGLU: gate, up, out) + 224 MiB (FC2) + 256 MiB (all-to-all).
  EXPECT_EQ(plan.buffer_bytes(), 989855744u);

  // Backward keeps the framework's transposes per group.
  const ExecutionPlan bwd =
      plan_partition(qwen3_moe_ep8().partition("bwd_moe_experts_a2a"), "linear");
  ASSERT_EQ(bwd.ops.size(), 5u);
  EXPECT_EQ(bwd.ops[0].gemm, (GemmShape{2048, 768, 2048, false, true, 16}));  // fc2 dgrad
  EXPECT_EQ(bwd.ops[1].gemm, (GemmShape{768, 2048, 2048, true, false, 16}));  // fc2 wgrad
  EXPECT_EQ(bwd.ops[2].type, OpType::kSwigluBackward);
  EXPECT_EQ(bwd.ops[2].elements, kRoutedRows * kExpertFfn);
  EXPECT_EQ(bwd.ops[3].gemm, (GemmShape{2048, 2048, 1536, false, true, 16}));  // fc1 dgrad
  EXPECT_EQ(bwd.ops[4].gemm, (GemmShape{2048, 1536, 2048, true, false, 16}));  // fc1 wgrad
  // dW of fc1 for 16 experts: 16 x 2048 x 1536 x 2 B.
  EXPECT_EQ(bwd.ops[4].output_bytes, (std::vector<std::size_t>{100663296u}));
}

TEST(CudaOpPlan, MoeRouterIsAPlainGemmAndNamesTheHiddenSize) {
  const Partition& p = qwen3_moe_ep8().partition("fwd_moe_route_a2a");
  EXPECT_EQ(infer_hidden(p.compute_ops), kMoeHidden);
  const ExecutionPlan plan = plan_partition(p, "norm");
  const OpStep* router = nullptr;
  const OpStep* norm = nullptr;
  for (const auto& op : plan.ops) {
    if (op.name == "router_gemm") router = &op;
    if (op.type == OpType::kRmsNorm) norm = &op;
  }
  ASSERT_NE(router, nullptr);
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(router->gemm, (GemmShape{kMoeTokens, 128, kMoeHidden}));
  EXPECT_EQ(router->gemm.batch, 1);
  EXPECT_EQ(norm->cols, kMoeHidden);
  EXPECT_EQ(norm->rows, kMoeTokens);
}

// 0 SMs (the copy engines) only for a copy-engine capable collective: the intra-node all-to-all.
TEST(CudaOpPlan, CopyEngineSmsOnlyForCopyEngineCollectives) {
  const ExecutionPlan a2a =
      plan_partition(qwen3_moe_ep8().partition("fwd_moe_experts_a2a"), "linear");
  EXPECT_NO_THROW(check_plan_sms(a2a, 0));
  EXPECT_NO_THROW(check_plan_sms(a2a, 8));
  EXPECT_THROW(check_plan_sms(a2a, -1), InvalidInput);
  const ExecutionPlan ar = plan_partition(llama_tp8().partition("fwd_mlp"), "activation");
  EXPECT_FALSE(ar.overlap->copy_engine);
  EXPECT_EQ(ar.overlap->proxy_bytes, ar.overlap->payload_bytes);
  EXPECT_THROW(check_plan_sms(ar, 0), InvalidInput);
  EXPECT_NO_THROW(check_plan_sms(ar, 1));
  // A segment's collectives run on the compute stream's SMs.
  EXPECT_THROW(check_plan_sms(plan_segment(llama_tp8().segments.front()), 0), InvalidInput);
}

// The kernel sweep's shapes of the TP=8 workload, written down from the model: one nano-batch's
// five forward kernels, their nine backward GEMMs and attention (dgrads NT, wgrads TN), and the
// logits GEMM of the whole micro-batch (8 x 4096 tokens, vocabulary 128256 / 8) in three
// directions. A second copy of the workload adds uses, never shapes.
TEST(CudaOpPlan, KernelShapeSetListsEachShapeOnce) {
  const std::string f = std::to_string(kTokens);  // 16384
  const std::vector<std::string> expected = {
      "gemm m" + f + " n640 k3072 NN x1",   // QKV: (3 + 2 x 1) heads x 128
      "attn_fwd g4 h3 q4096 kv4096 d128",   // 4 sequences x 1 KV head, 3 query heads each
      "gemm m" + f + " n3072 k384 NN x1",   // output projection
      "gemm m" + f + " n2048 k3072 NN x1",  // FC1 (SwiGLU: 2 x 8192 / 8)
      "gemm m" + f + " n3072 k1024 NN x1",  // FC2
      "gemm m" + f + " n1024 k3072 NT x1",  // FC2 dgrad
      "gemm m1024 n3072 k" + f + " TN x1",  // FC2 wgrad
      "gemm m" + f + " n3072 k2048 NT x1",  // FC1 dgrad
      "gemm m3072 n2048 k" + f + " TN x1",  // FC1 wgrad
      "gemm m" + f + " n384 k3072 NT x1",   // output projection dgrad
      "gemm m384 n3072 k" + f + " TN x1",   // output projection wgrad
      "attn_bwd g4 h3 q4096 kv4096 d128",
      "gemm m" + f + " n3072 k640 NT x1",  // QKV dgrad
      "gemm m3072 n640 k" + f + " TN x1",  // QKV wgrad
      "gemm m32768 n16032 k3072 NN x1",    // logits
      "gemm m32768 n3072 k16032 NT x1",    // logits dgrad
      "gemm m3072 n16032 k32768 TN x1",    // logits wgrad
  };
  KernelShapeSet once;
  once.add("3b", llama_tp8());
  std::vector<std::string> keys;
  for (const KernelShape& s : once.shapes()) keys.push_back(s.key);
  std::vector<std::string> sorted_expected = expected;
  std::sort(keys.begin(), keys.end());
  std::sort(sorted_expected.begin(), sorted_expected.end());
  EXPECT_EQ(keys, sorted_expected);
  EXPECT_EQ(once.shapes().front().key, expected.front());  // first seen first
  EXPECT_EQ(once.shapes().front().uses.front(), "3b/fwd_attn/qkv_gemm");

  KernelShapeSet twice;
  twice.add("3b", llama_tp8());
  twice.add("again", llama_tp8());
  ASSERT_EQ(twice.shapes().size(), once.shapes().size());
  for (std::size_t i = 0; i < once.shapes().size(); ++i) {
    EXPECT_EQ(twice.shapes()[i].uses.size(), 2 * once.shapes()[i].uses.size()) << expected[i];
  }
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
