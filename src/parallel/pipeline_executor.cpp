#include "coremesh/parallel/pipeline_executor.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "pipeline_parts.hpp"

namespace coremesh::parallel {
namespace {

int64_t steady_ns() {  // one clock for every process of the machine
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// From a mark launched before the work to one launched after: what the stream
// did in between (the action's kernels, a receive's wait). Profiling: a named
// interval on the stage's track of the trace; `times`: the interval.
class StreamSpan {
 public:
  StreamSpan(int stage, std::string name, std::string cat, std::pair<int64_t, int64_t>* times)
      : span_(std::make_shared<runtime::SpanRecord>()), times_(times) {
    span_->track = fmt::format("pipeline stage {}", stage), span_->name = std::move(name), span_->cat = std::move(cat);
    runtime::current_stream().launch(launch_info("span_begin", runtime::KernelKind::comm, 1),
                                     [s = span_, t = times_](const runtime::BlockContext&) {
                                       s->start_ns = runtime::profiler_now_ns();
                                       if (t) t->first = steady_ns();
                                     });
  }
  ~StreamSpan() {
    runtime::current_stream().launch(launch_info("span_end", runtime::KernelKind::comm, 1),
                                     [s = span_, t = times_](const runtime::BlockContext&) {
                                       s->end_ns = runtime::profiler_now_ns();
                                       if (t) t->second = steady_ns();
                                       if (runtime::profiler_enabled()) runtime::profiler_add_span(*s);
                                     });
  }
  StreamSpan(const StreamSpan&) = delete;
  StreamSpan& operator=(const StreamSpan&) = delete;

 private:
  std::shared_ptr<runtime::SpanRecord> span_;
  std::pair<int64_t, int64_t>* times_;
};

}  // namespace

std::string action_category(ActionKind k) {
  switch (k) {
    case ActionKind::F: return "F";
    case ActionKind::B: return "B";
    case ActionKind::I: return "I";
    case ActionKind::W: return "W";
    case ActionKind::FB: return "F&B";
    case ActionKind::SendSum:
    case ActionKind::RecvSum: return "grad sum";
    default: return "p2p";
  }
}

// Signals: one per receive buffer, then the tied table's (one per
// micro-batch and the table's refresh), then DualPipe's two per chunk.
SymmetricLayout PipelineExecutor::symmetric_layout(const Setup& s) {
  SymmetricLayout l;
  const Schedule& q = s.schedule;
  const bool several = q.ranks > 1, dualpipe = q.placement == Placement::bidirectional;
  const int64_t messages = several ? 2 * q.chunks * q.micro_batches : 0;
  int64_t tied = 0, arena = 0;
  for (int r = 0; several && r < q.ranks; ++r) {
    const StageParams p = s.params_of(s.stage_of(r));
    arena = std::max(arena, p.arena_size);
    if (const ParamSpan* replica = detail::replica_of(p); replica && s.tied_embeddings) tied = replica->numel;
  }
  const int64_t loads = dualpipe ? int64_t(s.shape.layers) * s.shape.routing_stats() : 0;
  l.add("pipeline receive buffers", {messages * s.shape.tokens() * s.shape.d_model});
  l.add("pipeline signals", {several ? messages + q.micro_batches + 1 + 4 : 0}, DType::i64);
  l.add("tied table gradients", {tied > 0 ? q.micro_batches * tied : 0});
  l.add("DualPipe partner gradients", {dualpipe ? arena : 0});
  l.add("DualPipe partner loads", {loads}, DType::i64);
  l.add("DualPipe own loads", {loads}, DType::i64);
  return l;
}

// ---- construction

PipelineExecutor::PipelineExecutor(Setup setup, runtime::Device& device) : s_(std::move(setup)), pair_(device) {
  stage_ = s_.stage_of(s_.rank);
  params_ = s_.params_of(stage_);
  rows_ = s_.shape.tokens();
  const SymmetricLayout layout = symmetric_layout(s_);
  if (s_.schedule.ranks > 1) buf_ = layout.allocate();
  else buf_.assign(kRegions, Tensor());
  if (s_.tied_embeddings && s_.schedule.ranks > 1 && buf_[kTied].numel() > 0) tied_ = std::make_unique<Tied>(*this);
}

PipelineExecutor::~PipelineExecutor() = default;

TiedEmbedding* PipelineExecutor::tied_seam() { return tied_.get(); }

int PipelineExecutor::buffer(bool grad, int chunk, int mb) const {
  return ((grad ? 1 : 0) * s_.schedule.chunks + chunk) * s_.schedule.micro_batches + mb;
}

uint64_t* PipelineExecutor::signal(int index) const { return static_cast<uint64_t*>(buf_[kSignals].raw_data()) + index; }

void PipelineExecutor::wait(int index, std::string what) {
  runtime::Stream stream = runtime::current_stream();
  wait_signal_on_stream(stream, signal(index), 1, std::move(what));
}

void PipelineExecutor::sync_tied_table(StageModel& stage) {
  if (tied_) tied_->sync(stage);
}

// ---- messages

Tensor PipelineExecutor::receive(bool grad, int chunk, int mb) {
  const int i = buffer(grad, chunk, mb);
  const int64_t size = rows_ * s_.shape.d_model;
  const StageRef from = s_.schedule.peer(s_.rank, {grad ? ActionKind::RecvB : ActionKind::RecvF, chunk, mb});
  wait(i, fmt::format("waits for PE {}'s {} of micro-batch {} (chunk {})", pe(from.rank),
                      grad ? "input gradient" : "activations", mb, chunk));
  // a copy of its own: the buffer is free again, the model may keep the input for its backward
  Tensor out = Tensor::empty({rows_, s_.shape.d_model});
  copy_on_stream(buf_[kRecv].slice(0, i * size, (i + 1) * size), out.view({size}));
  return out;
}

void PipelineExecutor::send(const Tensor& data, const Action& a) {
  const StageRef to = s_.schedule.peer(s_.rank, a);
  const int i = buffer(a.kind == ActionKind::SendB, to.chunk, a.micro_batch);
  const int64_t size = rows_ * s_.shape.d_model;
  CM_ASSERT(data.defined() && data.numel() == size);
  const Tensor src = data.contiguous().view({size});
  keep_.push_back(src);  // the put reads it when the stream gets there
  runtime::Stream stream = runtime::current_stream();
  put_on_stream(stream, buf_[kRecv], i * size, src, signal(i), pe(to.rank));
}

// ---- the step

void PipelineExecutor::run(StageModel& m) {
  keep_.clear();  // the previous step's puts are done (the step synchronized)
  const Schedule& q = s_.schedule;
  const int last = q.num_stages() - 1, me = s_.rank;
  // Where a chunk's input (or output gradient) comes from: a message, or the
  // chunk of the neighbouring stage on this rank.
  auto neighbour = [&](int chunk, int mb, int step) { return q.locate(mb, q.stage_of(me, chunk) + step); };
  auto take = [](std::map<std::pair<int, int>, Tensor>& from, std::pair<int, int> key) {
    auto it = from.find(key);
    CM_ASSERT(it != from.end());
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  };
  const bool traced = q.ranks > 1 && (s_.timed || runtime::profiler_enabled());
  std::set<std::pair<int, int>> live;  // chunk slots: (chunk, micro-batch) from F to B or W
  memory_ = {};
  auto note = [&](int chunk, int mb, bool taken) {
    if (!traced) return;
    if (!taken) return void(live.erase({chunk, mb}));
    live.insert({chunk, mb});
    int64_t bytes = 0;
    for (int i = 0; i < q.micro_batches; ++i)
      if (m.slot_open(i)) bytes += m.saved_activation_bytes(i);
    memory_.peak_activation_bytes = std::max(memory_.peak_activation_bytes, bytes);
    memory_.peak_slots = std::max(memory_.peak_slots, int(live.size()));
  };
  auto forward = [&](int c, int mb) {
    if (!m.slot_open(mb)) m.open_slot(mb);
    const int stage = q.stage_of(me, c);
    Tensor in;
    if (stage > 0) {
      const StageRef prev = neighbour(c, mb, -1);
      in = prev.rank == me ? take(outputs_, {prev.chunk, mb}) : take(inputs_, {c, mb});
    }
    Tensor out = m.forward_chunk(mb, c, in);
    if (stage < last) outputs_[{c, mb}] = out;
    note(c, mb, true);
  };
  // DualPipe: a micro-batch passes one chunk of a rank; its slot closes after that backward
  std::vector<int> passes(size_t(q.micro_batches), 0);
  for (int mb = 0; mb < q.micro_batches; ++mb)
    for (int c = 0; c < q.chunks; ++c) passes[size_t(mb)] += q.passes_through(mb, c);
  auto backward = [&](int c, int mb, bool defer) {
    const int stage = q.stage_of(me, c);
    Tensor dout;
    if (stage < last) {
      const StageRef next = neighbour(c, mb, 1);
      dout = next.rank == me ? take(grads_, {next.chunk, mb}) : take(grad_inputs_, {c, mb});
    }
    Tensor din = m.backward_chunk(mb, c, dout, defer);
    if (stage > 0) grads_[{c, mb}] = din;
    if (--passes[size_t(mb)] == 0 && m.slot_open(mb)) m.close_slot(mb);
    if (!defer) note(c, mb, false);
  };
  const std::vector<Action>& actions = q.actions[size_t(me)];
  times_.assign(actions.size(), {0, 0});
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    std::optional<StreamSpan> span;
    if (traced) span.emplace(q.stage_of(me, a.chunk), to_string(a), action_category(a.kind), &times_[i]);
    switch (a.kind) {
      case ActionKind::F: forward(a.chunk, a.micro_batch); break;
      case ActionKind::B: backward(a.chunk, a.micro_batch, false); break;
      case ActionKind::I: backward(a.chunk, a.micro_batch, true); break;
      case ActionKind::W: m.backward_weight(a.micro_batch, a.chunk), note(a.chunk, a.micro_batch, false); break;
      case ActionKind::FB: {  // the forward's slot is taken before the backward frees its own
        auto f = [&] { forward(a.chunk, a.micro_batch); };
        auto b = [&] { backward(a.b_chunk, a.b_micro_batch, a.b_kind == ActionKind::I); };
        if (s_.pair_streams) run_pair(a, f, b);
        else f(), b();
        break;
      }
      case ActionKind::SendF: send(take(outputs_, {a.chunk, a.micro_batch}), a); break;
      case ActionKind::SendB: send(take(grads_, {a.chunk, a.micro_batch}), a); break;
      case ActionKind::RecvF: inputs_[{a.chunk, a.micro_batch}] = receive(false, a.chunk, a.micro_batch); break;
      case ActionKind::RecvB: grad_inputs_[{a.chunk, a.micro_batch}] = receive(true, a.chunk, a.micro_batch); break;
      case ActionKind::SendSum: send_sums(m, a.chunk); break;
      case ActionKind::RecvSum: receive_sums(m, a.chunk); break;
    }
  }
  CM_ASSERT(outputs_.empty() && grads_.empty() && inputs_.empty() && grad_inputs_.empty());
}

// DualPipe's overlapped pair: the forward on the compute stream and the
// backward on pair_, concurrently, each stream limited to half of the
// stage's cores (at least one); the compute stream then waits for both.
// The halves touch different chunks (their own slots, parts and gradients);
// what the backward reads was made on the compute stream before the pair.
void PipelineExecutor::run_pair(const Action& a, const std::function<void()>& forward,
                                const std::function<void()>& backward) {
  const bool traced = s_.timed || runtime::profiler_enabled();
  runtime::Stream main = runtime::current_stream();
  const runtime::CoreLimits all = main.effective_limits();
  runtime::Event start;
  start.record(main);
  start.wait(pair_);
  main.set_limit(std::max(1, all.cube - all.cube / 2), std::max(1, all.vector - all.vector / 2));
  pair_.set_limit(std::max(1, all.cube / 2), std::max(1, all.vector / 2));
  const Schedule& q = s_.schedule;
  {
    std::optional<StreamSpan> span;
    if (traced) span.emplace(q.stage_of(s_.rank, a.chunk), to_string({ActionKind::F, a.chunk, a.micro_batch}), "F", nullptr);
    forward();
  }
  main.set_limit(all.cube, all.vector);
  {
    runtime::StreamGuard on(pair_);
    std::optional<StreamSpan> span;
    if (traced)
      span.emplace(q.stage_of(s_.rank, a.b_chunk), to_string({a.b_kind, a.b_chunk, a.b_micro_batch}),
                   action_category(a.b_kind), nullptr);
    backward();
  }
  runtime::Event done;
  done.record(pair_);
  done.wait(main);
}

// ---- validation

Tensor PipelineExecutor::forward_only(StageModel& m) {
  const Schedule& q = s_.schedule;
  const int last = q.num_stages() - 1, slot = 0, me = s_.rank;
  std::vector<int> order(size_t(q.chunks));  // this rank's chunks in stage order
  for (int c = 0; c < q.chunks; ++c) order[size_t(c)] = c;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return q.stage_of(me, a) < q.stage_of(me, b); });
  m.open_slot(slot);
  Tensor x, losses;
  for (int c : order) {
    if (!q.passes_through(slot, c)) continue;
    const int stage = q.stage_of(me, c);
    if (stage > 0 && q.locate(slot, stage - 1).rank != me) x = receive(false, c, slot);
    x = m.forward_chunk(slot, c, x);
    if (stage == last) losses = m.token_losses(slot);
    else if (q.locate(slot, stage + 1).rank != me) send(x, {ActionKind::SendF, c, slot});
  }
  if (q.ranks > 1) {
    runtime::current_stream().synchronize();
    keep_.clear();
  }
  m.close_slot(slot);
  if (q.ranks > 1) world_barrier();  // every buffer read before the next batch is put
  return losses;
}

}  // namespace coremesh::parallel
