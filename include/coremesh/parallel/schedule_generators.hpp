// Generators of the textbook pipeline schedules (see schedule.hpp for the data).
// Each returns a schedule with its sends and receives, valid by validate().
//
//   gpipe        all F, then all B (Huang et al. 2019)                      m slots on every rank
//   1f1b         p-r-1 warm-up F on rank r, then one F one B, then the rest of B
//                (PipeDream-flush, Narayanan et al. 2021)                   p-r slots
//   interleaved  Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): v chunks per
//                rank, micro-batches in groups of p, warm-up 2(p-r-1) + (v-1)p chunk forwards
//   zb-h1        Zero Bubble's ZB-H1 (Qi et al. 2023): 1F1B with B split into I and W,
//                rank r runs W r micro-batches late, so every rank holds p micro-batches
//   zbv          Zero Bubble's ZB-V: V placement, two chunks, 1F1B's activation memory
//   dualpipe     DeepSeek-V3's DualPipe: bidirectional, two model copies, even p,
//                overlapped F&B pairs in the middle (DeepSeek's eight phases)
//   dualpipev    DualPipe folded into a V: one copy, two chunks per rank
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "coremesh/parallel/config.hpp"
#include "coremesh/parallel/schedule.hpp"

namespace coremesh::parallel {

Schedule gpipe(int ranks, int micro_batches);
Schedule one_f_one_b(int ranks, int micro_batches);
Schedule interleaved_1f1b(int ranks, int micro_batches, int chunks);
Schedule zb_h1(int ranks, int micro_batches);
Schedule zb_v(int ranks, int micro_batches);
Schedule dualpipe(int ranks, int micro_batches);
Schedule dualpipe_v(int ranks, int micro_batches);

// By the enum of the training config (config.hpp) or its name there ("gpipe",
// "1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"); `chunks` is
// used by interleaved only.
Schedule make_schedule(PipelineSchedule kind, int ranks, int micro_batches, int chunks = 2);
Schedule make_schedule(std::string_view name, int ranks, int micro_batches, int chunks = 2);
std::vector<std::string> schedule_names();

// The schedule as the executor runs it, one PE's arithmetic bit for bit. The
// same schedule, except for a bidirectional one without gradient-sum
// messages (the textbook DualPipe): one PE sums a stage's micro-batches in
// order, copy 0's [0, m/2) first, so copy 1's weight gradients must continue
// copy 0's finished sums. Each copy-1 backward (B, and the B of an F&B pair)
// becomes its I, on time; the rank's own copy-1 W are dropped; the rank ends
// with 0SEND_SUM 1RECV_SUM, copy 1's W in micro-batch order, 1SEND_SUM
// 0RECV_SUM. Named NAME-exact ("dualpipe-exact"); it holds m/2 more chunk
// slots on each rank at its peak than the textbook form.
Schedule executed_form(const Schedule& schedule);

}  // namespace coremesh::parallel
