// The text form of pipeline schedules: printing, parsing (with errors that
// name the line and token) and the round trip, for every generator.
#include <gtest/gtest.h>

#include <string>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"

#include "contains.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

// The message of the InvalidArgument that parsing `text` throws ("" if none).
std::string parse_error(const std::string& text) {
  try {
    parse_schedule(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void expect_same(const Schedule& a, const Schedule& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.placement, b.placement);
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.micro_batches, b.micro_batches);
  EXPECT_EQ(a.actions, b.actions);
}

}  // namespace

TEST(ScheduleText, PrintsOneLinePerRankAfterTheHeader) {
  const Schedule s = one_f_one_b(2, 2);
  EXPECT_EQ(to_text(s, false),
            "schedule 1f1b placement=interleaved pp=2 chunks=1 microbatches=2\n"
            "0F0 0F1 0B0 0B1\n"
            "0F0 0B0 0F1 0B1\n");
  EXPECT_EQ(to_text(s),
            "schedule 1f1b placement=interleaved pp=2 chunks=1 microbatches=2\n"
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
            "0RECV_F0 0F0 0B0 0SEND_B0 0RECV_F1 0F1 0B1 0SEND_B1\n");
}

TEST(ScheduleText, TokensOfEveryKind) {
  EXPECT_EQ(to_string({ActionKind::F, 0, 3}), "0F3");
  EXPECT_EQ(to_string({ActionKind::B, 1, 0}), "1B0");
  EXPECT_EQ(to_string({ActionKind::I, 0, 12}), "0I12");
  EXPECT_EQ(to_string({ActionKind::W, 1, 2}), "1W2");
  EXPECT_EQ(to_string({ActionKind::FB, 0, 5, 1, 1}), "0F5&1B1");
  EXPECT_EQ(to_string({ActionKind::SendF, 0, 3}), "0SEND_F3");
  EXPECT_EQ(to_string({ActionKind::RecvF, 1, 3}), "1RECV_F3");
  EXPECT_EQ(to_string({ActionKind::SendB, 0, 7}), "0SEND_B7");
  EXPECT_EQ(to_string({ActionKind::RecvB, 1, 0}), "1RECV_B0");
  EXPECT_EQ(to_string({ActionKind::FB, 0, 5, 1, 1, ActionKind::I}), "0F5&1I1");
  EXPECT_EQ(to_string({ActionKind::SendSum, 0, 0}), "0SEND_SUM");
  EXPECT_EQ(to_string({ActionKind::RecvSum, 1, 0}), "1RECV_SUM");
}

TEST(ScheduleText, RoundTripOfEveryGenerator) {
  for (const std::string& name : schedule_names())
    for (int p : {2, 4})
      for (int m : {8, 12}) {
        SCOPED_TRACE(name + " pp=" + std::to_string(p) + " m=" + std::to_string(m));
        const Schedule s = make_schedule(name, p, m, 2);
        expect_same(parse_schedule(to_text(s)), s);
        // Without sends and receives, the parser inserts the same ones.
        expect_same(parse_schedule(to_text(s, false)), s);
        EXPECT_EQ(to_text(parse_schedule(to_text(s))), to_text(s));
      }
}

TEST(ScheduleText, CommentsBlankLinesAndKeyOrderAreFree) {
  const Schedule s = parse_schedule(
      "# a two-rank 1F1B\n\n"
      "schedule mine microbatches=2 chunks=1 pp=2 placement=interleaved  # sizes\n"
      "0F0 0F1   0B0 0B1\n"
      "\n"
      "0F0 0B0 0F1 0B1  # rank 1\n");
  EXPECT_EQ(s.name, "mine");
  expect_same(s, [] {
    Schedule g = one_f_one_b(2, 2);
    g.name = "mine";
    return g;
  }());
}

TEST(ScheduleText, OverlappedPairsAndSplitBackwards) {
  const Schedule s = parse_schedule(
      "schedule pair placement=v pp=1 chunks=2 microbatches=2\n"
      "0F0 1F0 0F1 1F1&1B0 0I0 0W0 1B1 0B1\n");
  ASSERT_EQ(s.actions[0].size(), 8u);  // one rank: no messages
  EXPECT_EQ(s.actions[0][3], (Action{ActionKind::FB, 1, 1, 1, 0}));
  EXPECT_EQ(s.actions[0][4], (Action{ActionKind::I, 0, 0}));
  validate(s);
  // A pair's backward split: its W comes later and frees the slot.
  const Schedule split = parse_schedule(
      "schedule pair placement=v pp=1 chunks=2 microbatches=2\n"
      "0F0 1F0 0F1 1F1&1I0 1W0 0I0 0W0 1B1 0B1\n");
  EXPECT_EQ(split.actions[0][3], (Action{ActionKind::FB, 1, 1, 1, 0, ActionKind::I}));
  validate(split);
}

TEST(ScheduleText, ErrorsNameTheLineAndToken) {
  const std::string header = "schedule x placement=v pp=2 chunks=2 microbatches=4\n";
  const std::string v = "schedule x placement=v pp=2 ";
  const struct {
    std::string text;
    const char* message;  // a part of the error
  } cases[] = {
      {header + "0F0 0X1\n0F0\n", "line 2, token 2 `0X1`: unknown action at character 2"},
      {header + "0F0\n0F0 2F1\n", "line 3, token 2 `2F1`: chunk 2 is out of range: chunks=2"},
      {header + "0F4\n0F0\n", "line 2, token 1 `0F4`: micro-batch 4 is out of range"},
      {header + "F0\n0F0\n", "token 1 `F0`: expected a chunk at character 1"},
      {header + "0F\n0F0\n", "token 1 `0F`: expected a micro-batch at character 3"},
      {header + "0F1x\n0F0\n", "token 1 `0F1x`: unexpected text after the action"},
      {header + "0F1&1W0\n0F0\n", "must be a backward B or its input half I"},
      {header + "0SEND_SUM3\n0F0\n", "token 1 `0SEND_SUM3`: unexpected text after the action"},
      {header + "0B1&1B0\n0F0\n", "only a forward can start an overlapped pair"},
      {header + "0F0\n", "1 rank lines for pp=2"},
      {header + "0F0\n0F0\n0F0\n", "line 4: more rank lines than pp=2"},
      {"0F0\n", "line 1: expected the header"},
      {"# nothing\n", "no header line"},
      {"schedule x placement=w pp=2 chunks=2 microbatches=4\n", "unknown placement 'w'"},
      {v + "chunks=2\n", "the header lacks microbatches="},
      {"schedule x placement=v pp=0 chunks=2 microbatches=4\n", "pp must be a positive integer"},
      {v + "chunks=3 microbatches=4\n", "needs chunks=2"},
      {v + "chunks=2 microbatches=4 depth=3\n", "unknown key 'depth'"},
      // sizes that would take gigabytes (a library error, or bad_alloc) are refused from the header
      {"schedule x placement=interleaved pp=2 chunks=40000 microbatches=40000\n0F0\n0F0\n",
       "= 3200000000 slots, more than 100000"},
      // The hint says what a token looks like.
      {header + "0Q0\n0F0\n", "HINT: a token is <chunk><F|B|I|W><micro-batch>"},
  };
  for (const auto& c : cases) EXPECT_PRED2(contains, parse_error(c.text), c.message);
}

TEST(ScheduleText, LoadNamesTheFile) {
  try {
    load_schedule("/nonexistent/schedule.txt");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_PRED2(contains, std::string(e.what()),
                 "cannot open schedule file '/nonexistent/schedule.txt'");
  }
}

TEST(ScheduleP2p, MessagesGoRightAfterTheProducerAndRightBeforeTheConsumer) {
  // V placement on 2 ranks: stages 0,3 on rank 0 and 1,2 on rank 1; the tip
  // (stages 1 -> 2) stays on rank 1 without messages.
  Schedule s;
  s.name = "v2";
  s.placement = Placement::v;
  s.ranks = 2;
  s.chunks = 2;
  s.micro_batches = 1;
  s.actions = {
      {{ActionKind::F, 0, 0}, {ActionKind::F, 1, 0}, {ActionKind::B, 1, 0}, {ActionKind::B, 0, 0}},
      {{ActionKind::F, 0, 0}, {ActionKind::F, 1, 0}, {ActionKind::B, 1, 0}, {ActionKind::B, 0, 0}}};
  add_p2p(s);
  EXPECT_EQ(to_text(s),
            "schedule v2 placement=v pp=2 chunks=2 microbatches=1\n"
            "0F0 0SEND_F0 1RECV_F0 1F0 1B0 1SEND_B0 0RECV_B0 0B0\n"
            "0RECV_F0 0F0 1F0 1SEND_F0 1RECV_B0 1B0 0B0 0SEND_B0\n");
  validate(s);
  EXPECT_THROW(add_p2p(s), InvalidArgument);  // already has them
}
