// The MPI transport: PEs started by OpenMPI's mpirun, on one host or many.
//
// Bootstrap, the size checks and the heap's remote keys come from MPI: every
// PE creates its heap segment (and, when globals are symmetric, a window
// over its program's writable data) and MPI_Win_create exchanges what the
// network needs to reach it. The data path is MPI-3 passive-target RMA in
// one lock_all epoch per window:
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
// Caveat (MPI-3 11.7.1): concurrent accumulates on one location are atomic
// for the same op (or MPI_NO_OP); OpenSHMEM mixes swap, compare-swap and
// add on one word (the MCS lock does). OpenMPI's osc components apply
// accumulates to one target one at a time, which makes the mix atomic
// there; another MPI may not.
#define OMPI_SKIP_MPICXX 1  // the C API only (no libmpi_cxx)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "data_segment.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  CM_THROW(Error, "check the mpirun command line (transport MCA parameters) and the peers' output",
           "MPI transport: {} failed: {}", what, std::string(text, static_cast<size_t>(len)));
}

constexpr size_t kChunk = size_t{1} << 30;  // MPI counts are ints

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(size_t user_heap_bytes);
  ~MpiTransport() override { close(); }

  const char* name() const override { return "mpi"; }
  int my_pe() const override { return my_pe_; }
  int n_pes() const override { return n_pes_; }
  std::byte* local_base() const override { return base_; }
  size_t segment_bytes() const override { return segment_bytes_; }
  std::byte* local_data_base() const override { return data_.base; }
  size_t data_bytes() const override { return data_.bytes; }
  // Only this PE's own memory is load/store here.
  std::byte* peer_pointer(int pe, size_t offset) const override {
    if (pe != my_pe_) return nullptr;
    return offset < segment_bytes_ ? base_ + offset : data_.base + (offset - segment_bytes_);
  }

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
  void check_sizes() const;

  int my_pe_ = 0;
  int n_pes_ = 1;
  bool owns_mpi_ = false;
  size_t user_heap_bytes_ = 0;
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

MpiTransport::MpiTransport(size_t user_heap_bytes) {
  CM_CHECK(user_heap_bytes >= 4096, "use a heap of at least 4K",
           "symmetric heap size {} B is too small", user_heap_bytes);
  user_heap_bytes_ = (user_heap_bytes + 4095) / 4096 * 4096;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
    CM_CHECK(provided >= MPI_THREAD_SERIALIZED, "use an MPI built with thread support",
             "MPI provides thread level {}, SHMEM needs MPI_THREAD_SERIALIZED", provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &my_pe_);
  MPI_Comm_size(MPI_COMM_WORLD, &n_pes_);
  CM_CHECK(n_pes_ <= kMaxPes, "run at most 256 PEs", "{} MPI ranks exceed {} PEs", n_pes_, kMaxPes);
  set_wait_identity(my_pe_, nullptr);

  segment_bytes_ = user_heap_base(n_pes_) + user_heap_bytes_;
  void* p = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  CM_CHECK(p != MAP_FAILED, "use a smaller heap (SHMEM_SYMMETRIC_SIZE / COREMESH_HEAP_SIZE)",
           "cannot map a symmetric heap of {} bytes: {}", segment_bytes_, std::strerror(errno));
  base_ = static_cast<std::byte*>(p);
  auto* header = reinterpret_cast<HeapHeader*>(base_);
  header->magic = kHeapMagic;
  header->segment_bytes = segment_bytes_;
  data_ = find_data_range();  // globals stay where they are: the window covers them
  check_sizes();

  check_mpi(MPI_Win_create(base_, static_cast<MPI_Aint>(segment_bytes_), 1, MPI_INFO_NULL,
                           MPI_COMM_WORLD, &heap_win_),
            "MPI_Win_create (heap)");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, heap_win_), "MPI_Win_lock_all");
  if (data_.bytes != 0) {
    check_mpi(MPI_Win_create(data_.base, static_cast<MPI_Aint>(data_.bytes), 1, MPI_INFO_NULL,
                             MPI_COMM_WORLD, &data_win_),
              "MPI_Win_create (globals)");
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, data_win_), "MPI_Win_lock_all");
  }
  g_mpi = this;
  set_poll_hook(poll_mpi);
}

// Every PE must have the same heap and data segment: gather them and name
// every PE's values on a mismatch.
void MpiTransport::check_sizes() const {
  const uint64_t mine[3] = {user_heap_bytes_, data_.bytes, data_.image_offset};
  std::vector<uint64_t> all(3 * static_cast<size_t>(n_pes_));
  check_mpi(MPI_Allgather(mine, 3, MPI_UINT64_T, all.data(), 3, MPI_UINT64_T, MPI_COMM_WORLD),
            "MPI_Allgather");
  std::string heaps, datas;
  bool same_heap = true, same_data = true;
  for (int pe = 0; pe < n_pes_; ++pe) {
    const uint64_t* v = &all[3 * static_cast<size_t>(pe)];
    same_heap = same_heap && v[0] == mine[0];
    same_data = same_data && v[1] == mine[1] && v[2] == mine[2];
    heaps += fmt::format("{}PE {}: {} B", pe ? ", " : "", pe, v[0]);
    datas += fmt::format("{}PE {}: {} B at image offset {:#x}", pe ? ", " : "", pe, v[1], v[2]);
  }
  CM_CHECK(same_heap, "set the same SHMEM_SYMMETRIC_SIZE / COREMESH_HEAP_SIZE on every PE",
           "symmetric heap sizes differ: {}", heaps);
  CM_CHECK(same_data, "run the same executable on every PE, with the same COREMESH_SYMMETRIC_DATA",
           "the PEs' global data segments differ: {}", datas);
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
  {
    std::lock_guard lock(mutex_);
    flush_all();
    MPI_Win_unlock_all(heap_win_);
    MPI_Win_free(&heap_win_);
    if (data_win_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(data_win_);
      MPI_Win_free(&data_win_);
    }
  }
  munmap(base_, segment_bytes_);
  base_ = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

}  // namespace

bool launched_by_mpirun() {
  return env::get("OMPI_COMM_WORLD_SIZE").has_value() || env::get("PMIX_RANK").has_value();
}

std::unique_ptr<Transport> make_mpi_transport(size_t user_heap_bytes) {
  return std::make_unique<MpiTransport>(user_heap_bytes);
}

void abort_mpi_job(int status) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
}

}  // namespace coremesh::shmem::internal
