#include "coremesh/parallel/fused_comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"
#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/transpose.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace coremesh::parallel {

// Signal words, kWords kinds of max(tp, chunks) words each (one per member,
// or per chunk): data puts into this PE's inbox / staging from member m, and
// the all-reduce's per-chunk reduce-scatter and all-gather arrivals.
enum FusedTensorComm::Word : int { gathered, scattered, chunk_summed, chunk_gathered, kWords };

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Chunks the buffers are sized for: the fixed count, else any the op cache may give.
int max_chunks(const FusedCommOptions& o) { return o.chunks > 0 ? o.chunks : FusedCommOptions::kMaxChunks; }

// A slot holds one member's share: its rows of a gathered input, or of h | y |
// rstd (add_rmsnorm_allreduce), or its copies of every chunk's shard.
int64_t slot_bytes(int tp, int64_t capacity, int64_t max_rows, const FusedCommOptions& o) {
  const int64_t share = (capacity + tp - 1) / tp;
  return 4 * round_up(2 * share + (max_rows + tp - 1) / tp + 16 * (max_chunks(o) + 1), 16);
}

constexpr const char* kOp = "fused_tensor_comm";

// chunked: the keys of the chunked all-reduces; the other operators cut one
// chunk per member, and only their comm cores are a choice (tile_m 0).
runtime::OpKey tiling_key(int tp, int64_t capacity, int64_t max_rows, runtime::CoreLimits limits, bool chunked) {
  return {kOp, {{tp}, {capacity}, {max_rows}}, {DType::f32}, limits, chunked ? "chunked=1" : "chunked=0"};
}

// The search space: 1..kMaxChunks chunks (powers of two, chunked keys) on 1 or 2 comm cores.
std::vector<runtime::Tiling> fused_tilings(const runtime::OpKey& key, const runtime::Tiling&, int max_blocks) {
  std::vector<runtime::Tiling> out;
  const bool chunked = key.attr("chunked") == "1";
  for (int cores = 1; cores <= std::min(2, max_blocks); ++cores) {
    if (!chunked) out.push_back({cores, 1, 0, 0});
    for (int chunks = 1; chunked && chunks <= FusedCommOptions::kMaxChunks; chunks *= 2)
      out.push_back({cores, 1, chunks, 0});
  }
  return out;
}

std::string describe_fused(const runtime::Tiling& t) {
  const std::string cores = fmt::format("{} comm core{}", t.block_dim, t.block_dim == 1 ? "" : "s");
  return t.tile_m == 0 ? cores : fmt::format("{} chunk{} on {}", t.tile_m, t.tile_m == 1 ? "" : "s", cores);
}

[[maybe_unused]] const bool registered = runtime::register_op(kOp, {0, nullptr, fused_tilings, true, describe_fused});

Tensor rows(const Tensor& t, std::pair<int64_t, int64_t> r) { return t.slice(0, r.first, r.second); }

// A weight's output and input sizes: nk (O, K), kn (K, O).
int64_t outputs_of(const Tensor& w, ops::WeightLayout layout) {
  return layout == ops::WeightLayout::nk ? w.size(0) : w.size(1);
}
int64_t inputs_of(const Tensor& w, ops::WeightLayout layout) {
  return layout == ops::WeightLayout::nk ? w.size(1) : w.size(0);
}
bool transposed(ops::WeightLayout layout) { return layout == ops::WeightLayout::nk; }

}  // namespace

FusedTensorComm::FusedTensorComm(Group group, int64_t capacity, int64_t max_rows, FusedCommOptions options)
    : group_(std::move(group)), options_(options), max_rows_(max_rows) {
  check_members_agree(group_, {capacity, max_rows, options.chunks, options.comm_cores}, "a fused TP group");
  CM_CHECK(capacity > 0 && max_rows > 0 && options_.chunks >= 0 && options_.chunks <= FusedCommOptions::kMaxChunks &&
               options_.comm_cores >= 0,
           fmt::format("give a positive capacity and row count, chunks from 1 to {} and comm_cores >= 1 (0: the op "
                       "cache's)", FusedCommOptions::kMaxChunks),
           "fused comm over {} elements, {} rows, {} chunks, {} comm cores", capacity, max_rows, options_.chunks,
           options_.comm_cores);
  const int tp = group_.size();
  slot_bytes_ = slot_bytes(tp, capacity, max_rows, options_);
  inbox_ = symmetric_tensor({2 * int64_t(tp) * slot_bytes_ / 4});  // two halves of tp slots
  staging_ = symmetric_tensor({2 * int64_t(tp) * slot_bytes_ / 4});
  arena_ = symmetric_tensor({round_up(capacity, 16)});
  signals_ = symmetric_tensor({int64_t(kWords) * std::max(tp, max_chunks(options_))}, DType::i64);
  capacity_ = capacity;
  // Every member must split the same way: a tuning cache on some hosts only would hang the first call.
  // peeked: the lookups must not make the keys the tuner searches (an unused one would be searched)
  const FusedCommOptions chunked = options_from(runtime::OpCache::global().peek(
                             key(true), runtime::KernelKind::vector, heuristic(true))),
                         whole = options_from(runtime::OpCache::global().peek(
                             key(false), runtime::KernelKind::vector, heuristic(false)));
  const std::vector<int64_t> mine = {chunked.chunks, chunked.comm_cores, whole.comm_cores};
  std::vector<int64_t> both = mine;
  for (int64_t v : mine) both.push_back(-v);
  const std::vector<int64_t> most = max_over_world(both);
  CM_CHECK(most[0] == -most[3] && most[1] == -most[4] && most[2] == -most[5],
           "give every PE the same tuning cache (or none), or fix the chunks and comm cores",
           "the PEs' fused TP exchanges would split differently: {} to {} chunks, {} to {} and {} to {} comm cores",
           -most[3], most[0], -most[4], most[1], -most[5], most[2]);
}

runtime::OpKey FusedTensorComm::key(bool chunked) const {
  return tiling_key(group_.size(), capacity_, max_rows_, runtime::current_stream().effective_limits(), chunked);
}

runtime::Tiling FusedTensorComm::heuristic(bool chunked) { return {1, 1, chunked ? 2 : 0, 0}; }

FusedCommOptions FusedTensorComm::options_from(const runtime::Tiling& t) const {
  return {options_.chunks > 0 ? options_.chunks : int(std::clamp<int64_t>(t.tile_m, 1, FusedCommOptions::kMaxChunks)),
          options_.comm_cores > 0 ? options_.comm_cores : t.block_dim};
}

FusedCommOptions FusedTensorComm::resolved(bool chunked) const {
  if (options_.chunks > 0 && options_.comm_cores > 0) return options_;
  const runtime::Tiling h = heuristic(chunked);
  return options_from(
      runtime::OpCache::global().get(key(chunked), runtime::KernelKind::vector, [&](int) { return h; }).second);
}

int64_t FusedTensorComm::symmetric_bytes(int tp, int64_t capacity, int64_t max_rows, FusedCommOptions options) {
  return 4 * int64_t(tp) * slot_bytes(tp, capacity, max_rows, options) + 4 * round_up(capacity, 16) +
         8 * int64_t(kWords) * std::max(tp, max_chunks(options)) + 4 * 64;
}

FusedTensorComm::~FusedTensorComm() {
  // The slots are views that do not own the buffers (a view held longer on one
  // PE would free the buffers in another order there: symmetric frees are
  // collective): nothing may still read them when the buffers go.
  if (!comm_) return;
  try {
    comm_->device().synchronize();
  } catch (const std::exception& e) {
    CM_LOG_WARN("fused comm: work still queued failed at teardown: {}", e.what());
  }
}

uint64_t* FusedTensorComm::word(Word w, int index) const {
  return static_cast<uint64_t*>(signals_.raw_data()) + int64_t(w) * std::max(group_.size(), max_chunks(options_)) +
         index;
}

void FusedTensorComm::put(runtime::Stream& s, const Tensor& dst, int64_t at, const void* src, int64_t bytes,
                          int member, Word signal, int index) {
  shmem::put_signal_on_stream(s, static_cast<std::byte*>(dst.raw_data()) + at, static_cast<const std::byte*>(src),
                              size_t(bytes), word(signal, index), 1, shmem::SignalOp::add,
                              group_.pes[size_t(member)]);
  bytes_put_ += bytes;
}

void FusedTensorComm::wait(runtime::Stream& s, Word w, int index, uint64_t count, const char* what) {
  const bool per_chunk = w == chunk_summed || w == chunk_gathered;
  const std::string from = per_chunk ? fmt::format("chunk {}", index) : fmt::format("PE {}", group_.pes[size_t(index)]);
  wait_signal_on_stream(s, word(w, index), count,
                        fmt::format("waits for {} ({}) of the fused TP group {}", what, from, others(group_)));
}

int64_t FusedTensorComm::next_half(int64_t& uses) const { return (uses++ % 2) * group_.size() * slot_bytes_; }

Tensor FusedTensorComm::slot(const Tensor& buffer, int64_t half, int member, int64_t at, Shape shape,
                             DType dtype) const {
  CM_CHECK(at + shape_numel(shape) * int64_t(dtype_size(dtype)) <= slot_bytes_,
           "size the fused comm's capacity for the largest tensor it moves",
           "{} of {} at byte {} of a {}-byte slot", shape_str(shape), dtype_name(dtype), at, slot_bytes_);
  auto* p = static_cast<std::byte*>(buffer.raw_data()) + half + int64_t(member) * slot_bytes_ + at;
  return Tensor::wrap(p, shape, dtype);
}

std::pair<int64_t, int64_t> FusedTensorComm::rows_of(int64_t n, int member) const {
  return shard_bounds(0, n, group_.size(), member, 1);
}

runtime::Stream& FusedTensorComm::comm(const runtime::Stream& after, int cores) {
  if (!comm_) comm_.emplace(after.device());
  comm_->set_limit(-1, cores);
  comm_->wait_event(runtime::Stream(after).record_event());
  return *comm_;
}

void FusedTensorComm::check_rows(const Tensor& t, const char* call) const {
  CM_CHECK(t.dim() == 2 && t.is_contiguous() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16) &&
               t.size(0) <= max_rows_,
           "pass a contiguous f32 or bf16 (rows, columns) within the rows the fused comm was sized for",
           "{} of {} (set up for {} rows)", call, t.describe(), max_rows_);
}

namespace {

// Keeps `tensors` alive until `s` gets here (a put reads them by address).
void hold_on(runtime::Stream& s, std::vector<Tensor> tensors) {
  s.launch(launch_info("hold", runtime::KernelKind::comm, 1, tensors), [tensors](const runtime::BlockContext&) {});
}

}  // namespace

void FusedTensorComm::gather_rows(const std::vector<Tensor>& parts,
                                  const std::function<void(int, const std::vector<Tensor>&)>& each) {
  const int tp = group_.size(), me = group_.me;
  runtime::Stream s = runtime::current_stream();
  const int64_t half = next_half(inbox_uses_);
  std::vector<int64_t> at;  // each part's byte offset in a member's slot (64-byte aligned)
  int64_t bytes = 0;
  for (const Tensor& p : parts) {
    at.push_back(bytes);
    slot(inbox_, half, me, bytes, p.shape(), p.dtype());  // checks the size
    bytes = round_up(bytes + int64_t(p.nbytes()), 64);
  }
  if (tp > 1) {
    runtime::Stream& c = comm(s, resolved(false).comm_cores);
    for (int i = 1; i < tp; ++i)  // the member that reads this one's rows next first
      for (size_t k = 0; k < parts.size(); ++k)
        put(c, inbox_, half + int64_t(me) * slot_bytes_ + at[k], parts[k].raw_data(), int64_t(parts[k].nbytes()),
            (me - i + tp) % tp, gathered, me);
    hold_on(c, parts);
  }
  for (int i = 0; i < tp; ++i) {
    const int m = (me + i) % tp;
    if (m == me) {
      each(m, parts);
      continue;
    }
    wait(s, gathered, m, parts.size(), "rows to multiply");  // a stream's puts land in order
    std::vector<Tensor> theirs;
    for (size_t k = 0; k < parts.size(); ++k) theirs.push_back(slot(inbox_, half, m, at[k], parts[k].shape(), parts[k].dtype()));
    each(m, theirs);
  }
  if (tp > 1) s.wait_event(comm_->record_event());
}

FusedTensorComm::Gathered FusedTensorComm::allgather_matmul(const Tensor& x, const Tensor& w, bool keep_input,
                                                           ops::WeightLayout layout) {
  const int tp = group_.size();
  CM_CHECK(x.dim() == 2 && x.is_contiguous() && (x.dtype() == DType::f32 || x.dtype() == DType::bf16) &&
               w.dim() == 2 && inputs_of(w, layout) == x.size(1),
           "pass x (n, K) contiguous f32 or bf16 and w (O, K), or (K, O) with the kn layout",
           "allgather_matmul of {} and {}", x.describe(), w.describe());
  const int64_t n = x.size(0), K = x.size(1);
  Gathered out{Tensor::empty({tp * n, outputs_of(w, layout)}),
               keep_input ? Tensor::empty({tp * n, K}, x.dtype()) : Tensor()};
  gather_rows({x}, [&](int m, const std::vector<Tensor>& xm) {
    Tensor y = out.y.slice(0, m * n, (m + 1) * n);
    ops::matmul_out(xm[0], w, y, false, transposed(layout));
    if (keep_input) copy_on_stream(xm[0], out.gathered.slice(0, m * n, (m + 1) * n));
  });
  return out;
}

FusedTensorComm::GatheredFp8 FusedTensorComm::allgather_matmul(const ops::QuantizedTensor& x,
                                                               const ops::QuantizedTensor& w) {
  const int tp = group_.size();
  CM_CHECK(x.data.dim() == 2 && x.data.is_contiguous() && x.scale.is_contiguous() && x.data.dtype() == DType::f8e4m3 &&
               x.scale.dim() == 2 && x.scale.size(0) == x.data.size(0) && w.data.dim() == 2 &&
               w.data.size(1) == x.data.size(1),
           "pass x quantized by ops::quantize_fp8_act (n, K) and w by ops::quantize_fp8_weight (O, K)",
           "fp8 allgather_matmul of {} (scales {}) and {}", x.data.describe(), x.scale.describe(), w.data.describe());
  const int64_t n = x.data.size(0);
  GatheredFp8 out{Tensor::empty({tp * n, w.data.size(0)}),
                  {Tensor::empty({tp * n, x.data.size(1)}, DType::f8e4m3), Tensor::empty({tp * n, x.scale.size(1)})}};
  gather_rows({x.data, x.scale}, [&](int m, const std::vector<Tensor>& xm) {
    const auto r = std::pair<int64_t, int64_t>{m * n, (m + 1) * n};
    copy_on_stream(ops::matmul_fp8({xm[0], xm[1]}, w), rows(out.y, r));
    copy_on_stream(xm[0], rows(out.gathered.data, r));
    copy_on_stream(xm[1], rows(out.gathered.scale, r));
  });
  return out;
}

Tensor FusedTensorComm::reduce_scatter_rows(int64_t N, int64_t C, const RowsGemm& gemm) {
  const int tp = group_.size(), me = group_.me;
  const int64_t n = N / tp;
  runtime::Stream s = runtime::current_stream();
  Tensor part = arena_.slice(0, 0, N * C).view({N, C});
  auto block = [&](int m) { return std::pair<int64_t, int64_t>{m * n, (m + 1) * n}; };
  runtime::Stream* c = tp > 1 ? &comm(s, resolved(false).comm_cores) : nullptr;
  const int64_t half = next_half(staging_uses_);
  slot(staging_, half, me, 0, {n, C});  // checks the size
  for (int i = 1; i <= tp; ++i) {  // the next member's rows first, this one's last
    const int o = (me + i) % tp;
    Tensor y = rows(part, block(o));
    gemm(block(o).first, block(o).second, y);
    if (o == me) break;
    c->wait_event(s.record_event());
    put(*c, staging_, half + int64_t(me) * slot_bytes_, y.raw_data(), int64_t(y.nbytes()), o, scattered, me);
  }
  Tensor out = Tensor::empty({n, C});
  if (tp == 1) {
    copy_on_stream(part, out);
    return out;
  }
  std::vector<Tensor> copies;
  for (int m = 0; m < tp; ++m) {
    if (m != me) wait(s, scattered, m, 1, "partial sums of this member's rows");
    copies.push_back(m == me ? rows(part, block(me)) : slot(staging_, half, m, 0, {n, C}));
  }
  sum_in_order(copies, out);
  s.wait_event(c->record_event());
  return out;
}

Tensor FusedTensorComm::matmul_reduce_scatter(const Tensor& h, const Tensor& w, ops::WeightLayout layout) {
  const int tp = group_.size();
  check_rows(h, "matmul_reduce_scatter");
  CM_CHECK(h.size(0) % tp == 0 && w.dim() == 2 && inputs_of(w, layout) == h.size(1) &&
               outputs_of(w, layout) * h.size(0) <= arena_.numel(),
           "choose rows divisible by tp and w (C, F) matching h (N, F), or (F, C) with the kn layout",
           "matmul_reduce_scatter of {} and {} over tp {}", h.describe(), w.describe(), tp);
  return reduce_scatter_rows(h.size(0), outputs_of(w, layout), [&](int64_t r0, int64_t r1, Tensor y) {
    ops::matmul_out(h.slice(0, r0, r1), w, y, false, transposed(layout));
  });
}

Tensor FusedTensorComm::allreduce_rows(int64_t N, int64_t C, const RowsGemm& gemm) {
  const int tp = group_.size(), me = group_.me;
  const FusedCommOptions o = resolved(true);
  const int chunks = int(std::min<int64_t>(o.chunks, N));
  runtime::Stream s = runtime::current_stream();
  const Tensor flat = arena_.slice(0, 0, N * C);
  runtime::Stream* c = tp > 1 ? &comm(s, o.comm_cores) : nullptr;
  const int64_t half = next_half(staging_uses_);
  int64_t staged = 0;  // floats into each staging slot: the chunks' largest shards one after the other
  for (int k = 0; k < chunks; ++k) {
    const int64_t r0 = N * k / chunks, r1 = N * (k + 1) / chunks, b = r0 * C, e = r1 * C;
    gemm(r0, r1, flat.slice(0, b, e).view({r1 - r0, C}));
    if (!c) continue;
    c->wait_event(s.record_event());
    int64_t largest = 0;
    for (int m = 0; m < tp; ++m) {
      const auto [sb, se] = shard_bounds(b, e, tp, m, 16);
      largest = std::max(largest, se - sb);
      if (m != me)
        put(*c, staging_, half + int64_t(me) * slot_bytes_ + 4 * staged, flat.data<float>() + sb, 4 * (se - sb), m,
            chunk_summed, k);
    }
    wait(*c, chunk_summed, k, uint64_t(tp - 1), "copies of this member's shard");
    const auto [sb, se] = shard_bounds(b, e, tp, me, 16);
    std::vector<Tensor> copies;
    for (int m = 0; m < tp; ++m)
      copies.push_back(m == me ? flat.slice(0, sb, se) : slot(staging_, half, m, 4 * staged, {se - sb}));
    {
      runtime::StreamGuard on(*c);
      sum_in_order(copies, flat.slice(0, sb, se));
    }
    for (int m = 0; m < tp; ++m)
      if (m != me) put(*c, arena_, 4 * sb, flat.data<float>() + sb, 4 * (se - sb), m, chunk_gathered, k);
    wait(*c, chunk_gathered, k, uint64_t(tp - 1), "summed shards");
    staged += round_up(largest, 16);
  }
  if (c) s.wait_event(c->record_event());
  Tensor out = Tensor::empty({N, C});
  copy_on_stream(flat, out);
  return out;
}

Tensor FusedTensorComm::matmul_allreduce(const Tensor& h, const Tensor& w, ops::WeightLayout layout) {
  check_rows(h, "matmul_allreduce");
  CM_CHECK(w.dim() == 2 && inputs_of(w, layout) == h.size(1) && outputs_of(w, layout) * h.size(0) <= arena_.numel(),
           "pass w (C, F) matching h (N, F), or (F, C) with the kn layout, within the capacity",
           "matmul_allreduce of {} and {}", h.describe(), w.describe());
  return allreduce_rows(h.size(0), outputs_of(w, layout), [&](int64_t r0, int64_t r1, Tensor y) {
    ops::matmul_out(h.slice(0, r0, r1), w, y, false, transposed(layout));
  });
}

namespace {

void check_backward(const Tensor& dy, const Tensor& input, const Tensor& w, int64_t dy_rows, const char* call) {
  CM_CHECK(dy.dim() == 2 && input.dim() == 2 && w.dim() == 2 && dy.dtype() == DType::f32 &&
               input.dtype() == DType::f32 && dy.size(0) == dy_rows && dy.size(1) == w.size(0) &&
               input.size(1) == w.size(1),
           "pass f32 dy as the forward returned y, the forward's f32 input rows and its w (O, K)",
           "{} of dy {}, input {} and w {}", call, dy.describe(), input.describe(), w.describe());
}

}  // namespace

FusedTensorComm::Grads FusedTensorComm::allgather_matmul_backward(const Tensor& dy, const Tensor& gathered,
                                                                  const Tensor& w) {
  check_backward(dy, gathered, w, gathered.size(0), "allgather_matmul_backward");
  Tensor dw = ops::matmul(dy, gathered, true, false);  // before the exchange: it needs no peer
  return {matmul_reduce_scatter(dy, w, ops::WeightLayout::kn), dw};
}

FusedTensorComm::Grads FusedTensorComm::matmul_reduce_scatter_backward(const Tensor& dy, const Tensor& h,
                                                                       const Tensor& w) {
  CM_CHECK(h.dim() == 2 && h.size(0) % group_.size() == 0, "pass the forward's h, rows divisible by tp",
           "matmul_reduce_scatter_backward of h {} over tp {}", h.describe(), group_.size());
  check_backward(dy, h, w, h.size(0) / group_.size(), "matmul_reduce_scatter_backward");
  Gathered g = allgather_matmul(dy, w, true, ops::WeightLayout::kn);
  return {g.y, ops::matmul(g.gathered, h, true, false)};
}

FusedTensorComm::Grads FusedTensorComm::matmul_allreduce_backward(const Tensor& dy, const Tensor& h,
                                                                  const Tensor& w) {
  check_backward(dy, h, w, h.size(0), "matmul_allreduce_backward");
  return {ops::matmul(dy, w), ops::matmul(dy, h, true, false)};
}

namespace {

// The group list of rows [r0, r1) of a grouped input: offsets clipped to the
// rows and shifted to start at 0, on the stream (the offsets may come from
// an earlier kernel).
Tensor clipped_groups(const Tensor& offsets, int64_t r0, int64_t r1) {
  Tensor clip = Tensor::empty({offsets.numel()}, DType::i64);
  runtime::current_stream().launch(
      launch_info("clip_groups", runtime::KernelKind::vector, 1, {offsets}, {clip}),
      [offsets, clip, r0, r1](const runtime::BlockContext&) {
        for (int64_t g = 0; g < offsets.numel(); ++g)
          clip.data<int64_t>()[g] = std::clamp(offsets.data<int64_t>()[g], r0, r1) - r0;
      });
  return clip;
}

}  // namespace

void FusedTensorComm::check_groups(int64_t N, const Tensor& offsets, int64_t groups, int64_t weight_elements,
                                   const char* call) const {
  CM_CHECK(offsets.dim() == 1 && offsets.dtype() == DType::i64 && offsets.is_contiguous() &&
               offsets.numel() == groups + 1 && N * weight_elements <= arena_.numel(),
           "pass w (G, C, F), a contiguous (G + 1) i64 group list and h (N, F) with N x C within the capacity",
           "{} with group list {} and {} rows of {} outputs", call, offsets.describe(), N, weight_elements);
}

Tensor FusedTensorComm::grouped_matmul_allreduce(const Tensor& h, const Tensor& w, const Tensor& offsets) {
  check_rows(h, "grouped_matmul_allreduce");
  CM_CHECK(w.dim() == 3 && w.size(2) == h.size(1), "pass w (G, C, F) matching h (N, F)",
           "grouped_matmul_allreduce of {} and {}", h.describe(), w.describe());
  check_groups(h.size(0), offsets, w.size(0), w.size(1), "grouped_matmul_allreduce");
  return allreduce_rows(h.size(0), w.size(1), [&](int64_t r0, int64_t r1, Tensor y) {
    ops::grouped_matmul_out(h.slice(0, r0, r1), w, clipped_groups(offsets, r0, r1), y);
  });
}

void FusedTensorComm::check_fp8(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w, const char* call) const {
  CM_CHECK(h.data.dim() == 2 && h.data.is_contiguous() && h.data.dtype() == DType::f8e4m3 && h.scale.dim() == 2 &&
               h.scale.is_contiguous() && h.scale.size(0) == h.data.size(0) && h.data.size(0) <= max_rows_ &&
               w.data.dim() == 2 && w.data.size(1) == h.data.size(1) &&
               w.data.size(0) * h.data.size(0) <= arena_.numel(),
           "pass h quantized by ops::quantize_fp8_act (N, F) within the rows and capacity the fused comm was sized "
           "for, and w by ops::quantize_fp8_weight (C, F)",
           "fp8 {} of {} (scales {}) and {} (set up for {} rows)", call, h.data.describe(), h.scale.describe(),
           w.data.describe(), max_rows_);
}

namespace {

// h's rows [r0, r1) times w^T into y (fp8: a product of its own, then copied).
void fp8_rows(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w, int64_t r0, int64_t r1, Tensor y) {
  copy_on_stream(ops::matmul_fp8({h.data.slice(0, r0, r1), h.scale.slice(0, r0, r1)}, w), y);
}

}  // namespace

Tensor FusedTensorComm::matmul_reduce_scatter(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  check_fp8(h, w, "matmul_reduce_scatter");
  CM_CHECK(h.data.size(0) % group_.size() == 0, "choose rows divisible by tp", "fp8 matmul_reduce_scatter of {} over tp {}",
           h.data.describe(), group_.size());
  return reduce_scatter_rows(h.data.size(0), w.data.size(0),
                             [&](int64_t r0, int64_t r1, Tensor y) { fp8_rows(h, w, r0, r1, y); });
}

namespace {

// dgrad's w^T (K, O) in 128x128 blocks.
ops::QuantizedTensor quantized_transpose(const Tensor& w) { return ops::quantize_fp8_weight(ops::transpose(w)); }

void check_backward_fp8(const Tensor& dy, const ops::QuantizedTensor& input, const Tensor& w, int64_t dy_rows,
                        const char* call) {
  CM_CHECK(dy.dim() == 2 && input.data.dim() == 2 && w.dim() == 2 && dy.dtype() == DType::f32 &&
               input.data.dtype() == DType::f8e4m3 && w.dtype() == DType::f32 && dy.size(0) == dy_rows &&
               dy.size(1) == w.size(0) && input.data.size(1) == w.size(1),
           "pass f32 dy as the forward returned y, the forward's fp8 input rows and the f32 master w (O, K)",
           "{} of dy {}, input {} and w {}", call, dy.describe(), input.data.describe(), w.describe());
}

}  // namespace

FusedTensorComm::Grads FusedTensorComm::allgather_matmul_backward(const Tensor& dy,
                                                                  const ops::QuantizedTensor& gathered,
                                                                  const Tensor& w) {
  check_backward_fp8(dy, gathered, w, gathered.data.size(0), "allgather_matmul_backward");
  Tensor dw = ops::matmul_fp8_wgrad(dy, ops::dequantize_fp8_act(gathered));  // needs no peer: first
  return {matmul_reduce_scatter(ops::quantize_fp8_act(dy), quantized_transpose(w)), dw};
}

FusedTensorComm::Grads FusedTensorComm::matmul_reduce_scatter_backward(const Tensor& dy, const ops::QuantizedTensor& h,
                                                                       const Tensor& w) {
  CM_CHECK(h.data.dim() == 2 && h.data.size(0) % group_.size() == 0, "pass the forward's h, rows divisible by tp",
           "matmul_reduce_scatter_backward of h {} over tp {}", h.data.describe(), group_.size());
  check_backward_fp8(dy, h, w, h.data.size(0) / group_.size(), "matmul_reduce_scatter_backward");
  GatheredFp8 g = allgather_matmul(ops::quantize_fp8_act(dy), quantized_transpose(w));
  return {g.y, ops::matmul_fp8_wgrad(ops::dequantize_fp8_act(g.gathered), ops::dequantize_fp8_act(h))};
}

Tensor FusedTensorComm::matmul_allreduce(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  check_fp8(h, w, "matmul_allreduce");
  return allreduce_rows(h.data.size(0), w.data.size(0),
                        [&](int64_t r0, int64_t r1, Tensor y) { fp8_rows(h, w, r0, r1, y); });
}

Tensor FusedTensorComm::grouped_matmul_allreduce(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w,
                                                 const Tensor& offsets) {
  CM_CHECK(h.data.dim() == 2 && w.data.dim() == 3, "pass h (N, F) and w (G, C, F) quantized",
           "fp8 grouped_matmul_allreduce of {} and {}", h.data.describe(), w.data.describe());
  check_fp8(h, {w.data.select(0, 0), w.scale.select(0, 0)}, "grouped_matmul_allreduce");
  check_groups(h.data.size(0), offsets, w.data.size(0), w.data.size(1), "fp8 grouped_matmul_allreduce");
  return allreduce_rows(h.data.size(0), w.data.size(1), [&](int64_t r0, int64_t r1, Tensor y) {
    ops::grouped_matmul_fp8({h.data.slice(0, r0, r1), h.scale.slice(0, r0, r1)}, w, clipped_groups(offsets, r0, r1), y);
  });
}

ops::RMSNormResidualOut FusedTensorComm::add_rmsnorm_allreduce(const Tensor& x, const Tensor& y, const Tensor& w,
                                                               float eps) {
  const int tp = group_.size(), me = group_.me;
  check_rows(y, "add_rmsnorm_allreduce");
  CM_CHECK(x.shape() == y.shape() && x.is_contiguous() && x.dtype() == DType::f32 && y.dtype() == DType::f32 &&
               y.numel() <= arena_.numel(),
           "pass the residual x and the update y of the same (N, C) f32, within the capacity",
           "add_rmsnorm_allreduce of {} and {}", x.describe(), y.describe());
  const int64_t N = y.size(0), C = y.size(1);
  if (tp == 1) return ops::rmsnorm_residual(x, y, w, eps);
  runtime::Stream s = runtime::current_stream();
  runtime::Stream& c = comm(s, resolved(false).comm_cores);
  // reduce-scatter by rows: each member sums, adds and normalizes its own rows
  const int64_t staging = next_half(staging_uses_), inbox = next_half(inbox_uses_);
  for (int i = 1; i < tp; ++i) {
    const int o = (me + i) % tp;
    const Tensor part = rows(y, rows_of(N, o));
    slot(staging_, staging, me, 0, part.shape());  // checks the size
    put(c, staging_, staging + int64_t(me) * slot_bytes_, part.raw_data(), int64_t(part.nbytes()), o, scattered, me);
  }
  hold_on(c, {y});
  const auto mine = rows_of(N, me);
  const int64_t n = mine.second - mine.first;
  std::vector<Tensor> copies;
  for (int m = 0; m < tp; ++m) {
    if (m != me) wait(s, scattered, m, 1, "updates of this member's rows");
    copies.push_back(m == me ? rows(y, mine) : slot(staging_, staging, m, 0, {n, C}));
  }
  Tensor sum = Tensor::empty({n, C});
  sum_in_order(copies, sum);
  // this member's h | y | rstd, packed as they land in the peers' inboxes: one put each
  const Tensor pack = Tensor::empty({n * (2 * C + 1)});
  const ops::RMSNormResidualOut own{pack.slice(0, 0, n * C).view({n, C}), pack.slice(0, n * C, 2 * n * C).view({n, C}),
                                    pack.slice(0, 2 * n * C, pack.numel())};
  ops::rmsnorm_residual_out(rows(x, mine), sum, w, eps, own);
  c.wait_event(s.record_event());
  slot(inbox_, inbox, me, 0, pack.shape());  // checks the size
  for (int i = 1; i < tp; ++i)
    put(c, inbox_, inbox + int64_t(me) * slot_bytes_, pack.raw_data(), int64_t(pack.nbytes()), (me - i + tp) % tp,
        gathered, me);
  hold_on(c, {pack});
  ops::RMSNormResidualOut out{Tensor::empty({N, C}), Tensor::empty({N, C}), Tensor::empty({N})};
  for (int i = 0; i < tp; ++i) {
    const int m = (me + i) % tp;
    const auto r = rows_of(N, m);
    const int64_t k = r.second - r.first;
    if (m != me) wait(s, gathered, m, 1, "normalized rows");
    copy_on_stream(m == me ? own.h : slot(inbox_, inbox, m, 0, {k, C}), rows(out.h, r));
    copy_on_stream(m == me ? own.y : slot(inbox_, inbox, m, 4 * k * C, {k, C}), rows(out.y, r));
    copy_on_stream(m == me ? own.rstd : slot(inbox_, inbox, m, 8 * k * C, {k}), out.rstd.slice(0, r.first, r.second));
  }
  s.wait_event(c.record_event());
  return out;
}

namespace reference {

FusedTensorComm::Gathered allgather_matmul(ShmemTensor& tp, const Tensor& x, const Tensor& w, ops::WeightLayout layout) {
  Tensor g = tp.all_gather(x);
  return {ops::matmul(g, w, false, transposed(layout)), g};
}

Tensor matmul_reduce_scatter(ShmemTensor& tp, const Tensor& h, const Tensor& w, ops::WeightLayout layout) {
  return tp.reduce_scatter(ops::matmul(h, w, false, transposed(layout)));
}

Tensor matmul_allreduce(ShmemTensor& tp, const Tensor& h, const Tensor& w, ops::WeightLayout layout) {
  return tp.all_reduce(ops::matmul(h, w, false, transposed(layout)));
}

FusedTensorComm::Grads allgather_matmul_backward(ShmemTensor& tp, const Tensor& dy, const Tensor& gathered,
                                                 const Tensor& w) {
  return {tp.reduce_scatter(ops::matmul(dy, w)), ops::matmul(dy, gathered, true, false)};
}

FusedTensorComm::Grads matmul_reduce_scatter_backward(ShmemTensor& tp, const Tensor& dy, const Tensor& h,
                                                      const Tensor& w) {
  Tensor g = tp.all_gather(dy);
  return {ops::matmul(g, w), ops::matmul(g, h, true, false)};
}

FusedTensorComm::GatheredFp8 allgather_matmul(ShmemTensor& tp, const Tensor& x, const ops::QuantizedTensor& w) {
  const ops::QuantizedTensor g = ops::quantize_fp8_act(tp.all_gather(x));
  return {ops::matmul_fp8(g, w), g};
}

Tensor matmul_reduce_scatter(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  return tp.reduce_scatter(ops::matmul_fp8(h, w));
}

FusedTensorComm::Grads allgather_matmul_backward(ShmemTensor& tp, const Tensor& dy,
                                                 const ops::QuantizedTensor& gathered, const Tensor& w) {
  const Tensor dx = ops::matmul_fp8(ops::quantize_fp8_act(dy), quantized_transpose(w));
  return {tp.reduce_scatter(dx), ops::matmul_fp8_wgrad(dy, ops::dequantize_fp8_act(gathered))};
}

FusedTensorComm::Grads matmul_reduce_scatter_backward(ShmemTensor& tp, const Tensor& dy, const ops::QuantizedTensor& h,
                                                      const Tensor& w) {
  const ops::QuantizedTensor g = ops::quantize_fp8_act(tp.all_gather(dy));
  return {ops::matmul_fp8(g, quantized_transpose(w)),
          ops::matmul_fp8_wgrad(ops::dequantize_fp8_act(g), ops::dequantize_fp8_act(h))};
}

Tensor matmul_allreduce(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  return tp.all_reduce(ops::matmul_fp8(h, w));
}

Tensor grouped_matmul_allreduce(ShmemTensor& tp, const Tensor& h, const Tensor& w, const Tensor& offsets) {
  return tp.all_reduce(ops::grouped_matmul(h, w, offsets));
}

Tensor grouped_matmul_allreduce(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w,
                                const Tensor& offsets) {
  return tp.all_reduce(ops::grouped_matmul_fp8(h, w, offsets));
}

ops::RMSNormResidualOut add_rmsnorm_allreduce(ShmemTensor& tp, const Tensor& x, const Tensor& y, const Tensor& w,
                                              float eps) {
  return ops::rmsnorm_residual(x, tp.all_reduce(y), w, eps);
}

}  // namespace reference

}  // namespace coremesh::parallel
