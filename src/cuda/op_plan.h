// Host-side plan of what the cuda backend runs for a partition or a segment: every compute
// kernel of the kareus::Partition mapped to a concrete operation (a cuBLASLt GEMM, an attention
// call, one of the backend's own elementwise kernels) with the byte size of each buffer it reads
// and writes, the other nano-batch's collective with its NCCL element counts, and the launch
// slot as an op index. Pure C++ without CUDA, so it is compiled and tested on machines without
// the toolkit; src/cuda/executor.cc turns a plan into launches.
//
// Shapes come from the kernel graph (include/kareus/kernel_graph.h), which knows the model;
// where a Kernel does not carry a dimension the executor needs (the hidden size of an RMSNorm,
// the batch x KV-head split of attention) it is recovered exactly from the kernel's byte counts
// and the partition's GEMM shapes, as documented at each function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/partition.h"

namespace kareus::cuda {

enum class OpType {
  kGemm,               ///< cuBLASLt, bf16 in/out, fp32 accumulation
  kAttentionForward,   ///< fused SDPA forward (cuDNN, or the labelled fallback kernel)
  kAttentionBackward,  ///< fused SDPA backward
  kRmsNorm,
  kRmsNormBackward,
  kRope,
  kSwiglu,
  kSwigluBackward,
  kAdd,         ///< residual add
  kStream,      ///< memory-bound kernel of known traffic (embedding, loss, anything unnamed)
  kCollective,  ///< a collective inside a segment (runs in order on the compute stream)
};
const char* to_string(OpType t);

/// Row-major C[m,n] = op(A) op(B) with op(A) [m,k] and op(B) [k,n]. `transa`: A is stored as
/// [k,m] (a wgrad's activations, dW = x^T dy); `transb`: B is stored as [n,k] (a dgrad's weight,
/// dx = dy W^T). Backward GEMMs run transposed like the framework's, since cuBLASLt picks
/// different kernels for NT/TN than for NN. `batch` > 1: that many independent GEMMs of this
/// shape in one strided batched cuBLASLt matmul (a mixture-of-experts layer's local experts,
/// Kernel::groups), group g's A, B and C packed one after another at g x stride_a/b/c elements.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  std::int64_t batch = 1;
  /// Row-major leading dimensions (elements per stored row) of A, B and C.
  std::int64_t lda() const { return transa ? m : k; }
  std::int64_t ldb() const { return transb ? k : n; }
  std::int64_t ldc() const { return n; }
  /// Elements from one group's matrix to the next (dense packing, whatever the transposes).
  std::int64_t stride_a() const { return m * k; }
  std::int64_t stride_b() const { return k * n; }
  std::int64_t stride_c() const { return m * n; }
  bool operator==(const GemmShape&) const = default;
  auto operator<=>(const GemmShape&) const = default;
};

/// Causal scaled-dot-product attention with grouped KV heads. `groups` folds batch x KV heads
/// (each group is independent); each group has `q_heads_per_group` query heads of `q_len` rows
/// attending `kv_len` key rows. Layout: Q, O [groups][q_heads_per_group][q_len][head_dim];
/// K, V [groups][kv_len][head_dim]; LSE [groups][q_heads_per_group][q_len] in fp32. The causal
/// mask is aligned bottom-right: query i attends keys j <= i + (kv_len - q_len).
struct AttentionShape {
  std::int64_t groups = 0;
  std::int64_t q_heads_per_group = 0;
  std::int64_t q_len = 0;
  std::int64_t kv_len = 0;
  std::int64_t head_dim = 0;
  std::int64_t q_rows() const { return groups * q_heads_per_group * q_len; }
  bool operator==(const AttentionShape&) const = default;
};

/// A collective as NCCL runs it over bf16 elements. Buffer sizes are per rank.
struct CollectiveStep {
  std::string name;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int group_size = 1;
  std::size_t payload_bytes = 0;  ///< Kernel::payload_bytes (rounded down to whole elements)
  std::size_t send_bytes = 0;     ///< AllReduce: payload; AllGather: payload / n; RS: payload;
                                  ///< AllToAll: payload
  std::size_t recv_bytes = 0;     ///< AllReduce: payload; AllGather: payload; RS: payload / n;
                                  ///< AllToAll: payload
  /// Element count argument of the NCCL call: AllReduce payload/2, AllGather sendcount,
  /// ReduceScatter recvcount, P2P the message's elements, AllToAll the elements to each peer
  /// (ncclAlltoAll's count; per ncclSend/ncclRecv pair without it).
  std::size_t nccl_count = 0;
  /// Bytes the one-GPU copy proxy moves: the payload, except for an all-to-all, where only the
  /// shards for the other n - 1 ranks leave the GPU.
  std::size_t proxy_bytes = 0;
  /// Kernel::copy_engine: NCCL may run it on the copy engines (SM count kCopyEngineSms).
  bool copy_engine = false;
};

struct OpStep {
  std::string name;  ///< the kernel's name in the kernel graph
  OpType type = OpType::kStream;
  GemmShape gemm;             ///< kGemm
  AttentionShape attn;        ///< kAttention*
  std::int64_t rows = 0;      ///< kRmsNorm*, kRope: rows x cols elements
  std::int64_t cols = 0;      ///< hidden size (RMSNorm), head dim (QK-norm, RoPE)
  std::int64_t elements = 0;  ///< kSwiglu*, kAdd, kRope, kRmsNorm*: elements of one output
  CollectiveStep collective;  ///< kCollective
  /// Bytes of every buffer the op reads and writes, in the order the executor binds them.
  std::vector<std::size_t> input_bytes;
  std::vector<std::size_t> output_bytes;
  std::size_t bytes() const;  ///< all buffers
};

struct ExecutionPlan {
  std::vector<OpStep> ops;                ///< one nano-batch's compute, in order
  std::optional<CollectiveStep> overlap;  ///< the other nano-batch's collective (partitions)
  int slot_index = 0;  ///< overlap launches right before ops[slot_index] (== ops.size(): at end)
  std::string slot;    ///< slot name
  std::size_t buffer_bytes() const;  ///< device memory one rank needs for buffers
  /// GPUs a rank set needs: the largest collective group (1 when there is none).
  int group_size() const;
};

/// Hidden size of a partition or segment's layer: recovered from its GEMMs (QKV and FC1 have
/// k = hidden, their dgrads n = hidden; the output projection and FC2 have n = hidden, their
/// dgrads k = hidden; the logits GEMM k = hidden). 0 when no GEMM names it.
std::int64_t infer_hidden(const std::vector<Kernel>& kernels);

/// Attention shape of an attention kernel. Kernel m = query rows x local heads, n = sequence
/// length, k = head dim; the K,V bytes (bytes_read minus the Q (and O, dO) bytes) give
/// batch x KV heads = kv_bytes / (2 tensors x 2 bytes x n x k); the query rows per group split
/// into q_len = n / cp for the smallest cp that divides evenly.
AttentionShape attention_shape(const Kernel& k);

CollectiveStep collective_step(const Kernel& k);

/// One op of `kernels` (the context supplies the hidden size and head dim).
OpStep plan_op(const Kernel& k, std::int64_t hidden, std::int64_t head_dim);

/// The ops of `kernels` in order (one OpStep per Kernel, the hidden size and head dim recovered
/// from the list as a whole), with no overlapping collective.
ExecutionPlan plan_kernels(const std::vector<Kernel>& kernels);
/// One GEMM or attention shape as the executor runs it, the first kernel that has it and every
/// use ("workload/partition-or-segment/kernel").
struct KernelShape {
  std::string key;  ///< e.g. "gemm m16384 n640 k3072 NN x1", "attn_fwd g4 h3 q4096 kv4096 d128"
  OpStep op;
  Kernel kernel;
  std::vector<std::string> uses;
};
std::string kernel_shape_key(const OpStep& op);  ///< GEMM and attention ops only

/// The distinct GEMM and attention shapes of workloads' partitions and segments, in first-seen
/// order: what the device check's kernel sweep times, each shape once however many partitions
/// of however many workloads run it.
class KernelShapeSet {
 public:
  void add(const std::string& workload, const PartitionSet& ps);
  const std::vector<KernelShape>& shapes() const { return shapes_; }

 private:
  void add_kernels(const std::string& use_prefix, const std::vector<Kernel>& kernels);
  std::vector<KernelShape> shapes_;
  std::map<std::string, std::size_t> index_;
};

/// The plan of a partition with its collective launched at `slot` (throws InvalidInput naming
/// the slots when `slot` is unknown).
ExecutionPlan plan_partition(const Partition& p, const std::string& slot);
/// A segment runs alone: its collectives are ops on the compute stream.
ExecutionPlan plan_segment(const Segment& s);

/// Communicators keyed by CTA count: NCCL fixes a communicator's CTAs at creation
/// (ncclConfig_t.minCTAs = maxCTAs = sms), so each SM count needs its own set, created once and
/// reused. At most `capacity` sets are kept; the least recently used is destroyed first, since
/// each set holds NCCL buffers on every GPU. Not thread-safe.
template <class Comms>
class CommCache {
 public:
  using Create = std::function<Comms(int sms)>;
  using Destroy = std::function<void(Comms&)>;
  CommCache(Create create, Destroy destroy, std::size_t capacity = 16)
      : create_(std::move(create)), destroy_(std::move(destroy)), capacity_(capacity) {}
  ~CommCache() { clear(); }
  CommCache(const CommCache&) = delete;
  CommCache& operator=(const CommCache&) = delete;

  /// The set for `sms` CTAs, created on first use. sms must be >= 1 (the copy engines' set,
  /// NCCL_CTA_POLICY_ZERO, is not cached here: it holds the registered symmetric windows).
  Comms& get(int sms);
  bool contains(int sms) const { return entries_.count(sms) > 0; }
  std::size_t size() const { return entries_.size(); }
  std::size_t created() const { return created_; }
  void clear() {
    for (auto& [sms, e] : entries_) destroy_(e.comms);
    entries_.clear();
    lru_.clear();
  }

 private:
  struct Entry {
    Comms comms;
    std::list<int>::iterator pos;
  };
  Create create_;
  Destroy destroy_;
  std::size_t capacity_;
  std::size_t created_ = 0;
  std::map<int, Entry> entries_;
  std::list<int> lru_;  ///< most recently used first
};

void check_sms(int sms);  ///< throws InvalidInput for sms < 1
/// The SM count of a plan's overlapping collective: 1 or more, or kCopyEngineSms (0: the copy
/// engines) when the collective is copy-engine capable (CollectiveStep::copy_engine); segments
/// run their collectives on SMs. Throws InvalidInput naming what is allowed.
void check_plan_sms(const ExecutionPlan& plan, int sms);

template <class Comms>
Comms& CommCache<Comms>::get(int sms) {
  check_sms(sms);
  auto it = entries_.find(sms);
  if (it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return it->second.comms;
  }
  while (capacity_ > 0 && entries_.size() >= capacity_) {
    const int victim = lru_.back();
    lru_.pop_back();
    destroy_(entries_.at(victim).comms);
    entries_.erase(victim);
  }
  Comms c = create_(sms);
  ++created_;
  lru_.push_front(sms);
  auto [ins, ok] = entries_.emplace(sms, Entry{std::move(c), lru_.begin()});
  (void)ok;
  return ins->second.comms;
}

}  // namespace kareus::cuda

namespace kareus::cuda {
/// Catalogue name (include/kareus/hw.h) of a CUDA device name such as "NVIDIA H200" or
/// "NVIDIA A100-SXM4-80GB"; empty when the card is not in the catalogue (PCIe and NVL variants
/// of the SXM parts have other clocks and power limits and are not mapped).
std::string catalogue_gpu_for_device(const std::string& device_name);

/// The supported clock of `g` nearest to `mhz` (the lower one on a tie); `mhz` when the
/// catalogue lists no clocks.
int snap_to_clock_grid(const GpuSpec& g, int mhz);
/// Grid steps between the supported clocks nearest to `a_mhz` and `b_mhz` (0: same clock). The
/// cuda backend without clock control compares a window's clock with the start-up clock by it.
int clock_grid_steps(const GpuSpec& g, int a_mhz, int b_mhz);
}  // namespace kareus::cuda
