// What every transport shares: the dissemination barrier built from the
// table's atomics, and the decorator that takes the load/store fast path
// away (the `shm-rma` transport).
#include <sys/mman.h>

#include <bit>
#include <cerrno>

#include "coremesh/core/error.hpp"

#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

// Reserves bytes + A of address space, maps the segment over the first
// multiple of A in it and returns the rest of the reservation.
std::byte* map_heap_segment(int fd, size_t bytes) {
  const size_t align = kHeapBaseAlignment;
  void* area = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  if (area == MAP_FAILED) return nullptr;
  const auto lo = reinterpret_cast<uintptr_t>(area);
  const uintptr_t at = (lo + align - 1) & ~(uintptr_t{align} - 1);
  const int flags = MAP_SHARED | MAP_FIXED | (fd < 0 ? MAP_ANONYMOUS : 0);
  void* p = mmap(reinterpret_cast<void*>(at), bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(area, bytes + align);
    errno = err;
    return nullptr;
  }
  if (at > lo) munmap(area, at - lo);
  const uintptr_t end = lo + bytes + align;
  if (end > at + bytes) munmap(reinterpret_cast<void*>(at + bytes), end - (at + bytes));
  return static_cast<std::byte*>(p);
}

// Dissemination barrier (Hensgen, Finkel, Manber): ceil(log2 n) rounds; in
// round k member i adds 1 to arrivals[k] of member (i + 2^k) mod n and waits
// for its own arrivals[k] to pass consumed[k]. Every member sends and
// consumes exactly one signal per round per barrier, so the counters stay
// matched across barriers, groups and reuse of the area. Only this PE's
// own SyncArea is ever read; peers are reached by atomic adds.
void Transport::sync(const SyncSpec& spec) {
  const int n = static_cast<int>(spec.world_pes.size());
  if (n <= 1) return;
  auto* mine = reinterpret_cast<SyncArea*>(local_base() + spec.sync_offset);
  if (spec.sync_offset >= segment_bytes())
    mine = reinterpret_cast<SyncArea*>(local_data_base() + (spec.sync_offset - segment_bytes()));
  ++mine->entered;
  if (spec.restores) return counting_sync(spec, *mine);
  Bell& bell = reinterpret_cast<HeapHeader*>(local_base())->sync_bell;
  for (int k = 0, step = 1; step < n; ++k, step <<= 1) {
    const int to = spec.world_pes[static_cast<size_t>((spec.my_index + step) % n)];
    atomic(to, spec.sync_offset + offsetof(SyncArea, arrivals) + k * sizeof(uint32_t), AmoOp::add,
           4, 1, 0);
    notify(to, Wake::sync);
    const uint32_t want = mine->consumed[k] + 1;
    const int from = spec.world_pes[static_cast<size_t>((spec.my_index - step % n + n) % n)];
    auto arrived = [&] {
      // Wrap-safe: the counters may pass 2^32 in a very long run.
      return static_cast<int32_t>(mine->arrivals[k].load(std::memory_order_acquire) - want) >= 0;
    };
    // A peer that finalized or exited has passed its last barrier: waiting
    // for it would last until the watchdog. Its arrival, if it made one, was
    // written before its state: look again after seeing the state.
    JobControl* control = job();
    auto ready = [&] {
      if (arrived()) return true;
      const uint32_t peer = control ? control->pes[from].state.load(std::memory_order_acquire) : 0;
      if (peer >= pe_finalized && !arrived())
        CM_THROW(Error, "every PE must make the same collective calls (barriers included) before shmem_finalize",
                 "{}: PE {} {} and will not arrive", spec.describe(), from,
                 peer == pe_finalized ? "already called shmem_finalize" : "already exited");
      return false;
    };
    wait_until_ready(bell, ready, [&] {
      return fmt::format("{} (round {} of {}: waiting for PE {})", spec.describe(), k + 1,
                         std::bit_width(static_cast<unsigned>(n - 1)),
                         spec.world_pes[static_cast<size_t>((spec.my_index - step % n + n) % n)]);
    });
    mine->consumed[k] = want;
  }
}

// A barrier whose words return to zero (an active set's pSync, 9.9): the
// members add 1 to member 0's arrivals[0] and wait for their arrivals[1];
// member 0 waits for n - 1 arrivals, zeroes its count, then releases each.
// A member zeroes its release before it returns, so a member already in the
// next barrier on the same pSync (allowed without other synchronisation)
// can only add to a count that was zeroed: none is lost.
void Transport::counting_sync(const SyncSpec& spec, SyncArea& mine) {
  const int n = static_cast<int>(spec.world_pes.size());
  const bool root = spec.my_index == 0;
  auto& word = mine.arrivals[root ? 0 : 1];
  const uint32_t want = root ? uint32_t(n - 1) : 1;
  if (!root) {
    atomic(spec.world_pes[0], spec.sync_offset + offsetof(SyncArea, arrivals), AmoOp::add, 4, 1, 0);
    notify(spec.world_pes[0], Wake::sync);
  }
  JobControl* control = job();
  auto ready = [&] {
    if (word.load(std::memory_order_acquire) >= want) return true;
    // A member that finalized or exited will not arrive (its arrival, if
    // made, was written before its state: look again after the state).
    for (int i = root ? 1 : 0; control && i < (root ? n : 1); ++i) {
      const int pe = spec.world_pes[size_t(i)];
      const uint32_t state = control->pes[pe].state.load(std::memory_order_acquire);
      if (state >= pe_finalized && word.load(std::memory_order_acquire) < want)
        CM_THROW(Error, "every PE must make the same collective calls (barriers included) before shmem_finalize",
                 "{}: PE {} {} and will not arrive", spec.describe(), pe,
                 state == pe_finalized ? "already called shmem_finalize" : "already exited");
    }
    return false;
  };
  Bell& bell = reinterpret_cast<HeapHeader*>(local_base())->sync_bell;
  wait_until_ready(bell, ready, [&] { return spec.describe(); });
  word.store(0, std::memory_order_release);
  if (root)
    for (int i = 1; i < n; ++i) {
      atomic(spec.world_pes[size_t(i)], spec.sync_offset + offsetof(SyncArea, arrivals) + sizeof(uint32_t),
             AmoOp::add, 4, 1, 0);
      notify(spec.world_pes[size_t(i)], Wake::sync);
    }
}

namespace {
// Forwards everything but the fast path.
class WithoutPeerPointers final : public Transport {
 public:
  explicit WithoutPeerPointers(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return "shm-rma"; }
  int my_pe() const override { return inner_->my_pe(); }
  int n_pes() const override { return inner_->n_pes(); }
  std::byte* local_base() const override { return inner_->local_base(); }
  size_t segment_bytes() const override { return inner_->segment_bytes(); }
  std::byte* local_data_base() const override { return inner_->local_data_base(); }
  size_t data_bytes() const override { return inner_->data_bytes(); }
  std::byte* peer_pointer(int, size_t) const override { return nullptr; }
  void put(int pe, size_t offset, const void* src, size_t bytes) override {
    inner_->put(pe, offset, src, bytes);
  }
  void get(void* dst, int pe, size_t offset, size_t bytes) override {
    inner_->get(dst, pe, offset, bytes);
  }
  void put_nbi(int pe, size_t offset, const void* src, size_t bytes) override {
    inner_->put_nbi(pe, offset, src, bytes);
  }
  void get_nbi(void* dst, int pe, size_t offset, size_t bytes) override {
    inner_->get_nbi(dst, pe, offset, bytes);
  }
  void put_signal(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                  uint64_t value, SignalOp op, bool nbi) override {
    inner_->put_signal(pe, offset, src, bytes, signal_offset, value, op, nbi);
  }
  void push(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
            uint64_t value) override {
    inner_->push(pe, offset, src, bytes, signal_offset, value);
  }
  uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                  uint64_t compare) override {
    return inner_->atomic(pe, offset, op, width, operand, compare);
  }
  void quiet() override { inner_->quiet(); }
  void fence() override { inner_->fence(); }
  void notify(int pe, Wake who) override { inner_->notify(pe, who); }
  JobControl* job() const override { return inner_->job(); }
  void close() override { inner_->close(); }

 private:
  std::unique_ptr<Transport> inner_;
};
}  // namespace

std::unique_ptr<Transport> without_peer_pointers(std::unique_ptr<Transport> inner) {
  return std::make_unique<WithoutPeerPointers>(std::move(inner));
}

}  // namespace coremesh::shmem::internal
