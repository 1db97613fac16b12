#include <gtest/gtest.h>

#include <sstream>

#include "kareus/error.h"
#include "kareus/profiler.h"
#include "profiler/builtin.h"
#include "test_util.h"

namespace kareus {
namespace {

// Trace options by field (ProfilerOptions grows; aggregate initialisation would not).
ProfilerOptions trace_options(const std::string& gpu, const std::string& path) {
  ProfilerOptions o;
  o.gpu = gpu;
  o.trace_path = path;
  return o;
}

TEST(TraceProfiler, ReplaysAndRejectsMissingPoints) {
  test::TempDir tmp;
  const std::string csv = tmp.write("t.csv",
                                    "# measured elsewhere\n"
                                    "partition,freq_mhz,sms,slot,time_s,energy_j\n"
                                    "fwd_attn,1410,24,norm,0.002,0.9\n"
                                    "stack_head,1410,0,-,0.001,0.3\n");
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  auto prof = create_profiler("trace", trace_options(w.gpu_name, csv));
  const auto m = prof->measure(ps.partition("fwd_attn"), {1410, 24, "norm"});
  EXPECT_DOUBLE_EQ(m.time_s, 0.002);
  EXPECT_DOUBLE_EQ(m.energy_j, 0.9);
  EXPECT_DOUBLE_EQ(m.static_energy_j, 0.002 * 85);
  Segment head{"stack_head", 0, "forward", {}};
  EXPECT_DOUBLE_EQ(prof->measure_segment(head, 1410).time_s, 0.001);
  try {
    prof->measure(ps.partition("fwd_attn"), {1380, 24, "norm"});
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("freq_mhz=1380"), std::string::npos);
  }
  // Through the CLI: exit code 2.
  const auto r = test::run_cli("profile " + test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096") +
                               " --backend trace --trace " + csv +
                               " --partition fwd_mlp --freq 1410 --sms 24 --slot norm");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no measurement"), std::string::npos);
}

TEST(TraceProfiler, BadFilesAreClearErrors) {
  test::TempDir tmp;
  EXPECT_THROW(create_profiler("trace", trace_options("a100-sxm4-40gb", tmp.file("missing.csv"))),
               InvalidInput);
  EXPECT_THROW(
      create_profiler("trace", trace_options("a100-sxm4-40gb", tmp.write("h.csv", "a,b\n"))),
      InvalidInput);
  EXPECT_THROW(create_profiler(
                   "trace", trace_options("a100-sxm4-40gb",
                                          tmp.write("v.csv",
                                                    "partition,freq_mhz,sms,slot,time_s,energy_j\n"
                                                    "fwd_attn,x,24,norm,0.1,1\n"))),
               InvalidInput);
  EXPECT_THROW(create_profiler("trace", trace_options("a100-sxm4-40gb", "")), InvalidInput);
}

// Fields are read whole: a number with trailing text, an infinite time or an extra column was
// once taken as its prefix or ignored; each is now an error naming the line.
TEST(TraceProfiler, FieldsAreReadWholeAndFinite) {
  const std::string header = "partition,freq_mhz,sms,slot,time_s,energy_j\n";
  for (const char* row : {"fwd_attn,1410x,24,norm,0.1,1", "fwd_attn,1410,24,norm,0.1s,1",
                          "fwd_attn,1410,24,norm,inf,1", "fwd_attn,1410,24,norm,0.1,nan",
                          "fwd_attn,1410,24,norm,0.1,1,extra", "fwd_attn,1410,24,norm,0.1,",
                          "fwd_attn,99999999999,24,norm,0.1,1", "fwd_attn,0,24,norm,0.1,1",
                          "fwd_attn,1410,-1,norm,0.1,1", "fwd_attn, 1410,24,norm,0.1,1"}) {
    std::istringstream in(header + row + "\n");
    try {
      parse_trace_csv(in, "t.csv");
      ADD_FAILURE() << "accepted: " << row;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("t.csv:2:"), std::string::npos) << e.what();
    }
  }
  std::istringstream good(header + "fwd_attn,1410,24,norm,2.5e-3,0\r\n");
  const TraceTable t = parse_trace_csv(good, "t.csv");
  ASSERT_EQ(t.points.size(), 1u);
  const auto& [time_s, energy_j] = t.points.at({"fwd_attn", 1410, 24, "norm"});
  EXPECT_DOUBLE_EQ(time_s, 0.0025);
  EXPECT_DOUBLE_EQ(energy_j, 0.0);
}

}  // namespace
}  // namespace kareus
