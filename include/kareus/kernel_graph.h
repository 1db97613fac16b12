// The kernel graph of a workload: for every pipeline stage, the forward and backward instruction
// of one micro-batch as an ordered list of kernels per nano-batch, each with its FLOPs and HBM
// traffic, and every collective with its payload and group. Everything downstream (partitions,
// emulator, composition) reads shapes from here, so there is one place that knows the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kareus/schedule.h"
#include "kareus/workload.h"

namespace kareus {

enum class OpKind { kGemm, kAttention, kNorm, kElementwise, kEmbedding, kLoss, kCollective };
enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kP2P, kAllToAll };
/// kEp: the expert-parallel group of a mixture-of-experts layer (token dispatch and combine);
/// kExpertDp: the ranks that hold the same experts (their gradients are reduced there).
enum class CommGroup { kTp, kCp, kPp, kDp, kEmbedding, kEp, kExpertDp };

const char* to_string(OpKind k);
const char* to_string(CollectiveKind k);
const char* short_name(CollectiveKind k);  ///< "ar", "ag", "rs", "p2p", "a2a"
const char* to_string(CommGroup g);

/// One kernel on one GPU. Sizes are per GPU (after tensor/context sharding).
struct Kernel {
  std::string name;
  OpKind kind = OpKind::kElementwise;
  double flops = 0;        ///< arithmetic the kernel performs
  double model_flops = 0;  ///< its share of the model-FLOPs formula (GEMMs and attention only)
  double bytes_read = 0;   ///< HBM bytes read
  double bytes_written = 0;
  /// GEMM shape (C[m,n] = A[m,k] B[k,n]); attention uses m = query rows x local heads, n = key
  /// rows, k = head dim.
  std::int64_t m = 0, n = 0, k = 0;
  /// Independent GEMMs of this shape run as one grouped kernel (a mixture-of-experts layer's
  /// local experts, m rows each); 1 for a plain GEMM.
  int groups = 1;
  /// Attention only: the keys are processed in this many kernel calls of n / kv_calls keys each
  /// (context parallelism's ring: one call per CP step); 1 otherwise.
  int kv_calls = 1;

  // Collectives only.
  CollectiveKind collective = CollectiveKind::kAllReduce;
  CommGroup group = CommGroup::kTp;
  int group_size = 1;
  double payload_bytes = 0;  ///< size of the full buffer (AllReduce buffer, AllGather output,
                             ///< ReduceScatter input, P2P message)
  bool inter_node = false;   ///< the group spans nodes
  /// Ranks of the group inside one node (all of them when !inter_node): an all-to-all sends
  /// (group_size - node_ranks) / group_size of its buffer over the network.
  int node_ranks = 1;
  /// The collective may run on the copy engines with no SMs (NCCL >= 2.28's
  /// NCCL_CTA_POLICY_ZERO on symmetric memory): an all-to-all inside one NVLink domain.
  bool copy_engine = false;

  bool is_collective() const { return kind == OpKind::kCollective; }
  double bytes() const { return bytes_read + bytes_written; }
  /// Bytes each GPU sends over its links (ring algorithms): AllReduce 2(n-1)/n, AllGather and
  /// ReduceScatter (n-1)/n, P2P the whole message; AllToAll (n-1)/n inside a node and the share
  /// for ranks on other nodes, (n - node_ranks)/n, when the group spans nodes (the network is
  /// the bottleneck; the NVLink share runs at the same time).
  double wire_bytes() const;
};

/// A launch point of the other nano-batch's collective: before compute op `op_index`.
struct Slot {
  std::string name;
  int op_index = 0;
};

/// Contiguous compute of one nano-batch between two collectives, and the collective after it.
struct Block {
  std::string name;  ///< "attn", "mlp" (TP); "qkv", "ao", "o", "a" (CP); ...
  InstructionKind direction = InstructionKind::kForward;  ///< recomputed blocks are kForward
  bool recompute = false;
  std::vector<Kernel> ops;
  std::vector<Slot> slots;
  Kernel collective;
  /// What the communication stream runs after `collective`, in order: small kernels (no tensor
  /// cores) and further collectives. Under sequence parallelism a layer's norm sits between a
  /// ReduceScatter and an AllGather with nothing else to hide behind them; it runs here, so one
  /// nano-batch's ReduceScatter, norm and AllGather overlap the other's GEMMs as one chain (as
  /// the AllReduce they replace would). See fold_small_blocks in kernel_graph.cc.
  std::vector<Kernel> comm_tail;
};

struct InstructionGraph {
  int stage = 0;
  InstructionKind kind = InstructionKind::kForward;
  int nano_batches = 2;
  std::vector<Kernel> prologue;  ///< whole micro-batch, before the layer stack
  std::vector<Block> blocks;     ///< one nano-batch's layer stack, in execution order
  std::vector<Kernel> epilogue;  ///< whole micro-batch, after the layer stack
};

/// Data-parallel communication of one model chunk under a distributed optimizer (ZeRO-1, as
/// Megatron-LM's --use-distributed-optimizer): the gradients are reduce-scattered in fp32 and
/// the updated bf16 parameters all-gathered, in buckets of `bucket_params` parameters.
struct DpComm {
  Kernel grad_reduce_scatter;  ///< the chunk's whole gradient buffer
  Kernel param_all_gather;     ///< the chunk's whole parameter buffer
  double params = 0;           ///< parameters of the chunk on one GPU
  double bucket_params = 0;    ///< Megatron-LM's bucket size
  /// With overlap (Workload ParallelConfig::overlap_dp_comm) the reduce-scatter of each bucket
  /// runs under the rest of the chunk's last backward and the all-gather ahead of its first
  /// forward; without, both run after the stage's last instruction (in per_iteration).
  bool overlapped = true;
};

struct StageGraph {
  int stage = 0;
  int layers = 0;
  InstructionGraph forward;
  InstructionGraph backward;
  std::optional<DpComm> dp;  ///< with parallel.dp > 1
  /// Once per iteration, after the stage's last instruction: tied-embedding reductions, and
  /// the DP collectives when they do not overlap.
  std::vector<Kernel> per_iteration;
};

struct KernelGraph {
  std::vector<StageGraph> stages;
  Kernel p2p;  ///< activation (forward) or gradient (backward) message between adjacent stages
  double model_flops_per_iteration = 0;     ///< whole job, without recompute (routed experts:
                                            ///< the top-k experts each token runs)
  double hardware_flops_per_iteration = 0;  ///< whole job, with the recomputed forward
};

/// Builds the kernel graph. With batch.nano_batches == 1 the blocks carry whole micro-batches.
KernelGraph build_kernel_graph(const Workload& w);

}  // namespace kareus
