// The MPI engine: the network path between hosts on MPI-3 RMA (the
// alternative to the UCX engine, COREMESH_TRANSPORT=mpi; host_transport.cpp
// creates it once MPI is up and this PE's memory exists).
//
// MPI_Win_create over the heap segment and over the program's writable data
// exchanges what the network needs to reach them. The data path is MPI-3
// passive-target RMA in one lock_all epoch per window:
//   put / get           MPI_Put / MPI_Get + MPI_Win_flush (complete on return)
//   put_nbi / get_nbi   MPI_Put / MPI_Get, completed by quiet (flush_all)
//   atomic              MPI_Fetch_and_op / MPI_Compare_and_swap + flush
//   put_signal          put + flush + an atomic on the signal (ordered by the flush)
//   fence, quiet        MPI_Win_flush_all
// Peers write this PE's memory without ringing its futex bells, so waits
// poll (wait.hpp's poll hook), calling MPI for progress: with TCP the
// target's library applies incoming RMA only when it is called.
//
// Thread safety: every MPI call is made under one mutex (MPI_THREAD_SERIALIZED
// suffices then); stream kernels may call from worker threads.
//
// Atomicity: MPI applies accumulates in its own code, not as CPU atomics
// (cpu_atomics() is false): the host transport then sends every atomic,
// also to PEs of this host, through MPI. MPI-3 (11.7.1) makes concurrent
// accumulates on one location atomic for the same op only; OpenSHMEM mixes
// swap, compare-swap and add on one word (the MCS lock does). OpenMPI's osc
// components apply accumulates to one target one at a time, which makes the
// mix atomic there; another MPI may not.
#define OMPI_SKIP_MPICXX 1  // the C API only (no libmpi_cxx)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <mutex>

#include "coremesh/core/error.hpp"
#include "mpi_boot.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {

constexpr size_t kChunk = size_t{1} << 30;  // MPI counts are ints

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const LocalMemory& memory);
  ~MpiTransport() override { close(); }

  const char* name() const override { return "mpi"; }
  int my_pe() const override { return my_pe_; }
  int n_pes() const override { return n_pes_; }
  std::byte* local_base() const override { return base_; }
  size_t segment_bytes() const override { return segment_bytes_; }
  std::byte* local_data_base() const override { return data_.base; }
  size_t data_bytes() const override { return data_.bytes; }
  std::byte* peer_pointer(int, size_t) const override { return nullptr; }

  void put(int pe, size_t offset, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    rma(true, pe, offset, const_cast<void*>(src), bytes);
    check_mpi(MPI_Win_flush(pe, window(offset)), "MPI_Win_flush");
  }
  void get(void* dst, int pe, size_t offset, size_t bytes) override {
    std::lock_guard lock(mutex_);
    rma(false, pe, offset, dst, bytes);
    check_mpi(MPI_Win_flush(pe, window(offset)), "MPI_Win_flush");
  }
  void put_nbi(int pe, size_t offset, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    rma(true, pe, offset, const_cast<void*>(src), bytes);
  }
  void get_nbi(void* dst, int pe, size_t offset, size_t bytes) override {
    std::lock_guard lock(mutex_);
    rma(false, pe, offset, dst, bytes);
  }
  // nbi too completes at once: MPI orders a put before an accumulate only
  // through a flush.
  void put_signal(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                  uint64_t value, SignalOp op, bool) override {
    if (bytes != 0) put(pe, offset, src, bytes);
    atomic(pe, signal_offset, op == SignalOp::add ? AmoOp::add : AmoOp::set, 8, value, 0);
  }
  uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                  uint64_t compare) override;
  void quiet() override {
    std::lock_guard lock(mutex_);
    flush_all();
  }
  void fence() override { quiet(); }
  void notify(int, Wake) override {}  // peers poll
  bool cpu_atomics() const override { return false; }
  JobControl* job() const override { return nullptr; }  // mpirun watches the job
  void close() override;

  // Lets incoming RMA land (called by waits, wait.hpp).
  void progress() {
    std::lock_guard lock(mutex_);
    MPI_Win_sync(heap_win_);
    if (data_win_ != MPI_WIN_NULL) MPI_Win_sync(data_win_);
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }

 private:
  MPI_Win window(size_t offset) const { return offset < segment_bytes_ ? heap_win_ : data_win_; }
  MPI_Aint disp(size_t offset) const {
    return static_cast<MPI_Aint>(offset < segment_bytes_ ? offset : offset - segment_bytes_);
  }
  void rma(bool is_put, int pe, size_t offset, void* local, size_t bytes) {
    auto* p = static_cast<std::byte*>(local);
    for (size_t at = 0; at < bytes; at += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, bytes - at));
      const MPI_Aint d = disp(offset) + static_cast<MPI_Aint>(at);
      if (is_put)
        check_mpi(MPI_Put(p + at, n, MPI_BYTE, pe, d, n, MPI_BYTE, window(offset)), "MPI_Put");
      else
        check_mpi(MPI_Get(p + at, n, MPI_BYTE, pe, d, n, MPI_BYTE, window(offset)), "MPI_Get");
    }
  }
  void flush_all() {
    check_mpi(MPI_Win_flush_all(heap_win_), "MPI_Win_flush_all");
    if (data_win_ != MPI_WIN_NULL) check_mpi(MPI_Win_flush_all(data_win_), "MPI_Win_flush_all");
  }

  int my_pe_ = 0;
  int n_pes_ = 1;
  size_t segment_bytes_ = 0;
  std::byte* base_ = nullptr;
  DataRange data_;
  MPI_Win heap_win_ = MPI_WIN_NULL;
  MPI_Win data_win_ = MPI_WIN_NULL;
  std::mutex mutex_;
};

MpiTransport* g_mpi = nullptr;  // for the poll hook
void poll_mpi() {
  if (g_mpi != nullptr) g_mpi->progress();
}

MpiTransport::MpiTransport(const LocalMemory& memory)
    : my_pe_(memory.my_pe),
      n_pes_(memory.n_pes),
      segment_bytes_(memory.segment_bytes),
      base_(memory.base),
      data_(memory.data) {
  check_mpi(MPI_Win_create(base_, static_cast<MPI_Aint>(segment_bytes_), 1, MPI_INFO_NULL,
                           MPI_COMM_WORLD, &heap_win_),
            "MPI_Win_create (heap)");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, heap_win_), "MPI_Win_lock_all");
  // Collective: every PE has the same data segment size (checked at bootstrap).
  if (data_.bytes != 0) {
    check_mpi(MPI_Win_create(data_.base, static_cast<MPI_Aint>(data_.bytes), 1, MPI_INFO_NULL,
                             MPI_COMM_WORLD, &data_win_),
              "MPI_Win_create (globals)");
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, data_win_), "MPI_Win_lock_all");
  }
  g_mpi = this;
  set_poll_hook(poll_mpi);
}

uint64_t MpiTransport::atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                              uint64_t compare) {
  const MPI_Datatype type = width == 4 ? MPI_UINT32_T : MPI_UINT64_T;
  uint32_t in32 = static_cast<uint32_t>(operand), cmp32 = static_cast<uint32_t>(compare), out32 = 0;
  uint64_t in64 = operand, cmp64 = compare, out64 = 0;
  void* in = width == 4 ? static_cast<void*>(&in32) : &in64;
  void* cmp = width == 4 ? static_cast<void*>(&cmp32) : &cmp64;
  void* out = width == 4 ? static_cast<void*>(&out32) : &out64;
  MPI_Op mpi_op = MPI_NO_OP;
  switch (op) {
    case AmoOp::fetch: mpi_op = MPI_NO_OP; break;
    case AmoOp::set:
    case AmoOp::swap: mpi_op = MPI_REPLACE; break;
    case AmoOp::add: mpi_op = MPI_SUM; break;
    case AmoOp::band: mpi_op = MPI_BAND; break;
    case AmoOp::bor: mpi_op = MPI_BOR; break;
    case AmoOp::bxor: mpi_op = MPI_BXOR; break;
    case AmoOp::compare_swap: break;
  }
  std::lock_guard lock(mutex_);
  const MPI_Win win = window(offset);
  if (op == AmoOp::compare_swap)
    check_mpi(MPI_Compare_and_swap(in, cmp, out, type, pe, disp(offset), win), "MPI_Compare_and_swap");
  else
    check_mpi(MPI_Fetch_and_op(in, out, type, pe, disp(offset), mpi_op, win), "MPI_Fetch_and_op");
  check_mpi(MPI_Win_flush(pe, win), "MPI_Win_flush");
  return width == 4 ? out32 : out64;
}

void MpiTransport::close() {
  if (base_ == nullptr) return;
  set_poll_hook(nullptr);
  g_mpi = nullptr;
  std::lock_guard lock(mutex_);
  flush_all();
  MPI_Win_unlock_all(heap_win_);
  MPI_Win_free(&heap_win_);
  if (data_win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(data_win_);
    MPI_Win_free(&data_win_);
  }
  base_ = nullptr;  // the bootstrap owns the memory
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const LocalMemory& memory) {
  return std::make_unique<MpiTransport>(memory);
}

}  // namespace coremesh::shmem::internal
