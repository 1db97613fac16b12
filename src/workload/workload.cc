// Workload files: YAML parsing and validation. Every error names the file, the dotted key and
// what is allowed, so that a user can fix the file without reading this code.
#include "kareus/workload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "kareus/error.h"

namespace kareus {
namespace {

// Model presets from the models' published configurations (brief section 9).
ModelConfig llama32_3b() {
  return {"llama3.2-3b", 28, 3072, 8192, 24, 8, 128, 128256, true, false};
}
ModelConfig qwen3_17b() { return {"qwen3-1.7b", 28, 2048, 6144, 16, 8, 128, 151936, true, true}; }
ModelConfig llama33_70b() {
  return {"llama3.3-70b", 80, 8192, 28672, 64, 8, 128, 128256, false, false};
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
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (const auto& kv : node_) {
      const auto key = kv.first.as<std::string>();
      if (!ok.count(key)) {
        fail(key, fmt::format("unknown key; allowed keys here: {}", fmt::join(allowed, ", ")));
      }
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
      fail(key, fmt::format("expected a positive integer, got '{}'", scalar_text(n)));
    }
    if (v <= 0) fail(key, fmt::format("must be a positive integer, got {}", v));
    if (v > 1'000'000'000LL) fail(key, fmt::format("value {} is too large", v));
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

ModelConfig parse_model(const Section& top) {
  const YAML::Node n = top.get("model");
  if (n.IsScalar()) return model_preset(n.as<std::string>());  // rethrown below with the file
  Section m = top.child("model");
  m.check_keys({"name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab",
                "tied_embeddings", "qk_norm"});
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
  return c;
}

std::string err_source(const Workload& w) { return w.source.empty() ? "<workload>" : w.source; }

}  // namespace

double Workload::tokens_per_iteration() const {
  return static_cast<double>(batch.micro_batch) * batch.seq_len * batch.micro_batches * parallel.dp;
}

std::vector<std::string> model_preset_names() {
  return {"llama3.2-3b", "qwen3-1.7b", "llama3.3-70b"};
}

ModelConfig model_preset(const std::string& name) {
  if (name == "llama3.2-3b") return llama32_3b();
  if (name == "qwen3-1.7b") return qwen3_17b();
  if (name == "llama3.3-70b") return llama33_70b();
  throw InvalidInput(
      fmt::format("unknown model preset '{}'; presets: {} (or a mapping with "
                  "layers, hidden, ffn_hidden, heads, kv_heads, head_dim, vocab)",
                  name, fmt::join(model_preset_names(), ", ")));
}

void validate_workload(const Workload& w) {
  const std::string src = err_source(w);
  auto fail = [&](const std::string& key, const std::string& what) {
    throw InvalidInput(fmt::format("{}: key '{}': {}", src, key, what));
  };
  const auto& p = w.parallel;
  const int gpus = w.cluster.gpus();
  if (p.tp * p.cp * p.pp * p.dp != gpus) {
    fail("parallel", fmt::format("tp*cp*pp*dp = {}*{}*{}*{} = {} must equal the GPU count "
                                 "cluster.nodes*cluster.gpus_per_node = {}",
                                 p.tp, p.cp, p.pp, p.dp, p.tp * p.cp * p.pp * p.dp, gpus));
  }
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
  if (static_cast<int>(p.stage_layers.size()) != p.pp) {
    fail("parallel.stage_layers",
         fmt::format("needs one entry per pipeline stage (pp = {}), got {}", p.pp,
                     p.stage_layers.size()));
  }
  for (int l : p.stage_layers) {
    if (l <= 0) fail("parallel.stage_layers", fmt::format("entries must be positive, got {}", l));
  }
  const int sum = std::accumulate(p.stage_layers.begin(), p.stage_layers.end(), 0);
  if (sum != w.model.layers) {
    fail("parallel.stage_layers",
         fmt::format("entries sum to {} but the model has {} layers", sum, w.model.layers));
  }
  const auto& b = w.batch;
  if (b.nano_batches != 1 && b.nano_batches != 2) {
    fail("batch.nano_batches", fmt::format("allowed values: 1, 2; got {}", b.nano_batches));
  }
  if (b.micro_batch % b.nano_batches != 0) {
    fail("batch.micro_batch", fmt::format("must be divisible by nano_batches ({}), got {}",
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
}

Workload parse_workload(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw InvalidInput(fmt::format("{}: YAML syntax error at line {}, column {}: {}", source,
                                   e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  Section top(root, source, "");
  top.check_keys({"model", "gpu", "cluster", "parallel", "batch", "recompute", "name"});

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

  Section c = top.child("cluster");
  c.check_keys({"nodes", "gpus_per_node"});
  w.cluster.nodes = c.positive_int("nodes");
  w.cluster.gpus_per_node = c.positive_int("gpus_per_node");

  Section p = top.child("parallel");
  p.check_keys({"tp", "cp", "pp", "dp", "sequence_parallel", "stage_layers"});
  w.parallel.tp = p.positive_int_or("tp", 1);
  w.parallel.cp = p.positive_int_or("cp", 1);
  w.parallel.pp = p.positive_int_or("pp", 1);
  w.parallel.dp = p.positive_int_or("dp", 1);
  w.parallel.sequence_parallel = p.boolean_or("sequence_parallel", false);
  if (p.has("stage_layers")) {
    const YAML::Node sl = p.get("stage_layers");
    if (!sl.IsSequence()) p.fail("stage_layers", "expected a list of positive integers");
    for (std::size_t i = 0; i < sl.size(); ++i) {
      long long v = 0;
      try {
        if (!sl[i].IsScalar()) throw YAML::BadConversion(sl[i].Mark());
        v = sl[i].as<long long>();
      } catch (const YAML::Exception&) {
        p.fail("stage_layers", fmt::format("entry {} is not an integer", i));
      }
      if (v <= 0) p.fail("stage_layers", fmt::format("entry {} must be positive, got {}", i, v));
      w.parallel.stage_layers.push_back(static_cast<int>(v));
    }
  } else {
    // Even split, earlier stages take the remainder (Megatron's default for uneven splits).
    const int pp = w.parallel.pp;
    for (int s = 0; s < pp; ++s) {
      w.parallel.stage_layers.push_back(w.model.layers / pp + (s < w.model.layers % pp ? 1 : 0));
    }
  }

  Section b = top.child("batch");
  b.check_keys({"micro_batch", "seq_len", "micro_batches", "nano_batches"});
  w.batch.micro_batch = b.positive_int("micro_batch");
  w.batch.seq_len = b.positive_int("seq_len");
  w.batch.micro_batches = b.positive_int("micro_batches");
  w.batch.nano_batches = b.positive_int_or("nano_batches", 2);

  if (top.has("recompute")) {
    const std::string r = top.string("recompute");
    if (r == "full") {
      w.recompute = Recompute::kFull;
    } else if (r == "none") {
      w.recompute = Recompute::kNone;
    } else {
      top.fail("recompute", fmt::format("allowed values: full, none; got '{}'", r));
    }
  }
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
