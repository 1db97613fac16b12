// The cuda backend's own kernels (kernels.cu): the small layers of a Llama/Qwen block that are
// not GEMMs (RMSNorm, RoPE, SwiGLU, residual add), a memory stream of known traffic, the proxy
// of a collective (a device-to-device copy on a fixed number of CTAs), a simple attention used
// only when cuDNN's fused attention cannot be built, and helpers. Buffers are bf16 unless named
// otherwise; every launcher is asynchronous on `stream` and throws InternalError on a launch
// error. Values are meaningless: the kernels exist to do the real work of the real shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kareus::cuda {

/// Fills `bytes` with pseudo-random bf16 values in [-1, 1) (zeros would under-state power:
/// switching activity depends on the data).
void fill_random(void* p, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);

void residual_add(const void* a, const void* b, void* out, std::int64_t n, cudaStream_t stream);
void rmsnorm_forward(const void* x, const void* w, void* y, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream);
void rmsnorm_backward(const void* x, const void* dy, const void* w, void* dx, std::int64_t rows,
                      std::int64_t cols, cudaStream_t stream);
/// Rotates pairs (i, i + cols/2) of every row of `cols` (the head dim) elements.
void rope(const void* x, void* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream);
void swiglu_forward(const void* gate, const void* up, void* out, std::int64_t n,
                    cudaStream_t stream);
void swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                     std::int64_t n, cudaStream_t stream);
/// Reads `in_bytes` and writes `out_bytes` (either may be 0).
void stream_bytes(const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes,
                  cudaStream_t stream);
/// The collective proxy: copies `bytes` with exactly `ctas` thread blocks (one per SM, as NCCL
/// runs one CTA per channel).
void copy_on_ctas(const void* src, void* dst, std::size_t bytes, int ctas, cudaStream_t stream);
/// The proxy of a collective on the copy engines (SM count 0): a device-to-device copy of
/// `bytes` with cudaMemcpyBatchAsync's hint to keep it off the SMs
/// (cudaMemcpyFlagPreferOverlapWithCompute), cudaMemcpyAsync where the driver refuses the batch.
void copy_on_copy_engines(const void* src, void* dst, std::size_t bytes, cudaStream_t stream);

/// Fallback attention (one warp per query row, online softmax); layouts as AttentionShape in
/// op_plan.h. Head dim must be a multiple of 32 and at most 256.
void attention_forward_fallback(const void* q, const void* k, const void* v, void* o, float* lse,
                                std::int64_t groups, std::int64_t q_heads, std::int64_t q_len,
                                std::int64_t kv_len, std::int64_t head_dim, cudaStream_t stream);
/// Writes dQ and the row sums D = rowsum(dO * O), then dK, dV (one warp per key row).
void attention_backward_fallback(const void* q, const void* k, const void* v, const void* o,
                                 const void* d_o, const float* lse, void* dq, void* dk, void* dv,
                                 float* row_sums, std::int64_t groups, std::int64_t q_heads,
                                 std::int64_t q_len, std::int64_t kv_len, std::int64_t head_dim,
                                 cudaStream_t stream);

/// Keeps every SM busy with FMAs for about `iterations` x 1k cycles (to read the loaded clock).
void busy(int sms, std::int64_t iterations, float* sink, cudaStream_t stream);
/// One CTA spins until *flag (host-mapped) becomes non-zero: a blocked receive on one GPU.
void spin_until(const volatile int* flag, cudaStream_t stream);

}  // namespace kareus::cuda
