// Workload files: YAML parsing and validation. Every error names the file, the dotted key and
// what is allowed, so that a user can fix the file without reading this code.
#include "kareus/workload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "kareus/error.h"

namespace kareus {
namespace {

// Model presets from the models' published configurations (Hugging Face config.json files).
ModelConfig llama32_3b() {
  return {"llama3.2-3b", 28, 3072, 8192, 24, 8, 128, 128256, true, false};
}
ModelConfig qwen3_17b() { return {"qwen3-1.7b", 28, 2048, 6144, 16, 8, 128, 151936, true, true}; }
ModelConfig llama33_70b() {
  return {"llama3.3-70b", 80, 8192, 28672, 64, 8, 128, 128256, false, false};
}
// Mixtures of experts (docs/moe.md gives each config's source): top-k routed experts in every
// layer, no shared experts, no leading dense layers.
ModelConfig moe_preset(const char* name, int layers, int hidden, int ffn, int heads, int kv_heads,
                       int vocab, bool qk_norm, int experts, int top_k, int expert_ffn) {
  ModelConfig c{name, layers, hidden, ffn, heads, kv_heads, 128, vocab, false, qk_norm};
  c.experts = experts;
  c.experts_per_token = top_k;
  c.expert_ffn_hidden = expert_ffn;
  return c;
}
// mistralai/Mixtral-8x7B-v0.1 config.json.
ModelConfig mixtral_8x7b() {
  return moe_preset("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, false, 8, 2, 14336);
}
// Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json (q/k RMSNorm as every Qwen3).
ModelConfig qwen3_30b_a3b() {
  return moe_preset("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 151936, true, 128, 8, 768);
}
ModelConfig qwen3_235b_a22b() {
  return moe_preset("qwen3-235b-a22b", 94, 4096, 12288, 64, 4, 151936, true, 128, 8, 1536);
}

// Upper limits on every size a workload names. Planning work and memory grow with them (the
// emulator and the frontier keep every (stage, micro-batch) pass; kernel shapes multiply them),
// so an absurd value must stop at load time, not after the machine runs out of memory. Each
// limit is several times what the largest published training jobs use (Llama 3 405B: 126
// layers, hidden 16384, 16K GPUs, 2048 sequences per global batch; contexts up to 1M tokens),
// so every real job fits. Products of these limits stay far inside 64-bit integers.
struct SizeLimit {
  std::string_view key;
  long long max;
  std::string_view why;
};
constexpr SizeLimit kSizeLimits[] = {
    {"model.layers", 1024, "8x the deepest published LLM (126 layers)"},
    {"model.hidden", 131072, "8x the widest published LLM (hidden 16384)"},
    {"model.ffn_hidden", 524288, "about 10x the largest published FFN width (53248)"},
    {"model.heads", 1024, "8x the most attention heads published (128)"},
    {"model.kv_heads", 1024, "8x the most attention heads published (128)"},
    {"model.head_dim", 1024, "4x the largest head dimension in use (256)"},
    {"model.vocab", 4194304, "16x the largest published vocabulary (256K tokens)"},
    {"model.experts", 4096, "16x the most routed experts published (256, DeepSeek-V3)"},
    {"model.experts_per_token", 4096, "at most model.experts (checked against it)"},
    {"model.expert_ffn_hidden", 524288, "the limit of model.ffn_hidden"},
    {"model.shared_experts", 64, "8x the most shared experts published (DeepSeek-MoE: 2 of 64)"},
    {"model.shared_expert_ffn_hidden", 524288, "the limit of model.ffn_hidden"},
    {"model.dense_layers", 1024, "the limit of model.layers"},
    {"parallel.ep", 131072, "the GPU count is at most 131072"},
    {"cluster.nodes", 16384, "131072 GPUs at 8 per node, beyond any cluster built"},
    {"cluster.gpus_per_node", 1024, "the largest NVLink domains hold 72 to 576 GPUs"},
    {"parallel.tp", 1024, "tensor parallelism stays inside one node"},
    {"parallel.cp", 1024, "1024 context-parallel ranks split 4M tokens into 4K-token chunks"},
    {"parallel.pp", 1024, "a pipeline stage holds at least one layer (model.layers <= 1024)"},
    {"parallel.dp", 131072, "the GPU count is at most 131072"},
    {"parallel.virtual_pipeline", 1024,
     "a model chunk holds at least one layer (model.layers <= 1024)"},
    {"batch.micro_batch", 4096, "2x the sequences of the largest published global batch (2048)"},
    {"batch.seq_len", 4194304, "4x the longest trained context (1M tokens)"},
    {"batch.micro_batches", 4096,
     "planning keeps every (stage, micro-batch) pass in memory; 2x the sequences of the largest "
     "published global batch (2048) at one sequence per micro-batch"},
};
// Limits on products of the sizes above, for the same reasons.
constexpr long long kMaxGpus = 131072;  // beyond the largest clusters built (about 100K GPUs)
constexpr long long kMaxMicroBatchTokens = 16777216;  // the largest published global batch (16M)

const SizeLimit* size_limit(std::string_view key) {
  for (const auto& l : kSizeLimits) {
    if (l.key == key) return &l;
  }
  return nullptr;
}

// The bound of a size without its own entry in kSizeLimits (batch.nano_batches, whose allowed
// values validation names): sizes are stored as int.
constexpr long long kMaxAnySize = 1'000'000'000;

// The largest value a dotted key allows.
long long size_max(std::string_view key) {
  const SizeLimit* l = size_limit(key);
  return l != nullptr ? l->max : kMaxAnySize;
}

// "the limit of N (why)" for a dotted key.
std::string limit_text(std::string_view key) {
  const SizeLimit* l = size_limit(key);
  return l != nullptr
             ? fmt::format("the limit of {} ({})", l->max, l->why)
             : fmt::format("the limit of {} (the largest size a workload takes)", kMaxAnySize);
}

// Why `value` is out of range for `key` (a dotted key of kSizeLimits), or "" when it is fine.
std::string size_error(std::string_view key, long long value) {
  if (value <= 0) return fmt::format("must be a positive integer, got {}", value);
  if (value > size_max(key)) {
    return fmt::format("{} is above {}", value, limit_text(key));
  }
  return "";
}

// A scalar that reads as a number, integer or not (1e11, 99999999999999999999, 2.5, 1e999 as
// infinity); nullopt for anything else, "inf" and "nan" included.
std::optional<double> number_value(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  if (!std::isfinite(v) && errno != ERANGE) return std::nullopt;
  return v;
}

// Walks a YAML mapping, checking key names and value types; errors carry file and dotted key.
class Section {
 public:
  Section(const YAML::Node& node, std::string source, std::string prefix)
      : node_(node), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InvalidInput(fmt::format("{}: key '{}': {}", source_, dotted(key), what));
  }

  std::string dotted(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  void require_map(const std::string& allowed) const {
    if (!node_.IsMap()) {
      throw InvalidInput(fmt::format("{}: key '{}': expected a mapping with keys {}", source_,
                                     prefix_.empty() ? "<top level>" : prefix_, allowed));
    }
  }

  void check_keys(const std::vector<std::string>& allowed) const {
    require_map(fmt::format("{}", fmt::join(allowed, ", ")));
    check_unique_keys();
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (const auto& kv : node_) {
      const auto key = key_text(kv.first);
      if (!ok.count(key)) {
        fail(key, fmt::format("unknown key; allowed keys here: {}", fmt::join(allowed, ", ")));
      }
    }
  }

  // yaml-cpp keeps every entry of a mapping whose key repeats, and a lookup returns the first:
  // an override appended at the end of a file would be ignored without a word. Refuse it,
  // naming both places.
  void check_unique_keys() const {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : node_) {
      if (!kv.first.IsScalar()) continue;  // not a key of the format: refused as unknown
      const std::string key = kv.first.Scalar();
      const YAML::Mark at = kv.first.Mark();
      const auto [first, fresh] = seen.emplace(key, at);
      if (fresh) continue;
      const YAML::Mark& was = first->second;
      const std::string where = was.line == at.line
                                    ? fmt::format("line {} (columns {} and {})", at.line + 1,
                                                  was.column + 1, at.column + 1)
                                    : fmt::format("lines {} and {}", was.line + 1, at.line + 1);
      fail(key, fmt::format("duplicate key at {}; allowed: each key once per mapping (YAML "
                            "would silently keep the first value); remove one of them",
                            where));
    }
  }

  bool has(const std::string& key) const { return static_cast<bool>(node_[key]); }

  YAML::Node get(const std::string& key) const {
    YAML::Node n = node_[key];
    if (!n) fail(key, "missing (required)");
    return n;
  }

  int positive_int(const std::string& key) const {
    const YAML::Node n = get(key);
    long long v = 0;
    try {
      if (!n.IsScalar()) throw YAML::BadConversion(n.Mark());
      v = n.as<long long>();
    } catch (const YAML::Exception&) {
      // A number beyond 64 bits or in exponent notation above the limit is too large rather
      // than malformed: say which limit.
      const auto number = n.IsScalar() ? number_value(n.Scalar()) : std::nullopt;
      if (number && *number > static_cast<double>(size_max(dotted(key)))) {
        fail(key, fmt::format("{} is above {}", n.Scalar(), limit_text(dotted(key))));
      }
      fail(key, fmt::format("expected a positive integer, got '{}'", scalar_text(n)));
    }
    if (const std::string why = size_error(dotted(key), v); !why.empty()) fail(key, why);
    return static_cast<int>(v);
  }

  int positive_int_or(const std::string& key, int fallback) const {
    return has(key) ? positive_int(key) : fallback;
  }

  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const YAML::Node n = node_[key];
    try {
      if (!n.IsScalar()) throw YAML::BadConversion(n.Mark());
      return n.as<bool>();
    } catch (const YAML::Exception&) {
      fail(key, fmt::format("expected true or false, got '{}'", scalar_text(n)));
    }
  }

  std::string string(const std::string& key) const {
    const YAML::Node n = get(key);
    if (!n.IsScalar()) fail(key, "expected a string");
    return n.as<std::string>();
  }

  Section child(const std::string& key) const { return Section(get(key), source_, dotted(key)); }
  const YAML::Node& node() const { return node_; }
  const std::string& source() const { return source_; }

 private:
  // A key may itself be a list or a mapping ("? [a, b]"): name it, do not convert it.
  static std::string key_text(const YAML::Node& k) {
    return k.IsScalar() ? k.Scalar() : scalar_text(k);
  }

  static std::string scalar_text(const YAML::Node& n) {
    if (n.IsScalar()) return n.Scalar();
    if (n.IsSequence()) return "<a list>";
    if (n.IsMap()) return "<a mapping>";
    return "<null>";
  }

  YAML::Node node_;
  std::string source_;
  std::string prefix_;
};

// The mixture-of-experts keys of a model mapping: experts turns them on; the others then have
// defaults or are required, and without experts none may appear.
void parse_moe(const Section& m, ModelConfig& c) {
  const char* moe_keys[] = {"experts_per_token",        "expert_ffn_hidden", "shared_experts",
                            "shared_expert_ffn_hidden", "dense_layers",      "expert_imbalance"};
  if (!m.has("experts")) {
    for (const char* k : moe_keys) {
      if (m.has(k)) m.fail(k, "only for a mixture of experts: set model.experts as well");
    }
    return;
  }
  c.experts = m.positive_int("experts");
  c.experts_per_token = m.positive_int("experts_per_token");
  c.expert_ffn_hidden = m.positive_int("expert_ffn_hidden");
  if (m.has("shared_experts")) c.shared_experts = m.positive_int("shared_experts");
  if (c.shared_experts > 0) {
    c.shared_expert_ffn_hidden = m.positive_int_or("shared_expert_ffn_hidden", c.expert_ffn_hidden);
  } else if (m.has("shared_expert_ffn_hidden")) {
    m.fail("shared_expert_ffn_hidden", "only with model.shared_experts");
  }
  if (m.has("dense_layers")) c.dense_layers = m.positive_int("dense_layers");
  if (m.has("expert_imbalance")) {
    const YAML::Node n = m.get("expert_imbalance");
    const auto v = n.IsScalar() ? number_value(n.Scalar()) : std::nullopt;
    if (!v || !std::isfinite(*v)) {
      m.fail("expert_imbalance",
             "expected a number >= 1 (the busiest rank's tokens over the mean)");
    }
    c.expert_imbalance = *v;
  }
}

ModelConfig parse_model(const Section& top) {
  const YAML::Node n = top.get("model");
  if (n.IsScalar()) return model_preset(n.as<std::string>());  // rethrown below with the file
  Section m = top.child("model");
  m.check_keys({"name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab",
                "tied_embeddings", "qk_norm", "experts", "experts_per_token", "expert_ffn_hidden",
                "shared_experts", "shared_expert_ffn_hidden", "dense_layers", "expert_imbalance"});
  ModelConfig c;
  c.name = m.has("name") ? m.string("name") : "custom";
  c.layers = m.positive_int("layers");
  c.hidden = m.positive_int("hidden");
  c.ffn_hidden = m.positive_int("ffn_hidden");
  c.heads = m.positive_int("heads");
  c.kv_heads = m.positive_int("kv_heads");
  c.head_dim = m.positive_int("head_dim");
  c.vocab = m.positive_int("vocab");
  c.tied_embeddings = m.boolean_or("tied_embeddings", false);
  c.qk_norm = m.boolean_or("qk_norm", false);
  if (c.heads % c.kv_heads != 0) {
    m.fail("kv_heads", fmt::format("must divide heads ({}), got {}", c.heads, c.kv_heads));
  }
  parse_moe(m, c);
  return c;
}

ClusterConfig parse_cluster(const Section& c) {
  c.check_keys({"nodes", "gpus_per_node", "nccl"});
  ClusterConfig cluster;
  cluster.nodes = c.positive_int("nodes");
  cluster.gpus_per_node = c.positive_int("gpus_per_node");
  if (c.has("nccl")) {
    const std::string v = c.string("nccl");
    int major = 0, minor = 0;
    char dot = 0, extra = 0;
    std::istringstream in(v);
    if (!(in >> major >> dot >> minor) || dot != '.' || (in >> extra) || major < 1 || major > 99 ||
        minor < 0 || minor > 99) {
      c.fail("nccl", fmt::format("expected a version as major.minor, e.g. \"2.28\"; got '{}'", v));
    }
    cluster.nccl_version = major * 100 + minor;
  }
  return cluster;
}

std::vector<int> parse_stage_layers(const Section& p, int model_layers) {
  const YAML::Node sl = p.get("stage_layers");
  if (!sl.IsSequence()) p.fail("stage_layers", "expected a list of positive integers");
  std::vector<int> out;
  for (std::size_t i = 0; i < sl.size(); ++i) {
    long long v = 0;
    try {
      if (!sl[i].IsScalar()) throw YAML::BadConversion(sl[i].Mark());
      v = sl[i].as<long long>();
    } catch (const YAML::Exception&) {
      p.fail("stage_layers", fmt::format("entry {} is not an integer", i));
    }
    if (v <= 0) p.fail("stage_layers", fmt::format("entry {} must be positive, got {}", i, v));
    if (v > model_layers) {
      p.fail("stage_layers",
             fmt::format("entry {} ({}) is above model.layers ({})", i, v, model_layers));
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

ParallelConfig parse_parallel(const Section& p, int model_layers) {
  p.check_keys({"tp", "cp", "pp", "dp", "ep", "sequence_parallel", "virtual_pipeline",
                "overlap_dp_comm", "stage_layers"});
  ParallelConfig par;
  par.tp = p.positive_int_or("tp", 1);
  par.cp = p.positive_int_or("cp", 1);
  par.pp = p.positive_int_or("pp", 1);
  par.dp = p.positive_int_or("dp", 1);
  par.ep = p.positive_int_or("ep", 1);
  par.sequence_parallel = p.boolean_or("sequence_parallel", false);
  par.virtual_pipeline = p.positive_int_or("virtual_pipeline", 1);
  par.overlap_dp_comm = p.boolean_or("overlap_dp_comm", true);
  if (p.has("stage_layers")) {
    par.stage_layers = parse_stage_layers(p, model_layers);
  } else {
    // Even split, earlier virtual stages take the remainder (Megatron's default for uneven
    // splits; with chunks Megatron-LM needs layers divisible by pp * virtual_pipeline).
    const int vs = par.virtual_stages();
    for (int s = 0; s < vs; ++s) {
      par.stage_layers.push_back(model_layers / vs + (s < model_layers % vs ? 1 : 0));
    }
  }
  return par;
}

BatchConfig parse_batch(const Section& b) {
  b.check_keys({"micro_batch", "seq_len", "micro_batches", "nano_batches"});
  BatchConfig batch;
  batch.micro_batch = b.positive_int("micro_batch");
  batch.seq_len = b.positive_int("seq_len");
  batch.micro_batches = b.positive_int("micro_batches");
  // One sequence cannot be split into two nano-batches: such a job runs sequentially
  // (frequency planning only) unless the file asks for two explicitly, which validation refuses.
  batch.nano_batches = b.positive_int_or("nano_batches", batch.micro_batch == 1 ? 1 : 2);
  return batch;
}

Recompute parse_recompute(const Section& top) {
  const std::string r = top.string("recompute");
  if (r == "full") return Recompute::kFull;
  if (r == "none") return Recompute::kNone;
  top.fail("recompute", fmt::format("allowed values: full, none; got '{}'", r));
}

std::string err_source(const Workload& w) { return w.source.empty() ? "<workload>" : w.source; }

// Every size within (0, limit] and the products within theirs. Runs first: the other checks
// divide by the sizes and multiply them.
void check_sizes(const Workload& w) {
  const std::string src = err_source(w);
  auto fail = [&](const std::string& key, const std::string& what) {
    throw InvalidInput(fmt::format("{}: key '{}': {}", src, key, what));
  };
  const auto& p = w.parallel;
  const auto& m = w.model;
  const auto& b = w.batch;
  const std::pair<std::string_view, long long> sizes[] = {
      {"model.layers", m.layers},
      {"model.hidden", m.hidden},
      {"model.ffn_hidden", m.ffn_hidden},
      {"model.heads", m.heads},
      {"model.kv_heads", m.kv_heads},
      {"model.head_dim", m.head_dim},
      {"model.vocab", m.vocab},
      {"model.experts", m.moe() ? m.experts : 1},
      {"model.experts_per_token", m.moe() ? m.experts_per_token : 1},
      {"model.expert_ffn_hidden", m.moe() ? m.expert_ffn_hidden : 1},
      {"model.shared_experts", m.shared_experts > 0 ? m.shared_experts : 1},
      {"model.shared_expert_ffn_hidden", m.shared_experts > 0 ? m.shared_expert_ffn_hidden : 1},
      {"model.dense_layers", m.dense_layers > 0 ? m.dense_layers : 1},
      {"parallel.ep", p.ep},
      {"cluster.nodes", w.cluster.nodes},
      {"cluster.gpus_per_node", w.cluster.gpus_per_node},
      {"parallel.tp", p.tp},
      {"parallel.cp", p.cp},
      {"parallel.pp", p.pp},
      {"parallel.dp", p.dp},
      {"parallel.virtual_pipeline", p.virtual_pipeline},
      {"batch.micro_batch", b.micro_batch},
      {"batch.seq_len", b.seq_len},
      {"batch.micro_batches", b.micro_batches},
      {"batch.nano_batches", b.nano_batches},
  };
  for (const auto& [key, value] : sizes) {
    if (const std::string why = size_error(key, value); !why.empty()) fail(std::string(key), why);
  }
  const long long gpus = static_cast<long long>(w.cluster.nodes) * w.cluster.gpus_per_node;
  if (gpus > kMaxGpus) {
    fail("cluster", fmt::format("nodes*gpus_per_node = {} is above the limit of {} GPUs (beyond "
                                "the largest clusters built, about 100K GPUs)",
                                gpus, kMaxGpus));
  }
  const long long ranks = static_cast<long long>(p.tp) * p.cp * p.pp * p.dp;
  if (ranks != gpus) {
    fail("parallel", fmt::format("tp*cp*pp*dp = {}*{}*{}*{} = {} must equal the GPU count "
                                 "cluster.nodes*cluster.gpus_per_node = {}",
                                 p.tp, p.cp, p.pp, p.dp, ranks, gpus));
  }
  const long long tokens = static_cast<long long>(b.micro_batch) * b.seq_len;
  if (tokens > kMaxMicroBatchTokens) {
    fail("batch", fmt::format("micro_batch*seq_len = {} tokens is above the limit of {} per "
                              "micro-batch (the largest published global batch)",
                              tokens, kMaxMicroBatchTokens));
  }
}

}  // namespace

int ParallelConfig::first_layer(int virtual_stage) const {
  int n = 0;
  for (int vs = 0; vs < virtual_stage; ++vs) n += stage_layers.at(static_cast<std::size_t>(vs));
  return n;
}

int ParallelConfig::layers_of_stage(int stage) const {
  int n = 0;
  for (std::size_t vs = 0; vs < stage_layers.size(); ++vs) {
    if (stage_of(static_cast<int>(vs)) == stage) n += stage_layers[vs];
  }
  return n;
}

Schedule Workload::schedule() const {
  return Schedule(parallel.pp, parallel.virtual_pipeline, batch.micro_batches);
}

double Workload::tokens_per_iteration() const {
  return static_cast<double>(batch.micro_batch) * batch.seq_len * batch.micro_batches * parallel.dp;
}

std::vector<std::string> model_preset_names() {
  return {"llama3.2-3b",  "qwen3-1.7b",    "llama3.3-70b",
          "mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b"};
}

ModelConfig model_preset(const std::string& name) {
  if (name == "llama3.2-3b") return llama32_3b();
  if (name == "qwen3-1.7b") return qwen3_17b();
  if (name == "llama3.3-70b") return llama33_70b();
  if (name == "mixtral-8x7b") return mixtral_8x7b();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b();
  if (name == "qwen3-235b-a22b") return qwen3_235b_a22b();
  throw InvalidInput(
      fmt::format("unknown model preset '{}'; presets: {} (or a mapping with "
                  "layers, hidden, ffn_hidden, heads, kv_heads, head_dim, vocab)",
                  name, fmt::join(model_preset_names(), ", ")));
}

namespace {

// The mixture-of-experts rules (docs/moe.md): Megatron-LM's, with its MoE parallel folding.
template <typename Fail>
void validate_moe(const Workload& w, const Fail& fail) {
  const auto& m = w.model;
  const auto& p = w.parallel;
  if (!m.moe()) {
    if (p.ep != 1) {
      fail("parallel.ep", fmt::format("expert parallelism needs a mixture of experts (set "
                                      "model.experts or use a MoE preset: {}), got ep = {}",
                                      "mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b", p.ep));
    }
    return;
  }
  if (m.experts_per_token > m.experts) {
    fail("model.experts_per_token", fmt::format("top-k must be at most model.experts ({}), got {}",
                                                m.experts, m.experts_per_token));
  }
  if (m.dense_layers >= m.layers) {
    fail("model.dense_layers",
         fmt::format("must leave at least one MoE layer: below model.layers ({}), got {}", m.layers,
                     m.dense_layers));
  }
  if (!(m.expert_imbalance >= 1.0) || m.expert_imbalance > std::max(1, p.ep)) {
    fail("model.expert_imbalance",
         fmt::format("allowed 1 (balanced) up to parallel.ep = {} (every token on one rank), "
                     "got {}",
                     p.ep, m.expert_imbalance));
  }
  if (p.gpus_per_stage() % p.ep != 0) {
    fail("parallel.ep", fmt::format("ep ({}) must divide the GPUs of a pipeline stage, tp*cp*dp = "
                                    "{}*{}*{} = {} (Megatron-Core's MoE parallel folding, expert "
                                    "tensor parallelism 1)",
                                    p.ep, p.tp, p.cp, p.dp, p.gpus_per_stage()));
  }
  if (m.experts % p.ep != 0) {
    fail("parallel.ep", fmt::format("ep ({}) must divide model.experts ({}): every rank holds the "
                                    "same number of experts",
                                    p.ep, m.experts));
  }
  if (p.ep > w.cluster.gpus_per_node && p.ep % w.cluster.gpus_per_node != 0) {
    fail("parallel.ep",
         fmt::format("an expert-parallel group across nodes must hold whole nodes: ep ({}) a "
                     "multiple of cluster.gpus_per_node ({})",
                     p.ep, w.cluster.gpus_per_node));
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    fail("parallel.sequence_parallel",
         fmt::format("a mixture of experts with tp = {} needs sequence_parallel: true "
                     "(Megatron-LM's rule: each TP rank routes its share of the tokens)",
                     p.tp));
  }
}

}  // namespace

void validate_workload(const Workload& w) {
  check_sizes(w);
  const std::string src = err_source(w);
  auto fail = [&](const std::string& key, const std::string& what) {
    throw InvalidInput(fmt::format("{}: key '{}': {}", src, key, what));
  };
  const auto& p = w.parallel;
  const auto& b = w.batch;
  if (w.model.heads % p.tp != 0) {
    fail("parallel.tp",
         fmt::format("model heads ({}) must be divisible by tp ({})", w.model.heads, p.tp));
  }
  if (w.model.kv_heads % p.tp != 0) {
    fail("parallel.tp",
         fmt::format("model kv_heads ({}) must be divisible by tp ({})", w.model.kv_heads, p.tp));
  }
  if (w.model.ffn_hidden % p.tp != 0) {
    fail("parallel.tp", fmt::format("model ffn_hidden ({}) must be divisible by tp ({})",
                                    w.model.ffn_hidden, p.tp));
  }
  if (p.virtual_pipeline > 1 && p.pp < 2) {
    fail("parallel.virtual_pipeline",
         fmt::format("{} model chunks per stage need a pipeline: parallel.pp >= 2 (got {})",
                     p.virtual_pipeline, p.pp));
  }
  if (p.virtual_pipeline > 1 && b.micro_batches % p.pp != 0) {
    fail("parallel.virtual_pipeline",
         fmt::format("interleaved 1F1B runs micro-batches in groups of the pipeline size: "
                     "batch.micro_batches ({}) must be a multiple of parallel.pp ({})",
                     b.micro_batches, p.pp));
  }
  if (p.virtual_stages() > w.model.layers) {
    fail(p.virtual_pipeline > 1 ? "parallel.virtual_pipeline" : "parallel.pp",
         fmt::format("pp * virtual_pipeline = {} * {} = {} model chunks for {} layers: every "
                     "chunk needs at least one layer",
                     p.pp, p.virtual_pipeline, p.virtual_stages(), w.model.layers));
  }
  if (static_cast<int>(p.stage_layers.size()) != p.virtual_stages()) {
    fail("parallel.stage_layers",
         p.virtual_pipeline == 1
             ? fmt::format("needs one entry per pipeline stage (pp = {}), got {}", p.pp,
                           p.stage_layers.size())
             : fmt::format("needs one entry per model chunk, pp * virtual_pipeline = {} * {} = "
                           "{} (chunk c of stage s is entry c * pp + s), got {}",
                           p.pp, p.virtual_pipeline, p.virtual_stages(), p.stage_layers.size()));
  }
  for (int l : p.stage_layers) {
    if (l <= 0) fail("parallel.stage_layers", fmt::format("entries must be positive, got {}", l));
  }
  const long long sum = std::accumulate(p.stage_layers.begin(), p.stage_layers.end(), 0LL);
  if (sum != w.model.layers) {
    fail("parallel.stage_layers",
         fmt::format("entries sum to {} but the model has {} layers", sum, w.model.layers));
  }
  if (b.nano_batches != 1 && b.nano_batches != 2) {
    fail("batch.nano_batches", fmt::format("allowed values: 1, 2; got {}", b.nano_batches));
  }
  if (b.micro_batch % b.nano_batches != 0) {
    fail("batch.micro_batch",
         fmt::format("must be divisible by nano_batches ({}), got {}; with micro_batch 1 set "
                     "nano_batches: 1 (or leave it out): overlap needs a micro-batch of at least 2",
                     b.nano_batches, b.micro_batch));
  }
  if (b.seq_len % (2 * p.cp) != 0) {
    fail("batch.seq_len", fmt::format("must be divisible by 2*cp = {} (load-balanced context "
                                      "parallel chunks), got {}",
                                      2 * p.cp, b.seq_len));
  }
  if (p.sequence_parallel && p.tp == 1) {
    fail("parallel.sequence_parallel", "requires tp > 1");
  }
  if (p.sequence_parallel && (b.seq_len / p.cp) % p.tp != 0) {
    fail("parallel.sequence_parallel",
         fmt::format("seq_len/cp ({}) must be divisible by tp ({})", b.seq_len / p.cp, p.tp));
  }
  if (p.tp > w.cluster.gpus_per_node) {
    fail("parallel.tp", fmt::format("tp ({}) must fit inside one node (gpus_per_node = {})", p.tp,
                                    w.cluster.gpus_per_node));
  }
  validate_moe(w, fail);
}

Workload parse_workload(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw InvalidInput(fmt::format("{}: YAML syntax error at line {}, column {}: {}", source,
                                   e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  Section top(root, source, "");
  top.check_keys({"model", "gpu", "cluster", "parallel", "batch", "recompute", "name", "what_if"});

  Workload w;
  w.source = source;
  w.name = std::filesystem::path(source).stem().string();
  if (top.has("name")) w.name = top.string("name");
  try {
    w.model = parse_model(top);
  } catch (const InvalidInput& e) {
    if (top.get("model").IsScalar()) top.fail("model", e.what());
    throw;
  }
  w.gpu_name = top.string("gpu");
  try {
    gpu_by_name(w.gpu_name);
  } catch (const InvalidInput& e) {
    top.fail("gpu", e.what());
  }
  w.cluster = parse_cluster(top.child("cluster"));
  w.parallel = parse_parallel(top.child("parallel"), w.model.layers);
  w.batch = parse_batch(top.child("batch"));
  if (top.has("recompute")) w.recompute = parse_recompute(top);
  w.what_if = top.boolean_or("what_if", false);
  validate_workload(w);
  return w;
}

Workload load_workload(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open workload file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_workload(ss.str(), path);
}

}  // namespace kareus
