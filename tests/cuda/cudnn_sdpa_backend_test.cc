// The cuDNN backend-API path of fused attention (src/cuda/cudnn_sdpa_backend.h) against a fake
// cuDNN: a table of functions with cuDNN's signatures that records every descriptor, checks
// what a real finalize would reject for these graphs (missing attributes, unfinalized
// references, matmul and broadcast shape mismatches, a variant pack that misses a non-virtual
// tensor of the graph) and fails on request at a chosen step. No GPU is involved: this checks
// the sequence of backend calls and the fallback decision, not cuDNN's acceptance of the graph
// (that needs a device; docs/cuda.md).
#include "cuda/cudnn_sdpa_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda/cudnn_sdpa.h"

namespace kareus::cuda::sdpa {
namespace {

struct FakeDesc {
  cudnnBackendDescriptorType_t type;
  std::map<int, std::vector<unsigned char>> attrs;
  std::map<int, std::int64_t> counts;
  bool finalized = false;
  FakeDesc* graph = nullptr;  // engine config: the operation graph the heuristics ran on
  std::int64_t engine = -1;   // engine config / engine: global index
};

struct Fake {
  std::vector<std::unique_ptr<FakeDesc>> all;
  std::map<int, int> created;  // by descriptor type
  int destroyed = 0;
  int engines = 2;
  // Injected failure: finalize of `fail_type` fails `fail_times` times (-1: always).
  int fail_type = -1;
  int fail_times = 0;
  bool fail_execute = false;
  int executes = 0;
  std::vector<std::int64_t> uids;
  std::vector<void*> ptrs;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<std::string> errors;  // what a real cuDNN would have rejected
};
Fake* g_fake = nullptr;

FakeDesc* D(cudnnBackendDescriptor_t d) { return static_cast<FakeDesc*>(d); }

std::size_t elem_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_DATA_TYPE:
      return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_INT64:
      return sizeof(std::int64_t);
    case CUDNN_TYPE_FLOAT:
      return sizeof(float);
    case CUDNN_TYPE_DOUBLE:
      return sizeof(double);
    case CUDNN_TYPE_HEUR_MODE:
      return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_POINTWISE_MODE:
      return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
      return sizeof(cudnnReduceTensorOp_t);
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(void*);
    default:
      return 0;
  }
}

bool has(FakeDesc* d, int a) { return d->attrs.count(a) > 0; }
template <class T>
std::vector<T> get(FakeDesc* d, int a) {
  std::vector<T> v;
  if (!has(d, a)) return v;
  const auto& b = d->attrs.at(a);
  v.resize(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}
FakeDesc* ref(FakeDesc* d, int a) {
  auto v = get<void*>(d, a);
  return v.empty() ? nullptr : D(v[0]);
}
std::vector<std::int64_t> dims(FakeDesc* t) {
  return get<std::int64_t>(t, CUDNN_ATTR_TENSOR_DIMENSIONS);
}

cudnnStatus_t fake_create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* out) {
  auto d = std::make_unique<FakeDesc>();
  d->type = type;
  *out = d.get();
  g_fake->all.push_back(std::move(d));
  ++g_fake->created[type];
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_destroy(cudnnBackendDescriptor_t) {
  ++g_fake->destroyed;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t type, std::int64_t count, const void* value) {
  const std::size_t es = elem_size(type);
  if (es == 0 || count < 0 || D(d)->finalized) return CUDNN_STATUS_BAD_PARAM;
  const auto* p = static_cast<const unsigned char*>(value);
  D(d)->attrs[name] = std::vector<unsigned char>(p, p + es * static_cast<std::size_t>(count));
  D(d)->counts[name] = count;
  return CUDNN_STATUS_SUCCESS;
}

void expect(bool ok, const std::string& what) {
  if (!ok) g_fake->errors.push_back(what);
}

// Each of x's dims equals y's or is 1 (broadcast).
bool broadcasts(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i] && x[i] != 1) return false;
  return true;
}

void check_refs(FakeDesc* d, std::initializer_list<int> attrs, const std::string& what) {
  for (int a : attrs) {
    FakeDesc* r = ref(d, a);
    expect(r != nullptr, what + ": missing descriptor attribute " + std::to_string(a));
    if (r) expect(r->finalized, what + ": refers to an unfinalized descriptor");
  }
}

cudnnStatus_t fake_finalize(cudnnBackendDescriptor_t desc) {
  FakeDesc* d = D(desc);
  if (d->type == g_fake->fail_type && g_fake->fail_times != 0) {
    if (g_fake->fail_times > 0) --g_fake->fail_times;
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      expect(has(d, CUDNN_ATTR_TENSOR_DATA_TYPE) && has(d, CUDNN_ATTR_TENSOR_UNIQUE_ID) &&
                 has(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT),
             "tensor without data type, uid or alignment");
      expect(dims(d).size() == 4 &&
                 get<std::int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES).size() == dims(d).size(),
             "tensor dims/strides not rank 4");
      break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      check_refs(d,
                 {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                  CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC},
                 "matmul");
      const auto a = dims(ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC));
      const auto b = dims(ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
      const auto c = dims(ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
      // [.., M, K] x [.., K, N] -> [.., M, N]; batch dims of A and B broadcast to C's (GQA).
      expect(a[3] == b[2] && a[2] == c[2] && b[3] == c[3], "matmul M/N/K mismatch");
      expect(broadcasts({a[0], a[1], 1, 1}, {c[0], c[1], 1, 1}) &&
                 broadcasts({b[0], b[1], 1, 1}, {c[0], c[1], 1, 1}),
             "matmul batch dims do not broadcast");
      break;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      check_refs(d,
                 {CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                  CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC},
                 "pointwise");
      const auto mode = get<cudnnPointwiseMode_t>(
          ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), CUDNN_ATTR_POINTWISE_MODE)[0];
      const bool unary = mode == CUDNN_POINTWISE_EXP || mode == CUDNN_POINTWISE_LOG ||
                         mode == CUDNN_POINTWISE_IDENTITY || mode == CUDNN_POINTWISE_GEN_INDEX;
      expect(unary != has(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC), "pointwise B port");
      expect(
          (mode == CUDNN_POINTWISE_BINARY_SELECT) == has(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC),
          "pointwise T port");
      const auto y = dims(ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
      for (int port : {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                       CUDNN_ATTR_OPERATION_POINTWISE_TDESC}) {
        if (FakeDesc* t = ref(d, port)) {
          expect(t->finalized, "pointwise input unfinalized");
          expect(broadcasts(dims(t), y), "pointwise operand does not broadcast to Y");
        }
      }
      break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      check_refs(d,
                 {CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                  CUDNN_ATTR_OPERATION_REDUCTION_YDESC},
                 "reduction");
      expect(broadcasts(dims(ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC)),
                        dims(ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC))),
             "reduction output is not a reduced shape of its input");
      break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      check_refs(d, {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC},
                 "reshape");
      auto n = [](const std::vector<std::int64_t>& v) {
        std::int64_t p = 1;
        for (auto x : v) p *= x;
        return p;
      };
      expect(n(dims(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC))) ==
                 n(dims(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC))),
             "reshape changes the element count");
      break;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      expect(d->counts[CUDNN_ATTR_OPERATIONGRAPH_OPS] > 0, "empty operation graph");
      for (void* op : get<void*>(d, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
        expect(D(op)->finalized, "operation graph holds an unfinalized op");
      }
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      check_refs(d, {CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH}, "heuristics");
      expect(has(d, CUDNN_ATTR_ENGINEHEUR_MODE), "heuristics without mode");
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      check_refs(d, {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG}, "execution plan");
      break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      expect(d->counts[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS] ==
                     d->counts[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS] &&
                 has(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE),
             "variant pack");
      break;
    default:
      break;
  }
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t fake_get(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t, std::int64_t requested, std::int64_t* count,
                       void* out) {
  FakeDesc* d = D(desc);
  if (!d->finalized && name != CUDNN_ATTR_ENGINECFG_ENGINE) return CUDNN_STATUS_BAD_PARAM;
  switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
      const std::int64_t n = std::min<std::int64_t>(requested, g_fake->engines);
      if (requested == 0) {
        *count = g_fake->engines;
        return CUDNN_STATUS_SUCCESS;
      }
      auto** cfg = static_cast<cudnnBackendDescriptor_t*>(out);
      for (std::int64_t i = 0; i < n; ++i) {
        D(cfg[i])->finalized = true;
        D(cfg[i])->graph = ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        D(cfg[i])->engine = 100 + i;
      }
      *count = n;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
      *static_cast<std::int64_t*>(out) = 1 << 20;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINECFG_ENGINE: {
      FakeDesc* e = D(*static_cast<cudnnBackendDescriptor_t*>(out));
      e->engine = d->engine;
      e->finalized = true;
      if (count) *count = 1;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      *static_cast<std::int64_t*>(out) = d->engine;
      return CUDNN_STATUS_SUCCESS;
    default:
      return CUDNN_STATUS_NOT_SUPPORTED;
  }
}

// The non-virtual tensors the operations of `graph` touch: what a variant pack must bind.
std::set<std::int64_t> bound_uids(FakeDesc* graph) {
  std::set<std::int64_t> u;
  for (void* op : get<void*>(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    for (auto& [a, bytes] : D(op)->attrs) {
      (void)bytes;
      const bool port =
          (a >= CUDNN_ATTR_OPERATION_POINTWISE_XDESC && a <= CUDNN_ATTR_OPERATION_POINTWISE_TDESC &&
           a != CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1 &&
           a != CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2) ||
          a == CUDNN_ATTR_OPERATION_MATMUL_ADESC || a == CUDNN_ATTR_OPERATION_MATMUL_BDESC ||
          a == CUDNN_ATTR_OPERATION_MATMUL_CDESC || a == CUDNN_ATTR_OPERATION_REDUCTION_XDESC ||
          a == CUDNN_ATTR_OPERATION_REDUCTION_YDESC || a == CUDNN_ATTR_OPERATION_RESHAPE_XDESC ||
          a == CUDNN_ATTR_OPERATION_RESHAPE_YDESC;
      if (!port) continue;
      FakeDesc* t = ref(D(op), a);
      if (!t || t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) continue;
      if (!get<char>(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL).empty() &&
          get<char>(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL)[0] != 0)
        continue;
      u.insert(get<std::int64_t>(t, CUDNN_ATTR_TENSOR_UNIQUE_ID)[0]);
    }
  }
  return u;
}

cudnnStatus_t fake_execute(cudnnHandle_t, cudnnBackendDescriptor_t plan,
                           cudnnBackendDescriptor_t vp) {
  ++g_fake->executes;
  expect(D(plan)->finalized && D(vp)->finalized, "execute with unfinalized plan or pack");
  g_fake->uids = get<std::int64_t>(D(vp), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  g_fake->ptrs = get<void*>(D(vp), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  g_fake->workspace = get<void*>(D(vp), CUDNN_ATTR_VARIANT_PACK_WORKSPACE)[0];
  FakeDesc* graph = ref(D(plan), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)->graph;
  expect(std::set<std::int64_t>(g_fake->uids.begin(), g_fake->uids.end()) == bound_uids(graph),
         "variant pack does not bind exactly the graph's non-virtual tensors");
  for (void* p : g_fake->ptrs) expect(p != nullptr, "null pointer in variant pack");
  return g_fake->fail_execute ? CUDNN_STATUS_EXECUTION_FAILED : CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t fake_set_stream(cudnnHandle_t, cudaStream_t s) {
  g_fake->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
const char* fake_error_string(cudnnStatus_t s) {
  return s == CUDNN_STATUS_NOT_SUPPORTED      ? "CUDNN_STATUS_NOT_SUPPORTED"
         : s == CUDNN_STATUS_EXECUTION_FAILED ? "CUDNN_STATUS_EXECUTION_FAILED"
                                              : "other";
}
std::size_t fake_version() { return 91900; }

Cudnn fake_api() {
  Cudnn c{};
  c.set_stream = fake_set_stream;
  c.error_string = fake_error_string;
  c.version = fake_version;
  c.create_descriptor = fake_create;
  c.destroy_descriptor = fake_destroy;
  c.set_attribute = fake_set;
  c.get_attribute = fake_get;
  c.finalize = fake_finalize;
  c.execute = fake_execute;
  return c;
}

class CudnnSdpaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake;
    api = fake_api();
    attention_path().reset();
    old_sink = attention_path().set_sink([this](const std::string& w) { warnings.push_back(w); });
  }
  void TearDown() override {
    attention_path().set_sink(old_sink);
    attention_path().reset();
    g_fake = nullptr;
  }
  std::unique_ptr<FusedAttention> make() {
    return std::make_unique<FusedAttention>(
        api, reinterpret_cast<cudnnHandle_t>(0x1),
        [this](std::size_t bytes) -> void* {
          allocated.push_back(bytes);
          ++live;
          return std::malloc(bytes);
        },
        [this](void* p) {
          --live;
          std::free(p);
        });
  }
  // Distinct fake device pointers for the executor's buffers.
  std::vector<void*> ptrs(int n, int base) {
    std::vector<void*> v;
    for (int i = 0; i < n; ++i) v.push_back(reinterpret_cast<void*>(0x1000 * (base + i)));
    return v;
  }

  Fake fake;
  Cudnn api{};
  AttentionPath::Sink old_sink;
  std::vector<std::string> warnings;
  std::vector<std::size_t> allocated;
  int live = 0;
  const AttentionShape shape{4, 3, 4096, 4096, 128};
};

TEST_F(CudnnSdpaBackend, ForwardBuildsOnceAndBindsBuffersByUid) {
  auto fa = make();
  const Graph g = forward_graph(shape);
  ASSERT_FALSE(fa->prepare(shape, Direction::kForward));
  EXPECT_TRUE(fake.errors.empty()) << fake.errors.front();
  EXPECT_EQ(fake.created[CUDNN_BACKEND_TENSOR_DESCRIPTOR], static_cast<int>(g.tensors.size()));
  EXPECT_EQ(fake.created[CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR], 2);
  EXPECT_EQ(fake.created[CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR], 2);
  EXPECT_EQ(fake.created[CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR], 10);
  EXPECT_EQ(fake.created[CUDNN_BACKEND_ENGINECFG_DESCRIPTOR], 2);
  EXPECT_EQ(fake.created[CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR], 1);  // first config finalized
  EXPECT_EQ(fa->engine_index(shape, Direction::kForward), 100);
  EXPECT_EQ(fa->workspace_bytes(shape, Direction::kForward), 1u << 20);
  EXPECT_EQ(allocated, (std::vector<std::size_t>{1u << 20}));  // no dQ accumulator forward

  const auto in = ptrs(3, 1), out = ptrs(2, 11);
  int dummy_stream = 0;
  const auto stream = reinterpret_cast<cudaStream_t>(&dummy_stream);
  ASSERT_TRUE(enqueue_fused(fa.get(), Direction::kForward, shape, in, out, stream));
  ASSERT_TRUE(enqueue_fused(fa.get(), Direction::kForward, shape, in, out, stream));
  EXPECT_TRUE(fake.errors.empty()) << fake.errors.front();
  EXPECT_EQ(fake.executes, 2);
  EXPECT_EQ(fake.created[CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR], 1);  // cached per shape
  EXPECT_EQ(fake.stream, stream);
  std::map<std::int64_t, void*> bound;
  for (std::size_t i = 0; i < fake.uids.size(); ++i) bound[fake.uids[i]] = fake.ptrs[i];
  EXPECT_EQ(bound.at(uid::kQ), in[0]);
  EXPECT_EQ(bound.at(uid::kK), in[1]);
  EXPECT_EQ(bound.at(uid::kV), in[2]);
  EXPECT_EQ(bound.at(uid::kO), out[0]);
  EXPECT_EQ(bound.at(uid::kStats), out[1]);
  // By-value scalars point at host floats: the scale 1/sqrt(128) and -inf for the mask.
  std::multiset<float> scalars;
  for (const auto& t : g.tensors)
    if (t.by_value) scalars.insert(*static_cast<const float*>(bound.at(t.uid)));
  EXPECT_EQ(scalars.size(), 2u);
  EXPECT_TRUE(std::isinf(*scalars.begin()));
  EXPECT_FLOAT_EQ(*scalars.rbegin(), 0.088388346f);
  EXPECT_NE(fake.workspace, nullptr);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(attention_path().backend(), "cudnn-fused");
  fa.reset();
  EXPECT_EQ(live, 0);
}

TEST_F(CudnnSdpaBackend, BackwardBindsRowSumsAndItsOwnAccumulator) {
  auto fa = make();
  const AttentionShape cp{8, 3, 2048, 4096, 128};
  const auto in = ptrs(6, 1), out = ptrs(4, 11);
  ASSERT_TRUE(enqueue_fused(fa.get(), Direction::kBackward, cp, in, out, nullptr));
  EXPECT_TRUE(fake.errors.empty()) << fake.errors.front();
  EXPECT_EQ(allocated, (std::vector<std::size_t>{1u << 20, 8u * 3 * 2048 * 128 * 4}));
  std::map<std::int64_t, void*> bound;
  for (std::size_t i = 0; i < fake.uids.size(); ++i) bound[fake.uids[i]] = fake.ptrs[i];
  const std::int64_t ins[] = {uid::kQ, uid::kK, uid::kV, uid::kO, uid::kDO, uid::kStats};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bound.at(ins[i]), in[static_cast<std::size_t>(i)]);
  EXPECT_EQ(bound.at(uid::kDQ), out[0]);
  EXPECT_EQ(bound.at(uid::kDK), out[1]);
  EXPECT_EQ(bound.at(uid::kDV), out[2]);
  EXPECT_EQ(bound.at(uid::kSoftmaxSum), out[3]);
  EXPECT_NE(bound.at(uid::kDQAccum), nullptr);
  // The CP shape's bottom-right mask adds two int32 scalars (s_kv, s_q) to the float ones.
  int ints = 0;
  for (const auto& t : backward_graph(cp).tensors)
    if (t.by_value && t.type == DataType::kInt32) {
      ++ints;
      const auto v = *static_cast<const std::int32_t*>(bound.at(t.uid));
      EXPECT_TRUE(v == 4096 || v == 2048) << v;
    }
  EXPECT_EQ(ints, 2);
}

TEST_F(CudnnSdpaBackend, NextEngineConfigIsTriedWhenAPlanDoesNotFinalize) {
  fake.fail_type = CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR;
  fake.fail_times = 1;
  auto fa = make();
  ASSERT_FALSE(fa->prepare(shape, Direction::kForward));
  EXPECT_EQ(fake.created[CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR], 2);
  EXPECT_EQ(fa->engine_index(shape, Direction::kForward), 101);
}

TEST_F(CudnnSdpaBackend, FailingStepsAreNamedWithTheirStatus) {
  struct Case {
    int fail_type;
    int engines;
    std::string step;
    int status;
  };
  const Case cases[] = {
      {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, 2,
       "execution plan finalize (2 engine configs tried)", CUDNN_STATUS_NOT_SUPPORTED},
      {-1, 0, "engine heuristics", CUDNN_STATUS_NOT_SUPPORTED},
      {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, 2, "operation graph finalize",
       CUDNN_STATUS_NOT_SUPPORTED},
      {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, 2, "pointwise 'attn_scale' descriptor finalize",
       CUDNN_STATUS_NOT_SUPPORTED},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, 2, "tensor descriptor 'Q' finalize",
       CUDNN_STATUS_NOT_SUPPORTED},
  };
  for (const auto& c : cases) {
    fake = Fake{};
    fake.fail_type = c.fail_type;
    fake.fail_times = -1;
    fake.engines = c.engines;
    auto fa = make();
    const auto e = fa->prepare(shape, Direction::kForward);
    ASSERT_TRUE(e.has_value()) << c.step;
    EXPECT_EQ(e->step, c.step);
    EXPECT_EQ(e->status, c.status) << c.step;
    EXPECT_EQ(fa->cached_plans(), 0u);
    fa.reset();
    EXPECT_EQ(live, 0) << c.step;  // nothing leaks on failure
  }
}

// The executor's decision: an execute error warns once, names the step and status, and every
// later attention op (forward or backward, any shape) goes to the fallback kernel without
// touching cuDNN again.
TEST_F(CudnnSdpaBackend, ExecuteFailureSwitchesEveryLaterCallToTheFallback) {
  auto fa = make();
  ASSERT_TRUE(
      enqueue_fused(fa.get(), Direction::kForward, shape, ptrs(3, 1), ptrs(2, 11), nullptr));
  fake.fail_execute = true;
  EXPECT_FALSE(
      enqueue_fused(fa.get(), Direction::kForward, shape, ptrs(3, 1), ptrs(2, 11), nullptr));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("failed at step 'execute': CUDNN_STATUS_EXECUTION_FAILED"),
            std::string::npos)
      << warnings[0];
  EXPECT_EQ(attention_path().backend(), "fallback kernel");
  EXPECT_EQ(attention_path().fingerprint_field(), "attention=fallback");
  fake.fail_execute = false;
  const int executes = fake.executes;
  EXPECT_FALSE(
      enqueue_fused(fa.get(), Direction::kForward, shape, ptrs(3, 1), ptrs(2, 11), nullptr));
  EXPECT_FALSE(
      enqueue_fused(fa.get(), Direction::kBackward, shape, ptrs(6, 1), ptrs(4, 11), nullptr));
  EXPECT_EQ(fake.executes, executes);
  EXPECT_EQ(warnings.size(), 1u);
}

TEST_F(CudnnSdpaBackend, BuildFailureAndMissingLibraryFallBack) {
  fake.engines = 0;
  auto fa = make();
  EXPECT_FALSE(
      enqueue_fused(fa.get(), Direction::kBackward, shape, ptrs(6, 1), ptrs(4, 11), nullptr));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("step 'engine heuristics': no engine supports the graph"),
            std::string::npos)
      << warnings[0];
  EXPECT_EQ(fake.executes, 0);
  attention_path().reset();
  // No cuDNN at all (the executor passes nullptr): fallback, and no warning from here (the
  // executor reports the load failure itself).
  EXPECT_FALSE(
      enqueue_fused(nullptr, Direction::kForward, shape, ptrs(3, 1), ptrs(2, 11), nullptr));
}

// The real cuDNN (the toolkit's libcudnn, no GPU needed up to this point): every tensor and
// operation descriptor of the six graphs and the operation graph itself finalize, so cuDNN's
// own checks (matmul M/N/K, broadcasts, port types, graph connectivity) accept the description.
// Without a device the heuristics find no engine, which is where the build must stop; with one
// the whole plan must build. (A mismatched matmul K makes cuDNN 9.19's finalize return
// CUDNN_STATUS_BAD_PARAM on a machine without a GPU: the check has teeth.)
TEST(CudnnSdpaRealLibrary, EveryDescriptorAndTheOperationGraphFinalize) {
  const Cudnn* api = nullptr;
  try {
    api = &cudnn();
  } catch (const std::exception& e) {
    GTEST_SKIP() << "libcudnn not loadable: " << e.what();
  }
  for (const AttentionShape& s :
       {AttentionShape{4, 3, 4096, 4096, 128}, AttentionShape{8, 3, 2048, 4096, 128},
        AttentionShape{2, 1, 256, 256, 64}}) {
    for (Direction d : {Direction::kForward, Direction::kBackward}) {
      FusedAttention fa(
          *api, nullptr, [](std::size_t b) { return std::malloc(b); },
          [](void* p) { std::free(p); });
      const auto e = fa.prepare(s, d);
      if (e) {
        EXPECT_EQ(e->step, "engine heuristics")
            << to_string(d) << " q_len " << s.q_len << ": " << e->status_text;
      }
    }
  }
}

}  // namespace
}  // namespace kareus::cuda::sdpa
