// ProgressBar: its text (percent, counts, rate, ETA), the terminal bar drawn
// only after show_after_s and at most once per redraw_s and erased at the
// end, plain lines at most once per line_every_s elsewhere, nothing when off.
// A fake clock makes the throttling exact.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "coremesh/train/progress_bar.hpp"

using namespace coremesh::train;

namespace {

// Everything a bar writes, read back from a memory stream.
struct Captured {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

ProgressBar::Options options(ProgressBar::Mode mode, std::FILE* out, const double* clock) {
  ProgressBar::Options o;
  o.label = "eval", o.unit = "bytes", o.mode = mode, o.out = out;
  o.clock = [clock] { return *clock; };
  return o;
}

}  // namespace

TEST(ProgressBar, DescribesPercentRateAndEta) {
  // 250 of 1000 in 5 s: 50 per second, 750 left: 15 s.
  EXPECT_EQ(ProgressBar::describe("eval", "bytes", 250, 1000, 5.0), "eval  25% 250/1.00K bytes 50 bytes/s ETA 00:00:15");
  EXPECT_EQ(ProgressBar::describe("eval", "bytes", 36000, 87420, 7.2),
            "eval  41% 36.00K/87.42K bytes 5.00K bytes/s ETA 00:00:10");
  // Nothing done yet: no rate, no ETA.
  EXPECT_EQ(ProgressBar::describe("v", "batches", 0, 16, 0.0), "v   0% 0/16 batches 0 batches/s ETA --:--:--");
  EXPECT_EQ(ProgressBar::describe("v", "batches", 16, 16, 2.0), "v 100% 16/16 batches 8 batches/s ETA 00:00:00");
}

TEST(ProgressBar, TerminalBarWaitsThrottlesAndErasesItself) {
  Captured out;
  double t = 100;
  {
    ProgressBar bar(100, options(ProgressBar::Mode::terminal, out.f, &t));
    bar.set(10);  // at 0 s: too early to show
    t += 0.4, bar.set(20);
    EXPECT_EQ(out.text(), "");
    t += 0.2, bar.set(30);  // 0.6 s: drawn
    EXPECT_EQ(count(out.text(), "\r\x1b[2K"), 1u);
    EXPECT_NE(out.text().find("eval [#######                 ]  30% 30/100 bytes"), std::string::npos) << out.text();
    for (int i = 0; i < 5; ++i) t += 0.01, bar.advance();  // within redraw_s of the last draw: not drawn
    EXPECT_EQ(count(out.text(), "\r\x1b[2K"), 1u);
    t += 0.1, bar.advance();
    EXPECT_EQ(count(out.text(), "\r\x1b[2K"), 2u);
    EXPECT_NE(out.text().find(" 36% 36/100"), std::string::npos);
    EXPECT_EQ(out.text().find('\n'), std::string::npos);  // one line, redrawn in place
  }  // the destructor erases the bar
  const std::string s = out.text();
  EXPECT_EQ(s.substr(s.size() - 5), "\r\x1b[2K");
  EXPECT_EQ(s.find('\n'), std::string::npos);
}

TEST(ProgressBar, ShortWorkOnATerminalShowsNothing) {
  Captured out;
  double t = 0;
  {
    ProgressBar bar(4, options(ProgressBar::Mode::terminal, out.f, &t));
    for (int i = 0; i < 4; ++i) t += 0.1, bar.advance();
  }
  EXPECT_EQ(out.text(), "");
}

TEST(ProgressBar, PlainLinesEveryIntervalWithoutEscapes) {
  Captured out;
  double t = 0;
  ProgressBar bar(1000, options(ProgressBar::Mode::lines, out.f, &t));
  for (int s = 1; s <= 25; ++s) t = s, bar.set(s * 10);  // 25 s at 10 units a second
  bar.finish();
  t = 26, bar.set(260);  // after finish(): nothing
  const std::string s = out.text();
  EXPECT_EQ(s, "eval  10% 100/1.00K bytes 10 bytes/s ETA 00:01:30\n"
               "eval  20% 200/1.00K bytes 10 bytes/s ETA 00:01:20\n");
}

TEST(ProgressBar, OffPrintsNothing) {
  Captured out;
  double t = 0;
  ProgressBar bar(10, options(ProgressBar::Mode::off, out.f, &t));
  for (int i = 0; i < 10; ++i) t += 20, bar.advance();
  bar.finish();
  EXPECT_EQ(out.text(), "");
  EXPECT_EQ(bar.mode(), ProgressBar::Mode::off);
}

TEST(ProgressBar, AutomaticIsLinesWhenNotATerminal) {
  Captured out;  // a memory stream is no terminal
  ProgressBar bar(10, {.label = "x", .unit = "u", .out = out.f});
  EXPECT_EQ(bar.mode(), ProgressBar::Mode::lines);
}
