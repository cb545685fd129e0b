// `coremesh schedule`: the text form it prints is the golden one, it loads what
// it prints, and bad arguments fail with a message that says what to change.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Result {
  int status;
  std::string output;  // stdout and stderr
};

Result run(const std::string& args) {
  const std::string command = std::string(COREMESH_EXE) + " schedule " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Result r{-1, ""};
  if (pipe == nullptr) return r;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.output.append(buffer, n);
  r.status = pclose(pipe);
  return r;
}

std::string golden(const std::string& name) {
  std::ifstream in(std::string(COREMESH_SOURCE_DIR) + "/tests/parallel/golden/" + name + ".txt");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST(ScheduleCli, PrintsTheGoldenTextForm) {
  const Result r = run("--pp 4 --microbatches 8 --schedule dualpipe --text-only");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, golden("dualpipe"));
}

// DualPipe trains as its exact form: shown after the textbook one, alone with --executed.
TEST(ScheduleCli, PrintsTheFormDualPipeTrainsWith) {
  Result r = run("--pp 4 --microbatches 8 --schedule dualpipe --executed --text-only");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, golden("dualpipe-exact"));
  r = run("--pp 2 --microbatches 8 --schedule dualpipe --costs 1,2,1,0,-1,0.5");
  EXPECT_EQ(r.status, 0);
  EXPECT_PRED2(contains, r.output, "textbook (P2P = 0): bubble (p/2-1)(F&B+B-3W)") << r.output;
  EXPECT_PRED2(contains, r.output, "training runs it as dualpipe-exact") << r.output;
  EXPECT_PRED2(contains, r.output, "0SEND_SUM 1RECV_SUM 1W4 1W5 1W6 1W7 1SEND_SUM 0RECV_SUM") << r.output;
  EXPECT_PRED2(contains, r.output, "peak 6 activation slots") << r.output;
}

TEST(ScheduleCli, PrintsTimelineBubbleAndSlots) {
  const Result r = run("--pp 4 --microbatches 8 --schedule 1f1b --costs 1,2,1,0");
  EXPECT_EQ(r.status, 0);
  EXPECT_PRED2(contains, r.output, "rank 0  |F0 F1 F2 F3 .....") << r.output;
  EXPECT_PRED2(contains, r.output,
               "step 33, bubble 27.27% of all ranks' time; peak 4 activation slots")
      << r.output;
  EXPECT_PRED2(contains, r.output, "textbook (P2P = 0): bubble (p-1)/(m+p-1) = 0.2727 of the step");
}

TEST(ScheduleCli, LoadsATextForm) {
  const std::string path = std::string(COREMESH_SOURCE_DIR) + "/tests/parallel/golden/zbv.txt";
  const Result r = run("--load " + path + " --costs 1,2,1,0");
  EXPECT_EQ(r.status, 0);
  EXPECT_PRED2(contains, r.output,
               "schedule zbv: placement v, pp 4, 2 chunk(s) per rank, 8 micro-batches")
      << r.output;
  EXPECT_PRED2(contains, r.output, "step 51,");
}

TEST(ScheduleCli, BadArgumentsSayWhatToChange) {
  Result r = run("--pp 4 --microbatches 10 --schedule interleaved");
  EXPECT_NE(r.status, 0);
  EXPECT_PRED2(contains, r.output,
               "HINT: Megatron-LM's interleaved schedule runs micro-batches in groups of pp=4")
      << r.output;
  r = run("--schedule 1f1b --costs 1,2");
  EXPECT_NE(r.status, 0);
  EXPECT_PRED2(contains, r.output, "HINT: give --costs F,B,W,P2P");
  r = run("");
  EXPECT_NE(r.status, 0);
  EXPECT_PRED2(contains, r.output, "HINT: give --schedule NAME, or --load FILE");
}
