// The textbook pipeline schedules (schedule_generators.hpp). Each generator
// writes the compute order of every rank; add_p2p() then inserts the messages.
#include "coremesh/parallel/schedule_generators.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <utility>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {
namespace {

Schedule start(PipelineSchedule kind, Placement placement, int ranks, int chunks, int micro_batches) {
  const std::string name = schedule_name(kind);
  CM_CHECK(ranks >= 1, "use --pp 1 or more", "{}: pp={} (the number of pipeline ranks)", name,
           ranks);
  CM_CHECK(micro_batches >= 1, "use --microbatches 1 or more", "{}: microbatches={}", name,
           micro_batches);
  constexpr int64_t kMaxSlots = kMaxScheduleSlots;
  CM_CHECK(int64_t(ranks) * std::max(chunks, 1) * micro_batches <= kMaxSlots,
           "use fewer pipeline ranks or micro-batches (the largest published layouts use a few thousand slots)",
           "{}: pp {} x {} chunk(s) x {} micro-batches = {} slots, more than {}", name, ranks, std::max(chunks, 1),
           micro_batches, int64_t(ranks) * std::max(chunks, 1) * micro_batches, kMaxSlots);
  Schedule s;
  s.name = name;
  s.placement = placement;
  s.ranks = ranks;
  s.chunks = chunks;
  s.micro_batches = micro_batches;
  s.actions.resize(static_cast<size_t>(ranks));
  return s;
}

Schedule finish(Schedule s) {
  add_p2p(s);
  return s;
}

Action make(ActionKind kind, int chunk, int mb) { return {kind, chunk, mb}; }

}  // namespace

Schedule gpipe(int p, int m) {
  Schedule s = start(PipelineSchedule::gpipe, Placement::interleaved, p, 1, m);
  for (auto& list : s.actions) {
    for (int mb = 0; mb < m; ++mb) list.push_back(make(ActionKind::F, 0, mb));
    for (int mb = 0; mb < m; ++mb) list.push_back(make(ActionKind::B, 0, mb));
  }
  return finish(std::move(s));
}

namespace {

// 1F1B's order on rank r: p-r-1 forwards ahead, then one forward (while any are
// left) and one backward per step, so at most p-r micro-batches are in flight.
// split (ZB-H1): each backward is an I and a W, and the W's run r micro-batches
// late, so every rank holds p micro-batches like rank 0 and the W's fill the
// gaps at the end instead of the I's waiting for them.
void one_f_one_b_rank(std::vector<Action>& list, int p, int r, int m, bool split) {
  const int warmup = std::min(p - r - 1, m);
  for (int mb = 0; mb < warmup; ++mb) list.push_back(make(ActionKind::F, 0, mb));
  int next_w = 0;
  for (int i = 0; i < m; ++i) {
    if (warmup + i < m) list.push_back(make(ActionKind::F, 0, warmup + i));
    list.push_back(make(split ? ActionKind::I : ActionKind::B, 0, i));
    if (split && i >= r) list.push_back(make(ActionKind::W, 0, next_w++));
  }
  while (split && next_w < m) list.push_back(make(ActionKind::W, 0, next_w++));
}

}  // namespace

Schedule one_f_one_b(int p, int m) {
  Schedule s = start(PipelineSchedule::one_f_one_b, Placement::interleaved, p, 1, m);
  for (int r = 0; r < p; ++r) one_f_one_b_rank(s.actions[static_cast<size_t>(r)], p, r, m, false);
  return finish(std::move(s));
}

Schedule zb_h1(int p, int m) {
  Schedule s = start(PipelineSchedule::zb_h1, Placement::interleaved, p, 1, m);
  for (int r = 0; r < p; ++r) one_f_one_b_rank(s.actions[static_cast<size_t>(r)], p, r, m, true);
  return finish(std::move(s));
}

// Megatron-LM's interleaved 1F1B. The k-th forward of a rank is micro-batch
// (k / (p v)) p + k % p of chunk (k / p) % v: micro-batches go through the chunks
// in groups of p. Backwards run the chunks in the reverse order.
Schedule interleaved_1f1b(int p, int m, int v) {
  Schedule s = start(PipelineSchedule::interleaved, Placement::interleaved, p, v, m);
  CM_CHECK(v >= 2, "use --virtual-stages 2 or more, or --schedule 1f1b for one chunk per rank",
           "interleaved: virtual-stages={}", v);
  CM_CHECK(
      m % p == 0,
      fmt::format("Megatron-LM's interleaved schedule runs micro-batches in groups of pp={}: use "
                  "--microbatches {} (a multiple of pp)",
                  p, std::max(p, (m + p - 1) / p * p)),
      "interleaved: microbatches={} is not a multiple of pp={}", m, p);
  const int total = m * v;
  auto micro_batch = [&](int k) { return k / (p * v) * p + k % p; };
  auto forward = [&](int k) { return make(ActionKind::F, k / p % v, micro_batch(k)); };
  auto backward = [&](int k) { return make(ActionKind::B, v - 1 - k / p % v, micro_batch(k)); };
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = m == p ? total : std::min(2 * (p - r - 1) + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) list.push_back(forward(k));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(forward(warmup + k));
      list.push_back(backward(k));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(backward(k));
  }
  return finish(std::move(s));
}

// ZB-V (the handcrafted schedule of the Zero Bubble paper, F = I = W): rank r
// holds stages r and 2p-1-r. Built for n = max(m, 2p-1) micro-batches, enough
// to fill the V, then the micro-batches >= m are dropped: removing whole
// micro-batches keeps every remaining dependency and cannot create a wait.
Schedule zb_v(int p, int m) {
  Schedule s = start(PipelineSchedule::zbv, Placement::v, p, 2, m);
  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    std::vector<Action> list;
    int f[2] = {0, 0}, i[2] = {0, 0}, w[2] = {0, 0};
    auto F = [&](int c) { list.push_back(make(ActionKind::F, c, f[c]++)); };
    auto I = [&](int c) { list.push_back(make(ActionKind::I, c, i[c]++)); };
    auto W = [&](int c) { list.push_back(make(ActionKind::W, c, w[c]++)); };
    for (int k = 0; k < 2 * (p - r) - 1; ++k) F(0);  // 1: fill the way down
    for (int k = 0; k < r; ++k) F(1), F(0);          // 2: the way up starts
    for (int k = 0; k < p - r; ++k) F(1), I(1), W(1);
    while (f[1] < f[0] || f[0] < n) {  // 4: steady state, both chunks
      if (f[0] < n) F(0);
      I(0), W(0), F(1), I(1), W(1);
    }
    for (int k = 0; k < r; ++k) I(0), I(1);  // 5: cool-down, W's left for the gaps
    for (int k = 0; k < p - r; ++k) I(0), W(0);
    while (w[1] < i[1]) W(1);
    while (w[0] < i[0]) W(0);
    auto& out = s.actions[static_cast<size_t>(r)];
    for (const Action& a : list)
      if (a.micro_batch < m) out.push_back(a);
  }
  return finish(std::move(s));
}

namespace {

// DeepSeek's DualPipe for one rank, in its eight phases. A "phase" is one
// direction as the rank sees it: phase 0 is the one whose pipeline it joins
// first. `ranks` is the length of one direction's pipeline up to its turn
// (DualPipe: p/2, DualPipeV: p), `h` the rank's distance from the outer end
// (DualPipe: min(r, p-1-r), DualPipeV: r); `middle` marks the ranks at the turn.
struct DualPipeRank {
  std::vector<Action>& out;
  int chunk[2];     // chunk of phase 0 and phase 1
  int first_mb[2];  // first micro-batch of each phase's chunk
  int next_f[2] = {0, 0};
  int next_b[2] = {0, 0};
  std::deque<std::pair<int, int>> pending_w;  // (chunk, mb) of split backwards, oldest first

  Action fwd(int phase) {
    return make(ActionKind::F, chunk[phase], first_mb[phase] + next_f[phase]++);
  }
  void f(int phase) { out.push_back(fwd(phase)); }
  void b(int phase, bool split) {
    const int mb = first_mb[phase] + next_b[phase]++;
    out.push_back(make(split ? ActionKind::I : ActionKind::B, chunk[phase], mb));
    if (split) pending_w.emplace_back(chunk[phase], mb);
  }
  void w() {
    out.push_back(make(ActionKind::W, pending_w.front().first, pending_w.front().second));
    pending_w.pop_front();
  }
  void fb(int f_phase, int b_phase) {  // overlapped forward and full backward
    Action a = fwd(f_phase);
    a.kind = ActionKind::FB;
    a.b_chunk = chunk[b_phase];
    a.b_micro_batch = first_mb[b_phase] + next_b[b_phase]++;
    out.push_back(a);
  }

  void run(int ranks, int h, int micro_batches, bool middle) {
    for (int k = 0; k < 2 * (ranks - h - 1); ++k) f(0);             // 1: nF0
    for (int k = 0; k < h + 1; ++k) f(0), f(1);                     // 2: nF0F1
    for (int k = 0; k < ranks - h - 1; ++k) b(1, true), w(), f(1);  // 3: nB1W1F1
    for (int k = 0; k < micro_batches - 2 * ranks + h + 1; ++k) {   // 4: nF0B1F1B0
      if (k == 0 && middle)
        f(0), b(1, false);  // not overlapped: shortens the bubble
      else
        fb(0, 1);
      fb(1, 0);
    }
    for (int k = 0; k < ranks - h - 1; ++k) b(1, false), fb(1, 0);  // 5: nB1F1B0
    bool split = false;                                             // 6: nB1B0, second half split
    for (int k = 0; k < h + 1; ++k) {
      if (k == (h + 1) / 2 && h % 2 == 1) split = true;
      b(1, split);
      if (k == (h + 1) / 2 && h % 2 == 0) split = true;
      b(0, split);
    }
    for (int k = 0; k < ranks - h - 1; ++k) w(), b(0, true);  // 7: nWB0
    while (!pending_w.empty()) w();                           // 8: nW
  }
};

}  // namespace

// DualPipe: copy 0 runs micro-batches [0, m/2) from rank 0 down, copy 1 runs
// [m/2, m) from rank p-1 up. Ranks in the second half see copy 1 as their phase 0.
Schedule dualpipe(int p, int m) {
  CM_CHECK(p >= 2 && p % 2 == 0,
           "DualPipe pairs rank r with rank p-1-r: use an even --pp (2, 4, 8)",
           "dualpipe: pp={} is not even", p);
  CM_CHECK(m % 2 == 0 && m >= 2 * p,
           fmt::format("DualPipe splits the micro-batches into two directions of at least pp each: "
                       "use --microbatches {} or more, even",
                       2 * p),
           "dualpipe: microbatches={} with pp={}", m, p);
  Schedule s = start(PipelineSchedule::dualpipe, Placement::bidirectional, p, 2, m);
  for (int r = 0; r < p; ++r) {
    const int second_half = r >= p / 2 ? 1 : 0;
    const int c0 = second_half, c1 = 1 - second_half;
    DualPipeRank rank{s.actions[static_cast<size_t>(r)], {c0, c1}, {c0 * m / 2, c1 * m / 2}};
    rank.run(p / 2, std::min(r, p - 1 - r), m / 2, r == p / 2 - 1 || r == p / 2);
  }
  return finish(std::move(s));
}

// DualPipeV: DualPipe's two halves folded onto p ranks; one model copy in a V.
Schedule dualpipe_v(int p, int m) {
  CM_CHECK(m >= 2 * p,
           fmt::format("DualPipeV needs at least 2 pp micro-batches: use --microbatches {} "
                       "or more",
                       2 * p),
           "dualpipev: microbatches={} with pp={}", m, p);
  Schedule s = start(PipelineSchedule::dualpipev, Placement::v, p, 2, m);
  for (int r = 0; r < p; ++r) {
    DualPipeRank rank{s.actions[static_cast<size_t>(r)], {0, 1}, {0, 0}};
    rank.run(p, r, m, r == p - 1);
  }
  return finish(std::move(s));
}

Schedule executed_form(const Schedule& s) {
  if (s.placement != Placement::bidirectional || has_sums(s)) return s;
  Schedule out = s;
  out.name = s.name + "-exact";
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<Action>& list = out.actions[static_cast<size_t>(r)];
    std::vector<Action> run;
    for (Action a : list) {
      if (a.kind == ActionKind::W && a.chunk == 1) continue;  // at the tail, in micro-batch order
      if (a.kind == ActionKind::B && a.chunk == 1) a.kind = ActionKind::I;
      if (a.kind == ActionKind::FB && a.b_chunk == 1) a.b_kind = ActionKind::I;
      run.push_back(a);
    }
    run.push_back(make(ActionKind::SendSum, 0, 0));
    run.push_back(make(ActionKind::RecvSum, 1, 0));
    for (int mb = s.micro_batches / 2; mb < s.micro_batches; ++mb) run.push_back(make(ActionKind::W, 1, mb));
    run.push_back(make(ActionKind::SendSum, 1, 0));
    run.push_back(make(ActionKind::RecvSum, 0, 0));
    list = std::move(run);
  }
  validate(out);
  return out;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& [kind, name] : pipeline_schedules()) names.push_back(name);
  return names;
}

Schedule make_schedule(PipelineSchedule kind, int ranks, int micro_batches, int chunks) {
  using S = PipelineSchedule;
  switch (kind) {
    case S::gpipe: return gpipe(ranks, micro_batches);
    case S::one_f_one_b: return one_f_one_b(ranks, micro_batches);
    case S::interleaved: return interleaved_1f1b(ranks, micro_batches, chunks);
    case S::zb_h1: return zb_h1(ranks, micro_batches);
    case S::zbv: return zb_v(ranks, micro_batches);
    case S::dualpipe: return dualpipe(ranks, micro_batches);
    case S::dualpipev: return dualpipe_v(ranks, micro_batches);
  }
  CM_ASSERT(false);
}

Schedule make_schedule(std::string_view name, int ranks, int micro_batches, int chunks) {
  for (const auto& [kind, known] : pipeline_schedules())
    if (known == name) return make_schedule(kind, ranks, micro_batches, chunks);
  CM_THROW(InvalidArgument, fmt::format("choose one of: {}", fmt::join(schedule_names(), ", ")),
           "unknown pipeline schedule '{}'", name);
}

}  // namespace coremesh::parallel
