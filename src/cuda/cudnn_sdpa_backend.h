// cuDNN fused attention through the cuDNN 9 backend API: turns the graph descriptions of
// cudnn_sdpa.h into tensor and operation descriptors, an operation graph, engine configurations
// from the heuristics (mode A), an execution plan and, per call, a variant pack of device
// pointers keyed by uid. The cuDNN functions come as a table (libs.h's Cudnn, the dlopen'ed
// library in the executor, a fake in the tests) so that every step can be exercised and made to
// fail without a GPU.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "cudnn_sdpa.h"
#include "libs.h"

namespace kareus::cuda::sdpa {

/// Graphs built once per (direction, shape) and reused. Each plan owns its workspace and, for
/// the backward, its float dQ accumulator. Not thread-safe; one per device (its handle).
class FusedAttention {
 public:
  /// Device memory; Alloc returns nullptr when it cannot allocate.
  using Alloc = std::function<void*(std::size_t bytes)>;
  using Release = std::function<void(void*)>;
  /// `handle` belongs to the caller and must outlive this object.
  FusedAttention(const Cudnn& api, cudnnHandle_t handle, Alloc alloc, Release release);
  ~FusedAttention();
  FusedAttention(const FusedAttention&) = delete;
  FusedAttention& operator=(const FusedAttention&) = delete;

  /// Builds and finalizes the plan of (shape, direction) unless cached; the failing step and
  /// cuDNN's status otherwise (nothing is cached then).
  std::optional<StepError> prepare(const AttentionShape& s, Direction d);
  /// Enqueues on `stream` (cudnnSetStream). Layouts and buffer order as the executor's
  /// attention ops (op_plan.cc): forward Q, K, V -> O, LSE; backward Q, K, V, O, dO, LSE ->
  /// dQ, dK, dV, row sums rowsum(dO * O).
  std::optional<StepError> forward(const AttentionShape& s, const void* q, const void* k,
                                   const void* v, void* o, void* lse, cudaStream_t stream);
  std::optional<StepError> backward(const AttentionShape& s, const void* q, const void* k,
                                    const void* v, const void* o, const void* d_o, const void* lse,
                                    void* dq, void* dk, void* dv, void* row_sums,
                                    cudaStream_t stream);

  std::size_t cached_plans() const { return plans_.size(); }
  /// cuDNN's global index of the engine the plan runs (-1 when not built or not reported).
  std::int64_t engine_index(const AttentionShape& s, Direction d) const;
  std::size_t workspace_bytes(const AttentionShape& s, Direction d) const;

 private:
  struct Plan;
  using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  static Key key(const AttentionShape& s, Direction d);
  std::optional<StepError> run(const AttentionShape& s, Direction d,
                               const std::map<std::int64_t, void*>& buffers, cudaStream_t stream);

  const Cudnn& api_;
  cudnnHandle_t handle_;
  Alloc alloc_;
  Release release_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

/// The executor's decision for one attention op: enqueues it on `f` (nullptr: cuDNN not
/// available) while attention_path() is fused and returns true; returns false when the caller
/// must run the fallback kernel instead, recording a failure of `f` in attention_path() (which
/// warns once and stays on the fallback). Buffers in the executor's order (op_plan.cc):
/// forward in = {Q, K, V}, out = {O, LSE}; backward in = {Q, K, V, O, dO, LSE},
/// out = {dQ, dK, dV, row sums}.
bool enqueue_fused(FusedAttention* f, Direction d, const AttentionShape& s,
                   const std::vector<void*>& in, const std::vector<void*>& out,
                   cudaStream_t stream);

/// Builds the forward and backward graphs of a small causal GQA shape (and one with
/// q_len < kv_len) on `device` with the real library, before anything is measured, so that a
/// failure switches attention_path() to the fallback before the profiler's fingerprint is read.
/// Returns whether the fused path is still on.
bool probe_fused_attention(int device);

/// Fused vs fallback on one shape, on a GPU: both run forward and backward on the same
/// pseudo-random bf16 inputs (the backward of both from the fused O and LSE); the largest
/// absolute differences of every output, and the largest magnitude of each fused output for
/// scale. `error` is set (and the numbers are 0) when anything failed.
struct CrossCheck {
  std::string error;
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0, row_sums = 0;        ///< max |fused - fallback|
  double o_max = 0, lse_max = 0, dq_max = 0, dk_max = 0, dv_max = 0;  ///< max |fused|
  /// Every difference within 2% of the output's largest magnitude (bf16 has 8 mantissa bits).
  bool agree() const;
};
CrossCheck cross_check_fused_attention(int device, const AttentionShape& s);

}  // namespace kareus::cuda::sdpa
