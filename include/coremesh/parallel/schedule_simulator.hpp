// Simulates a pipeline schedule with given costs: the timeline, the step time,
// the bubble and the peak activation slots of every rank.
//
// Conventions (the tests and `coremesh schedule` use exactly these):
// - Costs are per chunk action: F = f, B = b, I = b - w, W = w (DeepSeek's table
//   writes B for the full backward, so I = B - W), an overlapped F&B pair = fb
//   (fb < 0: the F of its forward chunk plus the B of its backward chunk, i.e. no
//   overlap gain; a pair whose backward is an I: that less the W). per_chunk, when given, sets f, b, w for each chunk;
//   per_rank, when given, for each chunk of each rank (measured stages that
//   are not alike: the embedding's, the head's).
// - Every rank starts at t = 0 and runs its actions in order; a compute action
//   starts when the previous action of its rank has ended.
// - P2P is latency only: a message sent at t can be received at t + p2p. Sends and
//   receives take no time on the rank (one-sided puts on a communication stream);
//   a receive waits until its message has arrived. A gradient-sum message
//   (SEND_SUM / RECV_SUM) moves a stage's gradients: `sum` on the sender (its
//   put) and on the receiver after the arrival (its copy out), plus p2p between. With p2p = 0 the simulator
//   reproduces the textbook formulas, which leave communication out.
// - The step is the time from 0 to the end of the last action on any rank (the
//   gradient reduction and optimizer step after it are not part of it).
// - busy = sum of a rank's compute and gradient-sum copy durations, bubble = step - busy (idle time in
//   the step, before, between and after its actions), bubble fraction = bubble /
//   step; the total fraction is sum(bubble) / (p * step).
// - A slot is one chunk's activations of one micro-batch: taken when its F starts,
//   freed when its B ends (or its W, when the backward is split: also an I pair's). Within an F&B
//   pair the forward's slot is taken before the backward frees its own
//   (DualPipe's PP+1). A chunk holds num_stages / p of the layers of a 1F1B
//   stage, so peak_slots * p / num_stages is the peak in 1F1B stage units.
#pragma once

#include <string>
#include <vector>

#include "coremesh/parallel/schedule.hpp"

namespace coremesh::parallel {

struct ComputeCost {
  double f = 1;  // forward
  double b = 2;  // full backward
  double w = 1;  // weight-gradient half of b (I = b - w)
};

struct Costs {
  ComputeCost uniform;                 // every chunk, unless per_chunk is set
  std::vector<ComputeCost> per_chunk;  // empty, or one entry per chunk
  std::vector<std::vector<ComputeCost>> per_rank;  // empty, or [rank][chunk] (overrides the others)
  double fb = -1;                      // overlapped F&B pair; < 0: f + b of its halves
  // empty, or [rank][forward chunk][backward chunk]: that pair's overlapped
  // time on that rank (overrides fb)
  std::vector<std::vector<std::vector<double>>> fb_pairs;
  double p2p = 0;                      // message latency
  double sum = 0;                      // a gradient-sum message's put or copy, on the rank
  // empty, or [rank][action index]: each action's own duration, overriding the
  // rest (a replay of a measured step: the bench checks the model against it)
  std::vector<std::vector<double>> per_action;

  const ComputeCost& of(int chunk, int rank = -1) const;
  double duration(const Action& action, int rank = -1) const;  // 0 for sends and receives
  void check(int chunks) const;                 // costs >= 0, w <= b, per_chunk sized 0 or chunks
};

struct TimedAction {
  Action action;
  double start = 0;  // a receive: when its message is there and the rank reaches it
  double end = 0;    // sends and receives: == start
};

struct Simulation {
  std::vector<std::vector<TimedAction>> timeline;  // [rank], in schedule order
  double step_time = 0;
  std::vector<double> busy;             // per rank
  std::vector<double> bubble;           // per rank: step_time - busy
  std::vector<double> bubble_fraction;  // per rank: bubble / step_time
  double total_bubble_fraction = 0;     // sum(bubble) / (ranks * step_time)
  std::vector<int> peak_slots;          // per rank
};

// Validates the schedule (validate()), then simulates it.
Simulation simulate(const Schedule& schedule, const Costs& costs);

// The timeline as text: one row per rank, `width` columns at most, and a time
// axis. Each compute action is a cell starting with its label: the kind and the
// micro-batch, upper case for chunk 0 and lower case for chunk 1 (F3, b0, i2, w2,
// F5&b1 for a pair), or the full token (2F3) when a rank has more chunks. Idle
// time is '.'. Cells narrower than their label are cut.
std::string draw_timeline(const Simulation& simulation, int width = 160);

}  // namespace coremesh::parallel
