// cuDNN backend-API realisation of the SDPA graphs (see cudnn_sdpa_backend.h). The sequence of
// calls follows cuDNN 9's documented backend flow (and cudnn-frontend's graph build, which
// TransformerEngine uses): every tensor descriptor finalized, every operation descriptor
// finalized, the operation graph, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR in mode A and its engine
// configurations tried in order until an execution plan finalizes, the plan's workspace size,
// then per call a variant pack (uids, device pointers, host pointers for by-value scalars,
// workspace) executed on the handle's stream. Each failing call is reported as a StepError.
#include "cudnn_sdpa_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kareus/error.h"
#include "kernels.h"

namespace kareus::cuda::sdpa {

namespace {

cudnnDataType_t cudnn_type(DataType t) {
  switch (t) {
    case DataType::kBf16:
      return CUDNN_DATA_BFLOAT16;
    case DataType::kFloat:
      return CUDNN_DATA_FLOAT;
    case DataType::kInt32:
      return CUDNN_DATA_INT32;
    case DataType::kBool:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t cudnn_mode(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
      return CUDNN_POINTWISE_ADD;
    case PointwiseMode::kSub:
      return CUDNN_POINTWISE_SUB;
    case PointwiseMode::kMul:
      return CUDNN_POINTWISE_MUL;
    case PointwiseMode::kDiv:
      return CUDNN_POINTWISE_DIV;
    case PointwiseMode::kExp:
      return CUDNN_POINTWISE_EXP;
    case PointwiseMode::kLog:
      return CUDNN_POINTWISE_LOG;
    case PointwiseMode::kIdentity:
      return CUDNN_POINTWISE_IDENTITY;
    case PointwiseMode::kGenIndex:
      return CUDNN_POINTWISE_GEN_INDEX;
    case PointwiseMode::kCmpGe:
      return CUDNN_POINTWISE_CMP_GE;
    case PointwiseMode::kBinarySelect:
      return CUDNN_POINTWISE_BINARY_SELECT;
  }
  return CUDNN_POINTWISE_IDENTITY;
}

bool is_binary(PointwiseMode m) {
  return m == PointwiseMode::kAdd || m == PointwiseMode::kSub || m == PointwiseMode::kMul ||
         m == PointwiseMode::kDiv || m == PointwiseMode::kCmpGe ||
         m == PointwiseMode::kBinarySelect;
}

// Raised inside a build and turned into a StepError at its boundary.
struct StepFailure {
  StepError error;
};

}  // namespace

struct FusedAttention::Plan {
  const Cudnn* api = nullptr;
  Release release;
  Graph graph;
  std::vector<cudnnBackendDescriptor_t> owned;  // destroyed in reverse creation order
  std::map<std::int64_t, cudnnBackendDescriptor_t> tensors;
  cudnnBackendDescriptor_t plan = nullptr;
  std::int64_t workspace_bytes = 0;
  std::int64_t engine_index = -1;
  void* workspace = nullptr;
  void* dq_accum = nullptr;
  // Host copies of the by-value scalars, 8 bytes each, for the variant pack.
  std::map<std::int64_t, std::uint64_t> scalars;

  ~Plan() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) api->destroy_descriptor(*it);
    if (release) {
      if (workspace) release(workspace);
      if (dq_accum) release(dq_accum);
    }
  }

  void check(cudnnStatus_t st, const std::string& step) const {
    if (st == CUDNN_STATUS_SUCCESS) return;
    const char* text = api->error_string ? api->error_string(st) : nullptr;
    throw StepFailure{{step, static_cast<int>(st), text ? text : "unknown cuDNN status"}};
  }
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const std::string& what) {
    cudnnBackendDescriptor_t d = nullptr;
    check(api->create_descriptor(type, &d), what + " create");
    owned.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, std::int64_t count, const void* value,
           const std::string& what) {
    check(api->set_attribute(d, name, type, count, value), what + " set attribute");
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendDescriptor_t value, const std::string& what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void finalize(cudnnBackendDescriptor_t d, const std::string& what) {
    check(api->finalize(d), what + " finalize");
  }
  cudnnBackendDescriptor_t tensor(std::int64_t uid) const { return tensors.at(uid); }

  void build_tensor(const Tensor& t) {
    const std::string what = "tensor descriptor '" + t.name + "'";
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const cudnnDataType_t dt = cudnn_type(t.type);
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, what);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(t.dims.size()),
        t.dims.data(), what);
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(t.strides.size()),
        t.strides.data(), what);
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, what);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &t.alignment, what);
    if (t.is_virtual) {
      const bool yes = true;
      set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    }
    if (t.by_value) {
      const bool yes = true;
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
      std::uint64_t bits = 0;
      if (t.type == DataType::kInt32) {
        const auto v = static_cast<std::int32_t>(t.value);
        std::memcpy(&bits, &v, sizeof(v));
      } else {
        const auto v = static_cast<float>(t.value);
        std::memcpy(&bits, &v, sizeof(v));
      }
      scalars[t.uid] = bits;
    }
    finalize(d, what);
    tensors[t.uid] = d;
  }

  cudnnBackendDescriptor_t build_op(const Op& op, int version) {
    const std::string what = fmt::format("{} '{}'", to_string(op.kind), op.name);
    const cudnnDataType_t compute = cudnn_type(op.compute);
    switch (op.kind) {
      case OpKind::kMatmul: {
        cudnnBackendDescriptor_t m = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what + " descriptor");
        set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
        finalize(m, what + " descriptor");
        cudnnBackendDescriptor_t o = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
        set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(op.x), what);
        set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(op.b), what);
        set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(op.y), what);
        set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, what);
        finalize(o, what);
        return o;
      }
      case OpKind::kPointwise: {
        cudnnBackendDescriptor_t p =
            create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what + " descriptor");
        const cudnnPointwiseMode_t mode = cudnn_mode(op.pointwise);
        set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
        set(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
        if (op.pointwise == PointwiseMode::kGenIndex) {
          set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op.axis, what);
        }
        finalize(p, what + " descriptor");
        cudnnBackendDescriptor_t o = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
        set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p, what);
        set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(op.x), what);
        set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(op.y), what);
        if (is_binary(op.pointwise)) {
          set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(op.b), what);
        }
        if (op.pointwise == PointwiseMode::kBinarySelect) {
          set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(op.t), what);
        }
        const float one = 1.f;
        set(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
        set(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
        finalize(o, what);
        return o;
      }
      case OpKind::kReduction: {
        cudnnBackendDescriptor_t r =
            create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what + " descriptor");
        set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
        const cudnnReduceTensorOp_t red =
            op.reduction == ReductionMode::kMax ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
        set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red, what);
        if (version >= 91100) {  // the attribute exists from cuDNN 9.11 on
          const bool deterministic = false;
          set(r, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic,
              what);
        }
        finalize(r, what + " descriptor");
        cudnnBackendDescriptor_t o = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
        set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, what);
        set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(op.x), what);
        set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(op.y), what);
        finalize(o, what);
        return o;
      }
      case OpKind::kReshape: {
        cudnnBackendDescriptor_t o = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
        set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(op.x), what);
        set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(op.y), what);
        finalize(o, what);
        return o;
      }
    }
    throw StepFailure{{what, 0, "unknown operation kind"}};
  }

  void build(cudnnHandle_t handle, const Alloc& alloc) {
    const cudnnBackendDescriptor_t og = build_operation_graph(handle);
    const std::vector<cudnnBackendDescriptor_t> configs = engine_configs(og);
    // The heuristics rank configurations; the first whose plan finalizes runs (as
    // cudnn-frontend's HEURISTICS_CHOICE policy does).
    StepError last{"execution plan finalize", 0, ""};
    for (std::size_t i = 0; i < configs.size() && !plan; ++i) {
      cudnnBackendDescriptor_t p =
          create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
      set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "execution plan");
      set_desc(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "execution plan");
      const cudnnStatus_t st = api->finalize(p);
      if (st == CUDNN_STATUS_SUCCESS) {
        plan = p;
        engine_index = query_engine_index(configs[i]);
      } else {
        const char* text = api->error_string ? api->error_string(st) : nullptr;
        last = {fmt::format("execution plan finalize ({} engine configs tried)", i + 1),
                static_cast<int>(st), text ? text : "unknown cuDNN status"};
      }
    }
    if (!plan) throw StepFailure{last};
    allocate_buffers(alloc);
  }

  // The tensors and operations of `graph` as a finalized cuDNN operation graph.
  cudnnBackendDescriptor_t build_operation_graph(cudnnHandle_t handle) {
    const int version = static_cast<int>(api->version ? api->version() : 0);
    for (const auto& t : graph.tensors) build_tensor(t);
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const auto& op : graph.ops) ops.push_back(build_op(op, version));
    cudnnBackendDescriptor_t og =
        create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<std::int64_t>(ops.size()), ops.data(), "operation graph");
    // The handle is optional from cuDNN 9.8 on (cudnn-frontend sets it only when it has one);
    // without it the graph can be finalized on a machine without a GPU.
    if (handle) {
      set(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
    }
    finalize(og, "operation graph");
    return og;
  }

  // The engine configurations heuristics mode A proposes for the graph, best first.
  std::vector<cudnnBackendDescriptor_t> engine_configs(cudnnBackendDescriptor_t og) {
    cudnnBackendDescriptor_t heur =
        create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og, "engine heuristics");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "engine heuristics");
    finalize(heur, "engine heuristics");
    std::int64_t count = 0;
    check(api->get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                             &count, nullptr),
          "engine heuristics result count");
    if (count <= 0) {
      throw StepFailure{{"engine heuristics", static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED),
                         "no engine supports the graph"}};
    }
    std::vector<cudnnBackendDescriptor_t> configs;
    for (std::int64_t i = 0; i < count; ++i) {
      configs.push_back(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    }
    std::int64_t returned = 0;
    check(api->get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             count, &returned, configs.data()),
          "engine heuristics results");
    if (returned <= 0) {
      throw StepFailure{{"engine heuristics", static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED),
                         "no engine configuration returned"}};
    }
    configs.resize(static_cast<std::size_t>(std::min(returned, count)));
    return configs;
  }

  // The plan's workspace and, for the backward graph, the float dQ accumulator.
  void allocate_buffers(const Alloc& alloc) {
    check(api->get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                             nullptr, &workspace_bytes),
          "execution plan workspace size");
    if (workspace_bytes > 0) {
      workspace = alloc(static_cast<std::size_t>(workspace_bytes));
      if (!workspace) {
        throw StepFailure{{fmt::format("workspace allocation ({} bytes)", workspace_bytes), 0,
                           "device memory allocation failed"}};
      }
    }
    if (const std::size_t b = graph.dq_accum_bytes(); b > 0) {
      dq_accum = alloc(b);
      if (!dq_accum) {
        throw StepFailure{{fmt::format("dQ accumulator allocation ({} bytes)", b), 0,
                           "device memory allocation failed"}};
      }
    }
  }

  // Best effort: the engine's global index, for the logs and the device check.
  std::int64_t query_engine_index(cudnnBackendDescriptor_t config) {
    cudnnBackendDescriptor_t engine = nullptr;
    if (api->create_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) {
      return -1;
    }
    owned.push_back(engine);
    std::int64_t n = 0, index = -1;
    if (api->get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                           &n, &engine) != CUDNN_STATUS_SUCCESS) {
      return -1;
    }
    if (api->get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                           &index) != CUDNN_STATUS_SUCCESS) {
      return -1;
    }
    return index;
  }
};

FusedAttention::FusedAttention(const Cudnn& api, cudnnHandle_t handle, Alloc alloc, Release release)
    : api_(api), handle_(handle), alloc_(std::move(alloc)), release_(std::move(release)) {}

FusedAttention::~FusedAttention() = default;

FusedAttention::Key FusedAttention::key(const AttentionShape& s, Direction d) {
  return {static_cast<int>(d), s.groups, s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim};
}

std::optional<StepError> FusedAttention::prepare(const AttentionShape& s, Direction d) {
  const Key k = key(s, d);
  if (plans_.count(k)) return std::nullopt;
  const std::string why = unsupported_reason(s);
  if (!why.empty()) return StepError{"shape check", 0, why};
  auto p = std::make_unique<Plan>();
  p->api = &api_;
  p->release = release_;
  p->graph = d == Direction::kForward ? forward_graph(s) : backward_graph(s);
  try {
    p->build(handle_, alloc_);
  } catch (const StepFailure& f) {
    return f.error;
  }
  plans_.emplace(k, std::move(p));
  return std::nullopt;
}

std::optional<StepError> FusedAttention::run(const AttentionShape& s, Direction d,
                                             const std::map<std::int64_t, void*>& buffers,
                                             cudaStream_t stream) {
  if (auto e = prepare(s, d)) return e;
  Plan& p = *plans_.at(key(s, d));
  std::vector<std::int64_t> uids;
  std::vector<void*> ptrs;
  for (std::int64_t u : p.graph.buffer_uids()) {
    void* ptr = nullptr;
    if (u == uid::kDQAccum) {
      ptr = p.dq_accum;
    } else if (auto it = buffers.find(u); it != buffers.end()) {
      ptr = it->second;
    }
    if (!ptr) return StepError{fmt::format("variant pack (no buffer for uid {})", u), 0, ""};
    uids.push_back(u);
    ptrs.push_back(ptr);
  }
  for (auto& [u, bits] : p.scalars) {
    uids.push_back(u);
    ptrs.push_back(&bits);
  }
  cudnnStatus_t st = api_.set_stream(handle_, stream);
  auto error = [&](const char* step) {
    const char* text = api_.error_string ? api_.error_string(st) : nullptr;
    return StepError{step, static_cast<int>(st), text ? text : "unknown cuDNN status"};
  };
  if (st != CUDNN_STATUS_SUCCESS) return error("cudnnSetStream");
  cudnnBackendDescriptor_t vp = nullptr;
  st = api_.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st != CUDNN_STATUS_SUCCESS) return error("variant pack create");
  std::optional<StepError> result;
  const auto n = static_cast<std::int64_t>(uids.size());
  if ((st = api_.set_attribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                               uids.data())) != CUDNN_STATUS_SUCCESS ||
      (st = api_.set_attribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                               ptrs.data())) != CUDNN_STATUS_SUCCESS ||
      (st = api_.set_attribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                               &p.workspace)) != CUDNN_STATUS_SUCCESS) {
    result = error("variant pack set attribute");
  } else if ((st = api_.finalize(vp)) != CUDNN_STATUS_SUCCESS) {
    result = error("variant pack finalize");
  } else if ((st = api_.execute(handle_, p.plan, vp)) != CUDNN_STATUS_SUCCESS) {
    result = error("execute");
  }
  api_.destroy_descriptor(vp);
  return result;
}

std::optional<StepError> FusedAttention::forward(const AttentionShape& s, const void* q,
                                                 const void* k, const void* v, void* o, void* lse,
                                                 cudaStream_t stream) {
  const std::map<std::int64_t, void*> b = {{uid::kQ, const_cast<void*>(q)},
                                           {uid::kK, const_cast<void*>(k)},
                                           {uid::kV, const_cast<void*>(v)},
                                           {uid::kO, o},
                                           {uid::kStats, lse}};
  return run(s, Direction::kForward, b, stream);
}

std::optional<StepError> FusedAttention::backward(const AttentionShape& s, const void* q,
                                                  const void* k, const void* v, const void* o,
                                                  const void* d_o, const void* lse, void* dq,
                                                  void* dk, void* dv, void* row_sums,
                                                  cudaStream_t stream) {
  const std::map<std::int64_t, void*> b = {{uid::kQ, const_cast<void*>(q)},
                                           {uid::kK, const_cast<void*>(k)},
                                           {uid::kV, const_cast<void*>(v)},
                                           {uid::kO, const_cast<void*>(o)},
                                           {uid::kDO, const_cast<void*>(d_o)},
                                           {uid::kStats, const_cast<void*>(lse)},
                                           {uid::kDQ, dq},
                                           {uid::kDK, dk},
                                           {uid::kDV, dv},
                                           {uid::kSoftmaxSum, row_sums}};
  return run(s, Direction::kBackward, b, stream);
}

std::int64_t FusedAttention::engine_index(const AttentionShape& s, Direction d) const {
  auto it = plans_.find(key(s, d));
  return it == plans_.end() ? -1 : it->second->engine_index;
}

std::size_t FusedAttention::workspace_bytes(const AttentionShape& s, Direction d) const {
  auto it = plans_.find(key(s, d));
  return it == plans_.end() ? 0 : static_cast<std::size_t>(it->second->workspace_bytes);
}

bool enqueue_fused(FusedAttention* f, Direction d, const AttentionShape& s,
                   const std::vector<void*>& in, const std::vector<void*>& out,
                   cudaStream_t stream) {
  AttentionPath& path = attention_path();
  if (!f || !path.fused()) return false;
  const bool fwd = d == Direction::kForward;
  if (in.size() != (fwd ? 3u : 6u) || out.size() != (fwd ? 2u : 4u)) {
    throw InternalError(fmt::format("attention {} op with {} inputs and {} outputs", to_string(d),
                                    in.size(), out.size()));
  }
  const auto e = fwd ? f->forward(s, in[0], in[1], in[2], out[0], out[1], stream)
                     : f->backward(s, in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1],
                                   out[2], out[3], stream);
  if (!e) return true;
  path.fail(*e, s, d);
  return false;
}

bool probe_fused_attention(int device) {
  AttentionPath& path = attention_path();
  if (!path.fused()) return false;
  const AttentionShape shapes[] = {{1, 2, 128, 128, 128}, {1, 2, 64, 128, 128}};
  const Cudnn* api = nullptr;
  try {
    api = &cudnn();
  } catch (const NotSupported& e) {
    path.fail({"load libcudnn", 0, e.what()}, shapes[0], Direction::kForward);
    return false;
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    path.fail({"cudaSetDevice", 0, cudaGetErrorString(cudaGetLastError())}, shapes[0],
              Direction::kForward);
    return false;
  }
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t st = api->create(&handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    path.fail({"cudnnCreate", static_cast<int>(st), api->error_string(st)}, shapes[0],
              Direction::kForward);
    return false;
  }
  {
    FusedAttention fa(
        *api, handle,
        [](std::size_t bytes) -> void* {
          void* p = nullptr;
          return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
        },
        [](void* p) { cudaFree(p); });
    for (const auto& s : shapes) {
      for (Direction d : {Direction::kForward, Direction::kBackward}) {
        if (auto e = fa.prepare(s, d)) {
          path.fail(*e, s, d);
          break;
        }
      }
      if (!path.fused()) break;
    }
  }
  api->destroy(handle);
  return path.fused();
}

bool CrossCheck::agree() const {
  if (!error.empty()) return false;
  auto within = [](double diff, double scale) { return diff <= 0.02 * std::max(1.0, scale); };
  return within(o, o_max) && within(lse, lse_max) && within(dq, dq_max) && within(dk, dk_max) &&
         within(dv, dv_max) && within(row_sums, 1.0);
}

namespace {

float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Device buffers of the cross check, freed on every path.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  void* get(std::size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      throw InternalError(fmt::format("cudaMalloc of {} bytes failed", bytes));
    }
    ptrs.push_back(p);
    return p;
  }
};

std::vector<float> to_host(const void* p, std::size_t bytes, bool bf16) {
  std::vector<float> out;
  if (bf16) {
    std::vector<std::uint16_t> h(bytes / 2);
    if (cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw InternalError("cudaMemcpy of a cross-check output failed");
    }
    for (auto x : h) out.push_back(bf16_to_float(x));
  } else {
    out.resize(bytes / 4);
    if (cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw InternalError("cudaMemcpy of a cross-check output failed");
    }
  }
  return out;
}

// max |a - b| and max |a| over finite entries; a non-finite difference counts as infinite.
std::pair<double, double> compare(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    diff = std::max(diff, std::isfinite(d) ? d : HUGE_VAL);
    if (std::isfinite(a[i])) mag = std::max(mag, std::fabs(static_cast<double>(a[i])));
  }
  return {diff, mag};
}

}  // namespace

CrossCheck cross_check_fused_attention(int device, const AttentionShape& s) {
  CrossCheck r;
  cudnnHandle_t handle = nullptr;
  const Cudnn* api = nullptr;
  try {
    api = &cudnn();
    if (cudaSetDevice(device) != cudaSuccess) throw InternalError("cudaSetDevice failed");
    const cudnnStatus_t st = api->create(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      throw InternalError(fmt::format("cudnnCreate: {}", api->error_string(st)));
    }
    DeviceBuffers mem;
    cudaStream_t stream = nullptr;  // the legacy default stream: everything in order
    const auto q_bytes = static_cast<std::size_t>(s.q_rows() * s.head_dim) * 2;
    const auto kv_bytes = static_cast<std::size_t>(s.groups * s.kv_len * s.head_dim) * 2;
    const auto row_bytes = static_cast<std::size_t>(s.q_rows()) * 4;
    void* q = mem.get(q_bytes);
    void* k = mem.get(kv_bytes);
    void* v = mem.get(kv_bytes);
    void* d_o = mem.get(q_bytes);
    fill_random(q, q_bytes, 11, stream);
    fill_random(k, kv_bytes, 12, stream);
    fill_random(v, kv_bytes, 13, stream);
    fill_random(d_o, q_bytes, 14, stream);
    struct Out {
      void *o, *lse, *dq, *dk, *dv, *rows;
    };
    auto outs = [&] {
      return Out{mem.get(q_bytes),  mem.get(row_bytes), mem.get(q_bytes),
                 mem.get(kv_bytes), mem.get(kv_bytes),  mem.get(row_bytes)};
    };
    const Out fused = outs(), fb = outs();
    {
      FusedAttention fa(
          *api, handle,
          [](std::size_t bytes) -> void* {
            void* p = nullptr;
            return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
          },
          [](void* p) { cudaFree(p); });
      auto fail = [](const StepError& e) {
        return InternalError(fmt::format("fused attention step '{}': {} (cuDNN status {})", e.step,
                                         e.status_text, e.status));
      };
      if (auto e = fa.forward(s, q, k, v, fused.o, fused.lse, stream)) throw fail(*e);
      if (auto e = fa.backward(s, q, k, v, fused.o, d_o, fused.lse, fused.dq, fused.dk, fused.dv,
                               fused.rows, stream))
        throw fail(*e);
      attention_forward_fallback(q, k, v, fb.o, static_cast<float*>(fb.lse), s.groups,
                                 s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim, stream);
      attention_backward_fallback(q, k, v, fused.o, d_o, static_cast<const float*>(fused.lse),
                                  fb.dq, fb.dk, fb.dv, static_cast<float*>(fb.rows), s.groups,
                                  s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim, stream);
      const cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) {
        throw InternalError(fmt::format("cross check: {}", cudaGetErrorString(e)));
      }
    }
    std::tie(r.o, r.o_max) = compare(to_host(fused.o, q_bytes, true), to_host(fb.o, q_bytes, true));
    std::tie(r.lse, r.lse_max) =
        compare(to_host(fused.lse, row_bytes, false), to_host(fb.lse, row_bytes, false));
    std::tie(r.dq, r.dq_max) =
        compare(to_host(fused.dq, q_bytes, true), to_host(fb.dq, q_bytes, true));
    std::tie(r.dk, r.dk_max) =
        compare(to_host(fused.dk, kv_bytes, true), to_host(fb.dk, kv_bytes, true));
    std::tie(r.dv, r.dv_max) =
        compare(to_host(fused.dv, kv_bytes, true), to_host(fb.dv, kv_bytes, true));
    r.row_sums =
        compare(to_host(fused.rows, row_bytes, false), to_host(fb.rows, row_bytes, false)).first;
  } catch (const std::exception& e) {
    r = CrossCheck{};
    r.error = e.what();
  }
  if (handle) api->destroy(handle);
  return r;
}

}  // namespace kareus::cuda::sdpa
