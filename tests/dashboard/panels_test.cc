// Data → panels: which panels a run gets, overlaid runs and their labels, --metrics choices,
// log axes, run names; axis ticks and their labels.
#include <gtest/gtest.h>

#include "dashboard/axis.h"
#include "dashboard/panels.h"
#include "test_util.h"

namespace astrai::dashboard {
namespace {

using testing::error_of;

RunRecords seq_run(const std::string& name, int steps) {
  RunRecords r{name, {}};
  r.records.push_back({{"step", 0}, {"val_loss", 4.0}});
  for (int s = 1; s <= steps; ++s) {
    Json rec{{"step", s}, {"loss", 4.0 / s}, {"lr", 1e-3 * s / steps}, {"grad_norm", 1.0 + s},
             {"tokens_per_s", 1000.0 * s}, {"step_seconds", 0.5}};
    if (s % 5 == 0) rec["val_loss"] = 4.5 / s;
    r.records.push_back(rec);
  }
  return r;
}

RunRecords dpo_run(const std::string& name) {
  RunRecords r{name, {}};
  for (int s = 1; s <= 4; ++s)
    r.records.push_back({{"step", s}, {"loss", 0.69 - 0.1 * s}, {"lr", 1e-4}, {"grad_norm", 0.5}, {"tokens_per_s", 50.0},
                         {"rewards_chosen", 0.1 * s}, {"rewards_rejected", -0.1 * s}, {"rewards_margin", 0.2 * s},
                         {"rewards_accuracy", 0.25 * s}});
  return r;
}

std::vector<std::string> names_of(const std::vector<Panel>& panels) {
  std::vector<std::string> out;
  for (const Panel& p : panels) out.push_back(p.spec.name);
  return out;
}

TEST(Panels, SeqRunGetsLossWithValidationAndTheRates) {
  const auto panels = build_panels({seq_run("a", 20)}, {}, {});
  EXPECT_EQ(names_of(panels), (std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_s", "step_seconds"}));
  const Panel& loss = panels[0];
  ASSERT_EQ(loss.series.size(), 2u);
  EXPECT_EQ(loss.series[0].key, "loss");
  EXPECT_EQ(loss.series[0].points.size(), 20u);
  EXPECT_EQ(loss.series[0].points[3].x, 4);
  EXPECT_DOUBLE_EQ(loss.series[0].points[3].y, 1.0);
  EXPECT_EQ(loss.series[1].key, "val_loss");
  ASSERT_EQ(loss.series[1].points.size(), 5u);  // step 0 and every 5th
  EXPECT_EQ(loss.series[1].points[0].x, 0);
  EXPECT_EQ(loss.series[0].label, "loss");  // one run: the key
  EXPECT_FALSE(loss.log_y);
}

TEST(Panels, OverlaidRunsAreLabelledByRun) {
  const auto panels = build_panels({seq_run("base", 10), dpo_run("dpo")}, {}, {});
  EXPECT_EQ(names_of(panels), (std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_s", "step_seconds",
                                                        "rewards_margin", "rewards_accuracy", "rewards_chosen"}));
  const Panel& loss = panels[0];
  ASSERT_EQ(loss.series.size(), 3u);
  EXPECT_EQ(loss.series[0].label, "base loss");
  EXPECT_EQ(loss.series[1].label, "base val_loss");
  EXPECT_EQ(loss.series[2].label, "dpo loss");
  EXPECT_EQ(loss.series[2].run, 1u);
  const Panel& lr = panels[1];
  ASSERT_EQ(lr.series.size(), 2u);
  EXPECT_EQ(lr.series[0].label, "base");  // one key: the run's name
  EXPECT_EQ(lr.series[1].label, "dpo");
  const Panel& margin = panels[5];
  ASSERT_EQ(margin.series.size(), 1u);
  EXPECT_EQ(margin.series[0].run, 1u);
  EXPECT_DOUBLE_EQ(margin.series[0].points.back().y, 0.8);
}

TEST(Panels, ChosenMetricsInOrderAndAnyNumericKey) {
  RunRecords grpo{"g", {{{"step", 1}, {"loss", 0.1}, {"reward_mean", 0.5}, {"kl", 0.0}, {"staleness", 1}}}};
  const auto panels = build_panels({grpo}, {"kl", "loss", "staleness"}, {});
  EXPECT_EQ(names_of(panels), (std::vector<std::string>{"kl", "loss", "staleness"}));
  EXPECT_EQ(panels[2].spec.keys, std::vector<std::string>{"staleness"});
}

TEST(Panels, UnknownOrAbsentMetricIsAnError) {
  const auto runs = std::vector<RunRecords>{seq_run("a", 3)};
  const std::string unknown = error_of([&] { build_panels(runs, {"los"}, {}); });
  EXPECT_NE(unknown.find("unknown metric \"los\""), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("grad_norm"), std::string::npos) << unknown;  // lists the known ones
  const std::string absent = error_of([&] { build_panels(runs, {"kl"}, {}); });
  EXPECT_NE(absent.find("\"kl\" is in none of the runs"), std::string::npos) << absent;
}

TEST(Panels, LogAxisOnlyForDrawnPositivePanels) {
  const auto runs = std::vector<RunRecords>{seq_run("a", 3), dpo_run("d")};
  const auto panels = build_panels(runs, {"loss", "rewards_chosen"}, {"loss"});
  EXPECT_TRUE(panels[0].log_y);
  EXPECT_FALSE(panels[1].log_y);
  EXPECT_NE(error_of([&] { build_panels(runs, {"rewards_chosen"}, {"rewards_chosen"}); }).find("values > 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { build_panels(runs, {"loss"}, {"lr"}); }).find("no such panel"), std::string::npos);
}

TEST(Panels, RunNamesAreDirectoryNamesUnlessTheyClash) {
  EXPECT_EQ(run_names({"runs/a", "runs/b/", "/x/c"}), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(run_names({"x/run", "y/run", "z"}), (std::vector<std::string>{"x/run", "y/run", "z"}));
}

TEST(Panels, SplitNames) {
  EXPECT_EQ(split_names("loss, lr ,kl", "--metrics"), (std::vector<std::string>{"loss", "lr", "kl"}));
  EXPECT_NE(error_of([] { split_names("loss,,lr", "--metrics"); }).find("--metrics: empty name"), std::string::npos);
}

TEST(Axis, LinearTicksAreRoundAndCoverTheData) {
  const Axis a = make_axis(0.37, 4.2, false, 5);
  EXPECT_LE(a.lo, 0.37);
  EXPECT_GE(a.hi, 4.2);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0", "1", "2", "3", "4", "5"}));
  EXPECT_DOUBLE_EQ(a.fraction(a.lo), 0);
  EXPECT_DOUBLE_EQ(a.fraction(a.hi), 1);
  const Axis small = make_axis(0.0, 3e-4, false, 3);
  EXPECT_EQ(small.labels, (std::vector<std::string>{"0", "1e-4", "2e-4", "3e-4"}));
  const Axis fine = make_axis(2.31, 2.38, false, 4);
  EXPECT_EQ(fine.labels.front(), "2.3");
  EXPECT_EQ(fine.labels[1], "2.32");
  EXPECT_EQ(make_axis(1, 4, false, 8, 1).labels, (std::vector<std::string>{"1", "2", "3", "4"}));  // whole steps
  const Axis flat = make_axis(5, 5, false, 4);  // one value: a range around it
  EXPECT_LT(flat.lo, 5);
  EXPECT_GT(flat.hi, 5);
}

TEST(Axis, LogTicksArePowersOfTen) {
  const Axis a = make_axis(0.02, 350, true, 8);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0.01", "0.1", "1", "10", "100", "1000"}));
  EXPECT_NEAR(a.fraction(1), 2.0 / 5.0, 1e-12);
  // Over at most two decades, 2 and 5 times the powers too.
  const Axis narrow = make_axis(1.5, 5.5, true, 5);
  EXPECT_EQ(narrow.labels, (std::vector<std::string>{"1", "2", "5", "10"}));
  EXPECT_EQ(tick_label(1e-5, 0, 1e-5), "1e-5");
  EXPECT_EQ(tick_label(2.5e6, 5e5, 3e6), "2.5e6");
  EXPECT_EQ(tick_label(12000, 2000, 14000), "12000");
  EXPECT_EQ(tick_label(-0.5, 0.25, 1), "-0.5");
  // One style per linear axis: 0..0.001 in decimals, 0..3e-4 in exponents.
  EXPECT_EQ(make_axis(0, 1e-3, false, 2).labels, (std::vector<std::string>{"0", "0.0005", "0.001"}));
}

}  // namespace
}  // namespace astrai::dashboard
