// Workload files: presets, the FLOPs formula on all 14 paper workloads, and every error class.
#include "kareus/workload.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"
#include "test_util.h"

namespace kareus {
namespace {

// The issue's formula, written out independently of the kernel graph:
// 3 * sum_layers T*(2h(a+2g)d + 2adh + 6hf + 2sad) + 3*T*2hV, T = tokens per iteration.
double formula_model_flops(double layers, double h, double f, double a, double g, double d,
                           double vocab, double s, double tokens) {
  const double per_layer =
      tokens * (2 * h * (a + 2 * g) * d + 2 * a * d * h + 6 * h * f + 2 * s * a * d);
  return 3 * layers * per_layer + 3 * tokens * 2 * h * vocab;
}

TEST(Workload, PaperSuiteIsComplete) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("workloads/paper"))) {
    if (e.path().extension() == ".yaml") ++n;
  }
  EXPECT_EQ(n, 14);
}

TEST(Workload, PaperSuiteFlopsMatchFormula) {
  for (const char* name : test::kPaperWorkloads) {
    const Workload w = load_workload(test::paper_workload(name));
    EXPECT_EQ(w.cluster.gpus(), 16) << name;
    EXPECT_EQ(w.parallel.pp, 2) << name;
    EXPECT_EQ(w.batch.micro_batches, 8) << name;
    const auto& m = w.model;
    const double tokens = static_cast<double>(w.batch.micro_batch) * w.batch.seq_len * 8;
    const double expect = formula_model_flops(m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads,
                                              m.head_dim, m.vocab, w.batch.seq_len, tokens);
    // Recompute repeats the forward of every layer: one third of the layers' 3x.
    const double layer_fwd = (expect - 3 * tokens * 2 * m.hidden * m.vocab) / 3.0;
    const auto g = build_kernel_graph(w);
    EXPECT_NEAR(g.model_flops_per_iteration / expect, 1.0, 0.01) << name;
    EXPECT_NEAR(g.hardware_flops_per_iteration / (expect + layer_fwd), 1.0, 0.01) << name;
  }
}

TEST(Workload, HandComputedLlama3bFlops) {
  // Llama 3.2 3B, mbs 8, seq 4096, 8 micro-batches: T = 262144 tokens.
  // per layer: 2*3072*(24+16)*128 = 31457280; 2*24*128*3072 = 18874368;
  // 6*3072*8192 = 150994944; 2*4096*24*128 = 25165824; sum 226492416 per token.
  // 3 * 28 * 226492416 * 262144 + 3 * 262144 * 2 * 3072 * 128256
  const double expect = 3.0 * 28 * 226492416.0 * 262144 + 3.0 * 262144 * 2 * 3072 * 128256;
  const auto g = build_kernel_graph(load_workload(test::paper_workload(test::kPaperWorkloads[0])));
  EXPECT_NEAR(g.model_flops_per_iteration / expect, 1.0, 1e-9);
}

TEST(Workload, PresetsMatchPublishedConfigs) {
  const auto l = model_preset("llama3.2-3b");
  EXPECT_EQ(l.layers, 28);
  EXPECT_EQ(l.hidden, 3072);
  EXPECT_EQ(l.kv_heads, 8);
  EXPECT_TRUE(l.tied_embeddings);
  const auto q = model_preset("qwen3-1.7b");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.vocab, 151936);
  const auto b = model_preset("llama3.3-70b");
  EXPECT_EQ(b.layers, 80);
  EXPECT_FALSE(b.tied_embeddings);
}

TEST(Workload, StageLayersDefaultToEvenSplit) {
  const Workload w = parse_workload(R"(
model: llama3.2-3b
gpu: a100-sxm4-40gb
cluster: {nodes: 1, gpus_per_node: 8}
parallel: {tp: 2, pp: 4}
batch: {micro_batch: 2, seq_len: 1024, micro_batches: 4}
)",
                                    "inline.yaml");
  EXPECT_EQ(w.parallel.stage_layers, (std::vector<int>{7, 7, 7, 7}));
  EXPECT_EQ(w.batch.nano_batches, 2);
}

TEST(Workload, VirtualPipelineSplitsLayersOverChunksAndChecksMegatronsRules) {
  const std::string base = R"(
model: llama3.2-3b
gpu: a100-sxm4-40gb
cluster: {nodes: 1, gpus_per_node: 8}
parallel: {tp: 2, pp: 4, virtual_pipeline: VP}
batch: {micro_batch: 2, seq_len: 1024, micro_batches: MB}
)";
  auto job = [&](const std::string& vp, const std::string& mb) {
    std::string t = base;
    t.replace(t.find("VP"), 2, vp);
    t.replace(t.find("MB"), 2, mb);
    return parse_workload(t, "vp.yaml");
  };
  // 28 layers over 4 x 2 chunks: the first four chunks take the remainder.
  const Workload w = job("2", "8");
  EXPECT_EQ(w.parallel.stage_layers, (std::vector<int>{4, 4, 4, 4, 3, 3, 3, 3}));
  EXPECT_EQ(w.parallel.layers_of_stage(0), 7);
  EXPECT_EQ(w.schedule().chunks(), 2);
  auto error_of = [&](const std::string& vp, const std::string& mb) {
    try {
      job(vp, mb);
    } catch (const InvalidInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      error_of("2", "6").find("'parallel.virtual_pipeline': interleaved 1F1B runs "
                              "micro-batches in groups of the pipeline size: "
                              "batch.micro_batches (6) must be a multiple of parallel.pp (4)"),
      std::string::npos);
  EXPECT_NE(error_of("8", "8").find("4 * 8 = 32 model chunks for 28 layers"), std::string::npos);
  EXPECT_NE(error_of("0", "8").find("parallel.virtual_pipeline"), std::string::npos);
}

// ---- Every error class: exit code 2 and a message naming the file and the key.

const char* kGood = R"(model: llama3.2-3b
gpu: a100-sxm4-40gb
cluster: {nodes: 2, gpus_per_node: 8}
parallel: {tp: 8, cp: 1, pp: 2, dp: 1, sequence_parallel: false, stage_layers: [15, 13]}
batch: {micro_batch: 8, seq_len: 4096, micro_batches: 8, nano_batches: 2}
recompute: full
)";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return s.replace(pos, from.size(), to);
}

struct BadCase {
  const char* label;
  std::string yaml;
  const char* key;  ///< must appear in the message
};

TEST(WorkloadErrors, EveryClassExitsTwoNamingFileAndKey) {
  const std::string g = kGood;
  const std::vector<BadCase> cases = {
      {"yaml syntax", replace(g, "batch: {micro_batch", "batch: {{micro_batch"), "line"},
      {"missing key", replace(g, "gpu: a100-sxm4-40gb\n", ""), "'gpu'"},
      {"unknown key", g + "optimizer: adam\n", "'optimizer'"},
      {"unknown nested key", replace(g, "nano_batches: 2", "nano_batch: 2"), "batch.nano_batch"},
      {"wrong type", replace(g, "micro_batch: 8", "micro_batch: eight"), "batch.micro_batch"},
      {"wrong type list", replace(g, "[15, 13]", "fifteen"), "parallel.stage_layers"},
      {"negative size", replace(g, "seq_len: 4096", "seq_len: -4096"), "batch.seq_len"},
      {"zero size", replace(g, "micro_batches: 8", "micro_batches: 0"), "batch.micro_batches"},
      {"gpu count", replace(g, "dp: 1", "dp: 2"), "'parallel'"},
      {"heads not divisible", replace(replace(g, "tp: 8", "tp: 16"), "nodes: 2", "nodes: 4"),
       "parallel.tp"},
      {"kv_heads not divisible",
       replace(replace(replace(g, "model: llama3.2-3b",
                               "model: {layers: 28, hidden: 3072, ffn_hidden: 8192, heads: 24, "
                               "kv_heads: 6, head_dim: 128, vocab: 128256}"),
                       "tp: 8", "tp: 4"),
               "cp: 1", "cp: 2"),
       "parallel.tp"},
      {"stage_layers sum", replace(g, "[15, 13]", "[15, 12]"), "parallel.stage_layers"},
      {"unknown model", replace(g, "llama3.2-3b", "llama9"), "'model'"},
      {"unknown gpu", replace(g, "a100-sxm4-40gb", "tpu-v5"), "'gpu'"},
      {"bad recompute", replace(g, "recompute: full", "recompute: some"), "'recompute'"},
      {"bad nano_batches", replace(g, "nano_batches: 2", "nano_batches: 3"), "batch.nano_batches"},
  };
  test::TempDir tmp;
  for (const auto& c : cases) {
    const std::string path = tmp.write("bad.yaml", c.yaml);
    const auto r = test::run_cli("workload show " + path + " --json");
    EXPECT_EQ(r.exit_code, 2) << c.label << ": " << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << c.label << ": " << r.err;
    EXPECT_NE(r.err.find(c.key), std::string::npos) << c.label << ": " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << c.label;
    EXPECT_TRUE(r.out.empty()) << c.label;
  }
}

TEST(WorkloadErrors, MessagesSayWhatIsAllowed) {
  const std::string g = kGood;
  EXPECT_THROW(
      {
        try {
          parse_workload(replace(g, "a100-sxm4-40gb", "tpu"), "x.yaml");
        } catch (const InvalidInput& e) {
          EXPECT_NE(std::string(e.what()).find("h100-sxm"), std::string::npos);
          throw;
        }
      },
      InvalidInput);
  EXPECT_THROW(
      {
        try {
          parse_workload(g + "foo: 1\n", "x.yaml");
        } catch (const InvalidInput& e) {
          EXPECT_NE(std::string(e.what()).find("allowed keys here: model"), std::string::npos);
          throw;
        }
      },
      InvalidInput);
}

// ---- Size limits: an absurd size stops at load time, naming the key, the limit and why.

std::string limit_message(const std::string& yaml) {
  try {
    parse_workload(yaml, "big.yaml");
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "accepted";
}

TEST(WorkloadLimits, EachSizeAboveItsLimitNamesKeyAndLimit) {
  const std::string g = kGood;
  const std::string custom =
      "model: {layers: 28, hidden: 3072, ffn_hidden: 8192, heads: 24, kv_heads: 8, head_dim: "
      "128, vocab: 128256}";
  struct Case {
    std::string yaml;
    const char* key;
    const char* limit;
  };
  const std::vector<Case> cases = {
      {replace(g, "micro_batches: 8", "micro_batches: 4097"), "batch.micro_batches", "4096"},
      {replace(g, "micro_batch: 8,", "micro_batch: 5000,"), "batch.micro_batch", "4096"},
      {replace(g, "seq_len: 4096", "seq_len: 8388608"), "batch.seq_len", "4194304"},
      {replace(g, "nodes: 2", "nodes: 20000"), "cluster.nodes", "16384"},
      {replace(g, "gpus_per_node: 8", "gpus_per_node: 2048"), "cluster.gpus_per_node", "1024"},
      {replace(g, "dp: 1", "dp: 200000"), "parallel.dp", "131072"},
      {replace(g, "cp: 1", "cp: 2048"), "parallel.cp", "1024"},
      {replace(g, "model: llama3.2-3b", replace(custom, "layers: 28", "layers: 2000")),
       "model.layers", "1024"},
      {replace(g, "model: llama3.2-3b", replace(custom, "vocab: 128256", "vocab: 10000000")),
       "model.vocab", "4194304"},
      {replace(g, "model: llama3.2-3b", replace(custom, "head_dim: 128", "head_dim: 4096")),
       "model.head_dim", "1024"},
      // Within each size's limit, but the product is not: 16384 nodes * 1024 GPUs.
      {replace(replace(g, "nodes: 2", "nodes: 16384"), "gpus_per_node: 8", "gpus_per_node: 1024"),
       "'cluster'", "131072"},
      // 4096 sequences of 4096 tokens = 16777216 tokens is the limit; 8192 is twice that.
      {replace(replace(g, "micro_batch: 8,", "micro_batch: 4096,"), "seq_len: 4096",
               "seq_len: 8192"),
       "'batch'", "16777216"},
      {replace(g, "[15, 13]", "[15, 2000000000]"), "parallel.stage_layers", "model.layers (28)"},
  };
  for (const auto& c : cases) {
    const std::string msg = limit_message(c.yaml);
    EXPECT_NE(msg.find("big.yaml"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.key << ": " << msg;
    EXPECT_NE(msg.find(c.limit), std::string::npos) << c.key << ": " << msg;
  }
}

TEST(WorkloadLimits, LimitsAreInclusiveAndSayWhy) {
  const std::string g = kGood;
  // 4096 micro-batches is allowed; the message for 4097 gives the reason.
  EXPECT_EQ(parse_workload(replace(g, "micro_batches: 8", "micro_batches: 4096"), "ok.yaml")
                .batch.micro_batches,
            4096);
  const std::string msg = limit_message(replace(g, "micro_batches: 8", "micro_batches: 4097"));
  EXPECT_NE(msg.find("4097 is above the limit of 4096"), std::string::npos) << msg;
  EXPECT_NE(msg.find("published global batch"), std::string::npos) << msg;
}

TEST(WorkloadLimits, BillionMicroBatchesExitTwoAtOnce) {
  test::TempDir tmp;
  const std::string path =
      tmp.write("huge.yaml", replace(kGood, "micro_batches: 8", "micro_batches: 1000000000"));
  const auto start = std::chrono::steady_clock::now();
  const auto r = test::run_cli("emulate " + path);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("batch.micro_batches"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("limit of 4096"), std::string::npos) << r.err;
  EXPECT_LT(wall_s, 10.0);
}

TEST(WorkloadLimits, CodeBuiltWorkloadsAreCheckedBeforeArithmetic) {
  Workload w = parse_workload(kGood, "good.yaml");
  // Zero and huge values would divide by zero or overflow int in the checks that follow.
  Workload zero_tp = w;
  zero_tp.parallel.tp = 0;
  EXPECT_THROW(validate_workload(zero_tp), InvalidInput);
  Workload zero_kv = w;
  zero_kv.model.kv_heads = 0;
  EXPECT_THROW(validate_workload(zero_kv), InvalidInput);
  Workload huge = w;
  huge.parallel.dp = 1 << 30;
  huge.parallel.pp = 1 << 30;
  try {
    validate_workload(huge);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pp"), std::string::npos) << e.what();
  }
}

// ---- Duplicate keys: yaml-cpp keeps the first silently; Kareus names the key and both lines.

std::string duplicate_message(const std::string& yaml) {
  try {
    parse_workload(yaml, "dup.yaml");
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "accepted";
}

TEST(WorkloadErrors, DuplicateKeysNameTheKeyAndBothLines) {
  const std::string g =
      kGood;  // lines: 1 model, 2 gpu, 3 cluster, 4 parallel, 5 batch, 6 recompute
  struct Case {
    std::string yaml;
    std::string expected;  ///< the whole message after "dup.yaml: "
  };
  const std::string rest =
      "; allowed: each key once per mapping (YAML would silently keep the first value); remove "
      "one of them";
  const std::vector<Case> cases = {
      // An override appended at the end: today's first-wins would ignore it.
      {g + "recompute: none\n", "key 'recompute': duplicate key at lines 6 and 7" + rest},
      {g + "batch: {micro_batch: 8, seq_len: 8192, micro_batches: 8}\n",
       "key 'batch': duplicate key at lines 5 and 7" + rest},
      // Inside the flow mappings: the same line, so the columns too.
      {replace(g, "nodes: 2, gpus_per_node: 8", "nodes: 2, gpus_per_node: 8, nodes: 1"),
       "key 'cluster.nodes': duplicate key at line 3 (columns 11 and 39)" + rest},
      {replace(g, "micro_batches: 8,", "micro_batches: 8, micro_batches: 4,"),
       "key 'batch.micro_batches': duplicate key at line 5 (columns 40 and 58)" + rest},
      // Block mappings, one level down.
      {replace(g,
               "parallel: {tp: 8, cp: 1, pp: 2, dp: 1, sequence_parallel: false, stage_layers: "
               "[15, 13]}",
               "parallel:\n  tp: 8\n  pp: 2\n  tp: 4\n"),
       "key 'parallel.tp': duplicate key at lines 5 and 7" + rest},
      {replace(g, "model: llama3.2-3b\n",
               "model:\n  layers: 28\n  hidden: 3072\n  ffn_hidden: 8192\n  heads: 24\n"
               "  kv_heads: 8\n  head_dim: 128\n  vocab: 128256\n  hidden: 4096\n"),
       "key 'model.hidden': duplicate key at lines 3 and 9" + rest},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(duplicate_message(c.yaml), "dup.yaml: " + c.expected) << c.yaml;
  }
  // The same key in different mappings is fine.
  EXPECT_EQ(
      parse_workload(replace(g, "recompute: full", "recompute: full\nname: tp"), "ok.yaml").name,
      "tp");
  // Through the CLI: exit 2, the file, the key and both lines.
  test::TempDir tmp;
  const std::string path = tmp.write("dup.yaml", g + "gpu: h100-sxm\n");
  const auto r = test::run_cli("workload show " + path);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(path + ": key 'gpu': duplicate key at lines 2 and 7"), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty());
}

// ---- "Too large" always names the limit, whatever form the number takes.

TEST(WorkloadLimits, TooLargeInAnyNotationNamesTheLimit) {
  const std::string g = kGood;
  struct Case {
    std::string from, to, expected;
  };
  const std::string mb_why =
      " (planning keeps every (stage, micro-batch) pass in memory; 2x the sequences of the "
      "largest published global batch (2048) at one sequence per micro-batch)";
  const std::vector<Case> cases = {
      // Above the int range: used to say "value 100000000000 is too large" without a limit.
      {"micro_batches: 8", "micro_batches: 100000000000",
       "key 'batch.micro_batches': 100000000000 is above the limit of 4096" + mb_why},
      // Exponent notation and beyond 64 bits: used to say "expected a positive integer".
      {"micro_batches: 8", "micro_batches: 1e11",
       "key 'batch.micro_batches': 1e11 is above the limit of 4096" + mb_why},
      {"micro_batches: 8", "micro_batches: 99999999999999999999999",
       "key 'batch.micro_batches': 99999999999999999999999 is above the limit of 4096" + mb_why},
      {"seq_len: 4096", "seq_len: 1e999",
       "key 'batch.seq_len': 1e999 is above the limit of 4194304 (4x the longest trained context "
       "(1M tokens))"},
      // A key without its own limit gets the general one.
      {"nano_batches: 2", "nano_batches: 5000000000",
       "key 'batch.nano_batches': 5000000000 is above the limit of 1000000000 (the largest size "
       "a workload takes)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(limit_message(replace(g, c.from, c.to)), "big.yaml: " + c.expected) << c.to;
  }
  // Small numbers in other notations are still not integers.
  EXPECT_EQ(limit_message(replace(g, "micro_batches: 8", "micro_batches: 2.5")),
            "big.yaml: key 'batch.micro_batches': expected a positive integer, got '2.5'");
}

TEST(WorkloadErrors, MissingFileExitsTwo) {
  const auto r = test::run_cli("workload show /nonexistent/w.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/w.yaml"), std::string::npos);
}

TEST(WorkloadErrors, EmptyAndNonMappingFiles) {
  test::TempDir tmp;
  for (const char* text : {"", "- 1\n- 2\n", "just a string\n"}) {
    const auto r = test::run_cli("workload show " + tmp.write("w.yaml", text));
    EXPECT_EQ(r.exit_code, 2) << text << r.err;
  }
}

}  // namespace
}  // namespace kareus
