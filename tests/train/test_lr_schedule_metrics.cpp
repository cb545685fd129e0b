// LR schedule, balance metric, number formatting, the progress display and
// the per-step log.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/train/metrics.hpp"
#include "coremesh/train/lr_schedule.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

TEST(Schedule, WarmupThenCosine) {
  LrSchedule s{1e-3, 1e-4, 10, 110};
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);                   // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-12);  // halfway
  EXPECT_NEAR(s.at(109), 1e-4, 1e-6);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int i = 11; i < 110; ++i) EXPECT_LE(s.at(i), s.at(i - 1));
}

TEST(Schedule, InvalidSettingsAreRejected) {
  EXPECT_THROW((LrSchedule{-1, 0, 0, 10}.validate()), InvalidArgument);
  EXPECT_THROW((LrSchedule{1e-3, 1e-2, 0, 10}.validate()), InvalidArgument);
  EXPECT_THROW((LrSchedule{1e-3, 0, 20, 10}.validate()), InvalidArgument);
}

TEST(Metrics, ExpertBalance) {
  EXPECT_DOUBLE_EQ(expert_balance({5, 5, 5, 5}), 1.0);
  EXPECT_DOUBLE_EQ(expert_balance({20, 0, 0, 0}), 4.0);
  EXPECT_DOUBLE_EQ(expert_balance({3, 1}), 1.5);
  EXPECT_DOUBLE_EQ(expert_balance({}), 0.0);
}

TEST(Metrics, Formatting) {
  EXPECT_EQ(format_duration(3725), "01:02:05");
  EXPECT_EQ(format_count(12345678), "12.35M");
  EXPECT_EQ(format_bytes(3 * 1024.0 * 1024 * 1024), "3.0 GiB");
}

TEST(Metrics, MeasuredPeakIsPlausible) {
  double peak = measured_peak_flops(1);
  EXPECT_GT(peak, 1e9);    // any machine this runs on does > 1 GFLOP/s
  EXPECT_LT(peak, 1e13);
  EXPECT_DOUBLE_EQ(measured_peak_flops(2), 2 * peak);
  const double again = remeasure_peak_flops(1);  // keeps the higher of the two
  EXPECT_GE(again, peak);
  EXPECT_DOUBLE_EQ(measured_peak_flops(1), again);
}

static std::string capture(bool tty) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  {
    Progress p(4, 0, 2, f, tty ? 1 : 0);
    for (int s = 0; s < 4; ++s) {
      StepRecord r;
      r.step = s;
      r.loss = 2.0 - 0.1 * s;
      r.tokens_per_s = 1000;
      p.update(r, s == 3 ? 1.5 : -1);
    }
    p.message("saved checkpoint");
    p.finish();
  }
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

TEST(Metrics, ProgressPlainLinesOffATerminal) {
  std::string out = capture(false);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_NE(out.find("step 2/4 loss 1.9000"), std::string::npos) << out;
  EXPECT_NE(out.find("step 4/4 loss 1.7000 val 1.5000"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 1/4"), std::string::npos) << out;  // log_every = 2
}

TEST(Metrics, ProgressBarWithEtaOnATerminal) {
  std::string out = capture(true);
  EXPECT_NE(out.find("\r\x1b[2K["), std::string::npos);
  EXPECT_NE(out.find("100%"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("saved checkpoint\n"), std::string::npos) << out;
}

