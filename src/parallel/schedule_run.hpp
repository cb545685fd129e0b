// Runs the actions of a schedule on a clock per rank; shared by validate()
// (deadlock check with unit costs) and simulate().
#pragma once

#include <cstddef>
#include <vector>

#include "coremesh/parallel/schedule_simulator.hpp"

namespace coremesh::parallel::detail {

struct Run {
  std::vector<std::vector<TimedAction>> timeline;  // [rank]: the actions that ran
  std::vector<size_t> next;                        // [rank]: first action that did not run
  bool complete = false;                           // false: deadlock (next names the waits)
};

// Every rank runs its actions in order; a receive waits until its message has
// been sent (by an action that ran) and p2p has passed. Stops when no rank can
// move on. Expects sends and receives whose peers exist (validate's local checks).
Run run_actions(const Schedule& schedule, const Costs& costs);

}  // namespace coremesh::parallel::detail
