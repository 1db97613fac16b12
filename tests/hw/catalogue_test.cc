#include <gtest/gtest.h>

#include "kareus/error.h"
#include "kareus/hw.h"

namespace kareus {
namespace {

TEST(Catalogue, A100ClockTable) {
  const auto& g = gpu_by_name("a100-sxm4-40gb");
  const auto f = g.supported_freqs_mhz();
  ASSERT_EQ(f.size(), 81u);  // (1410 - 210) / 15 + 1
  EXPECT_EQ(f.front(), 210);
  EXPECT_EQ(f.back(), 1410);
  const auto s = g.candidate_freqs_mhz();
  ASSERT_EQ(s.size(), 18u);  // 1410, 1380, ..., 900
  EXPECT_EQ(s.front(), 1410);
  EXPECT_EQ(s.back(), 900);
  EXPECT_TRUE(g.supports_freq(1395));
  EXPECT_FALSE(g.supports_freq(1400));
  EXPECT_FALSE(g.supports_freq(1425));
  EXPECT_EQ(g.sm_count, 108);
  EXPECT_DOUBLE_EQ(g.static_power_w, 85.0);
}

TEST(Catalogue, A40SearchRange) {
  const auto s = gpu_by_name("a40").candidate_freqs_mhz();
  EXPECT_EQ(s.front(), 1740);
  EXPECT_EQ(s.back(), 900);
  EXPECT_DOUBLE_EQ(gpu_by_name("a40").static_power_w, 70.0);
}

TEST(Catalogue, EveryEntryIsComplete) {
  for (const auto& name : gpu_names()) {
    const auto& g = gpu_by_name(name);
    EXPECT_GT(g.sm_count, 0) << name;
    EXPECT_GT(g.bf16_peak_tflops, 0) << name;
    EXPECT_GT(g.hbm_bandwidth_gbs, 0) << name;
    EXPECT_GT(g.static_power_w, 0) << name;
    EXPECT_LT(g.static_power_w, g.tdp_w) << name;
    EXPECT_TRUE(g.supports_freq(g.search_max_freq_mhz)) << name;
    EXPECT_TRUE(g.supports_freq(g.search_min_freq_mhz)) << name;
    // Best-case kernel efficiencies are fractions of the peak, forward attention above
    // backward (FlashAttention-2 and cuDNN on A100 and H100), each with its source.
    EXPECT_GT(g.gemm_best_efficiency, 0.5) << name;
    EXPECT_LT(g.gemm_best_efficiency, 1.0) << name;
    EXPECT_GT(g.attn_fwd_best_efficiency, g.attn_bwd_best_efficiency) << name;
    EXPECT_GT(g.attn_bwd_best_efficiency, 0.3) << name;
    EXPECT_FALSE(g.kernel_source.empty()) << name;
  }
  EXPECT_EQ(gpu_names().size(), 5u);
}

TEST(Catalogue, UnknownNameListsKnownOnes) {
  try {
    gpu_by_name("v100");
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("v100"), std::string::npos);
    EXPECT_NE(m.find("a100-sxm4-40gb"), std::string::npos);
    EXPECT_NE(m.find("h200"), std::string::npos);
  }
}

// One wording of the clock rule for every caller (search space, thermal target, plans, flags).
TEST(Catalogue, RequireFreqNamesTheValueAndTheRule) {
  const auto& g = gpu_by_name("a100-sxm4-40gb");
  EXPECT_NO_THROW(g.require_freq(1395, "--freq 1395"));
  try {
    g.require_freq(1400, "--freq 1400");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_STREQ(e.what(), "--freq 1400: a100-sxm4-40gb supports 210..1410 MHz in 15 MHz steps");
  }
  // Untuned work (P2P messages, reductions) runs at the top clock with NCCL's default CTAs.
  EXPECT_EQ(g.p2p_reduction_freq_mhz(), 1410);
  EXPECT_EQ(g.segment_collective_sms(), 24);
}

}  // namespace
}  // namespace kareus
