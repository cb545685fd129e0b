// SIGINT and SIGTERM ask a training run to stop in order: the trainer
// finishes the step it is in, every PE agrees on that step, a checkpoint is
// written and the process exits 128 + the signal (130, 143).
//
// The handler only records the first signal. Run alone, a second one ends
// the process at once (a stuck run can still be stopped from the keyboard);
// as a PE of a job, repeats are ignored -- a terminal's Ctrl-C reaches the
// PEs and the launcher both, and the launcher passes it on once more -- and
// the launcher (or mpirun) is the one to stop the job at once.
#pragma once

namespace coremesh::cli {

void install_stop_signals(bool second_stops_at_once);
// The first stop signal received, 0 if none.
int stop_signal();
// "SIGINT", "SIGTERM".
const char* stop_signal_name(int sig);

}  // namespace coremesh::cli
