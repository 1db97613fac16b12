// Group executor of the cuda backend (see executor.h). GEMMs: cuBLASLt with bf16 operands and
// output, fp32 accumulation and the first algorithm of cublasLtMatmulAlgoGetHeuristic under a
// 32 MiB workspace, one plan per shape and device. A row-major C[m,n] = A[m,k] B[k,n] is run as
// the column-major C^T[n,m] = B^T[n,k] A^T[k,m]; backward GEMMs keep their stored transposes
// (dgrad NT, wgrad TN in row-major terms, GemmShape) so cuBLASLt picks the framework's kernels.
// NCCL in one process: communicators of all ranks are created inside one ncclGroupStart/End (NCCL's
// "one device per thread is not required" mode), and every collective call of one step is grouped
// the same way. Grouped GEMMs (a mixture-of-experts layer's local experts, GemmShape::batch > 1)
// are one strided batched cuBLASLt matmul. An all-to-all runs with ncclAlltoAll where the loaded
// NCCL has it, as one ncclSend/ncclRecv pair per peer otherwise; with 0 SMs (the copy engines) on
// communicators created with NCCL_CTA_POLICY_ZERO over buffers from ncclMemAlloc registered as
// symmetric windows (NCCL >= 2.28).
#include "executor.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "cudnn_sdpa_backend.h"
#include "kareus/error.h"
#include "kareus/instruction_settings.h"
#include "kernels.h"
#include "libs.h"

namespace kareus::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;
constexpr std::size_t kBf16 = 2;
// NCCL's version code of 2.28.0 (ncclGetVersion: major * 10000 + minor * 100 + patch).
constexpr int kNcclCopyEngineVersion = 22800;

#define KAREUS_CUDA(call) check_cuda(static_cast<int>(call), #call)

std::string format_uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct Rank {
  int device = 0;
  cudaStream_t compute = nullptr, coll = nullptr;
  cudaEvent_t slot_ev = nullptr, coll_done = nullptr, start = nullptr, stop = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::map<GemmShape, GemmPlan> gemms;
  std::vector<std::vector<void*>> in, out;  // per op
  void* coll_send = nullptr;
  void* coll_recv = nullptr;
  // The copy-engine all-to-all's buffers: ncclMemAlloc'd, registered as symmetric windows on
  // the copy-engine communicator (GroupExecutor::Impl::register_symmetric()).
  ncclWindow_t send_win = nullptr, recv_win = nullptr;
  std::vector<void*> allocations;
  void* p2p_buf = nullptr;
  cudnnHandle_t dnn = nullptr;  // created with the first fused attention on this device
  std::unique_ptr<sdpa::FusedAttention> sdpa;
};

void* device_alloc(Rank& r, std::size_t bytes) {
  void* p = nullptr;
  const std::size_t n = std::max<std::size_t>(bytes, 16);
  const cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    throw InternalError(fmt::format("cudaMalloc of {:.1f} MiB on GPU {} failed: {}",
                                    static_cast<double>(n) / (1 << 20), r.device,
                                    cudaGetErrorString(e)));
  }
  r.allocations.push_back(p);
  return p;
}

using Comms = std::vector<ncclComm_t>;

}  // namespace

int visible_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls report their own
    throw NotSupported(fmt::format(
        "backend 'cuda': no CUDA device visible (cudaGetDeviceCount: {})", cudaGetErrorString(e)));
  }
  if (n <= 0) throw NotSupported("backend 'cuda': no CUDA device visible (0 devices)");
  return n;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp p{};
  KAREUS_CUDA(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.uuid = format_uuid(p.uuid);
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.memory_bytes = p.totalGlobalMem;
  return d;
}

int cuda_runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

int cuda_driver_version() {
  int v = 0;
  cudaDriverGetVersion(&v);
  return v;
}

struct GroupExecutor::Impl {
  std::vector<Rank> ranks;
  std::vector<int> device_list;
  std::unique_ptr<CommCache<Comms>> comms;
  // The copy engines' communicators (NCCL_CTA_POLICY_ZERO), created on first use; kept out of
  // the cache since the symmetric windows registered on them must go before they do.
  Comms ce_comms;
  bool symmetric = false;  // coll_send/coll_recv are registered symmetric windows on ce_comms
  ExecutionPlan plan;
  std::string plan_key;
  int sms = 0;
  bool proxy = false;
  int* host_flag = nullptr;  // mapped pinned memory for the one-GPU blocked receive
  float* sink = nullptr;

  explicit Impl(std::vector<int> devices) {
    if (devices.empty()) throw InvalidInput("cuda backend: no devices given");
    const int visible = visible_device_count();
    for (int d : devices) {
      if (d < 0 || d >= visible) {
        throw InvalidInput(fmt::format("--devices: GPU {} does not exist ({} visible: 0..{})", d,
                                       visible, visible - 1));
      }
    }
    device_list = devices;
    ranks.resize(devices.size());
    for (std::size_t i = 0; i < devices.size(); ++i) {
      Rank& r = ranks[i];
      r.device = devices[i];
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
      KAREUS_CUDA(cudaStreamCreateWithFlags(&r.coll, cudaStreamNonBlocking));
      KAREUS_CUDA(cudaEventCreateWithFlags(&r.slot_ev, cudaEventDisableTiming));
      KAREUS_CUDA(cudaEventCreateWithFlags(&r.coll_done, cudaEventDisableTiming));
      KAREUS_CUDA(cudaEventCreate(&r.start));
      KAREUS_CUDA(cudaEventCreate(&r.stop));
      KAREUS_CUDA(cudaMalloc(&r.workspace, kWorkspaceBytes));
      check_cublas(cublaslt().create(&r.lt), "cublasLtCreate");
    }
    comms = std::make_unique<CommCache<Comms>>([this](int n_ctas) { return create_comms(n_ctas); },
                                               [this](Comms& c) { destroy_comms(c); });
  }

  // ncclCommDestroy waits for the communicator's operations; a receive whose send can no longer
  // be posted would make it hang, ncclCommAbort does not wait.
  void destroy_comms(Comms& c) const {
    for (auto comm : c) abort_comms ? nccl().abort(comm) : nccl().destroy(comm);
    c.clear();
  }

  // An exception between begin_blocked_receive() and end_blocked_receive() leaves receives in
  // flight; devices are synchronised only after they are released (or their communicators
  // aborted), and communicators destroyed only after the devices are idle.
  ~Impl() {
    if (blocked) {
      try {
        release_blocked();
      } catch (...) {
        abort_comms = true;
      }
    }
    if (abort_comms) {
      try {
        comms.reset();
        destroy_comms(ce_comms);
      } catch (...) {
      }
    }
    for (auto& r : ranks) {
      cudaSetDevice(r.device);
      cudaDeviceSynchronize();
    }
    try {
      release_symmetric();
    } catch (...) {
    }
    try {
      comms.reset();
      destroy_comms(ce_comms);
    } catch (...) {
    }
    for (auto& r : ranks) {
      cudaSetDevice(r.device);
      free_buffers(r);
      r.sdpa.reset();
      if (r.dnn) cudnn().destroy(r.dnn);
      for (auto& [shape, g] : r.gemms) destroy_gemm(g);
      if (r.lt) cublaslt().destroy(r.lt);
      cudaFree(r.workspace);
      cudaEventDestroy(r.slot_ev);
      cudaEventDestroy(r.coll_done);
      cudaEventDestroy(r.start);
      cudaEventDestroy(r.stop);
      cudaStreamDestroy(r.compute);
      cudaStreamDestroy(r.coll);
    }
    if (host_flag) cudaFreeHost(host_flag);
  }

  static void destroy_gemm(GemmPlan& g) {
    const auto& lt = cublaslt();
    if (g.a) lt.layout_destroy(g.a);
    if (g.b) lt.layout_destroy(g.b);
    if (g.c) lt.layout_destroy(g.c);
    if (g.desc) lt.desc_destroy(g.desc);
  }

  static void free_buffers(Rank& r) {
    for (void* p : r.allocations) cudaFree(p);
    r.allocations.clear();
    r.in.clear();
    r.out.clear();
    r.coll_send = r.coll_recv = r.p2p_buf = nullptr;
  }

  // One communicator per rank; kCopyEngineSms: NCCL's zero-CTA policy (the copy engines)
  // instead of a fixed CTA count.
  Comms create_comms(int n_ctas) {
    const auto& n = nccl();
    ncclUniqueId id;
    check_nccl(n.unique_id(&id), "ncclGetUniqueId");
    Comms c(ranks.size(), nullptr);
    check_nccl(n.group_start(), "ncclGroupStart");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      KAREUS_CUDA(cudaSetDevice(ranks[i].device));
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      if (n_ctas == kCopyEngineSms) {
        cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
      } else {
        cfg.minCTAs = n_ctas;
        cfg.maxCTAs = n_ctas;
      }
      check_nccl(
          n.init_rank_config(&c[i], static_cast<int>(ranks.size()), id, static_cast<int>(i), &cfg),
          "ncclCommInitRankConfig");
    }
    check_nccl(n.group_end(), "ncclGroupEnd (communicator creation)");
    return c;
  }

  Comms& copy_engine_comms() {
    if (ce_comms.empty()) ce_comms = create_comms(kCopyEngineSms);
    return ce_comms;
  }

  // The communicators a collective runs on with the prepared SM count.
  Comms& comms_for_sms() { return sms == kCopyEngineSms ? copy_engine_comms() : comms->get(sms); }

  // SM count 0 runs the all-to-all on the copy engines: NCCL >= 2.28 with its symmetric-memory
  // API. Refused before anything is allocated when the loaded library is older.
  static void check_copy_engine_support(const CollectiveStep& c) {
    const auto& n = nccl();
    int version = 0;
    check_nccl(n.version(&version), "ncclGetVersion");
    const std::string missing = n.missing_copy_engine_symbols();
    if (version >= kNcclCopyEngineVersion && missing.empty()) return;
    throw InvalidInput(fmt::format(
        "cuda backend: '{}' with 0 SMs runs on the copy engines (NCCL_CTA_POLICY_ZERO on symmetric "
        "windows), which needs NCCL >= 2.28; the loaded NCCL is version code {}{}",
        c.name, version, missing.empty() ? "" : " and lacks " + missing));
  }

  // The copy-engine all-to-all's buffers: every rank's from ncclMemAlloc, registered as
  // symmetric windows (ncclCommWindowRegister is collective: all ranks in one group).
  void register_symmetric(const CollectiveStep& c, std::uint64_t& seed) {
    const auto& n = nccl();
    Comms& cs = copy_engine_comms();
    symmetric = true;  // release_symmetric() frees whatever gets allocated here
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      check_nccl(n.mem_alloc(&r.coll_send, c.send_bytes), "ncclMemAlloc");
      check_nccl(n.mem_alloc(&r.coll_recv, c.recv_bytes), "ncclMemAlloc");
      fill_random(r.coll_send, c.send_bytes, seed++, r.compute);
    }
    check_nccl(n.group_start(), "ncclGroupStart");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      check_nccl(
          n.window_register(cs[i], r.coll_send, c.send_bytes, &r.send_win, NCCL_WIN_COLL_SYMMETRIC),
          "ncclCommWindowRegister (send)");
      check_nccl(
          n.window_register(cs[i], r.coll_recv, c.recv_bytes, &r.recv_win, NCCL_WIN_COLL_SYMMETRIC),
          "ncclCommWindowRegister (receive)");
    }
    check_nccl(n.group_end(), "ncclGroupEnd (window registration)");
  }

  // Deregisters the symmetric windows (collective, like the registration) and frees their
  // memory; the devices must be idle.
  void release_symmetric() {
    if (!symmetric) return;
    symmetric = false;
    const auto& n = nccl();
    bool registered = false;
    for (const auto& r : ranks) registered = registered || r.send_win || r.recv_win;
    if (registered && !ce_comms.empty()) {
      check_nccl(n.group_start(), "ncclGroupStart");
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        Rank& r = ranks[i];
        if (r.send_win) check_nccl(n.window_deregister(ce_comms[i], r.send_win), "deregister");
        if (r.recv_win) check_nccl(n.window_deregister(ce_comms[i], r.recv_win), "deregister");
        r.send_win = r.recv_win = nullptr;
      }
      check_nccl(n.group_end(), "ncclGroupEnd (window deregistration)");
    }
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      if (r.coll_send) n.mem_free(r.coll_send);
      if (r.coll_recv) n.mem_free(r.coll_recv);
      r.coll_send = r.coll_recv = nullptr;
    }
  }

  // The collective is replaced by a copy of its proxy bytes (one rank, or asked for).
  bool copies() const { return proxy || ranks.size() == 1; }

  const GemmPlan& gemm_plan(Rank& r, const GemmShape& s) {
    auto it = r.gemms.find(s);
    if (it != r.gemms.end()) return it->second;
    const auto& lt = cublaslt();
    GemmPlan g;
    const auto m = static_cast<std::uint64_t>(s.m), n = static_cast<std::uint64_t>(s.n),
               k = static_cast<std::uint64_t>(s.k);
    check_cublas(lt.desc_create(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate");
    // Column-major view of the row-major product: C^T[n,m] = op(B)^T op(A)^T, so cuBLASLt's
    // "A" is the row-major B buffer and its "B" the row-major A buffer. A row-major buffer of
    // r rows and c columns is the column-major c x r matrix with leading dimension c; a stored
    // transpose becomes op = T on that view.
    const cublasOperation_t op_a = s.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = s.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_cublas(lt.desc_set(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(lt.desc_set(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
    check_cublas(s.transb ? lt.layout_create(&g.a, CUDA_R_16BF, k, n, s.ldb())
                          : lt.layout_create(&g.a, CUDA_R_16BF, n, k, s.ldb()),
                 "cublasLtMatrixLayoutCreate");
    check_cublas(s.transa ? lt.layout_create(&g.b, CUDA_R_16BF, m, k, s.lda())
                          : lt.layout_create(&g.b, CUDA_R_16BF, k, m, s.lda()),
                 "cublasLtMatrixLayoutCreate");
    check_cublas(lt.layout_create(&g.c, CUDA_R_16BF, n, m, s.ldc()), "cublasLtMatrixLayoutCreate");
    if (s.batch > 1) {
      // The local experts: one strided batched matmul; cuBLASLt's "A" is the row-major B.
      const auto count = static_cast<std::int32_t>(s.batch);
      const std::pair<cublasLtMatrixLayout_t, std::int64_t> strides[] = {
          {g.a, s.stride_b()}, {g.b, s.stride_a()}, {g.c, s.stride_c()}};
      for (const auto& [layout, stride] : strides) {
        check_cublas(
            lt.layout_set(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        check_cublas(lt.layout_set(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                   sizeof(stride)),
                     "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = kWorkspaceBytes;
    check_cublas(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                 "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        lt.heuristic(r.lt, g.desc, g.a, g.b, g.c, g.c, pref, 1, &result, &found);
    lt.pref_destroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      destroy_gemm(g);
      throw InternalError(
          fmt::format("cuBLASLt has no algorithm for a bf16 GEMM m={} n={} k={} transa={} "
                      "transb={} batch={} on GPU {} ({})",
                      s.m, s.n, s.k, s.transa, s.transb, s.batch, r.device, lt.status_string(st)));
    }
    g.algo = result.algo;
    return r.gemms.emplace(s, g).first->second;
  }

  static std::string key_of(const ExecutionPlan& p, bool proxy) {
    std::string k = proxy ? "proxy;" : "nccl;";
    for (const auto& op : p.ops) {
      k += op.name + ":";
      for (auto b : op.input_bytes) k += std::to_string(b) + ",";
      for (auto b : op.output_bytes) k += std::to_string(b) + ",";
      k += ";";
    }
    if (p.overlap) k += fmt::format("coll:{}:{}", p.overlap->send_bytes, p.overlap->recv_bytes);
    return k;
  }

  void prepare(const ExecutionPlan& p, int n_ctas, bool use_proxy) {
    check_plan_sms(p, n_ctas);
    const int group = p.group_size();
    if (!use_proxy && group != static_cast<int>(ranks.size())) {
      throw InternalError(
          fmt::format("plan needs {} GPUs, executor drives {}", group, ranks.size()));
    }
    const bool copy = use_proxy || ranks.size() == 1;
    // 0 SMs over NCCL: the copy engines, on symmetric windows.
    const bool sym = n_ctas == kCopyEngineSms && !copy;
    if (sym) check_copy_engine_support(*p.overlap);
    const std::string key = key_of(p, use_proxy) + (sym ? ";symmetric" : "");
    plan = p;
    sms = n_ctas;
    proxy = use_proxy;
    if (key != plan_key) {
      plan_key.clear();
      std::uint64_t seed = 1;
      for (auto& r : ranks) {
        KAREUS_CUDA(cudaSetDevice(r.device));
        KAREUS_CUDA(cudaDeviceSynchronize());
      }
      release_symmetric();
      for (auto& r : ranks) {
        KAREUS_CUDA(cudaSetDevice(r.device));
        free_buffers(r);
        for (const auto& op : p.ops) {
          std::vector<void*> in, out;
          if (op.type == OpType::kCollective && copy) {
            // The proxy copies the payload whatever the collective's shard sizes.
            in.push_back(device_alloc(r, op.collective.proxy_bytes));
            fill_random(in.back(), op.collective.proxy_bytes, seed++, r.compute);
            out.push_back(device_alloc(r, op.collective.proxy_bytes));
            r.in.push_back(std::move(in));
            r.out.push_back(std::move(out));
            continue;
          }
          for (auto b : op.input_bytes) {
            in.push_back(device_alloc(r, b));
            fill_random(in.back(), b, seed++, r.compute);
          }
          for (auto b : op.output_bytes) out.push_back(device_alloc(r, b));
          r.in.push_back(std::move(in));
          r.out.push_back(std::move(out));
        }
        if (p.overlap && !sym) {
          const auto& c = *p.overlap;
          const std::size_t send = copy ? c.proxy_bytes : c.send_bytes;
          const std::size_t recv = copy ? c.proxy_bytes : c.recv_bytes;
          r.coll_send = device_alloc(r, send);
          fill_random(r.coll_send, send, seed++, r.compute);
          r.coll_recv = device_alloc(r, recv);
        }
      }
      if (sym) register_symmetric(*p.overlap, seed);
      for (auto& r : ranks) {
        KAREUS_CUDA(cudaSetDevice(r.device));
        KAREUS_CUDA(cudaStreamSynchronize(r.compute));
      }
      plan_key = key;
    }
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      for (const auto& op : p.ops) {
        if (op.type == OpType::kGemm) gemm_plan(r, op.gemm);
        // Attention graphs are built here, outside the timed window; a failure switches the
        // process to the fallback kernel before anything is measured.
        if (is_attention(op.type)) {
          if (sdpa::FusedAttention* f = fused_attention(r)) {
            if (auto e = f->prepare(op.attn, direction(op.type))) {
              sdpa::attention_path().fail(*e, op.attn, direction(op.type));
            }
          }
        }
      }
    }
    if (!copy) comms_for_sms();
  }

  void enqueue_collective(const CollectiveStep& c, const void* const* send, void* const* recv,
                          bool on_coll_stream) {
    if (copies()) {
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        Rank& r = ranks[i];
        KAREUS_CUDA(cudaSetDevice(r.device));
        cudaStream_t s = on_coll_stream ? r.coll : r.compute;
        if (sms == kCopyEngineSms) {
          copy_on_copy_engines(send[i], recv[i], c.proxy_bytes, s);
        } else {
          copy_on_ctas(send[i], recv[i], c.proxy_bytes, sms, s);
        }
      }
      return;
    }
    const auto& n = nccl();
    Comms& cs = comms_for_sms();
    check_nccl(n.group_start(), "ncclGroupStart");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      cudaStream_t s = on_coll_stream ? r.coll : r.compute;
      const int peer = static_cast<int>(i ^ 1u);
      switch (c.kind) {
        case CollectiveKind::kAllReduce:
          check_nccl(n.all_reduce(send[i], recv[i], c.nccl_count, ncclBfloat16, ncclSum, cs[i], s),
                     "ncclAllReduce");
          break;
        case CollectiveKind::kAllGather:
          check_nccl(n.all_gather(send[i], recv[i], c.nccl_count, ncclBfloat16, cs[i], s),
                     "ncclAllGather");
          break;
        case CollectiveKind::kReduceScatter:
          check_nccl(
              n.reduce_scatter(send[i], recv[i], c.nccl_count, ncclBfloat16, ncclSum, cs[i], s),
              "ncclReduceScatter");
          break;
        case CollectiveKind::kAllToAll:
          enqueue_all_to_all(c, send[i], recv[i], cs[i], s);
          break;
        case CollectiveKind::kP2P:
          // Pairs (0,1), (2,3): the even rank sends, the odd rank receives.
          if (peer < static_cast<int>(ranks.size())) {
            if (i % 2 == 0) {
              check_nccl(n.send(send[i], c.nccl_count, ncclBfloat16, peer, cs[i], s), "ncclSend");
            } else {
              check_nccl(n.recv(recv[i], c.nccl_count, ncclBfloat16, peer, cs[i], s), "ncclRecv");
            }
          }
          break;
      }
    }
    check_nccl(n.group_end(), "ncclGroupEnd");
  }

  // Equal splits: nccl_count elements to and from every rank, peer j's at j x count. Inside the
  // caller's ncclGroupStart/End.
  static void enqueue_all_to_all(const CollectiveStep& c, const void* send, void* recv,
                                 ncclComm_t comm, cudaStream_t s) {
    const auto& n = nccl();
    if (n.all_to_all) {
      check_nccl(n.all_to_all(send, recv, c.nccl_count, ncclBfloat16, comm, s), "ncclAlltoAll");
      return;
    }
    const std::size_t shard = c.nccl_count * kBf16;
    for (int peer = 0; peer < c.group_size; ++peer) {
      const auto off = static_cast<std::size_t>(peer) * shard;
      check_nccl(
          n.send(static_cast<const char*>(send) + off, c.nccl_count, ncclBfloat16, peer, comm, s),
          "ncclSend (all-to-all)");
      check_nccl(n.recv(static_cast<char*>(recv) + off, c.nccl_count, ncclBfloat16, peer, comm, s),
                 "ncclRecv (all-to-all)");
    }
  }

  void enqueue_op(Rank& r, std::size_t i) {
    const OpStep& op = plan.ops[i];
    const auto& in = r.in[i];
    const auto& out = r.out[i];
    cudaStream_t s = r.compute;
    switch (op.type) {
      case OpType::kGemm: {
        const GemmPlan& g = gemm_plan(r, op.gemm);
        const float alpha = 1.f, beta = 0.f;
        // Column-major view: "A" is the row-major B buffer, "B" the row-major A buffer.
        check_cublas(cublaslt().matmul(r.lt, g.desc, &alpha, in[1], g.a, in[0], g.b, &beta, out[0],
                                       g.c, out[0], g.c, &g.algo, r.workspace, kWorkspaceBytes, s),
                     "cublasLtMatmul");
        break;
      }
      case OpType::kAttentionForward:
        if (run_fused(r, op, in, out, s)) break;
        attention_forward_fallback(in[0], in[1], in[2], out[0], static_cast<float*>(out[1]),
                                   op.attn.groups, op.attn.q_heads_per_group, op.attn.q_len,
                                   op.attn.kv_len, op.attn.head_dim, s);
        break;
      case OpType::kAttentionBackward:
        if (run_fused(r, op, in, out, s)) break;
        attention_backward_fallback(
            in[0], in[1], in[2], in[3], in[4], static_cast<const float*>(in[5]), out[0], out[1],
            out[2], static_cast<float*>(out[3]), op.attn.groups, op.attn.q_heads_per_group,
            op.attn.q_len, op.attn.kv_len, op.attn.head_dim, s);
        break;
      case OpType::kRmsNorm:
        rmsnorm_forward(in[0], in[1], out[0], op.rows, op.cols, s);
        break;
      case OpType::kRmsNormBackward:
        rmsnorm_backward(in[0], in[1], in[2], out[0], op.rows, op.cols, s);
        break;
      case OpType::kRope:
        rope(in[0], out[0], op.rows, op.cols, s);
        break;
      case OpType::kSwiglu:
        swiglu_forward(in[0], in[1], out[0], op.elements, s);
        break;
      case OpType::kSwigluBackward:
        swiglu_backward(in[0], in[1], in[2], out[0], out[1], op.elements, s);
        break;
      case OpType::kAdd:
        residual_add(in[0], in[1], out[0], op.elements, s);
        break;
      case OpType::kStream:
        stream_bytes(in[0], op.input_bytes[0], out[0], op.output_bytes[0], s);
        break;
      case OpType::kCollective:
        throw InternalError("collective op enqueued as compute");
    }
  }

  static bool is_attention(OpType t) {
    return t == OpType::kAttentionForward || t == OpType::kAttentionBackward;
  }
  static sdpa::Direction direction(OpType t) {
    return t == OpType::kAttentionForward ? sdpa::Direction::kForward : sdpa::Direction::kBackward;
  }

  // cuDNN's fused attention of the current device, or nullptr once the process runs the
  // fallback kernel (sdpa::attention_path()). The caller has set r.device.
  sdpa::FusedAttention* fused_attention(Rank& r) {
    sdpa::AttentionPath& path = sdpa::attention_path();
    if (!path.fused()) return nullptr;
    if (r.sdpa) return r.sdpa.get();
    const AttentionShape none{};
    try {
      const Cudnn& api = cudnn();
      const cudnnStatus_t st = api.create(&r.dnn);
      if (st != CUDNN_STATUS_SUCCESS) {
        r.dnn = nullptr;
        path.fail({"cudnnCreate", static_cast<int>(st), api.error_string(st)}, none,
                  sdpa::Direction::kForward);
        return nullptr;
      }
      r.sdpa = std::make_unique<sdpa::FusedAttention>(
          api, r.dnn,
          [](std::size_t bytes) -> void* {
            void* p = nullptr;
            return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
          },
          [](void* p) { cudaFree(p); });
    } catch (const NotSupported& e) {
      path.fail({"load libcudnn", 0, e.what()}, none, sdpa::Direction::kForward);
      return nullptr;
    }
    return r.sdpa.get();
  }

  // Enqueues the op on cuDNN's fused attention; false (nothing enqueued) when the fallback
  // kernel must run instead.
  bool run_fused(Rank& r, const OpStep& op, const std::vector<void*>& in,
                 const std::vector<void*>& out, cudaStream_t s) {
    return sdpa::enqueue_fused(fused_attention(r), direction(op.type), op.attn, in, out, s);
  }

  void launch_overlap() {
    std::vector<const void*> send;
    std::vector<void*> recv;
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaEventRecord(r.slot_ev, r.compute));
      KAREUS_CUDA(cudaStreamWaitEvent(r.coll, r.slot_ev, 0));
      send.push_back(r.coll_send);
      recv.push_back(r.coll_recv);
    }
    enqueue_collective(*plan.overlap, send.data(), recv.data(), true);
  }

  void enqueue_iteration() {
    const std::size_t n_ops = plan.ops.size();
    for (std::size_t i = 0; i < n_ops; ++i) {
      if (plan.overlap && static_cast<std::size_t>(plan.slot_index) == i) launch_overlap();
      if (plan.ops[i].type == OpType::kCollective) {
        std::vector<const void*> send;
        std::vector<void*> recv;
        for (auto& r : ranks) {
          send.push_back(r.in[i][0]);
          recv.push_back(r.out[i][0]);
        }
        enqueue_collective(plan.ops[i].collective, send.data(), recv.data(), false);
        continue;
      }
      for (auto& r : ranks) {
        KAREUS_CUDA(cudaSetDevice(r.device));
        enqueue_op(r, i);
      }
    }
    if (plan.overlap && static_cast<std::size_t>(plan.slot_index) >= n_ops) launch_overlap();
    if (plan.overlap) {
      for (auto& r : ranks) {
        KAREUS_CUDA(cudaSetDevice(r.device));
        KAREUS_CUDA(cudaEventRecord(r.coll_done, r.coll));
        KAREUS_CUDA(cudaStreamWaitEvent(r.compute, r.coll_done, 0));
      }
    }
  }

  double run(int iterations) {
    if (plan_key.empty()) throw InternalError("GroupExecutor::run before prepare");
    if (iterations < 1) throw InternalError("GroupExecutor::run needs >= 1 iteration");
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaEventRecord(r.start, r.compute));
    }
    for (int it = 0; it < iterations; ++it) enqueue_iteration();
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaEventRecord(r.stop, r.compute));
    }
    double max_s = 0;
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaEventSynchronize(r.stop));
      float ms = 0;
      KAREUS_CUDA(cudaEventElapsedTime(&ms, r.start, r.stop));
      max_s = std::max(max_s, static_cast<double>(ms) / 1e3);
    }
    return max_s;
  }

  double host_enqueue_s(int iterations) {
    if (plan_key.empty()) throw InternalError("GroupExecutor::host_enqueue_s before prepare");
    if (iterations < 1) throw InternalError("GroupExecutor::host_enqueue_s needs >= 1 iteration");
    wait();
    const auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; ++it) enqueue_iteration();
    const std::chrono::duration<double> host = std::chrono::steady_clock::now() - start;
    wait();
    return host.count() / iterations;
  }

  void wait() {
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      KAREUS_CUDA(cudaDeviceSynchronize());
    }
  }

  void start_busy(double seconds) {
    Rank& r = ranks[0];
    KAREUS_CUDA(cudaSetDevice(r.device));
    if (!sink) KAREUS_CUDA(cudaMalloc(&sink, sizeof(float)));
    const DeviceInfo d = device_info(r.device);
    // Calibrate once: time a short burst, then scale it to the requested length.
    const std::int64_t probe = 200;
    KAREUS_CUDA(cudaEventRecord(r.start, r.compute));
    busy(d.sm_count, probe, sink, r.compute);
    KAREUS_CUDA(cudaEventRecord(r.stop, r.compute));
    KAREUS_CUDA(cudaEventSynchronize(r.stop));
    float ms = 0;
    KAREUS_CUDA(cudaEventElapsedTime(&ms, r.start, r.stop));
    const double per_iter_s = std::max(1e-9, static_cast<double>(ms) / 1e3 / probe);
    const auto iters = static_cast<std::int64_t>(std::clamp(seconds / per_iter_s, 1.0, 1e12));
    busy(d.sm_count, iters, sink, r.compute);
  }

  // P2P buffers for the blocked receive: one small message per receiving rank.
  static constexpr std::size_t kRecvElements = 1 << 20;

  void begin_blocked_receive() {
    if (ranks.size() == 1) {
      if (!host_flag) {
        KAREUS_CUDA(
            cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int), cudaHostAllocMapped));
      }
      *reinterpret_cast<volatile int*>(host_flag) = 0;
      int* dev_flag = nullptr;
      KAREUS_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flag), host_flag, 0));
      KAREUS_CUDA(cudaSetDevice(ranks[0].device));
      spin_until(dev_flag, ranks[0].compute);
      blocked = true;
      return;
    }
    const auto& n = nccl();
    sms = std::max(sms, 1);
    for (auto& r : ranks) {
      KAREUS_CUDA(cudaSetDevice(r.device));
      if (!r.p2p_buf) r.p2p_buf = device_alloc(r, kRecvElements * 2);
    }
    blocked_ctas = sms;
    sends_round(true);
    wait();
    Comms& cs = comms->get(blocked_ctas);
    check_nccl(n.group_start(), "ncclGroupStart");
    for (std::size_t i = 1; i < ranks.size(); ++i) {
      check_nccl(n.recv(ranks[i].p2p_buf, kRecvElements, ncclBfloat16, 0, cs[i], ranks[i].coll),
                 "ncclRecv");
    }
    const ncclResult_t end = n.group_end();
    if (end != ncclSuccess) {
      // Some receives may be in flight with no way to know which: sends could hang on them.
      abort_comms = true;
      check_nccl(end, "ncclGroupEnd (blocked receive)");
    }
    blocked = true;
  }

  // Rank 0's sends to every other rank, with the matching receives when `with_recv`. The
  // communicators are looked up by CTA count on every call rather than held by reference: a
  // reference into the cache would dangle once the cache evicts the entry.
  void sends_round(bool with_recv) {
    const auto& n = nccl();
    Comms& cs = comms->get(blocked_ctas);
    check_nccl(n.group_start(), "ncclGroupStart");
    for (std::size_t i = 1; i < ranks.size(); ++i) {
      check_nccl(n.send(ranks[0].p2p_buf, kRecvElements, ncclBfloat16, static_cast<int>(i), cs[0],
                        ranks[0].coll),
                 "ncclSend");
      if (with_recv) {
        check_nccl(n.recv(ranks[i].p2p_buf, kRecvElements, ncclBfloat16, 0, cs[i], ranks[i].coll),
                   "ncclRecv");
      }
    }
    check_nccl(n.group_end(), "ncclGroupEnd");
  }

  bool blocked = false;      // receives (or the one-GPU spin) posted and not yet released
  bool abort_comms = false;  // release failed: communicators are aborted, not destroyed
  int blocked_ctas = 0;      // CTA count of the communicators the blocked receive runs on

  // Posts the sends (or sets the spin flag) that end the blocked receive; does not wait.
  void release_blocked() {
    if (!blocked) return;
    blocked = false;
    if (ranks.size() == 1) {
      *reinterpret_cast<volatile int*>(host_flag) = 1;
    } else {
      sends_round(false);
    }
  }

  void end_blocked_receive() {
    try {
      release_blocked();
    } catch (...) {
      abort_comms = true;  // the receives stay in flight: ~Impl must not wait for them
      throw;
    }
    wait();
  }
};

GroupExecutor::GroupExecutor(std::vector<int> devices)
    : impl_(std::make_unique<Impl>(std::move(devices))) {}
GroupExecutor::~GroupExecutor() = default;
int GroupExecutor::ranks() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& GroupExecutor::devices() const { return impl_->device_list; }
void GroupExecutor::prepare(const ExecutionPlan& plan, int sms, bool proxy) {
  impl_->prepare(plan, sms, proxy);
}
double GroupExecutor::run(int iterations) { return impl_->run(iterations); }
double GroupExecutor::host_enqueue_s(int iterations) { return impl_->host_enqueue_s(iterations); }
std::string GroupExecutor::attention_backend() const { return sdpa::attention_path().backend(); }
bool GroupExecutor::proxy() const { return impl_->copies(); }
void GroupExecutor::start_busy(double seconds) { impl_->start_busy(seconds); }
void GroupExecutor::begin_blocked_receive() { impl_->begin_blocked_receive(); }
void GroupExecutor::end_blocked_receive() { impl_->end_blocked_receive(); }
std::vector<int> GroupExecutor::blocked_ranks() const {
  std::vector<int> r;
  if (impl_->ranks.size() == 1) return {0};
  for (int i = 1; i < static_cast<int>(impl_->ranks.size()); ++i) r.push_back(i);
  return r;
}
void GroupExecutor::wait() { impl_->wait(); }

}  // namespace kareus::cuda
