// validate(): local checks rank by rank in action order, then the deadlock check
// by running the actions with unit costs (schedule.hpp).
#include <fmt/format.h>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "schedule_run.hpp"

namespace coremesh::parallel {
namespace {

// What a rank has done so far for one (chunk, micro-batch).
struct Done {
  bool f = false, b = false, i = false, w = false;
  bool recv_f = false, recv_b = false, send_f = false, send_b = false;
};

constexpr const char* kP2pHint =
    "or leave out every send and receive so that they are inserted where they are needed";

class RankChecker {
 public:
  RankChecker(const Schedule& s, int rank)
      : s_(s), rank_(rank), done_(static_cast<size_t>(s.chunks * s.micro_batches)) {
    for (const Action& a : s.actions[static_cast<size_t>(rank)]) sums_ = sums_ || is_sum(a.kind);
  }

  void check() {
    const auto& list = s_.actions[static_cast<size_t>(rank_)];
    for (index_ = 0; index_ < list.size(); ++index_) action(list[index_]);
    for (int c = 0; c < s_.chunks; ++c)
      for (int mb = 0; mb < s_.micro_batches; ++mb)
        if (s_.passes_through(mb, c)) complete(c, mb);
    if (sums_)
      for (int c = 0; c < 2; ++c)
        for (const bool send : {true, false})
          if (!(send ? sent_sum_ : received_sum_)[c])
            fail_at_end(fmt::format("the sums of chunk {} are never {}", c,
                                    send ? "sent to the partner" : "received from the partner"),
                        fmt::format("add `{}{}`", c, send ? "SEND_SUM" : "RECV_SUM"));
  }
  bool has_sums() const { return sums_; }

 private:
  const Schedule& s_;
  int rank_;
  size_t index_ = 0;
  std::vector<Done> done_;
  bool sums_ = false;  // this rank exchanges gradient sums with its partner
  bool sent_sum_[2] = {false, false}, received_sum_[2] = {false, false};

  Done& at(int chunk, int mb) { return done_[static_cast<size_t>(chunk * s_.micro_batches + mb)]; }
  static std::string token(char kind, int chunk, int mb) {
    return fmt::format("{}{}{}", chunk, kind, mb);
  }
  static std::string token(std::string_view kind, int chunk, int mb) {
    return fmt::format("{}{}{}", chunk, kind, mb);
  }

  [[noreturn]] void fail(const std::string& what, const std::string& hint) const {
    const Action& a = s_.actions[static_cast<size_t>(rank_)][index_];
    CM_THROW(InvalidArgument, hint, "schedule '{}': rank {}, action {} `{}`: {}", s_.name, rank_,
             index_ + 1, to_string(a), what);
  }
  [[noreturn]] void fail_at_end(const std::string& what, const std::string& hint) const {
    CM_THROW(InvalidArgument, hint, "schedule '{}': rank {}: {}", s_.name, rank_, what);
  }

  // The neighbouring stage of (chunk, mb) in direction step (-1 previous, +1 next):
  // false when there is none, else true and its rank and chunk in `where`.
  bool neighbour(int chunk, int mb, int step, StageRef& where) const {
    const int stage = s_.stage_of(rank_, chunk) + step;
    if (stage < 0 || stage >= s_.num_stages()) return false;
    where = s_.locate(mb, stage);
    return true;
  }

  void in_range(int chunk, int mb) const {
    if (chunk < 0 || chunk >= s_.chunks)
      fail(fmt::format("chunk {} is out of range (chunks={})", chunk, s_.chunks),
           "chunks count from 0 on each rank");
    if (mb < 0 || mb >= s_.micro_batches)
      fail(fmt::format("micro-batch {} is out of range (microbatches={})", mb, s_.micro_batches),
           "micro-batches count from 0");
    if (!s_.passes_through(mb, chunk))
      fail(
          fmt::format(
              "micro-batch {} does not pass through chunk {} (it runs on copy {}, chunk {})", mb,
              chunk, s_.copy_of(mb), s_.copy_of(mb)),
          "in a bidirectional schedule micro-batches [0, m/2) run on chunk 0, [m/2, m) on chunk 1");
  }

  void forward(int c, int mb) {
    Done& d = at(c, mb);
    if (d.f)
      fail(fmt::format("second forward of chunk {} micro-batch {}", c, mb),
           "each (chunk, micro-batch) runs F exactly once");
    StageRef prev;
    if (neighbour(c, mb, -1, prev)) {
      if (prev.rank != rank_ && !d.recv_f)
        fail(fmt::format("forward of stage {} before its input from rank {} is received",
                         s_.stage_of(rank_, c), prev.rank),
             fmt::format("add `{}` before it, {}", token("RECV_F", c, mb), kP2pHint));
      if (prev.rank == rank_ && !at(prev.chunk, mb).f)
        fail(fmt::format("forward of stage {} before the forward of stage {} on this rank",
                         s_.stage_of(rank_, c), s_.stage_of(rank_, prev.chunk)),
             fmt::format("move `{}` before it", token('F', prev.chunk, mb)));
    }
    d.f = true;
  }

  void backward(int c, int mb, bool split) {
    Done& d = at(c, mb);
    if (!d.f)
      fail(fmt::format("backward of chunk {} micro-batch {} before its forward", c, mb),
           fmt::format("a backward needs the activations of its forward: move `{}` before it",
                       token('F', c, mb)));
    if (d.b || d.i)
      fail(fmt::format("second backward of chunk {} micro-batch {}", c, mb),
           "each (chunk, micro-batch) runs one B, or one I and one W");
    StageRef next;
    if (neighbour(c, mb, +1, next)) {
      if (next.rank != rank_ && !d.recv_b)
        fail(fmt::format("backward of stage {} before its output gradient from rank {} is received",
                         s_.stage_of(rank_, c), next.rank),
             fmt::format("add `{}` before it, {}", token("RECV_B", c, mb), kP2pHint));
      const Done& n = at(next.chunk, mb);
      if (next.rank == rank_ && !(n.b || n.i))
        fail(fmt::format("backward of stage {} before the backward of stage {} on this rank",
                         s_.stage_of(rank_, c), s_.stage_of(rank_, next.chunk)),
             fmt::format("move the backward of chunk {} micro-batch {} before it", next.chunk, mb));
    }
    if (!split) weight_gradient(c, mb);
    (split ? d.i : d.b) = true;
  }

  // A B or W adds to chunk c's gradient sums: not after they were sent, and
  // on copy 1 only onto copy 0's received sums.
  void weight_gradient(int c, int mb) const {
    if (!sums_) return;
    if (sent_sum_[c])
      fail(fmt::format("weight gradient of chunk {} micro-batch {} after the chunk's sums were sent", c,
                       mb),
           fmt::format("move `{}SEND_SUM` after it", c));
    if (c == 1 && !received_sum_[1])
      fail(fmt::format("weight gradient of copy 1's micro-batch {} before copy 0's sums of its stage "
                       "are received (one PE sums micro-batches in order)",
                       mb),
           "run copy 1's backwards as I and their W after `1RECV_SUM` (executed_form() does)");
  }

  // cSEND_SUM / cRECV_SUM: the chunk's sums to or from the partner.
  void sum_message(const Action& a) {
    const int c = a.chunk;
    if (s_.placement != Placement::bidirectional)
      fail("gradient sums are exchanged between DualPipe's two model copies of a stage only",
           "remove it: only a bidirectional schedule holds a stage twice");
    if (c < 0 || c > 1) fail(fmt::format("chunk {} is out of range (chunks=2)", c), "use chunk 0 or 1");
    const bool send = a.kind == ActionKind::SendSum;
    if ((send ? sent_sum_ : received_sum_)[c])
      fail(fmt::format("second {} of the sums of chunk {}", send ? "send" : "receive", c),
           "each chunk's sums are sent once and received once");
    if (send) {
      if (c == 1 && !received_sum_[1])
        fail("sends copy 1's sums before it has received copy 0's, which they continue",
             "move `1RECV_SUM` before it");
      for (int mb = 0; mb < s_.micro_batches; ++mb)
        if (s_.passes_through(mb, c) && !at(c, mb).b && !at(c, mb).w)
          fail(fmt::format("sends the sums of chunk {} before the weight gradient of micro-batch {}", c,
                           mb),
               fmt::format("move it after the B or W of chunk {} micro-batch {}", c, mb));
    } else if (c == 0 && !sent_sum_[0]) {
      fail("receives the finished sums of copy 0's stage before sending this rank's own, which they continue",
           "move `0SEND_SUM` before it");
    }
    (send ? sent_sum_ : received_sum_)[c] = true;
  }

  void weight(int c, int mb) {
    Done& d = at(c, mb);
    if (d.b)
      fail(fmt::format("weight gradient of chunk {} micro-batch {} after a full backward", c, mb),
           "a W completes an I: write I instead of B, or drop the W");
    if (!d.i)
      fail(fmt::format("weight gradient of chunk {} micro-batch {} before its I", c, mb),
           fmt::format("move `{}` before it", token('I', c, mb)));
    if (d.w)
      fail(fmt::format("second weight gradient of chunk {} micro-batch {}", c, mb),
           "each I is followed by exactly one W");
    weight_gradient(c, mb);
    d.w = true;
  }

  // A send or receive: its neighbouring stage must be on another rank.
  void message(const Action& a) {
    const bool forward_data = a.kind == ActionKind::SendF || a.kind == ActionKind::RecvF;
    const bool towards_next = a.kind == ActionKind::SendF || a.kind == ActionKind::RecvB;
    StageRef peer;
    if (!neighbour(a.chunk, a.micro_batch, towards_next ? +1 : -1, peer))
      fail(fmt::format("stage {} is the {} stage: there is no rank to exchange with",
                       s_.stage_of(rank_, a.chunk), towards_next ? "last" : "first"),
           "remove it");
    if (peer.rank == rank_)
      fail(fmt::format("stage {} hands over to chunk {} on this same rank: no message is needed",
                       s_.stage_of(rank_, a.chunk), peer.chunk),
           "remove it");
    Done& d = at(a.chunk, a.micro_batch);
    bool* flag = nullptr;
    switch (a.kind) {
      case ActionKind::SendF:
        if (!d.f)
          fail("sends activations before the forward that makes them",
               fmt::format("move it after `{}`", token('F', a.chunk, a.micro_batch)));
        flag = &d.send_f;
        break;
      case ActionKind::SendB:
        if (!d.b && !d.i)
          fail("sends an input gradient before the backward that makes it",
               fmt::format("move it after the B or I of chunk {} micro-batch {}", a.chunk,
                           a.micro_batch));
        flag = &d.send_b;
        break;
      case ActionKind::RecvF: flag = &d.recv_f; break;
      default: flag = &d.recv_b; break;
    }
    if (*flag)
      fail(fmt::format("second {} of chunk {} micro-batch {}",
                       forward_data ? "activation message" : "gradient message", a.chunk,
                       a.micro_batch),
           "each message is sent and received exactly once");
    *flag = true;
  }

  void action(const Action& a) {
    if (is_sum(a.kind)) return sum_message(a);
    in_range(a.chunk, a.micro_batch);
    switch (a.kind) {
      case ActionKind::F: forward(a.chunk, a.micro_batch); break;
      case ActionKind::B: backward(a.chunk, a.micro_batch, false); break;
      case ActionKind::I: backward(a.chunk, a.micro_batch, true); break;
      case ActionKind::W: weight(a.chunk, a.micro_batch); break;
      case ActionKind::FB:
        in_range(a.b_chunk, a.b_micro_batch);
        if (a.b_chunk == a.chunk && a.b_micro_batch == a.micro_batch)
          fail("an overlapped pair cannot run the backward of its own forward",
               "pair the forward with the backward of another chunk or micro-batch");
        if (a.b_kind != ActionKind::B && a.b_kind != ActionKind::I)
          fail("the backward half of a pair is a B or an I", "write 0F5&1B1 or 0F5&1I1");
        forward(a.chunk, a.micro_batch);
        backward(a.b_chunk, a.b_micro_batch, a.b_kind == ActionKind::I);
        break;
      default: message(a); break;
    }
  }

  // After the last action: everything (chunk, mb) needs ran, and every message was sent.
  void complete(int c, int mb) {
    const Done& d = at(c, mb);
    const std::string what = fmt::format("chunk {} micro-batch {}", c, mb);
    if (!d.f) fail_at_end(what + " has no forward", fmt::format("add `{}`", token('F', c, mb)));
    if (!d.b && !d.i)
      fail_at_end(what + " has no backward",
                  fmt::format("add `{}` (or `{}` and `{}`)", token('B', c, mb), token('I', c, mb),
                              token('W', c, mb)));
    if (d.i && !d.w)
      fail_at_end(what + " has an I but no W",
                  fmt::format("add `{}` after its I", token('W', c, mb)));
    StageRef peer;
    if (neighbour(c, mb, +1, peer) && peer.rank != rank_ && !d.send_f)
      fail_at_end(fmt::format("the activations of {} are never sent to rank {}", what, peer.rank),
                  fmt::format("add `{}` after its forward, {}", token("SEND_F", c, mb), kP2pHint));
    if (neighbour(c, mb, -1, peer) && peer.rank != rank_ && !d.send_b)
      fail_at_end(fmt::format("the input gradient of {} is never sent to rank {}", what, peer.rank),
                  fmt::format("add `{}` after its backward, {}", token("SEND_B", c, mb), kP2pHint));
  }
};

}  // namespace

void validate(const Schedule& s) {
  s.check_sizes();
  CM_CHECK(static_cast<int>(s.actions.size()) == s.ranks, "give one action list per rank",
           "schedule '{}': {} action lists for pp={}", s.name, s.actions.size(), s.ranks);
  int with_sums = -1, without_sums = -1;
  for (int r = 0; r < s.ranks; ++r) {
    RankChecker rank(s, r);
    rank.check();
    (rank.has_sums() ? with_sums : without_sums) = r;
  }
  CM_CHECK(with_sums < 0 || without_sums < 0,
           "give every rank its four gradient-sum messages (its partner's wait for them), or none",
           "schedule '{}': rank {} exchanges gradient sums, rank {} does not", s.name, with_sums,
           without_sums);

  // Every message exists exactly once; now prove the order cannot deadlock.
  const detail::Run run = detail::run_actions(s, Costs{});
  if (run.complete) return;
  std::string waits;
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    const size_t k = run.next[static_cast<size_t>(r)];
    if (k == list.size()) continue;
    const StageRef from = s.peer(r, list[k]);
    waits += fmt::format("{}rank {} at action {} `{}` (sent by rank {})", waits.empty() ? "" : "; ",
                         r, k + 1, to_string(list[k]), from.rank);
  }
  CM_THROW(InvalidArgument,
           "each of these waits for a message that its sender only sends after a wait of its "
           "own: move the sending compute earlier or the receiving one later",
           "schedule '{}': deadlock: {}", s.name, waits);
}

}  // namespace coremesh::parallel
