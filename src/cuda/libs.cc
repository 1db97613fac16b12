// dlopen loader of cuBLASLt, cuDNN and NCCL (why: see libs.h). Each library is tried first at
// the path CMake found at configure time, then by soname through the dynamic linker's search
// path, so a binary built on one machine also runs where the toolkit lives elsewhere.
#include "libs.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "kareus/error.h"

#ifndef KAREUS_CUBLASLT_LIBRARY
#define KAREUS_CUBLASLT_LIBRARY "libcublasLt.so"
#endif
#ifndef KAREUS_CUDNN_LIBRARY
#define KAREUS_CUDNN_LIBRARY "libcudnn.so.9"
#endif
#ifndef KAREUS_NCCL_LIBRARY
#define KAREUS_NCCL_LIBRARY "libnccl.so.2"
#endif

namespace kareus::cuda {
namespace {

void* open_library(const std::vector<std::string>& candidates) {
  std::string errors;
  for (const auto& c : candidates) {
    if (c.empty()) continue;
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    errors += fmt::format("\n  {}: {}", c, e ? e : "unknown error");
  }
  throw NotSupported(fmt::format("cannot load a CUDA library the cuda backend needs:{}", errors));
}

template <class F>
void bind(void* lib, const char* name, F& fn) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (!sym) {
    throw NotSupported(fmt::format("CUDA library lacks symbol {} (toolkit too old?)", name));
  }
  fn = reinterpret_cast<F>(sym);
}

// A symbol newer releases have: stays nullptr when the loaded library lacks it.
template <class F>
void bind_optional(void* lib, const char* name, F& fn) {
  dlerror();
  fn = reinterpret_cast<F>(dlsym(lib, name));
}

std::string soname_of(const std::string& path, const std::string& fallback) {
  return path == fallback ? std::string() : fallback;
}

}  // namespace

const CublasLt& cublaslt() {
  static CublasLt l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h =
        open_library({KAREUS_CUBLASLT_LIBRARY,
                      soname_of(KAREUS_CUBLASLT_LIBRARY, "libcublasLt.so.13"), "libcublasLt.so"});
    bind(h, "cublasLtCreate", l.create);
    bind(h, "cublasLtDestroy", l.destroy);
    bind(h, "cublasLtGetStatusString", l.status_string);
    bind(h, "cublasLtMatmulDescCreate", l.desc_create);
    bind(h, "cublasLtMatmulDescSetAttribute", l.desc_set);
    bind(h, "cublasLtMatmulDescDestroy", l.desc_destroy);
    bind(h, "cublasLtMatrixLayoutCreate", l.layout_create);
    bind(h, "cublasLtMatrixLayoutDestroy", l.layout_destroy);
    bind(h, "cublasLtMatrixLayoutSetAttribute", l.layout_set);
    bind(h, "cublasLtMatmulPreferenceCreate", l.pref_create);
    bind(h, "cublasLtMatmulPreferenceDestroy", l.pref_destroy);
    bind(h, "cublasLtMatmulPreferenceSetAttribute", l.pref_set);
    bind(h, "cublasLtMatmulAlgoGetHeuristic", l.heuristic);
    bind(h, "cublasLtMatmul", l.matmul);
  });
  return l;
}

const Cudnn& cudnn() {
  static Cudnn l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h =
        open_library({KAREUS_CUDNN_LIBRARY, soname_of(KAREUS_CUDNN_LIBRARY, "libcudnn.so.9")});
    bind(h, "cudnnCreate", l.create);
    bind(h, "cudnnDestroy", l.destroy);
    bind(h, "cudnnSetStream", l.set_stream);
    bind(h, "cudnnGetErrorString", l.error_string);
    bind(h, "cudnnGetVersion", l.version);
    bind(h, "cudnnBackendCreateDescriptor", l.create_descriptor);
    bind(h, "cudnnBackendDestroyDescriptor", l.destroy_descriptor);
    bind(h, "cudnnBackendSetAttribute", l.set_attribute);
    bind(h, "cudnnBackendGetAttribute", l.get_attribute);
    bind(h, "cudnnBackendFinalize", l.finalize);
    bind(h, "cudnnBackendExecute", l.execute);
  });
  return l;
}

const Nccl& nccl() {
  static Nccl l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = open_library({KAREUS_NCCL_LIBRARY, soname_of(KAREUS_NCCL_LIBRARY, "libnccl.so.2")});
    bind(h, "ncclGetVersion", l.version);
    bind(h, "ncclGetUniqueId", l.unique_id);
    bind(h, "ncclCommInitRankConfig", l.init_rank_config);
    bind(h, "ncclCommDestroy", l.destroy);
    bind(h, "ncclCommAbort", l.abort);
    bind(h, "ncclGetErrorString", l.error_string);
    bind(h, "ncclGroupStart", l.group_start);
    bind(h, "ncclGroupEnd", l.group_end);
    bind(h, "ncclAllReduce", l.all_reduce);
    bind(h, "ncclAllGather", l.all_gather);
    bind(h, "ncclReduceScatter", l.reduce_scatter);
    bind(h, "ncclSend", l.send);
    bind(h, "ncclRecv", l.recv);
    bind_optional(h, "ncclAlltoAll", l.all_to_all);
    bind_optional(h, "ncclMemAlloc", l.mem_alloc);
    bind_optional(h, "ncclMemFree", l.mem_free);
    bind_optional(h, "ncclCommWindowRegister", l.window_register);
    bind_optional(h, "ncclCommWindowDeregister", l.window_deregister);
  });
  return l;
}

std::string Nccl::missing_copy_engine_symbols() const {
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  need(all_to_all != nullptr, "ncclAlltoAll");
  need(mem_alloc != nullptr, "ncclMemAlloc");
  need(mem_free != nullptr, "ncclMemFree");
  need(window_register != nullptr, "ncclCommWindowRegister");
  need(window_deregister != nullptr, "ncclCommWindowDeregister");
  return missing;
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw InternalError(
      fmt::format("{} failed: {} ({})", what, cublaslt().status_string(s), static_cast<int>(s)));
}

void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  throw InternalError(
      fmt::format("{} failed: {} ({})", what, cudnn().error_string(s), static_cast<int>(s)));
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  throw InternalError(
      fmt::format("{} failed: {} ({})", what, nccl().error_string(r), static_cast<int>(r)));
}

void check_cuda(int err, const char* what) {
  const auto e = static_cast<cudaError_t>(err);
  if (e == cudaSuccess) return;
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
      e == cudaErrorDevicesUnavailable) {
    throw NotSupported(fmt::format("no CUDA device visible ({}: {})", what, cudaGetErrorString(e)));
  }
  throw InternalError(fmt::format("{} failed: {} ({})", what, cudaGetErrorString(e), err));
}

}  // namespace kareus::cuda
