// The CUDA libraries the cuda backend calls besides the runtime: cuBLASLt, cuDNN and NCCL,
// loaded with dlopen on first use instead of linked. Linking them costs every `kareus` process
// about 0.3 s at start-up (cuBLASLt alone is 540 MB with 366k relocations; measured on the build
// machine), which every CLI call and every test process would pay even when no GPU is involved.
// Loading is lazy and happens only when the cuda backend runs on a device. Types come from the
// toolkit's own headers (decltype of the declared functions), so a signature mismatch is a
// compile error. The CUDA runtime itself is linked statically (cudart_static; it needs no driver
// to load).
#pragma once

#include <cublasLt.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

namespace kareus::cuda {

struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

struct Cudnn {
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetVersion) version;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
};

struct Nccl {
  decltype(&ncclGetVersion) version;
  decltype(&ncclGetUniqueId) unique_id;
  decltype(&ncclCommInitRankConfig) init_rank_config;
  decltype(&ncclCommDestroy) destroy;
  decltype(&ncclCommAbort) abort;
  decltype(&ncclGetErrorString) error_string;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclReduceScatter) reduce_scatter;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  // NCCL >= 2.28 (the headers are; the loaded library may be older): nullptr when absent.
  // Without ncclAlltoAll an all-to-all runs as grouped ncclSend/ncclRecv; the copy-engine
  // path (NCCL_CTA_POLICY_ZERO) needs all of them (missing_copy_engine_symbols()).
  decltype(&ncclAlltoAll) all_to_all = nullptr;
  decltype(&ncclMemAlloc) mem_alloc = nullptr;
  decltype(&ncclMemFree) mem_free = nullptr;
  decltype(&ncclCommWindowRegister) window_register = nullptr;
  decltype(&ncclCommWindowDeregister) window_deregister = nullptr;
  /// The names of the symbols above that the loaded library lacks, comma-separated ("" if none).
  std::string missing_copy_engine_symbols() const;
};

/// Loaded once per process; throws NotSupported naming the library and dlerror() when a library
/// or symbol is missing. Thread-safe.
const CublasLt& cublaslt();
const Cudnn& cudnn();
const Nccl& nccl();

/// Throws InternalError with the call, the code and the library's message on failure.
void check_cublas(cublasStatus_t s, const char* what);
void check_cudnn(cudnnStatus_t s, const char* what);
void check_nccl(ncclResult_t r, const char* what);
/// CUDA runtime: cudaErrorNoDevice / cudaErrorInsufficientDriver become NotSupported
/// ("no CUDA device visible"), everything else InternalError.
void check_cuda(int err, const char* what);

}  // namespace kareus::cuda
