// The validator: every generator's output is valid over a sweep of sizes, bad
// generator arguments say what to change, and hand-made bad schedules are each
// rejected with a message naming the first bad action.
#include <gtest/gtest.h>

#include <string>

#include "contains.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

// The message validate() (after parsing) throws for `text`, or "" when it is valid.
std::string rejection(const std::string& text) {
  try {
    validate(parse_schedule(text));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string generator_error(const std::string& name, int p, int m, int v = 2) {
  try {
    make_schedule(name, p, m, v);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

const std::string kOneRank = "schedule bad placement=interleaved pp=1 chunks=1 microbatches=2\n";
const std::string kTwoRanks = "schedule bad placement=interleaved pp=2 chunks=1 microbatches=1\n";
const std::string kTwoRanksTwoMicroBatches =
    "schedule bad placement=interleaved pp=2 chunks=1 microbatches=2\n";
const std::string kV = "schedule bad placement=v pp=1 chunks=2 microbatches=1\n";  // stages 0, 1
const std::string kVTwo = "schedule bad placement=v pp=1 chunks=2 microbatches=2\n";
// DualPipe on 2 ranks: micro-batch 0 runs on copy 0 (chunk 0), micro-batch 1 on copy 1.
const std::string kBidirectional =
    "schedule bad placement=bidirectional pp=2 chunks=2 microbatches=2\n";

// The executed DualPipe's text at pp 2, m 4 with `from` replaced by `to` on rank `rank`'s line.
std::string edited(int rank, const std::string& from, const std::string& to) {
  std::string text = to_text(executed_form(dualpipe(2, 4)));
  size_t line = text.find('\n') + 1;
  for (int r = 0; r < rank; ++r) line = text.find('\n', line) + 1;
  const size_t at = text.find(from, line);
  EXPECT_LT(at, text.find('\n', line)) << from << " is not on rank " << rank << "'s line";
  return text.replace(at, from.size(), to);
}

// ... with rank `rank`'s four gradient-sum messages left out (its W stay at the tail).
std::string without_sums(int rank) {
  Schedule s = executed_form(dualpipe(2, 4));
  std::erase_if(s.actions[size_t(rank)], [](const Action& a) { return is_sum(a.kind); });
  return to_text(s);
}

struct BadSchedule {
  const char* rule;
  std::string text;
  const char* message;  // a part of the error
};

}  // namespace

TEST(ScheduleValidate, EveryGeneratorIsValidOverASweep) {
  int valid = 0;
  for (const std::string& name : schedule_names())
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 3 * p + 1; ++m)
        for (int v : {2, 3}) {
          if (v == 3 && name != "interleaved") continue;
          SCOPED_TRACE(name + " pp=" + std::to_string(p) + " m=" + std::to_string(m));
          Schedule s;
          try {
            s = make_schedule(name, p, m, v);
          } catch (const InvalidArgument&) {
            continue;  // arguments the schedule does not take (checked below)
          }
          EXPECT_NO_THROW(validate(s));
          ++valid;
        }
  EXPECT_GT(valid, 500);
}

TEST(ScheduleValidate, GeneratorArgumentsSayWhatToChange) {
  const struct {
    const char* name;
    int p, m, v;
    const char* message;
  } cases[] = {
      {"interleaved", 4, 10, 2, "microbatches=10 is not a multiple of pp=4"},
      {"interleaved", 4, 10, 2, "use --microbatches 12"},
      {"interleaved", 4, 8, 1, "--schedule 1f1b for one chunk per rank"},
      {"dualpipe", 3, 12, 2, "use an even --pp"},
      {"dualpipe", 4, 6, 2, "use --microbatches 8 or more, even"},
      {"dualpipe", 4, 9, 2, "use --microbatches 8 or more, even"},
      {"dualpipev", 4, 7, 2, "use --microbatches 8 or more"},
      {"1f1b", 0, 8, 2, "use --pp 1 or more"},
      {"interleaved", 0, 8, 2, "use --pp 1 or more"},
      {"gpipe", 4, 0, 2, "use --microbatches 1 or more"},
      {"pipedream", 4, 8, 2, "choose one of: gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipe, dualpipev"},
  };
  for (const auto& c : cases) EXPECT_PRED2(contains, generator_error(c.name, c.p, c.m, c.v), c.message);
  EXPECT_EQ(generator_error("zbv", 4, 3), "");  // fewer micro-batches than the V holds is fine
}

// One bad schedule per rule; each message names the rank, the action's position
// and token, and what is wrong (or, for something missing, the rank and what).
TEST(ScheduleValidate, BadSchedulesAreRejectedWithTheRightMessage) {
  const BadSchedule cases[] = {
      {"F before B", kOneRank + "0B0 0F0 0F1 0B1",
       "rank 0, action 1 `0B0`: backward of chunk 0 micro-batch 0 before its forward"},
      {"F once", kOneRank + "0F0 0F1 0F0 0B0 0B1", "rank 0, action 3 `0F0`: second forward"},
      {"B once", kOneRank + "0F0 0F1 0B0 0B1 0B1", "rank 0, action 5 `0B1`: second backward"},
      {"B or I, not both", kOneRank + "0F0 0F1 0B0 0I0 0W0 0B1", "action 4 `0I0`: second backward"},
      {"every B", kOneRank + "0F0 0F1 0B0", "rank 0: chunk 0 micro-batch 1 has no backward"},
      {"every F", kOneRank + "0F0 0B0", "rank 0: chunk 0 micro-batch 1 has no forward"},
      {"I before W", kOneRank + "0F0 0F1 0W0 0I0 0B1",
       "action 3 `0W0`: weight gradient of chunk 0 micro-batch 0 before its I"},
      {"W only after I", kOneRank + "0F0 0F1 0B0 0W0 0B1",
       "action 4 `0W0`: weight gradient of chunk 0 micro-batch 0 after a full backward"},
      {"every W", kOneRank + "0F0 0F1 0I0 0W0 0I1", "chunk 0 micro-batch 1 has an I but no W"},
      {"W once", kOneRank + "0F0 0F1 0I0 0W0 0W0 0B1", "action 5 `0W0`: second weight gradient"},
      {"F of stage s after F of stage s-1 (received)",
       kTwoRanks + "0F0 0SEND_F0 0RECV_B0 0B0\n0F0 0RECV_F0 0B0 0SEND_B0",
       "rank 1, action 1 `0F0`: forward of stage 1 before its input from rank 0 is received"},
      {"B of stage s after B of stage s+1 (received)",
       kTwoRanks + "0F0 0SEND_F0 0B0 0RECV_B0\n0RECV_F0 0F0 0B0 0SEND_B0",
       "rank 0, action 3 `0B0`: backward of stage 0 before its output gradient from rank 1 is "
       "received"},
      {"F of stage s after F of stage s-1 (same rank)", kV + "1F0 0F0 1B0 0B0",
       "action 1 `1F0`: forward of stage 1 before the forward of stage 0 on this rank"},
      {"B of stage s after B of stage s+1 (same rank)", kV + "0F0 1F0 0B0 1B0",
       "action 3 `0B0`: backward of stage 0 before the backward of stage 1 on this rank"},
      {"send after its compute", kTwoRanks + "0SEND_F0 0F0 0RECV_B0 0B0\n0RECV_F0 0F0 0B0 0SEND_B0",
       "rank 0, action 1 `0SEND_F0`: sends activations before the forward that makes them"},
      {"every activation sent", kTwoRanks + "0F0 0RECV_B0 0B0\n0RECV_F0 0F0 0B0 0SEND_B0",
       "rank 0: the activations of chunk 0 micro-batch 0 are never sent to rank 1"},
      {"every gradient sent", kTwoRanks + "0F0 0SEND_F0 0RECV_B0 0B0\n0RECV_F0 0F0 0B0",
       "rank 1: the input gradient of chunk 0 micro-batch 0 is never sent to rank 0"},
      {"each message once", kTwoRanks + "0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0\n0RECV_F0 0F0 0B0 0SEND_B0",
       "rank 0, action 3 `0SEND_F0`: second activation message"},
      {"no receive on the first stage",
       kTwoRanks + "0RECV_F0 0F0 0SEND_F0 0RECV_B0 0B0\n0RECV_F0 0F0 0B0 0SEND_B0",
       "rank 0, action 1 `0RECV_F0`: stage 0 is the first stage"},
      {"no message at the tip of a V", kV + "0F0 0SEND_F0 1F0 1B0 0B0",
       "action 2 `0SEND_F0`: stage 0 hands over to chunk 1 on this same rank"},
      {"a pair is two different actions", kVTwo + "0F0 1F0&1B0",
       "cannot run the backward of its own forward"},
      {"a pair's backward after its forward", kVTwo + "0F0 0F1&1B0",
       "action 2 `0F1&1B0`: backward of chunk 1 micro-batch 0 before its forward"},
      {"a copy's micro-batches", kBidirectional + "1F0 0B0\n0F0 0B0",
       "rank 0, action 1 `1F0`: micro-batch 0 does not pass through chunk 1"},
      // Rank 0 waits for the gradient of micro-batch 0 before it sends micro-batch
      // 1; rank 1 waits for micro-batch 1 before it runs the backward of 0.
      {"no deadlock",
       kTwoRanksTwoMicroBatches + "0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1 0RECV_B1 0B1\n"
                                  "0RECV_F0 0F0 0RECV_F1 0F1 0B0 0SEND_B0 0B1 0SEND_B1",
       "deadlock: rank 0 at action 3 `0RECV_B0` (sent by rank 1); rank 1 at action 3 `0RECV_F1` "
       "(sent by rank 0)"},
  };
  for (const BadSchedule& c : cases) {
    SCOPED_TRACE(c.rule);
    EXPECT_PRED2(contains, rejection(c.text), c.message);
  }
}

TEST(ScheduleValidate, GoodHandMadeSchedules) {
  // Without any messages they are inserted where needed.
  EXPECT_EQ(rejection(kTwoRanks + "0F0 0B0\n0F0 0B0"), "");
  EXPECT_EQ(rejection(kV + "0F0 1F0 1I0 0B0 1W0"), "");
  EXPECT_EQ(rejection(kBidirectional + "0F0 1F1 1B1 0B0\n1F1 0F0 0B0 1B1"), "");
}

TEST(ScheduleValidate, ChecksSchedulesBuiltInCode) {
  Schedule s = one_f_one_b(2, 2);
  s.actions[1][0].micro_batch = 7;
  EXPECT_THROW(validate(s), InvalidArgument);
  s.actions.pop_back();
  EXPECT_THROW(validate(s), InvalidArgument);
}

// DualPipe's gradient-sum messages (executed_form), each rule broken once.
TEST(ScheduleValidate, BadGradientSumsAreRejectedWithTheRightMessage) {
  const struct {
    const char* rule;
    std::string text;
    const char* message;
  } cases[] = {
      {"the executed form is valid", edited(0, "0SEND_SUM", "0SEND_SUM"), ""},
      {"copy 1's W after copy 0's sums", edited(0, "0SEND_SUM 1RECV_SUM 1W2", "0SEND_SUM 1W2 1RECV_SUM"),
       "rank 0, action 18 `1W2`: weight gradient of copy 1's micro-batch 2 before copy 0's sums of its stage are "
       "received"},
      {"copy 1's backward split", edited(1, "0F1&1I2", "0F1&1B2"),
       "`0F1&1B2`: weight gradient of copy 1's micro-batch 2 before copy 0's sums"},
      {"sums sent after the last weight gradient", edited(0, "0I1 0W1 0SEND_SUM", "0I1 0SEND_SUM 0W1"),
       "rank 0, action 16 `0SEND_SUM`: sends the sums of chunk 0 before the weight gradient of micro-batch 1"},
      {"no weight gradient after the sums are sent", edited(0, "1W3 1SEND_SUM", "1SEND_SUM 1W3"),
       "sends the sums of chunk 1 before the weight gradient of micro-batch 3"},
      {"copy 0 takes the finished sums after sending its own", edited(1, "0SEND_SUM", "0RECV_SUM 0SEND_SUM"),
       "receives the finished sums of copy 0's stage before sending this rank's own"},
      {"each sum once", edited(1, "1SEND_SUM", "1SEND_SUM 1SEND_SUM"), "second send of the sums of chunk 1"},
      {"every sum", edited(1, " 0RECV_SUM", ""), "rank 1: the sums of chunk 0 are never received"},
      {"sums on every rank or none", without_sums(1), "rank 0 exchanges gradient sums, rank 1 does not"},
      {"sums between DualPipe's copies only",
       "schedule bad placement=interleaved pp=1 chunks=1 microbatches=1\n0F0 0B0 0SEND_SUM\n",
       "gradient sums are exchanged between DualPipe's two model copies of a stage only"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.rule);
    if (std::string(c.message).empty())
      EXPECT_EQ(rejection(c.text), "");
    else
      EXPECT_PRED2(contains, rejection(c.text), c.message);
  }
  // both ranks wait for the partner's copy-0 sums before sending their own
  std::string both = to_text(executed_form(dualpipe(2, 4)));
  for (size_t at; (at = both.find("0SEND_SUM 1RECV_SUM")) != std::string::npos;)
    both.replace(at, 19, "1RECV_SUM 0SEND_SUM");
  EXPECT_PRED2(contains, rejection(both), "deadlock: rank 0 at action 17 `1RECV_SUM` (sent by rank 1); rank 1 at action 16 `1RECV_SUM` (sent by rank 0)");
}
