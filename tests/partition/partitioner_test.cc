#include <gtest/gtest.h>

#include <set>

#include "kareus/error.h"
#include "kareus/partition.h"
#include "test_util.h"

namespace kareus {
namespace {

std::set<std::string> keys(const PartitionSet& ps) {
  std::set<std::string> k;
  for (const auto& p : ps.partitions) k.insert(p.key);
  return k;
}

TEST(Partitioner, TpWorkloadsHaveExactlyFourKeys) {
  for (const char* name : {"llama3.2-3b_tp8_mbs8_seq4096", "qwen3-1.7b_tp8_mbs16_seq4096",
                           "llama3.3-70b_tp8_mbs4_seq4096"}) {
    const auto ps = partition_workload(load_workload(test::paper_workload(name)));
    EXPECT_EQ(keys(ps), (std::set<std::string>{"fwd_attn", "fwd_mlp", "bwd_attn", "bwd_mlp"}))
        << name;
  }
}

TEST(Partitioner, CpWorkloadsHaveTheArtifactsTwelveKeys) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096")));
  EXPECT_EQ(keys(ps), (std::set<std::string>{"fwd_qkv_ar", "fwd_qkv_ag", "fwd_ao_ag", "fwd_ao_ar",
                                             "fwd_mlp", "bwd_qkv_ar", "bwd_qkv_rs", "bwd_a_rs",
                                             "bwd_a_ag", "bwd_o_ag", "bwd_o_ar", "bwd_mlp"}));
}

TEST(Partitioner, RepeatCountsByHand) {
  // Stage with L layers, 2 blocks per layer and nano-batch: the forward interleaves 4L compute
  // blocks; the first runs alone, so 4L-1 partitions: fwd_attn 2L-1, fwd_mlp 2L.
  // Backward (recompute + backward): 8L blocks, 8L-1 partitions; the stack starts with the last
  // layer's recomputed attention, so recomputed fwd_attn 2L-1, fwd_mlp 2L, bwd_mlp 2L, bwd_attn 2L.
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  auto count = [&](const std::string& key, int stage, InstructionKind kind) {
    for (const auto& o : ps.partition(key).occurrences) {
      if (o.stage == stage && o.instruction == kind) return o.count;
    }
    return 0;
  };
  const auto F = InstructionKind::kForward, B = InstructionKind::kBackward;
  EXPECT_EQ(count("fwd_attn", 0, F), 29);
  EXPECT_EQ(count("fwd_mlp", 0, F), 30);
  EXPECT_EQ(count("fwd_attn", 1, F), 25);
  EXPECT_EQ(count("fwd_attn", 0, B), 29);
  EXPECT_EQ(count("fwd_mlp", 0, B), 30);
  EXPECT_EQ(count("bwd_mlp", 0, B), 30);
  EXPECT_EQ(count("bwd_attn", 0, B), 30);
  EXPECT_EQ(ps.partition("fwd_attn").repeats(), 29 + 25 + 29 + 25);
  // Steps of stage 0 forward: embedding, stack head, 59 partitions, stack tail.
  const auto& is = ps.instruction(0, F);
  EXPECT_EQ(is.steps.size(), 1u + 1 + 59 + 1);
  // Last stage forward ends with the output layer; backward starts with its gradient.
  const auto& last_b = ps.instruction(1, B);
  EXPECT_EQ(ps.segments[static_cast<std::size_t>(last_b.steps.front().index)].name,
            "output_layer_bwd");
}

TEST(Partitioner, LaunchSlotsFollowTheArtifact) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096")));
  EXPECT_EQ(ps.partition("fwd_attn").slot_names(),
            (std::vector<std::string>{"norm", "qkv", "rope", "attn"}));
  EXPECT_EQ(ps.partition("fwd_mlp").slot_names(),
            (std::vector<std::string>{"norm", "linear", "activation"}));
  EXPECT_EQ(ps.partition("bwd_attn").slot_names(),
            (std::vector<std::string>{"norm", "linear", "attn", "rope"}));
  EXPECT_EQ(ps.partition("bwd_mlp").slot_names(),
            (std::vector<std::string>{"norm", "linear", "activation"}));
  // The first slot launches the collective at the partition start.
  for (const auto& p : ps.partitions) EXPECT_EQ(p.slots.front().op_index, 0) << p.key;
  // Qwen3's QK-norm sits between the QKV GEMM and RoPE.
  const auto& ops = ps.partition("fwd_attn").compute_ops;
  EXPECT_EQ(ops[3].name, "qk_norm");
  EXPECT_EQ(ps.partition("fwd_attn").slot("rope").op_index, 4);
  EXPECT_THROW(ps.partition("fwd_attn").slot("fc1"), InvalidInput);
  EXPECT_THROW(ps.partition("fwd_ffn"), InvalidInput);
}

TEST(Partitioner, PartitionPairsComputeWithOtherNanoBatchCollective) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  const auto& p = ps.partition("fwd_mlp");
  EXPECT_EQ(p.collective.collective, CollectiveKind::kAllReduce);
  EXPECT_DOUBLE_EQ(p.collective.payload_bytes, 16384.0 * 3072 * 2);
  // Signatures are stable and distinct.
  EXPECT_EQ(p.signature.size(), 16u);
  EXPECT_NE(p.signature, ps.partition("fwd_attn").signature);
  const auto again =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  EXPECT_EQ(again.partition("fwd_mlp").signature, p.signature);
  // A different shape gives a different signature.
  const auto other =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs16_seq4096")));
  EXPECT_NE(other.partition("fwd_mlp").signature, p.signature);
}

TEST(Partitioner, WithoutNanoBatchesEverythingIsASegment) {
  auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  w.batch.nano_batches = 1;
  const auto ps = partition_workload(w);
  EXPECT_TRUE(ps.partitions.empty());
  int stacks = 0;
  for (const auto& s : ps.segments) stacks += s.name == "layer_stack";
  EXPECT_EQ(stacks, 4);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// Stage 0's forward layer stack run without nano-batches: one nano-batch's kernels in order.
std::vector<Kernel> sequential_forward_stack(Workload w) {
  w.batch.nano_batches = 1;
  const auto ps = partition_workload(w);
  const auto& stack = ps.segments[static_cast<std::size_t>(
      ps.instruction(0, InstructionKind::kForward).steps[1].index)];
  EXPECT_EQ(stack.name, "layer_stack");
  return stack.kernels;
}

bool tensor_core_work(const std::vector<Kernel>& ops) {
  for (const auto& k : ops) {
    if (k.kind == OpKind::kGemm || k.kind == OpKind::kAttention) return true;
  }
  return false;
}

// Sequence parallelism: the norms between a ReduceScatter and an AllGather run on the
// communication stream, so every partition but the stack's first overlaps GEMMs with a chain
// RS -> residual add + norm -> AG (the AllReduce it replaces, in two halves).
TEST(Partitioner, SequenceParallelNormsRideTheCommunicationChain) {
  const Workload w =
      load_workload(test::source_path("workloads/examples/llama3.2-3b_h100_tp4_sp_dp2.yaml"));
  const auto ps = partition_workload(w);
  int small = 0;
  for (const auto& p : ps.partitions) {
    if (!tensor_core_work(p.compute_ops)) {
      ++small;
      EXPECT_EQ(p.key, "fwd_attn_norm");
      continue;
    }
    if (p.comm_tail.empty()) continue;
    // RS, then residual add and norm on the shard, then AG, all on the TP group.
    EXPECT_EQ(p.collective.collective, CollectiveKind::kReduceScatter) << p.key;
    ASSERT_EQ(p.comm_tail.size(), 3u) << p.key;
    EXPECT_FALSE(p.comm_tail[0].is_collective());
    EXPECT_FALSE(p.comm_tail[1].is_collective());
    // The residual add and the norm (forward), or the norm's backward and the residual gradient.
    EXPECT_TRUE(p.comm_tail[0].kind == OpKind::kNorm || p.comm_tail[1].kind == OpKind::kNorm)
        << p.key;
    EXPECT_EQ(p.comm_tail[2].collective, CollectiveKind::kAllGather) << p.key;
    EXPECT_EQ(p.comm_tail[2].group_size, 4);
    EXPECT_EQ(p.chain_name(), "rs_ag");
    // The norm runs on the sequence shard: tokens / tp rows of hidden elements, bf16.
    const double shard = 4.0 * 4096 / 4 * 3072;  // micro-batch 8 / 2 nano-batches, TP4
    if (p.comm_tail[1].name == "rmsnorm") {
      EXPECT_NEAR(p.comm_tail[1].bytes_read, shard * 2, 1) << p.key;
    }
  }
  EXPECT_EQ(small, 1);  // only the first block of a stack: nothing precedes it
  // 16 partitions per layer before (8 of them a norm against a 100 MB collective), 10 now.
  EXPECT_EQ(ps.partitions.size(), 10u);
  for (const char* k : {"fwd_attn_rs_ag", "fwd_mlp_rs_ag", "bwd_attn_rs_ag", "bwd_mlp_gemm"}) {
    EXPECT_EQ(keys(ps).count(k), 1u) << k;
  }
  // One nano-batch's kernels in order are the same as without nano-batches: the sequential
  // instruction holds the same kernel names as the blocks, collectives and tails in order.
  const std::vector<Kernel> stack = sequential_forward_stack(w);
  // Per layer: residual add, norm, AG, QKV, RoPE, attention, out proj, RS (attention half) and
  // residual add, norm, AG, FC1, SwiGLU, FC2, RS (MLP half): 15 kernels.
  ASSERT_EQ(stack.size(), 15u * 14);
  EXPECT_EQ(stack[0].name, "residual_add");
  EXPECT_EQ(stack[2].name, "tp_allgather");
  EXPECT_EQ(stack[7].name, "tp_reducescatter");
  EXPECT_EQ(stack[8].name, "residual_add");
}

// Context and sequence parallelism together: the forward gathers K,V over the CP group (it used
// to be lost under SP) besides the TP AllGather and ReduceScatter.
TEST(Partitioner, ContextWithSequenceParallelGathersKv) {
  Workload w = load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"));
  w.parallel.sequence_parallel = true;
  const auto ps = partition_workload(w);
  int cp_ag_fwd = 0, cp_rs_bwd = 0;
  for (const auto& p : ps.partitions) {
    auto count = [&](const Kernel& k) {
      if (k.group != CommGroup::kCp) return;
      if (p.direction == InstructionKind::kForward && k.collective == CollectiveKind::kAllGather)
        ++cp_ag_fwd;
      if (k.collective == CollectiveKind::kReduceScatter) ++cp_rs_bwd;
    };
    count(p.collective);
    for (const auto& k : p.comm_tail) count(k);
  }
  EXPECT_GT(cp_ag_fwd, 0);
  EXPECT_GT(cp_rs_bwd, 0);
  // The forward's first kernels per layer: residual add, norm, TP AG, QKV, (QK-norm), RoPE,
  // then the CP AllGather of K,V.
  const std::vector<Kernel> stack = sequential_forward_stack(w);
  ASSERT_GE(stack.size(), 7u);
  std::vector<std::string> first;
  for (std::size_t i = 0; i < 7; ++i) first.push_back(stack[i].name);
  EXPECT_EQ(first, (std::vector<std::string>{"residual_add", "rmsnorm", "tp_allgather", "qkv_gemm",
                                             "qk_norm", "rope", "cp_allgather_kv"}));
}

}  // namespace
}  // namespace kareus
