// Pipeline schedules as data: per rank, the ordered list of actions it runs.
//
// Notation (Megatron-LM, Zero Bubble, DualPipe):
//   p    pipeline ranks (pp)         m  micro-batches        v  chunks per rank
//   F    forward of one chunk for one micro-batch (the last stage also computes the loss)
//   B    full backward of one chunk (input and weight gradients)
//   I    input-gradient half of B (Zero Bubble's "B"); W  weight-gradient half
//   F&B  DualPipe's overlapped pair: F of one chunk and B of another, run together
//
// Where the model lives (Placement). A micro-batch passes through num_stages()
// stages in order; stage s of micro-batch mb runs on (rank, chunk) = locate(mb, s).
//   interleaved    stage = rank + chunk * p (Megatron's virtual stages; v = 1 is
//                  plain GPipe / 1F1B / ZB-H1). num_stages = p * v.
//   v              two chunks: chunk 0 = stage rank, chunk 1 = stage 2p-1-rank, so the
//                  last rank runs stages p-1 and p back to back (ZB-V, DualPipeV).
//   bidirectional  DualPipe: two copies of a p-stage model run in opposite directions.
//                  chunk 0 = copy 0's stage `rank` (micro-batches [0, m/2) enter at
//                  rank 0); chunk 1 = copy 1's stage `p-1-rank` (micro-batches [m/2, m)
//                  enter at rank p-1). Stage s's weights live twice (rank s chunk 0 and
//                  rank p-1-s chunk 1): the executor sums their gradients.
//
// Communication is explicit: after the F of a stage whose next stage is on another
// rank comes a SEND_F of that (chunk, micro-batch), and before the F that needs it
// a RECV_F; gradients travel back by SEND_B / RECV_B after B or I. A send is a
// one-sided put (it never waits); a receive waits until the data has arrived.
// Stages on the same rank (the tip of a V) hand over without messages.
//
// DualPipe's two copies of a stage (bidirectional) sum their gradients in one
// PE's micro-batch order by two more messages between partners r and p-1-r
// (chunk c holds copy c's stage; the partner holds it as chunk 1-c):
// cSEND_SUM puts chunk c's gradient sums and router loads to the partner;
// cRECV_SUM waits for them and takes them into chunk c: on chunk 1 (copy 1,
// the later micro-batches) its next weight gradients continue the received
// sums and the loads add up; on chunk 0 the received sums are the finished
// ones (they continued this chunk's) and replace its own. The textbook
// generator has none; executed_form() (schedule_generators.hpp) adds them.
//
// Text form (what `coremesh schedule` prints, golden files hold and --load reads):
//   file     := { comment | blank } header rank-line{p}       one line per rank, rank 0 first
//   header   := "schedule" NAME "placement=" (interleaved|v|bidirectional)
//               "pp=" INT "chunks=" INT "microbatches=" INT    (keys in any order)
//   rankline := token { token }                               tokens separated by blanks
//   token    := CHUNK KIND MB                                  e.g. 0F3, 1B0, 0I2, 0W2
//             | CHUNK "F" MB "&" CHUNK "B" MB                  overlapped pair, e.g. 0F5&1B1
//             | CHUNK "F" MB "&" CHUNK "I" MB                  its backward split (W later)
//             | CHUNK ("SEND_F"|"RECV_F"|"SEND_B"|"RECV_B") MB e.g. 0SEND_F3, 1RECV_B0
//             | CHUNK ("SEND_SUM"|"RECV_SUM")                  e.g. 0SEND_SUM, 1RECV_SUM
//   KIND     := "F" | "B" | "I" | "W"
//   comment  := "#" to the end of the line (allowed anywhere)
// CHUNK is the chunk on this rank (not the global stage), MB the micro-batch (global:
// in DualPipe, micro-batch 5 of 8 is copy 1's second). A file without any send or
// receive gets them inserted by add_p2p(); a file with some must have all of them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace coremesh::parallel {

enum class ActionKind : uint8_t {
  F,      // forward
  B,      // full backward
  I,      // input-gradient half of the backward
  W,      // weight-gradient half (after the I of the same chunk and micro-batch)
  FB,     // overlapped F of (chunk, micro_batch) and B of (b_chunk, b_micro_batch)
  SendF,  // activations of (chunk, micro_batch) to the rank of the next stage
  RecvF,  // activations for (chunk, micro_batch) from the rank of the previous stage
  SendB,  // input gradient of (chunk, micro_batch) to the rank of the previous stage
  RecvB,  // output gradient for (chunk, micro_batch) from the rank of the next stage
  SendSum,  // bidirectional: chunk's gradient sums and router loads to the partner
  RecvSum,  // bidirectional: the partner's sums of this chunk's stage, taken into it
};

bool is_compute(ActionKind kind);  // F, B, I, W, FB
bool is_sum(ActionKind kind);      // SendSum, RecvSum (no micro-batch)

struct Action {
  ActionKind kind = ActionKind::F;
  int chunk = 0;
  int micro_batch = 0;
  int b_chunk = 0;        // FB only: the backward half
  int b_micro_batch = 0;  // FB only
  ActionKind b_kind = ActionKind::B;  // FB only: B, or I (its W comes later)
  friend bool operator==(const Action&, const Action&) = default;
};

std::string to_string(const Action& action);  // its token: "0F3", "0F5&1B1", "1SEND_B2", "0SEND_SUM"

enum class Placement : uint8_t { interleaved, v, bidirectional };
std::string_view placement_name(Placement placement);

struct StageRef {
  int rank = 0;
  int chunk = 0;
};

// The most action slots (ranks x chunks x micro-batches) a schedule holds:
// each is a few hundred bytes, and past this the schedule alone takes
// gigabytes and minutes (the largest published layouts use a few thousand).
inline constexpr int64_t kMaxScheduleSlots = 100'000;

struct Schedule {
  std::string name = "custom";
  Placement placement = Placement::interleaved;
  int ranks = 1;
  int chunks = 1;  // per rank
  int micro_batches = 1;
  std::vector<std::vector<Action>> actions;  // actions[rank], in execution order

  int num_stages() const;                   // stages each micro-batch passes through
  int copy_of(int micro_batch) const;       // bidirectional: 0 or 1; else 0
  int stage_of(int rank, int chunk) const;  // the stage (rank, chunk) holds
  StageRef locate(int micro_batch, int stage) const;
  bool passes_through(int micro_batch, int chunk) const;  // on any rank
  // The rank and chunk at the other end of a send or receive of `rank`
  // (a gradient-sum message: the partner p-1-rank, chunk 1-chunk).
  StageRef peer(int rank, const Action& message) const;
  // Throws InvalidArgument unless the sizes fit the placement (v: 2 chunks;
  // bidirectional: 2 chunks, even pp and micro-batches). Does not look at actions.
  void check_sizes() const;
};

// Inserts the sends and receives a schedule without stage messages needs
// (gradient-sum messages stay where they are): each receive right
// before the compute that consumes it, each send right after the compute that
// produces it (the latest and the earliest point: nothing waits longer than needed).
void add_p2p(Schedule& schedule);
bool has_p2p(const Schedule& schedule);  // any stage message (not the gradient sums)
bool has_sums(const Schedule& schedule);  // any gradient-sum message

std::string to_text(const Schedule& schedule, bool with_p2p = true);
// Parses the text form; errors name the source, line and token. Inserts sends
// and receives when the text has none. Does not validate: call validate().
Schedule parse_schedule(std::string_view text, std::string_view source = "schedule text");
Schedule load_schedule(const std::string& path);

// Throws InvalidArgument naming the first bad action (rank, position, token):
// forward before backward of each (chunk, micro-batch) on its rank, the stage
// order across ranks (F of stage s after F of stage s-1 has been received or run
// here, B/I of stage s after that of stage s+1), I before W, every (chunk,
// micro-batch) a micro-batch passes through gets exactly one F and one B or one
// I + W, every needed send and receive present exactly once, and no deadlock
// (proved by simulating the actions with unit costs).
void validate(const Schedule& schedule);

}  // namespace coremesh::parallel
