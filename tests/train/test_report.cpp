// The HTML report: self-contained, and rendered by headless Chromium into a
// picture that is not blank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "coremesh/train/report.hpp"
#include "test_util.hpp"

using namespace coremesh::train;

static ReportData sample_report() {
  ReportData d;
  d.summary = {{"model", "4 layers, top-2 of 8 experts"}, {"steps", "200"}};
  for (int s = 0; s < 200; ++s) {
    StepRecord r;
    r.step = s;
    r.loss = 5.5 * std::exp(-s / 60.0) + 1.2;
    r.tokens_per_s = 20000 + 500 * std::sin(s / 10.0);
    r.lr = 1e-3;
    r.grad_norm = 1.0 / (1 + s / 50.0);
    d.steps.push_back(r);
    if (s % 25 == 24) d.validation.push_back({s, r.loss + 0.1});
    if (s % 5 == 0) {
      ExpertLoadRecord e{s, {}};
      for (int l = 0; l < 3; ++l) {
        std::vector<double> load(8);
        for (int x = 0; x < 8; ++x) load[x] = (1 + 0.8 * std::sin(x + s / 40.0 + l)) / 8;
        e.load.push_back(load);
      }
      d.expert_load.push_back(e);
    }
  }
  d.schedule = "1f1b on 2 ranks, 2 micro-batches";
  const char* actions[2][4] = {{"0F0", "0F1", "0B0", "0B1"}, {"0F0", "0B0", "0F1", "0B1"}};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i)
      d.executed.push_back({r, actions[r][i], std::string(1, actions[r][i][1]), 1.0 * i + r, 1.0 * i + r + 0.8});
  d.executed.push_back({1, "0RECV_F0", "p2p", 0.0, 0.9});
  return d;
}

TEST(Report, IsSelfContained) {
  std::string html = render_report_html(sample_report());
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Expert load"), std::string::npos);
  EXPECT_NE(html.find("polyline"), std::string::npos);
  // the balance over time, a line per MoE layer (the sample has 3)
  EXPECT_NE(html.find("Expert balance per MoE layer"), std::string::npos);
  EXPECT_NE(html.find("MoE layer 2"), std::string::npos);
  EXPECT_EQ(html.find("MoE layer 3"), std::string::npos);
  // the executed schedule: a box per action, its token and times in its title
  EXPECT_NE(html.find("Executed schedule, last step: 1f1b on 2 ranks"), std::string::npos);
  EXPECT_NE(html.find("<title>0B1 4.000-4.800 ms</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>0RECV_F0 0.000-0.900 ms</title>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  // The only URL is the SVG namespace name, which is never fetched.
  size_t pos = 0;
  while ((pos = html.find("http", pos)) != std::string::npos) {
    EXPECT_EQ(html.compare(pos, 26, "http://www.w3.org/2000/svg"), 0);
    pos += 4;
  }
}

static std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

TEST(Report, RendersNonBlankInHeadlessChromium) {
  std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  TempDir d;
  std::string html = write_report(d.path + "/report.html", sample_report());
  std::string png = d.path + "/shot.png";
  std::string cmd = chromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                    " --disable-background-networking --disable-component-update --disable-sync"
                    " --user-data-dir=" + d.path + "/profile --screenshot=" + png +
                    " --window-size=1200,900 file://" + html + " >" + d.path + "/chromium.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_TRUE(std::filesystem::exists(png));
  if (const char* keep = std::getenv("COREMESH_KEEP_REPORT_PNG")) std::filesystem::copy_file(png, keep, std::filesystem::copy_options::overwrite_existing);
  std::string stats_cmd = "/usr/bin/python3 " + source_root() + "/tests/train/png_stats.py " + png;
  std::FILE* p = ::popen(stats_cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  int w = 0, h = 0, colors = 0;
  double nonwhite = 0;
  ASSERT_EQ(std::fscanf(p, "%d %d %lf %d", &w, &h, &nonwhite, &colors), 4);
  ::pclose(p);
  EXPECT_EQ(w, 1200);
  EXPECT_EQ(h, 900);
  // Charts, axes and the heatmap cover a good part of the page in many colours.
  EXPECT_GT(nonwhite, 0.08) << "nonwhite fraction " << nonwhite;
  EXPECT_GT(colors, 50);
}
