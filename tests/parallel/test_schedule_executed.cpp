// The executed form of a schedule (executed_form): the textbook DualPipe
// turned into the one the executor runs, one PE's gradient sums bit for bit:
// copy 1's backwards split into I on time and W after the partner's copy-0
// sums, the gradient-sum messages simulated and read back (validated:
// test_schedule_validate.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/parallel/schedule_simulator.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

TEST(ScheduleExecuted, DualPipeSplitsCopyOneAndSumsItsCopiesInOrder) {
  for (int p : {2, 4, 6})
    for (int m : {2 * p, 2 * p + 2, 4 * p}) {
      SCOPED_TRACE("pp=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule textbook = dualpipe(p, m), run = executed_form(textbook);
      validate(run);
      EXPECT_EQ(run.name, "dualpipe-exact");
      for (int r = 0; r < p; ++r) {
        const auto& was = textbook.actions[size_t(r)];
        const auto& now = run.actions[size_t(r)];
        // the textbook's actions, copy 1's backwards as I, its W dropped ...
        size_t k = 0;
        for (Action a : was) {
          if (a.kind == ActionKind::W && a.chunk == 1) continue;
          if (a.kind == ActionKind::B && a.chunk == 1) a.kind = ActionKind::I;
          if (a.kind == ActionKind::FB && a.b_chunk == 1) a.b_kind = ActionKind::I;
          ASSERT_LT(k, now.size());
          EXPECT_EQ(now[k++], a) << "rank " << r << " action " << k;
        }
        // ... then the sums and copy 1's W in micro-batch order
        std::vector<Action> tail{{ActionKind::SendSum, 0, 0}, {ActionKind::RecvSum, 1, 0}};
        for (int mb = m / 2; mb < m; ++mb) tail.push_back({ActionKind::W, 1, mb});
        tail.push_back({ActionKind::SendSum, 1, 0});
        tail.push_back({ActionKind::RecvSum, 0, 0});
        EXPECT_EQ(std::vector<Action>(now.begin() + long(k), now.end()), tail) << "rank " << r;
      }
      // the text form reads back; the executed form is its own executed form
      EXPECT_EQ(parse_schedule(to_text(run)).actions, run.actions);
      EXPECT_EQ(parse_schedule(to_text(run, false)).actions, run.actions);
      EXPECT_EQ(executed_form(run).actions, run.actions);
    }
  // every other schedule runs as generated
  for (const std::string& name : schedule_names())
    if (name != "dualpipe") {
      EXPECT_EQ(executed_form(make_schedule(name, 4, 8, 2)).actions, make_schedule(name, 4, 8, 2).actions) << name;
    }
}

TEST(ScheduleExecuted, SimulatorCostsTheSumsAndHoldsTheDeferredSlots) {
  Costs c;
  c.uniform = {1, 2, 1};
  c.p2p = 0.25, c.sum = 0.5;
  for (int p : {2, 4}) {
    const Schedule run = executed_form(dualpipe(p, 2 * p));
    const Simulation sim = simulate(run, c);
    const Simulation textbook = simulate(dualpipe(p, 2 * p), c);
    for (int r = 0; r < p; ++r) {
      SCOPED_TRACE("pp=" + std::to_string(p) + " rank " + std::to_string(r));
      const auto& mine = sim.timeline[size_t(r)];
      const auto& theirs = sim.timeline[size_t(p - 1 - r)];
      auto at = [](const std::vector<TimedAction>& list, ActionKind kind, int chunk) {
        for (const TimedAction& t : list)
          if (t.action.kind == kind && t.action.chunk == chunk) return t;
        ADD_FAILURE() << "missing";
        return TimedAction{};
      };
      for (int c0 : {0, 1}) {  // a sum takes `sum` on each end and arrives p2p after its put
        const TimedAction send = at(theirs, ActionKind::SendSum, 1 - c0), recv = at(mine, ActionKind::RecvSum, c0);
        EXPECT_DOUBLE_EQ(send.end - send.start, 0.5);
        EXPECT_DOUBLE_EQ(recv.end - recv.start, 0.5);
        EXPECT_GE(recv.start, send.end + 0.25);
      }
      // busy: the textbook's compute and four sum copies (the W moved, not changed)
      EXPECT_DOUBLE_EQ(sim.busy[size_t(r)], textbook.busy[size_t(r)] + 4 * 0.5);
      // the copy-1 micro-batches' slots are freed by their W at the tail
      EXPECT_GE(sim.peak_slots[size_t(r)], textbook.peak_slots[size_t(r)]);
    }
  }
  // pp 2, m 8: the executor's 6 and 5 chunk slots against the textbook's 3 (bench/pipeline_bubble.cpp)
  EXPECT_EQ(simulate(executed_form(dualpipe(2, 8)), Costs{}).peak_slots, (std::vector<int>{6, 5}));
  EXPECT_EQ(simulate(dualpipe(2, 8), Costs{}).peak_slots, (std::vector<int>{3, 3}));
}
