// Context parallelism: ring attention and Ulysses over SHMEM (see
// context_parallel.hpp for the algorithms).
#include "coremesh/parallel/context_parallel.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/transpose.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel {
namespace {

constexpr int kSlots = 2;  // ring slots per channel: one in use, one arriving

runtime::LaunchInfo kernel(const char* name, runtime::KernelKind kind = runtime::KernelKind::vector) {
  return {name, kind, 1, 0};
}

// On the current stream: for every outer index o and t < n,
//   dst[o, d0 + t, :] (+)= src[o, s0 + t, :]
// where dimension `time` of src and dst is the token axis (the dimensions
// before it are `o`, those after it one row). Contiguous f32.
void copy_tokens(const Tensor& src, int64_t s0, const Tensor& dst, int64_t d0, int64_t n, bool add, int time = 1) {
  CM_CHECK(src.is_contiguous() && dst.is_contiguous() && src.dim() == dst.dim() && s0 + n <= src.size(time) &&
               d0 + n <= dst.size(time),
           "copy token ranges inside contiguous tensors", "tokens [{}, +{}) of {} into [{}, +{}) of {}", s0, n,
           src.describe(), d0, n, dst.describe());
  int64_t outer = 1, width = 1;
  for (int i = 0; i < time; ++i) outer *= src.size(i);
  for (int i = time + 1; i < src.dim(); ++i) width *= src.size(i);
  const int64_t ts = src.size(time), td = dst.size(time);
  runtime::current_stream().launch(kernel(add ? "cp_add_tokens" : "cp_copy_tokens"),
                                   [=](const runtime::BlockContext&) {
                                     const float* s = src.data<float>();
                                     float* d = dst.data<float>();
                                     for (int64_t o = 0; o < outer; ++o) {
                                       const float* x = s + (o * ts + s0) * width;
                                       float* y = d + (o * td + d0) * width;
                                       if (add)
                                         for (int64_t i = 0; i < n * width; ++i) y[i] += x[i];
                                       else
                                         std::memcpy(y, x, size_t(n * width) * sizeof(float));
                                     }
                                   });
}

// Tokens [t0, t1) of x along `time`, as a new contiguous tensor.
Tensor tokens(const Tensor& x, int64_t t0, int64_t t1, int time = 1) {
  Shape shape = x.shape();
  shape[size_t(time)] = t1 - t0;
  Tensor out = Tensor::empty(shape);
  copy_tokens(x, t0, out, 0, t1 - t0, false, time);
  return out;
}

// A ring slot holds k and v (or dk and dv) of one block.
int64_t ring_slot_elems(const ShmemContext::Sizes& m) {
  return std::max<int64_t>(2 * m.batch * m.tokens * m.kv_heads * m.head_dim, 1);
}
// A Ulysses message: the backward's inputs dout, q, k, v, out (and lse), the
// largest of the four exchanges, 1/cp of each.
int64_t ulysses_region_elems(int cp, const ShmemContext::Sizes& m) {
  const int64_t per_token = (3 * m.heads + 2 * m.kv_heads) * m.head_dim + m.heads;
  return std::max<int64_t>(m.batch * m.tokens * per_token / cp, 1);
}

uint64_t* signal(const Tensor& signals, int i) { return reinterpret_cast<uint64_t*>(signals.data<int64_t>()) + i; }

// On `stream`: adds one to `sig` on `pe` (a hand-back).
void notify(runtime::Stream& stream, uint64_t* sig, std::vector<int> pes) {
  stream.launch(kernel("cp_release", runtime::KernelKind::comm), [sig, pes](const runtime::BlockContext&) {
    shmem::fence();
    for (int pe : pes) shmem::atomic_add(sig, uint64_t{1}, pe);
  });
}

}  // namespace

// ---- the split ------------------------------------------------------------

std::vector<int> SequenceSplit::chunks_of(int r) const {
  if (!zigzag) return {r};
  return {r, 2 * cp - 1 - r};
}

int64_t SequenceSplit::global(int r, int64_t t, int64_t T_local) const {
  const std::vector<int> mine = chunks_of(r);
  const int64_t c = T_local / int64_t(mine.size());
  return mine[size_t(t / c)] * c + t % c;
}

Tensor SequenceSplit::positions(int64_t T_local) const {
  CM_CHECK(T_local % int64_t(chunks_of(rank).size()) == 0, "give every rank whole chunks",
           "{} local tokens do not split into {} chunks", T_local, chunks_of(rank).size());
  std::vector<int64_t> p(static_cast<size_t>(T_local));
  for (int64_t t = 0; t < T_local; ++t) p[size_t(t)] = global(rank, t, T_local);
  return Tensor::from_vector(p, {T_local});
}

CpTraffic cp_bytes_per_call(CpComm comm, int cp, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t kv = 4 * B * T * Hkv * D, row = 4 * B * T;  // one of k, v; 4 bytes per float per token
  if (cp == 1) return {};
  if (comm == CpComm::ring) return {2 * (cp - 1) * kv, 2 * (cp - 1) * kv + 2 * cp * kv};
  // Ulysses: all but this PE's 1/cp of each tensor leaves
  auto sent = [&](int64_t per_token) { return row * per_token / cp * (cp - 1); };
  return {sent((H + 2 * Hkv) * D) + sent(H * D + H), sent((3 * H + 2 * Hkv) * D + H) + sent((H + 2 * Hkv) * D)};
}

// ---- ring channel -----------------------------------------------------------

// Two symmetric slots that the previous PE of the ring puts into; each use of
// a slot is a set of pieces (one put and one arrival signal each). The
// receiver hands a slot back to the sender once done with it; the sender's
// next put into it waits for (takes) that hand-back; each slot starts handed
// back once.
struct ShmemContext::Channel {
  Tensor slots;    // (kSlots * slot_elems) f32
  Tensor signals;  // u64: arrived[kSlots], released[kSlots]
  int64_t slot_elems = 0;
  int next = 0, prev = 0;

  Channel(const Group& g, int64_t elems)
      : slots(symmetric_tensor({kSlots * std::max<int64_t>(elems, 1)})),
        signals(symmetric_tensor({2 * kSlots}, DType::i64)),
        slot_elems(std::max<int64_t>(elems, 1)),
        next(g.pes[size_t((g.me + 1) % g.size())]),
        prev(g.pes[size_t((g.me + g.size() - 1) % g.size())]) {
    for (int s = 0; s < kSlots; ++s) *signal(signals, kSlots + s) = 1;  // nobody signals before my first put
  }

  float* slot(int s) { return slots.data<float>() + s * slot_elems; }

  // On `stream`: waits until the next PE has handed back slot s's last use.
  void claim(runtime::Stream& stream, int s) {
    wait_signal_on_stream(stream, signal(signals, kSlots + s), 1,
                          fmt::format("waits for PE {} to hand back ring slot {}", next, s));
  }
  // On `stream`: the pieces into the next PE's slot s (claimed), a signal each.
  void put(runtime::Stream& stream, int s, const std::vector<Tensor>& pieces, int64_t& bytes) {
    int64_t at = 0;
    for (const Tensor& p : pieces) {
      CM_CHECK(at + p.numel() <= slot_elems && p.is_contiguous(), "size the ring slots for the blocks",
               "{} floats into a slot of {}", at + p.numel(), slot_elems);
      shmem::put_signal_on_stream(stream, slot(s) + at, p.data<float>(), size_t(p.numel()), signal(signals, s), 1,
                                  shmem::SignalOp::add, next);
      at += p.numel(), bytes += 4 * p.numel();
    }
    // the pieces live until their puts have run
    stream.launch(kernel("cp_sent"), [pieces](const runtime::BlockContext&) {});
  }
  void send(runtime::Stream& stream, int s, const std::vector<Tensor>& pieces, int64_t& bytes) {
    claim(stream, s);
    put(stream, s, pieces, bytes);
  }

  // On `stream`: waits for the next use of slot s (its pieces' shapes) and
  // returns views of them in the slot.
  std::vector<Tensor> receive(runtime::Stream& stream, int s, const std::vector<Shape>& shapes) {
    wait_signal_on_stream(stream, signal(signals, s), shapes.size(),
                          fmt::format("waits for ring slot {} from PE {}", s, prev));
    std::vector<Tensor> out;
    int64_t at = 0;
    for (const Shape& shape : shapes) {
      out.push_back(slots.slice(0, s * slot_elems + at, s * slot_elems + at + shape_numel(shape)).view(shape));
      at += shape_numel(shape);
    }
    return out;
  }
  void release(runtime::Stream& stream, int s) { notify(stream, signal(signals, kSlots + s), {prev}); }
};

// ---- Ulysses exchange -------------------------------------------------------

// A symmetric receive buffer of one region per source. Every use: each PE
// waits until all others handed its region back from the last use, puts its
// message for PE d into region `me` of d's buffer, waits for the cp − 1
// messages to it, and hands the regions back once unpacked.
struct ShmemContext::Exchange {
  Tensor buffer;   // (cp * region) f32
  Tensor signals;  // u64: arrived, released
  int64_t region = 0;

  Exchange(int cp, int64_t region_elems)
      : buffer(symmetric_tensor({cp * std::max<int64_t>(region_elems, 1)})),
        signals(symmetric_tensor({2}, DType::i64)),
        region(std::max<int64_t>(region_elems, 1)) {
    *signal(signals, 1) = uint64_t(cp - 1);  // every region starts handed back
  }
};

// ---- the seam -----------------------------------------------------------------

ShmemContext::ShmemContext(Group cp, CpComm comm, bool zigzag, const Sizes& m)
    : group_(std::move(cp)), comm_kind_(comm), max_(m) {
  check_members_agree(group_, {int64_t(comm), zigzag, m.batch, m.tokens, m.heads, m.kv_heads, m.head_dim},
                      "a context-parallel group");
  split_ = {group_.size(), group_.me, zigzag};
  const int n = group_.size();
  const auto found = problems(comm, n, m.heads, m.kv_heads);
  CM_CHECK(found.empty(), "change the layout as listed", "context parallel: {}", fmt::join(found, "; "));
  if (n == 1) return;
  if (comm == CpComm::ring) {
    kv_ = std::make_unique<Channel>(group_, ring_slot_elems(m));
    dkv_ = std::make_unique<Channel>(group_, ring_slot_elems(m));
  } else {
    a2a_ = std::make_unique<Exchange>(n, ulysses_region_elems(n, m));
  }
}

ShmemContext::~ShmemContext() = default;

std::vector<std::string> ShmemContext::problems(CpComm comm, int cp, int64_t heads, int64_t kv_heads) {
  std::vector<std::string> out;
  if (comm == CpComm::ulysses)
    for (auto [size, what] : {std::pair{heads, "query heads"}, std::pair{kv_heads, "key/value heads"}})
      if (size % cp != 0)
        out.push_back(fmt::format("Ulysses splits the {} {} over cp = {} PEs: choose cp among the divisors of {}, "
                                  "or cp_comm ring",
                                  size, what, cp, size));
  return out;
}

int64_t ShmemContext::symmetric_bytes(CpComm comm, int cp, const Sizes& m) {
  if (cp == 1) return 0;
  constexpr int64_t kAlign = 128;  // the heap's alignment per block
  if (comm == CpComm::ring) return 2 * (4 * kSlots * ring_slot_elems(m) + 8 * 2 * kSlots + 2 * kAlign);
  return 4 * cp * ulysses_region_elems(cp, m) + 8 * 2 + 2 * kAlign;
}

void ShmemContext::check_shapes(const Tensor& q, const Tensor& k) const {
  CM_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) <= max_.batch && q.size(1) <= max_.tokens &&
               q.size(2) == max_.heads && k.size(2) == max_.kv_heads && q.size(3) == max_.head_dim &&
               q.size(1) % split_.chunks_of(split_.rank).size() == 0,
           "size the context-parallel buffers for the largest micro-batch (batch_size x seq_len / cp tokens, the "
           "model's heads and head size)",
           "attention of q {} k {}; the buffers take B <= {}, T <= {}, H = {}, Hkv = {}, D = {}", q.describe(),
           k.describe(), max_.batch, max_.tokens, max_.heads, max_.kv_heads, max_.head_dim);
}

ops::AttentionOut ShmemContext::attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (group_.size() == 1) return ContextParallel::local().attention(q, k, v);
  check_shapes(q, k);
  if (comm_kind_ == CpComm::ring) return ring_forward(q, k, v);
  // Ulysses: heads in, one causal attention over the whole sequence, back.
  const int64_t B = q.size(0), H = q.size(2) / group_.size();
  const auto heads = to_heads({q, k, v});
  const ops::AttentionOut full = ops::flash_attention(heads[0], heads[1], heads[2], true);
  const Tensor lse_rows = ops::transpose(full.lse).view({B, full.lse.size(2), H, 1});  // (B,T,H/cp,1)
  const auto back = to_sequence({full.out, lse_rows});
  const int64_t T = q.size(1);
  return {back[0], ops::transpose(back[1].view({B, T, q.size(2)}))};
}

ops::AttentionGrads ShmemContext::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const ops::AttentionOut& fwd) {
  if (group_.size() == 1) return ContextParallel::local().attention_backward(dout, q, k, v, fwd);
  check_shapes(q, k);
  if (comm_kind_ == CpComm::ring) return ring_backward(dout, q, k, v, fwd);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2);
  const Tensor lse_rows = ops::transpose(fwd.lse).view({B, T, H, 1});
  const auto h = to_heads({dout, q, k, v, fwd.out, lse_rows});
  const Tensor lse = ops::transpose(h[5].view({B, h[5].size(1), H / group_.size()}));
  const ops::AttentionGrads g = ops::flash_attention_backward(h[0], h[1], h[2], h[3], h[4], lse, true);
  const auto back = to_sequence({g.dq, g.dk, g.dv});
  return {back[0], back[1], back[2]};
}

// ---- ring attention -------------------------------------------------------------

namespace {

// Local query chunk `a` of rank r sees the first `keys_seen` chunks of rank
// s's block in full (s != r): the chunks of s below a's global chunk (each
// rank's chunks ascend, so they are a prefix).
int chunks_seen(const SequenceSplit& split, int r, int a, int s) {
  const int mine = split.chunks_of(r)[size_t(a)];
  int n = 0;
  for (int c : split.chunks_of(s)) n += c < mine;
  return n;
}

// K and V (kv[0], kv[1]) of a block's first `seen` of `chunks` chunks of c
// tokens: the slot's views when it is all of them.
std::pair<Tensor, Tensor> first_chunks(const std::vector<Tensor>& kv, int seen, int chunks, int64_t c) {
  if (seen == chunks) return {kv[0], kv[1]};
  return {tokens(kv[0], 0, seen * c), tokens(kv[1], 0, seen * c)};
}

}  // namespace

// K/V puts run on a comm stream while the compute stream attends over the
// block just received; every wait for a signal stays on the compute stream
// (a wait holds a core: on the comm stream it could sit in front of the put
// its neighbour waits for) and the comm stream only follows its events. The
// order is deadlock-free: step i waits only for the neighbours' steps i - 1
// and earlier, and each put has run before the slot it read is handed back.
runtime::Event ShmemContext::forward_kv(int s, const std::vector<Tensor>& kv) {
  runtime::Stream cur = runtime::current_stream();
  if (!comm_) comm_.emplace(cur.device());
  kv_->claim(cur, s);
  comm_->wait_event(cur.record_event());
  kv_->put(*comm_, s, kv, bytes_put_);
  return comm_->record_event();
}

ops::AttentionOut ShmemContext::ring_forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int n = group_.size(), r = group_.me;
  const int chunks = int(split_.chunks_of(r).size());
  const int64_t T = q.size(1), c = T / chunks;
  runtime::Stream cur = runtime::current_stream();
  runtime::Event sent = forward_kv(1 % kSlots, {k, v});
  // my own block: causal over my ascending chunks
  const ops::AttentionOut own = ops::flash_attention(q, k, v, true);
  std::vector<ops::AttentionOut> part(static_cast<size_t>(chunks));
  std::vector<Tensor> qs(static_cast<size_t>(chunks));
  for (int a = 0; a < chunks; ++a) {
    const int64_t t0 = a * c, t1 = (a + 1) * c;
    part[size_t(a)] = chunks == 1 ? own : ops::AttentionOut{tokens(own.out, t0, t1), tokens(own.lse, t0, t1, 2)};
    qs[size_t(a)] = chunks == 1 ? q : tokens(q, t0, t1);
  }
  // each arriving block: on to the next PE, then merged into the query
  // chunks that see part of it
  for (int i = 1; i < n; ++i) {
    const int src = (r - i + n) % n, s = i % kSlots;
    cur.wait_event(sent);  // no put of mine is pending while this stream waits for a signal
    const auto kv = kv_->receive(cur, s, {k.shape(), v.shape()});
    if (i + 1 < n) sent = forward_kv((i + 1) % kSlots, kv);
    for (int a = 0; a < chunks; ++a) {
      const int seen = chunks_seen(split_, r, a, src);
      if (seen == 0) continue;
      const auto [kb, vb] = first_chunks(kv, seen, chunks, c);
      const ops::AttentionOut p = ops::flash_attention(qs[size_t(a)], kb, vb, false);
      part[size_t(a)] = ops::merge_attention(part[size_t(a)].out, part[size_t(a)].lse, p.out, p.lse);
    }
    cur.wait_event(sent);  // the put that read slot s has run
    kv_->release(cur, s);
  }
  if (chunks == 1) return part[0];
  ops::AttentionOut res{Tensor::empty(q.shape()), Tensor::empty(own.lse.shape())};
  for (int a = 0; a < chunks; ++a) {
    copy_tokens(part[size_t(a)].out, 0, res.out, a * c, c, false);
    copy_tokens(part[size_t(a)].lse, 0, res.lse, a * c, c, false, 2);
  }
  return res;
}

ops::AttentionGrads ShmemContext::ring_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const ops::AttentionOut& fwd) {
  const int n = group_.size(), r = group_.me;
  const int chunks = int(split_.chunks_of(r).size());
  const int64_t T = q.size(1), c = T / chunks;
  runtime::Stream cur = runtime::current_stream();
  runtime::Event sent = forward_kv(1 % kSlots, {k, v});
  // my own block; its dK/dV start the accumulator that goes around the ring
  ops::AttentionGrads g = ops::flash_attention_backward(dout, q, k, v, fwd.out, fwd.lse, true);
  const Tensor dq = g.dq;
  cur.wait_event(sent);
  dkv_->send(cur, 1 % kSlots, {g.dk, g.dv}, bytes_put_);
  struct Chunk {
    Tensor q, dout, out, lse;
  };
  std::vector<Chunk> qc(static_cast<size_t>(chunks));
  for (int a = 0; a < chunks; ++a) {
    const int64_t t0 = a * c, t1 = (a + 1) * c;
    qc[size_t(a)] = chunks == 1 ? Chunk{q, dout, fwd.out, fwd.lse}
                                : Chunk{tokens(q, t0, t1), tokens(dout, t0, t1), tokens(fwd.out, t0, t1),
                                        tokens(fwd.lse, t0, t1, 2)};
  }
  for (int i = 1; i < n; ++i) {
    const int src = (r - i + n) % n, s = i % kSlots;
    const auto kv = kv_->receive(cur, s, {k.shape(), v.shape()});
    // the accumulator of src's block, with the shares of src .. r - 1
    const auto acc = dkv_->receive(cur, s, {k.shape(), v.shape()});
    const Tensor dk = tokens(acc[0], 0, T), dv = tokens(acc[1], 0, T);
    dkv_->release(cur, s);
    if (i + 1 < n) sent = forward_kv((i + 1) % kSlots, kv);
    for (int a = 0; a < chunks; ++a) {
      const int seen = chunks_seen(split_, r, a, src);
      if (seen == 0) continue;
      const auto [kb, vb] = first_chunks(kv, seen, chunks, c);
      const Chunk& x = qc[size_t(a)];
      const ops::AttentionGrads p = ops::flash_attention_backward(x.dout, x.q, kb, vb, x.out, x.lse, false);
      copy_tokens(p.dq, 0, dq, a * c, c, true);
      copy_tokens(p.dk, 0, dk, 0, seen * c, true);
      copy_tokens(p.dv, 0, dv, 0, seen * c, true);
    }
    cur.wait_event(sent);  // the put that read slot s has run
    kv_->release(cur, s);
    dkv_->send(cur, (i + 1) % kSlots, {dk, dv}, bytes_put_);  // at i = n - 1: home to the block's owner
  }
  const auto home = dkv_->receive(cur, n % kSlots, {k.shape(), v.shape()});
  g = {dq, tokens(home[0], 0, T), tokens(home[1], 0, T)};
  dkv_->release(cur, n % kSlots);
  return g;
}

// ---- Ulysses all-to-all -------------------------------------------------------------

namespace {

// The heads [h0, h0 + hn) of x (B,T,Hx,Dx), to (or, into_x, from) a packed
// (B,T,hn,Dx) block at p.
void pack_heads(const Tensor& x, int64_t h0, int64_t hn, float* p, bool into_x) {
  const int64_t B = x.size(0), T = x.size(1), Hx = x.size(2), Dx = x.size(3);
  float* base = x.data<float>();
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* row = base + (bt * Hx + h0) * Dx;
    float* packed = p + bt * hn * Dx;
    if (into_x) std::memcpy(row, packed, size_t(hn * Dx) * sizeof(float));
    else std::memcpy(packed, row, size_t(hn * Dx) * sizeof(float));
  }
}

}  // namespace

// On the current stream: pack(d, p) writes the message to member d at p,
// the messages go out (after every member handed back the buffer's last
// use), and unpack(s, p) reads member s's message at p, for every member
// (this one included); then the buffer goes back to the senders.
void ShmemContext::all_to_all(int64_t msg, std::function<void(int, float*)> pack,
                              std::function<void(int, float*)> unpack) {
  const int n = group_.size(), me = group_.me;
  Exchange& x = *a2a_;
  CM_CHECK(msg <= x.region, "size the Ulysses buffers for the largest micro-batch", "{} floats into {}", msg,
           x.region);
  runtime::Stream cur = runtime::current_stream();
  const Tensor staging = Tensor::empty({n, msg});
  cur.launch(kernel("ulysses_pack"), [staging, pack, n, msg](const runtime::BlockContext&) {
    for (int d = 0; d < n; ++d) pack(d, staging.data<float>() + d * msg);
  });
  wait_signal_on_stream(cur, signal(x.signals, 1), uint64_t(n - 1),
                        fmt::format("waits for {} to hand back its Ulysses buffer", others(group_)));
  std::vector<int> peers;
  for (int d = 0; d < n; ++d)
    if (d != me) {
      peers.push_back(group_.pes[size_t(d)]);
      shmem::put_signal_on_stream(cur, x.buffer.data<float>() + me * x.region, staging.data<float>() + d * msg,
                                  size_t(msg), signal(x.signals, 0), 1, shmem::SignalOp::add, group_.pes[size_t(d)]);
      bytes_put_ += 4 * msg;
    }
  wait_signal_on_stream(cur, signal(x.signals, 0), uint64_t(n - 1),
                        fmt::format("waits for the Ulysses messages of {}", others(group_)));
  const Tensor buffer = x.buffer;
  const int64_t region = x.region;
  cur.launch(kernel("ulysses_unpack"), [buffer, staging, unpack, region, n, me, msg](const runtime::BlockContext&) {
    for (int s = 0; s < n; ++s) unpack(s, s == me ? staging.data<float>() + me * msg : buffer.data<float>() + s * region);
  });
  notify(cur, signal(x.signals, 1), peers);
}

// Each message to PE d: for each tensor, heads d's share of my tokens; the
// receiver places source s's tokens at their global positions.
std::vector<Tensor> ShmemContext::to_heads(const std::vector<Tensor>& xs) {
  const int n = group_.size();
  int64_t msg = 0;
  std::vector<Tensor> ys;
  for (const Tensor& t : xs) {
    msg += t.numel() / n;
    ys.push_back(Tensor::empty({t.size(0), t.size(1) * n, t.size(2) / n, t.size(3)}));
  }
  const SequenceSplit split = split_;
  auto pack = [xs, n](int d, float* p) {
    for (const Tensor& t : xs) {
      const int64_t hn = t.size(2) / n;
      pack_heads(t, d * hn, hn, p, false);
      p += t.numel() / n;
    }
  };
  auto unpack = [ys, split, n](int s, float* p) {  // a packed (B,Tl,hn,Dx) block per tensor, chunk by chunk
    const auto chunks = split.chunks_of(s);
    for (const Tensor& y : ys) {
      const int64_t B = y.size(0), T = y.size(1), Tl = T / n, c = Tl / int64_t(chunks.size()), row = y.size(2) * y.size(3);
      for (size_t j = 0; j < chunks.size(); ++j)
        for (int64_t b = 0; b < B; ++b)
          std::memcpy(y.data<float>() + (b * T + chunks[j] * c) * row, p + (b * Tl + int64_t(j) * c) * row,
                      size_t(c * row) * sizeof(float));
      p += y.numel() / n;
    }
  };
  all_to_all(msg, pack, unpack);
  return ys;
}

// The mirror: to PE d, the tokens of d's chunks of my heads; the receiver
// places source s's heads at s's share.
std::vector<Tensor> ShmemContext::to_sequence(const std::vector<Tensor>& ys) {
  const int n = group_.size();
  int64_t msg = 0;
  std::vector<Tensor> xs;
  for (const Tensor& t : ys) {
    msg += t.numel() / n;
    xs.push_back(Tensor::empty({t.size(0), t.size(1) / n, t.size(2) * n, t.size(3)}));
  }
  const SequenceSplit split = split_;
  auto pack = [ys, split, n](int d, float* p) {
    const auto chunks = split.chunks_of(d);
    for (const Tensor& y : ys) {
      const int64_t B = y.size(0), T = y.size(1), Tl = T / n, c = Tl / int64_t(chunks.size()), row = y.size(2) * y.size(3);
      for (size_t j = 0; j < chunks.size(); ++j)
        for (int64_t b = 0; b < B; ++b)
          std::memcpy(p + (b * Tl + int64_t(j) * c) * row, y.data<float>() + (b * T + chunks[j] * c) * row,
                      size_t(c * row) * sizeof(float));
      p += y.numel() / n;
    }
  };
  auto unpack = [xs, n](int s, float* p) {
    for (const Tensor& t : xs) {
      const int64_t hn = t.size(2) / n;
      pack_heads(t, s * hn, hn, p, true);
      p += t.numel() / n;
    }
  };
  all_to_all(msg, pack, unpack);
  return xs;
}

}  // namespace coremesh::parallel
