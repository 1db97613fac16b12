#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/search.h"
#include "kareus/search_prior.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(SearchPrior, UnknownNameListsTheRegisteredOnes) {
  try {
    create_search_prior("nope", {});
    FAIL() << "no exception";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("unknown search prior 'nope'; available: emulator, store"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(create_search_prior("store", {}), InvalidInput);     // no store
  EXPECT_THROW(create_search_prior("emulator", {}), InvalidInput);  // no emulator
}

// A hand-built response on a 6 x 3 x 2 space: log y = additive part + an interaction g that no
// additive model can fit, plus a small seeded perturbation.
struct Synthetic {
  SearchSpace space{{900, 1000, 1100, 1200, 1300, 1400}, {4, 8, 12}, {"a", "b"}};
  std::vector<std::size_t> index;
  std::vector<double> g_all, log_y;

  Synthetic() {
    for (std::size_t i = 0; i < space.size(); ++i) {
      // Interaction: a sign pattern over (clock, choice) with amplitude 0.05 (5%).
      g_all.push_back(0.05 * std::sin(2.7 * static_cast<double>(i) + 0.3));
    }
    // Every other configuration measured: 54 points, enough for 5 folds.
    for (std::size_t i = 0; i < space.size(); i += 2) {
      const auto c = space.at(i);
      const double additive = -0.001 * c.freq_mhz + 0.01 * c.sms + (c.slot == "a" ? 0.0 : 0.02);
      const double jitter = 0.002 * std::cos(11.0 * static_cast<double>(i));
      index.push_back(i);
      log_y.push_back(additive + g_all[i] + jitter);
    }
  }
  std::vector<double> z(double scale) const {
    std::vector<double> out;
    for (std::size_t i : index) out.push_back(scale * g_all[i]);
    return out;
  }
};

TEST(SearchPrior, WeightIsOneForAPerfectPriorAndZeroForAMisleadingOne) {
  Synthetic s;
  const double pseudo = SearchOptions{}.choice_pseudo_count;  // the search's own shrinkage
  EXPECT_EQ(choose_prior_weight(s.space, s.index, s.log_y, s.z(1.0), 100, 1, pseudo), 1.0);
  // Half the interaction's size: the data ask for z's full weight twice over, 1 is closest.
  EXPECT_EQ(choose_prior_weight(s.space, s.index, s.log_y, s.z(0.5), 100, 1, pseudo), 1.0);
  // Twice its size: 1/2 explains it exactly.
  EXPECT_EQ(choose_prior_weight(s.space, s.index, s.log_y, s.z(2.0), 100, 1, pseudo), 0.5);
  // The opposite shape, or a constant (no information): the cold model.
  EXPECT_EQ(choose_prior_weight(s.space, s.index, s.log_y, s.z(-1.0), 100, 1, pseudo), 0.0);
  EXPECT_EQ(choose_prior_weight(s.space, s.index, s.log_y, std::vector<double>(s.index.size(), 0.3),
                                100, 1, pseudo),
            0.0);
  // Too few points for 5 folds: off.
  const std::vector<std::size_t> few(s.index.begin(), s.index.begin() + 9);
  const std::vector<double> few_y(s.log_y.begin(), s.log_y.begin() + 9);
  const auto z = s.z(1.0);
  EXPECT_EQ(choose_prior_weight(s.space, few, few_y, {z.begin(), z.begin() + 9}, 100, 1, pseudo),
            0.0);
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n;
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

StoredPartition exhaustive(Profiler& prof, const Partition& p) {
  StoredPartition out{partition_shape(p), prof.fingerprint(), {}};
  for (const auto& c : make_search_space(p, prof.gpu()).configs()) {
    out.points.emplace_back(c, prof.measure(p, c));
  }
  return out;
}

// The store prior trained on fwd_mlp at micro-batch 8 (sequences 4096 and 8192) predicts the
// shape of fwd_mlp's response at micro-batch 16, which it never saw: the emulator's exact log
// time over the whole space, centred, against the prediction.
TEST(SearchPrior, StorePriorPredictsARelatedPartitionsResponse) {
  const Workload w8 = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const Workload w8l = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq8192"));
  const Workload w16 = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs16_seq4096"));
  EmulatorProfiler exact(test::emulator_options(w8.gpu_name, 0.0, 1));
  const auto p8 = partition_workload(w8).partition("fwd_mlp");
  const auto p8l = partition_workload(w8l).partition("fwd_mlp");
  const auto p16 = partition_workload(w16).partition("fwd_mlp");
  ASSERT_NE(p8.signature, p16.signature);
  const std::vector<StoredPartition> related = {exhaustive(exact, p8), exhaustive(exact, p8l)};
  auto prior = make_store_prior([&](const Partition&) { return related; });
  EXPECT_EQ(prior->name(), "store");
  const auto space = make_search_space(p16, exact.gpu());
  const PriorPrediction z = prior->predict(p16, space);
  ASSERT_EQ(z.log_time_s.size(), space.size());
  std::vector<double> truth_t, truth_d;
  for (const auto& c : space.configs()) {
    const auto m = exact.measure(p16, c);
    truth_t.push_back(std::log(m.time_s));
    truth_d.push_back(std::log(m.dynamic_energy_j));
  }
  EXPECT_GT(pearson(truth_t, z.log_time_s), 0.95);
  EXPECT_GT(pearson(truth_d, z.log_dynamic_energy_j), 0.95);
  // Centred, the prediction is close in size too: RMS error under a fifth of the spread.
  const double mt = std::accumulate(truth_t.begin(), truth_t.end(), 0.0) / truth_t.size();
  const double mz = std::accumulate(z.log_time_s.begin(), z.log_time_s.end(), 0.0) / truth_t.size();
  double err = 0, spread = 0;
  for (std::size_t i = 0; i < truth_t.size(); ++i) {
    err += std::pow((truth_t[i] - mt) - (z.log_time_s[i] - mz), 2);
    spread += std::pow(truth_t[i] - mt, 2);
  }
  EXPECT_LT(std::sqrt(err / spread), 0.2);
  // Additive in (clock) + (SMs, slot): each value is its clock's mean plus its choice's mean
  // less the grand mean, for every objective.
  for (const auto* v : {&z.log_time_s, &z.log_energy_j, &z.log_dynamic_energy_j}) {
    std::map<int, std::vector<double>> by_clock;
    std::map<std::pair<int, std::string>, std::vector<double>> by_choice;
    const auto configs = space.configs();
    for (std::size_t i = 0; i < configs.size(); ++i) {
      by_clock[configs[i].freq_mhz].push_back((*v)[i]);
      by_choice[{configs[i].sms, configs[i].slot}].push_back((*v)[i]);
    }
    auto mean = [](const std::vector<double>& x) {
      return std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
    };
    const double grand = mean(*v);
    double interaction = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const double additive = mean(by_clock[configs[i].freq_mhz]) +
                              mean(by_choice[{configs[i].sms, configs[i].slot}]) - grand;
      interaction = std::max(interaction, std::abs((*v)[i] - additive));
    }
    EXPECT_LT(interaction, 1e-9);
  }
  // Nothing related: no prediction, the search runs cold.
  auto empty = make_store_prior([](const Partition&) { return std::vector<StoredPartition>{}; });
  EXPECT_TRUE(empty->predict(p16, space).empty());
}

// End to end: mbo with the exact emulator as prior on the noisy emulator gives it weight; the
// same prior inverted gets none in the selection.
TEST(SearchPrior, MboWeighsAnExactPriorAndSwitchesOffAnInvertedOne) {
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const Partition p = partition_workload(w).partition("fwd_attn");
  EmulatorProfiler exact(test::emulator_options(w.gpu_name, 0.0, 1));
  EmulatorProfiler noisy(test::emulator_options(w.gpu_name, 0.01, 1));
  const auto space = make_search_space(p, noisy.gpu());
  class Inverted : public SearchPrior {
   public:
    explicit Inverted(Profiler& e) : inner_(make_profiler_prior(e)) {}
    std::string name() const override { return "inverted"; }
    PriorPrediction predict(const Partition& p, const SearchSpace& s) override {
      auto z = inner_->predict(p, s);
      for (auto* v : {&z.log_time_s, &z.log_energy_j, &z.log_dynamic_energy_j})
        for (double& x : *v) x = -x;
      return z;
    }

   private:
    std::unique_ptr<SearchPrior> inner_;
  };
  SearchOptions o;
  o.budget = 56;
  o.prior = make_profiler_prior(exact);
  CachedProfiler cp(noisy, nullptr);
  const auto good = create_search_strategy("mbo")->run(p, space, cp, o, {});
  EXPECT_EQ(good.prior, "emulator");
  EXPECT_EQ(good.prior_prediction.log_time_s.size(), space.size());
  EXPECT_GT(good.beta_time, 0);
  EXPECT_GT(good.beta_select_time, 0);
  EXPECT_GT(good.beta_select_energy, 0);
  o.prior = std::make_shared<Inverted>(exact);
  CachedProfiler cp2(noisy, nullptr);
  const auto bad = create_search_strategy("mbo")->run(p, space, cp2, o, {});
  EXPECT_EQ(bad.prior, "inverted");
  EXPECT_EQ(bad.beta_select_time, 0);
  EXPECT_EQ(bad.beta_select_energy, 0);
  EXPECT_EQ(bad.beta_time, 0);
  // The exact prior ranks the first 10 points as measured: the other 11 follow its front. The
  // inverted one does not: the initial design is the cold search's, point for point.
  EXPECT_TRUE(good.prior_seeded);
  EXPECT_FALSE(bad.prior_seeded);
  SearchOptions cold_o = o;
  cold_o.prior = nullptr;
  CachedProfiler cp3(noisy, nullptr);
  const auto cold = create_search_strategy("mbo")->run(p, space, cp3, cold_o, {});
  for (std::size_t i = 0; i < static_cast<std::size_t>(o.initial_points); ++i) {
    EXPECT_EQ(bad.points[i].config.freq_mhz, cold.points[i].config.freq_mhz) << i;
    EXPECT_EQ(bad.points[i].config.sms, cold.points[i].config.sms) << i;
    EXPECT_EQ(bad.points[i].config.slot, cold.points[i].config.slot) << i;
  }
  // A prior needs the additive surrogate.
  o.surrogate = "trees";
  EXPECT_THROW(create_search_strategy("mbo")->run(p, space, cp2, o, {}), InvalidInput);
}

}  // namespace
}  // namespace kareus
