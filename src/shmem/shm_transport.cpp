// The shm transport: one POSIX shared memory segment per PE, mapped by every
// PE of the job; RMA is memcpy through the mapping, waits sleep on futexes.
//
// Bootstrap (inside `coremesh run`):
//   1. map the job control block from the inherited fd COREMESH_JOB_FD;
//   2. move our globals into "/cm-<job id>-<pe>-data" (data_segment.hpp;
//      first, before any thread of ours exists);
//   3. create "/cm-<job id>-<pe>" (O_EXCL, mode 0600), size it, map it;
//   4. publish both sizes, wait until every PE has created its segments;
//   5. check that all sizes agree, map every peer's segments;
//   6. wait until every PE has mapped every segment, then unlink our names:
//      from here on no name exists in /dev/shm (the launcher also unlinks
//      every name of the job when it exits, for PEs that die half-way).
// A single PE (no launcher) maps its heap anonymously and leaves its globals
// where they are: nobody else needs to map them. Under mpirun the host
// transport maps the segments of the PEs of its host and hands them over
// (ShmSegments); the other PEs' entries are null and never asked for.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "copy_engine.hpp"
#include "data_segment.hpp"
#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/launch.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {

void* map_fd(int fd, size_t bytes, const std::string& what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CM_CHECK(p != MAP_FAILED, "check free memory in /dev/shm (df -h /dev/shm) and ulimit -v",
           "cannot map {} ({} bytes): {}", what, bytes, std::strerror(errno));
  return p;
}

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(size_t user_heap_bytes);
  explicit ShmTransport(ShmSegments segments);
  ~ShmTransport() override { close(); }

  const char* name() const override { return "shm"; }
  int my_pe() const override { return my_pe_; }
  int n_pes() const override { return n_pes_; }
  std::byte* local_base() const override { return bases_[my_pe_]; }
  size_t segment_bytes() const override { return segment_bytes_; }
  std::byte* local_data_base() const override { return data_.base; }
  size_t data_bytes() const override { return data_.bytes; }
  std::byte* peer_pointer(int pe, size_t offset) const override { return at(pe, offset); }

  void put(int pe, size_t offset, const void* src, size_t bytes) override {
    perform({at(pe, offset), static_cast<const std::byte*>(src), bytes, nullptr, 0, false,
             &doorbell(pe)});
  }
  void get(void* dst, int pe, size_t offset, size_t bytes) override {
    std::memcpy(dst, at(pe, offset), bytes);
  }
  void put_nbi(int pe, size_t offset, const void* src, size_t bytes) override {
    engine_.submit({at(pe, offset), static_cast<const std::byte*>(src), bytes, nullptr, 0, false,
                    &doorbell(pe)});
  }
  void get_nbi(void* dst, int pe, size_t offset, size_t bytes) override {
    engine_.submit({static_cast<std::byte*>(dst), at(pe, offset), bytes, nullptr, 0, false,
                    nullptr});
  }
  void put_signal(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                  uint64_t value, SignalOp op, bool nbi) override {
    CopyOp copy{at(pe, offset), static_cast<const std::byte*>(src), bytes,
                reinterpret_cast<std::atomic<uint64_t>*>(at(pe, signal_offset)), value,
                op == SignalOp::add, &doorbell(pe)};
    if (nbi) engine_.submit(copy);
    else perform(copy);
  }
  uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                  uint64_t compare) override {
    std::byte* word = at(pe, offset);
    const uint64_t old = width == 4 ? amo<uint32_t>(word, op, operand, compare)
                                    : amo<uint64_t>(word, op, operand, compare);
    if (op != AmoOp::fetch) ring(doorbell(pe));
    return old;
  }
  // The engine runs nbi operations in submission order on its own thread,
  // while blocking puts and AMOs run on the caller's: a fence therefore
  // waits for the engine, so that nothing issued after it can overtake a
  // put_nbi issued before it (quiet does the same and more).
  void quiet() override { engine_.drain(); }
  void fence() override { engine_.drain(); }
  void notify(int pe, Wake who) override {
    auto* header = reinterpret_cast<HeapHeader*>(bases_[pe]);
    ring(who == Wake::sync ? header->sync_bell : header->doorbell);
  }
  JobControl* job() const override { return launched_ ? job_ : nullptr; }
  void close() override;

 private:
  Bell& doorbell(int pe) { return reinterpret_cast<HeapHeader*>(bases_[pe])->doorbell; }
  template <typename W>
  static uint64_t amo(std::byte* word, AmoOp op, uint64_t operand, uint64_t compare) {
    std::atomic_ref<W> ref(*reinterpret_cast<W*>(word));
    const W v = static_cast<W>(operand);
    constexpr auto order = std::memory_order_seq_cst;
    switch (op) {
      case AmoOp::fetch: return ref.load(order);
      case AmoOp::set: ref.store(v, order); return 0;
      case AmoOp::swap: return ref.exchange(v, order);
      case AmoOp::compare_swap: {
        W expected = static_cast<W>(compare);
        ref.compare_exchange_strong(expected, v, order);
        return expected;  // the old value, whether or not it matched
      }
      case AmoOp::add: return ref.fetch_add(v, order);
      case AmoOp::band: return ref.fetch_and(v, order);
      case AmoOp::bor: return ref.fetch_or(v, order);
      case AmoOp::bxor: return ref.fetch_xor(v, order);
    }
    return 0;
  }
  // A symmetric offset's address at `pe` (heap or data segment); nullptr
  // where that segment is not mapped.
  std::byte* at(int pe, size_t offset) const {
    std::byte* base = offset < segment_bytes_ ? bases_[pe] : data_bases_[pe];
    if (base == nullptr) return nullptr;
    return offset < segment_bytes_ ? base + offset : base + (offset - segment_bytes_);
  }
  void start_alone();
  void join_job(const std::string& job_id);
  void create_data_segment();
  void check_sizes() const;
  std::string segment_name(int pe) const { return "/cm-" + job_id_ + "-" + std::to_string(pe); }
  std::string data_name(int pe) const { return segment_name(pe) + "-data"; }

  int my_pe_ = 0;
  int n_pes_ = 1;
  bool launched_ = false;
  size_t user_heap_bytes_ = 0;
  size_t segment_bytes_ = 0;
  std::string job_id_;
  JobControl* job_ = nullptr;
  size_t job_bytes_ = 0;
  std::vector<std::byte*> bases_;
  DataRange data_;                      // our globals (never unmapped)
  std::vector<std::byte*> data_bases_;  // every PE's data segment; ours is data_.base
  CopyEngine engine_;
};

ShmTransport::ShmTransport(size_t user_heap_bytes) {
  CM_CHECK(user_heap_bytes >= 4096, "use a heap of at least 4K",
           "symmetric heap size {} B is too small", user_heap_bytes);
  user_heap_bytes_ = (user_heap_bytes + 4095) / 4096 * 4096;
  auto job_id = env::get(kJobIdEnv);
  if (job_id) join_job(*job_id);
  else start_alone();
}

ShmTransport::ShmTransport(ShmSegments segments)
    : my_pe_(segments.my_pe),
      n_pes_(segments.n_pes),
      segment_bytes_(segments.segment_bytes),
      bases_(std::move(segments.heaps)),
      data_(segments.data),
      data_bases_(std::move(segments.datas)) {}

void ShmTransport::start_alone() {
  // A single PE: anonymous shared memory, no names at all.
  segment_bytes_ = user_heap_base(1) + user_heap_bytes_;
  std::byte* p = map_heap_segment(-1, segment_bytes_);
  CM_CHECK(p != nullptr, "use a smaller heap (COREMESH_HEAP_SIZE)",
           "cannot map a symmetric heap of {} bytes: {}", segment_bytes_, std::strerror(errno));
  bases_ = {p};
  data_ = find_data_range();
  data_bases_ = {data_.base};
  job_bytes_ = job_control_bytes(1);
  job_ = static_cast<JobControl*>(std::calloc(1, job_bytes_));
  job_->n_pes = 1;
}

void ShmTransport::join_job(const std::string& job_id) {
  launched_ = true;
  job_id_ = job_id;
  my_pe_ = static_cast<int>(env::get_int(kPeEnv, -1));
  n_pes_ = static_cast<int>(env::get_int(kNumPesEnv, -1));
  const int job_fd = static_cast<int>(env::get_int(kJobFdEnv, -1));
  CM_CHECK(n_pes_ >= 1 && n_pes_ <= kMaxPes && my_pe_ >= 0 && my_pe_ < n_pes_ && job_fd >= 0,
           "start SHMEM programs with `coremesh run -n N prog`",
           "inconsistent launcher environment: {}={} {}={} {}={}", kPeEnv, my_pe_, kNumPesEnv,
           n_pes_, kJobFdEnv, job_fd);
  job_bytes_ = job_control_bytes(n_pes_);
  job_ = static_cast<JobControl*>(map_fd(job_fd, job_bytes_, "the job control block"));
  ::close(job_fd);
  CM_CHECK(job_->magic == kJobMagic && job_->n_pes == static_cast<uint32_t>(n_pes_),
           "start SHMEM programs with `coremesh run -n N prog`",
           "the job control block does not match this launcher environment");
  set_wait_identity(my_pe_, job_);

  // 2: our globals, before the copy engine (or anything else of ours) runs a thread.
  data_bases_.assign(n_pes_, nullptr);
  create_data_segment();

  // 3-4: our heap segment.
  segment_bytes_ = user_heap_base(n_pes_) + user_heap_bytes_;
  bases_.assign(n_pes_, nullptr);
  {
    const std::string name = segment_name(my_pe_);
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    CM_CHECK(fd >= 0, "check that /dev/shm is mounted and writable",
             "PE {}: cannot create shared memory segment: {}", my_pe_, std::strerror(errno));
    const bool sized = ftruncate(fd, static_cast<off_t>(segment_bytes_)) == 0;
    const int err = errno;
    CM_CHECK(sized,
             err == EFBIG ? fmt::format("raise the file size limit (ulimit -f) above {} MiB (the heap is a file in "
                                        "/dev/shm), or use a smaller heap (--heap / COREMESH_HEAP_SIZE)",
                                        (segment_bytes_ >> 20) + 1)
                          : std::string("use a smaller heap (--heap / COREMESH_HEAP_SIZE) or free space in /dev/shm"),
             "PE {}: cannot size the heap segment to {} bytes: {}", my_pe_, segment_bytes_, std::strerror(err));
    bases_[my_pe_] = map_heap_segment(fd, segment_bytes_);
    CM_CHECK(bases_[my_pe_] != nullptr, "check free memory in /dev/shm (df -h /dev/shm) and ulimit -v",
             "cannot map the heap segment ({} bytes): {}", segment_bytes_, std::strerror(errno));
    ::close(fd);
    auto* header = reinterpret_cast<HeapHeader*>(bases_[my_pe_]);
    header->magic = kHeapMagic;
    header->segment_bytes = segment_bytes_;
  }
  PeSlot& slot = job_->pes[my_pe_];
  slot.pid = static_cast<int32_t>(getpid());
  slot.heap_bytes = user_heap_bytes_;
  slot.data_bytes = data_.bytes;
  slot.data_image_offset = data_.image_offset;
  slot.state.store(pe_created, std::memory_order_release);
  ring(job_->created);
  auto missing = [&](PeState state) {
    std::string who;
    for (int pe = 0; pe < n_pes_; ++pe)
      if (job_->pes[pe].state.load() < state) who += (who.empty() ? "" : ", ") + std::to_string(pe);
    return who;
  };
  wait_until_ready(
      job_->created, [&] { return job_->created.seq.load() >= static_cast<uint32_t>(n_pes_); },
      [&] { return fmt::format("PE {} waits in shmem init for PEs {} to start", my_pe_,
                               missing(pe_created)); });

  // 5: every PE must have the same heap size and data segment.
  check_sizes();
  auto map_peer = [&](const std::string& name, int pe, size_t bytes, const char* what) {
    int fd = shm_open(name.c_str(), O_RDWR, 0600);
    CM_CHECK(fd >= 0, "the PE may have died during start-up; see its output",
             "PE {}: cannot open the {} of PE {}: {}", my_pe_, what, pe, std::strerror(errno));
    auto* p = static_cast<std::byte*>(map_fd(fd, bytes, what));
    ::close(fd);
    return p;
  };
  for (int pe = 0; pe < n_pes_; ++pe) {
    if (pe == my_pe_) continue;
    bases_[pe] = map_peer(segment_name(pe), pe, segment_bytes_, "heap segment");
    if (data_.bytes != 0) data_bases_[pe] = map_peer(data_name(pe), pe, data_.bytes, "data segment");
  }
  // 6: once everybody holds every mapping, the names are no longer needed.
  slot.state.store(pe_mapped, std::memory_order_release);
  ring(job_->mapped);
  wait_until_ready(
      job_->mapped, [&] { return job_->mapped.seq.load() >= static_cast<uint32_t>(n_pes_); },
      [&] { return fmt::format("PE {} waits in shmem init for PEs {} to map the heaps", my_pe_,
                               missing(pe_mapped)); });
  shm_unlink(segment_name(my_pe_).c_str());
  if (data_.bytes != 0) shm_unlink(data_name(my_pe_).c_str());
}

void ShmTransport::create_data_segment() {
  data_ = find_data_range();
  data_bases_[my_pe_] = data_.base;
  if (data_.bytes == 0) return;
  const std::string name = data_name(my_pe_);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  CM_CHECK(fd >= 0, "check that /dev/shm is mounted and writable",
           "PE {}: cannot create the data segment: {}", my_pe_, std::strerror(errno));
  CM_CHECK(ftruncate(fd, static_cast<off_t>(data_.bytes)) == 0, "free space in /dev/shm",
           "PE {}: cannot size the data segment to {} bytes: {}", my_pe_, data_.bytes,
           std::strerror(errno));
  move_into_shm(data_, fd);
  ::close(fd);
}

void ShmTransport::check_sizes() const {
  std::string heaps, datas;
  bool same_heap = true, same_data = true;
  const PeSlot& mine = job_->pes[my_pe_];
  for (int pe = 0; pe < n_pes_; ++pe) {
    const PeSlot& p = job_->pes[pe];
    same_heap = same_heap && p.heap_bytes == user_heap_bytes_;
    same_data = same_data && p.data_bytes == mine.data_bytes &&
                p.data_image_offset == mine.data_image_offset;
    heaps += fmt::format("{}PE {}: {} B", pe ? ", " : "", pe, p.heap_bytes);
    datas += fmt::format("{}PE {}: {} B at image offset {:#x}", pe ? ", " : "", pe, p.data_bytes,
                         p.data_image_offset);
  }
  CM_CHECK(same_heap,
           "pass the same heap size on every PE (or set only COREMESH_HEAP_SIZE / --heap)",
           "symmetric heap sizes differ: {}", heaps);
  CM_CHECK(same_data,
           "run the same executable on every PE, with the same COREMESH_SYMMETRIC_DATA",
           "the PEs' global data segments differ: {}", datas);
}

void ShmTransport::close() {
  if (bases_.empty()) return;
  engine_.drain();
  for (std::byte* base : bases_)
    if (base != nullptr) munmap(base, segment_bytes_);
  bases_.clear();
  // Our own data segment holds the program's globals: it stays.
  for (std::byte* base : data_bases_)
    if (base != nullptr && base != data_.base) munmap(base, data_.bytes);
  data_bases_.clear();
  if (launched_) {
    set_wait_identity(my_pe_, nullptr);
    job_->pes[my_pe_].state.store(pe_finalized, std::memory_order_release);
    munmap(job_, job_bytes_);
  } else {
    std::free(job_);
  }
  job_ = nullptr;
}

}  // namespace

std::unique_ptr<Transport> make_shm_transport(size_t user_heap_bytes) {
  return std::make_unique<ShmTransport>(user_heap_bytes);
}

std::unique_ptr<Transport> make_shm_transport(ShmSegments segments) {
  return std::make_unique<ShmTransport>(std::move(segments));
}

}  // namespace coremesh::shmem::internal
