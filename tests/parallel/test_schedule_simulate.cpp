// The simulator against the textbook figures (P2P = 0, as the formulas leave
// communication out), against closed forms with P2P > 0, and its chart.
// Notation: p ranks, m micro-batches, v chunks per rank; F, B (full backward),
// W, I = B - W and F&B (overlapped pair) are the times of one chunk's action.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"

#include "contains.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

Costs costs(double f, double b, double w, double fb = -1, double p2p = 0) {
  Costs c;
  c.uniform = {f, b, w};
  c.fb = fb;
  c.p2p = p2p;
  return c;
}

double max_bubble(const Simulation& sim) {
  return *std::max_element(sim.bubble.begin(), sim.bubble.end());
}

std::string trace(const std::string& name, int p, int m, double f, double b, double w,
                  double fb = -1) {
  return name + " p=" + std::to_string(p) + " m=" + std::to_string(m) + " F=" + std::to_string(f) +
         " B=" + std::to_string(b) + " W=" + std::to_string(w) + " F&B=" + std::to_string(fb);
}

constexpr double kEps = 1e-9;

}  // namespace

// GPipe and 1F1B: bubble (p-1)/(m+p-1) of the step on every rank, for any F and B.
TEST(ScheduleSimulate, GPipeAnd1F1BBubble) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 4, 9, 16})
      for (auto [f, b] : {std::pair{1.0, 2.0}, std::pair{1.5, 2.5}, std::pair{1.0, 1.0}}) {
        const double expected = double(p - 1) / (m + p - 1);
        for (const char* name : {"gpipe", "1f1b"}) {
          SCOPED_TRACE(trace(name, p, m, f, b, 0));
          const Simulation sim = simulate(make_schedule(name, p, m), costs(f, b, 0));
          EXPECT_NEAR(sim.step_time, (m + p - 1) * (f + b), kEps);
          EXPECT_NEAR(sim.total_bubble_fraction, expected, kEps);
          for (int r = 0; r < p; ++r) EXPECT_NEAR(sim.bubble_fraction[r], expected, kEps);
        }
      }
}

// Peak activation slots: GPipe holds all m micro-batches; 1F1B's rank r holds
// p - r, so the first stage holds p.
TEST(ScheduleSimulate, GPipeAnd1F1BPeakSlots) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 8, 16}) {
      const Simulation g = simulate(gpipe(p, m), costs(1, 2, 1));
      const Simulation o = simulate(one_f_one_b(p, m), costs(1, 2, 1));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.peak_slots[r], m);
        EXPECT_EQ(o.peak_slots[r], std::min(p - r, m)) << "p=" << p << " m=" << m << " rank " << r;
      }
    }
}

// Megatron-LM's interleaved 1F1B: bubble (p-1)/(v m + p-1) with per-chunk costs.
TEST(ScheduleSimulate, InterleavedBubble) {
  for (int p : {2, 3, 4})
    for (int v : {2, 3, 4})
      for (int groups : {1, 2, 3}) {
        const int m = groups * p;
        SCOPED_TRACE("interleaved p=" + std::to_string(p) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        const Simulation sim = simulate(interleaved_1f1b(p, m, v), costs(1, 2, 1));
        const double expected = double(p - 1) / (v * m + p - 1);
        EXPECT_NEAR(sim.total_bubble_fraction, expected, kEps);
        for (int r = 0; r < p; ++r) EXPECT_NEAR(sim.bubble_fraction[r], expected, kEps);
        // Megatron's warm-up on the first rank: 2(p-1) + (v-1)p chunk forwards
        // (all of them when m == p), then one more before the first backward.
        const int warmup = m == p ? v * m : std::min(2 * (p - 1) + (v - 1) * p, v * m);
        EXPECT_EQ(sim.peak_slots[0], std::min(warmup + 1, v * m));
      }
}

// ZB-H1: bubble time (p-1)(F+B-2W) on every rank (DeepSeek's notation: B is the
// full backward, so this is Zero Bubble's (p-1)(F+I-W)), with 1F1B's memory:
// every rank holds p micro-batches. The formula assumes a W fits in the gap
// of an F or an I (W <= F and W <= I), as in the paper's figure (F = I = W).
TEST(ScheduleSimulate, ZbH1Bubble) {
  for (int p : {2, 3, 4, 8})
    for (int m : {p, 2 * p, 3 * p + 1})
      for (auto [f, b, w] :
           {std::tuple{1.0, 2.0, 1.0}, std::tuple{1.0, 2.0, 0.5}, std::tuple{2.0, 3.0, 1.0},
            std::tuple{1.5, 3.0, 1.0}, std::tuple{3.0, 2.0, 1.0}}) {
        SCOPED_TRACE(trace("zb-h1", p, m, f, b, w));
        const Simulation sim = simulate(zb_h1(p, m), costs(f, b, w));
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(sim.bubble[r], (p - 1) * (f + b - 2 * w), kEps);
          EXPECT_EQ(sim.peak_slots[r], p);
        }
        // One third of 1F1B's bubble (p-1)(F+B) when F = I = W.
        if (f == 1.0 && b == 2.0 && w == 1.0) {
          EXPECT_NEAR(sim.bubble[0], simulate(one_f_one_b(p, m), costs(f, b, w)).bubble[0] / 3,
                      kEps);
        }
      }
}

// ZB-V at F = I = W (the paper's handcrafted case): the only bubble left is the
// unavoidable one, (p-1) F: the last rank cannot start before the first
// micro-batch crossed p-1 chunks. Peak 2p chunk slots = p stages, 1F1B's memory.
TEST(ScheduleSimulate, ZbVBubbleAndMemory) {
  for (int p : {2, 3, 4, 8})
    for (int m : {2 * p, 3 * p, 4 * p + 1})
      for (double f : {1.0, 0.5}) {
        SCOPED_TRACE(trace("zbv", p, m, f, 2 * f, f));
        const Simulation sim = simulate(zb_v(p, m), costs(f, 2 * f, f));
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(sim.bubble[r], (p - 1) * f, kEps);
          EXPECT_EQ(sim.peak_slots[r], 2 * p);
        }
        // Half of ZB-H1's bubble for the same model (a ZB-H1 stage is two chunks).
        EXPECT_NEAR(sim.bubble[0], simulate(zb_h1(p, m), costs(2 * f, 4 * f, 2 * f)).bubble[0] / 2,
                    kEps);
      }
}

// DualPipe: bubble (p/2-1)(F&B+B-3W), DeepSeek's table (B the full backward),
// on the ranks that wait most (the middle ones; the outer ones run more pairs),
// and PP+1 activation slots. The formula holds for the cell sizes of DeepSeek's
// figure: I = F (B = F + W), W <= F and an overlapped pair no slower than its
// halves run one after the other (F&B <= F + B).
TEST(ScheduleSimulate, DualPipeBubbleAndMemory) {
  for (int p : {4, 6, 8})
    for (int m : {2 * p, 2 * p + 2, 3 * p + (p % 4)})
      for (auto [f, w, fb] :
           {std::tuple{1.0, 1.0, 3.0}, std::tuple{1.0, 1.0, 2.5}, std::tuple{1.0, 1.0, 2.0},
            std::tuple{1.0, 0.5, 2.5}, std::tuple{1.0, 0.5, 1.5}, std::tuple{2.0, 1.0, 4.0}}) {
        const double b = f + w;
        SCOPED_TRACE(trace("dualpipe", p, m, f, b, w, fb));
        const Simulation sim = simulate(dualpipe(p, m), costs(f, b, w, fb));
        EXPECT_NEAR(max_bubble(sim), (p / 2 - 1) * (fb + b - 3 * w), kEps);
        EXPECT_EQ(*std::max_element(sim.peak_slots.begin(), sim.peak_slots.end()), p + 1);
      }
}

// DualPipeV on p ranks is DualPipe's schedule for 2p ranks folded into a V, so
// its bubble is DeepSeek's formula with PP = 2p: (p-1)(F&B+B-3W), in chunk costs;
// its 2p+1 chunk slots are DualPipe's PP+1 for the 2p half-size stages.
TEST(ScheduleSimulate, DualPipeVBubbleAndMemory) {
  for (int p : {2, 3, 4, 8})
    for (int m : {2 * p, 2 * p + 1, 3 * p})
      for (auto [f, w, fb] : {std::tuple{1.0, 1.0, 3.0}, std::tuple{1.0, 1.0, 2.0},
                              std::tuple{1.0, 0.5, 2.0}, std::tuple{2.0, 1.0, 4.0}}) {
        const double b = f + w;
        SCOPED_TRACE(trace("dualpipev", p, m, f, b, w, fb));
        const Simulation sim = simulate(dualpipe_v(p, m), costs(f, b, w, fb));
        EXPECT_NEAR(max_bubble(sim), (p - 1) * (fb + b - 3 * w), kEps);
        EXPECT_EQ(*std::max_element(sim.peak_slots.begin(), sim.peak_slots.end()), 2 * p + 1);
      }
}

// P2P > 0, GPipe: the forwards of the last micro-batch reach the last rank after
// (m+p-1) F and p-1 messages; the backwards return the same way:
// step = (m+p-1)(F+B) + 2(p-1) P2P.
TEST(ScheduleSimulate, GPipeWithP2pLatency) {
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 4, 8})
      for (double c : {0.25, 1.0, 3.0}) {
        const Simulation sim = simulate(gpipe(p, m), costs(1, 2, 1, -1, c));
        EXPECT_NEAR(sim.step_time, (m + p - 1) * 3.0 + 2 * (p - 1) * c, kEps)
            << "p=" << p << " m=" << m;
      }
}

// P2P > 0, 1F1B on 2 ranks with 2 micro-batches, F = 1, B = 2, P2P = 0.5, by hand:
//   rank 0: F0 [0,1] send (arrives 1.5), F1 [1,2] send (2.5), B0 [5,7], B1 [8,10]
//   rank 1: F0 [1.5,2.5], B0 [2.5,4.5] send (5), F1 [4.5,5.5], B1 [5.5,7.5] send (8)
TEST(ScheduleSimulate, OneF1BWithP2pLatencyByHand) {
  const Simulation sim = simulate(one_f_one_b(2, 2), costs(1, 2, 1, -1, 0.5));
  auto window = [&](int rank, const std::string& token) {
    for (const TimedAction& t : sim.timeline[rank])
      if (to_string(t.action) == token) return std::pair{t.start, t.end};
    return std::pair{-1.0, -1.0};
  };
  EXPECT_EQ(window(0, "0F1"), (std::pair{1.0, 2.0}));
  EXPECT_EQ(window(0, "0B0"), (std::pair{5.0, 7.0}));
  EXPECT_EQ(window(0, "0RECV_B1"), (std::pair{8.0, 8.0}));
  EXPECT_EQ(window(0, "0B1"), (std::pair{8.0, 10.0}));
  EXPECT_EQ(window(1, "0F0"), (std::pair{1.5, 2.5}));
  EXPECT_EQ(window(1, "0F1"), (std::pair{4.5, 5.5}));
  EXPECT_EQ(window(1, "0B1"), (std::pair{5.5, 7.5}));
  EXPECT_DOUBLE_EQ(sim.step_time, 10.0);
  EXPECT_DOUBLE_EQ(sim.busy[0], 6.0);
  EXPECT_DOUBLE_EQ(sim.bubble[1], 4.0);
  EXPECT_DOUBLE_EQ(sim.total_bubble_fraction, 0.4);
}

// Per-chunk costs and the pair cost: on one rank nothing waits, so the step is
// the sum of the action times.
TEST(ScheduleSimulate, PerChunkCostsAndPairs) {
  Costs c = costs(1, 2, 1);
  c.per_chunk = {{1, 2, 1}, {2, 4, 3}};
  const Simulation v = simulate(zb_v(1, 3), c);
  EXPECT_DOUBLE_EQ(v.step_time, 3 * (1 + 2 + 2 + 4));
  EXPECT_DOUBLE_EQ(v.bubble[0], 0.0);
  const Schedule pairs = dualpipe_v(1, 2);  // one overlapped F&B pair among its actions
  EXPECT_DOUBLE_EQ(simulate(pairs, costs(1, 2, 1)).step_time, 2 * (1 + 1 + 2 + 2));
  EXPECT_DOUBLE_EQ(simulate(pairs, costs(1, 2, 1, 2.5)).step_time, 2 * (1 + 1 + 2 + 2) - 0.5);
  c.per_chunk.pop_back();
  EXPECT_THROW(simulate(zb_v(1, 3), c), InvalidArgument);
  EXPECT_THROW(simulate(zb_v(1, 3), costs(1, 1, 2)), InvalidArgument);  // W > B
  EXPECT_THROW(simulate(zb_v(1, 3), costs(1, 2, 1, -1, -1)), InvalidArgument);
  // a pair below the W it leaves out would run backwards in time
  EXPECT_THROW(simulate(pairs, costs(1, 2, 1, 0.5)), InvalidArgument);
  // pairs priced per rank and chunk pair override the one F&B
  Costs per_pair = costs(1, 2, 1, 100);
  per_pair.fb_pairs = {{{2.5, 2.5}, {2.5, 2.5}}};
  EXPECT_DOUBLE_EQ(simulate(pairs, per_pair).step_time, 2 * (1 + 1 + 2 + 2) - 0.5);
  per_pair.fb_pairs[0][1][0] = 0.5;  // below the W
  EXPECT_THROW(simulate(pairs, per_pair), InvalidArgument);
}

// Measured stages differ (the embedding's, the head's): costs per rank. GPipe
// on 2 ranks, 1 micro-batch, rank 0 F 1 B 2, rank 1 F 3 B 4: the step is
// 1 + 3 + 4 + 2 and each rank idles for the other's work.
TEST(ScheduleSimulate, PerRankCosts) {
  Costs c = costs(1, 2, 1);
  c.per_rank = {{{1, 2, 1}}, {{3, 4, 1}}};
  const Simulation s = simulate(gpipe(2, 1), c);
  EXPECT_DOUBLE_EQ(s.step_time, 10.0);
  EXPECT_DOUBLE_EQ(s.busy[0], 3.0);
  EXPECT_DOUBLE_EQ(s.busy[1], 7.0);
  c.per_rank.pop_back();
  EXPECT_THROW(simulate(gpipe(2, 1), c), InvalidArgument);  // a rank without costs
}

// A replay: each action's own duration. With every action at its kind's cost
// it is the plain simulation; one slow forward on rank 0 delays rank 1 by as
// much (1F1B at pp 2, m 2: rank 1 waits for each forward).
TEST(ScheduleSimulate, PerActionCostsReplayAStep) {
  const Schedule s = one_f_one_b(2, 2);
  const Costs plain = costs(1, 2, 1);
  Costs replay = plain;
  for (const auto& list : s.actions) {
    auto& own = replay.per_action.emplace_back();
    for (const Action& a : list) own.push_back(plain.duration(a));
  }
  const Simulation a = simulate(s, plain), b = simulate(s, replay);
  EXPECT_DOUBLE_EQ(a.step_time, b.step_time);
  EXPECT_EQ(a.busy, b.busy);
  replay.per_action[0][0] = 3;  // 0F0 takes 3 instead of 1
  const Simulation slow = simulate(s, replay);
  EXPECT_DOUBLE_EQ(slow.step_time, a.step_time + 2);
  EXPECT_DOUBLE_EQ(slow.busy[0], a.busy[0] + 2);
  replay.per_action[1].pop_back();
  EXPECT_THROW(simulate(s, replay), InvalidArgument);  // an action without its duration
}

TEST(ScheduleSimulate, ChartHasOneRowPerRank) {
  // F = 1, B = 2: 3 columns per time unit fit "F0 "; idle time is '.'.
  const Simulation sim = simulate(gpipe(2, 1), costs(1, 2, 1));
  EXPECT_EQ(draw_timeline(sim),
            "rank 0  |F0 .........B0    |\n"
            "rank 1  |...F0 B0    ......|\n"
            "         0              5\n");
  // Chunk 1 in lower case, a pair as its two halves.
  const std::string v = draw_timeline(simulate(dualpipe_v(1, 2), costs(1, 2, 1)));
  EXPECT_PRED2(contains, v, "F0 f0 ") << v;
  EXPECT_PRED2(contains, v, "f1&B0") << v;
  // Nanosecond costs: the same chart (the axis's end was an absolute 1e-9 past: out of range)
  EXPECT_EQ(draw_timeline(simulate(gpipe(2, 1), costs(1e-10, 2e-10, 1e-10))),
            "rank 0  |F0 .........B0    |\n"
            "rank 1  |...F0 B0    ......|\n"
            "         0              5e-10\n");
  // More than two chunks: full tokens.
  EXPECT_PRED2(contains, draw_timeline(simulate(interleaved_1f1b(1, 1, 3), costs(1, 2, 1))),
               "0F0 1F0 2F0 2B0");
  // A narrow chart squeezes the cells and keeps every row inside the width.
  const std::string narrow = draw_timeline(simulate(dualpipe(4, 8), costs(1, 2, 1)), 60);
  size_t rows = 0;
  for (size_t start = 0; start < narrow.size();) {
    const size_t end = narrow.find('\n', start);
    EXPECT_LE(end - start, 60u);
    start = end + 1;
    ++rows;
  }
  EXPECT_EQ(rows, 5u);
}
