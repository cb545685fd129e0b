// The transport under mpirun: hierarchical. PEs of one host reach each other
// through shared memory (the shm transport over each other's segments;
// shmem_ptr works between them), PEs of other hosts through a network
// engine (ucx_transport.cpp, or mpi_transport.cpp with COREMESH_TRANSPORT=mpi).
// Every call picks its path by the target PE, so the table composes.
//
// Bootstrap, every step collective over MPI_COMM_WORLD:
//   1. globals: while this is the process's only thread (before MPI starts
//      its threads) the executable's writable data moves into a memfd
//      (data_segment.hpp), so that PEs of this host can map it. If threads
//      run already (the program started MPI itself), globals stay private
//      and even PEs of this host reach them through the network;
//   2. MPI_Init_thread unless the program did; the MPI rank is the PE;
//   3. the heap segment: a memfd mapped shared (header, team slots, heap);
//   4. hosts: PEs that share memory (MPI_COMM_TYPE_SHARED), or, to simulate
//      hosts on one machine, COREMESH_PES_PER_HOST=k: PEs [0, k), [k, 2k) ...
//      (k = 1: every PE its own host, the network path between all);
//   5. an allgather of (pid, memfds, sizes, host): the sizes must agree; the
//      segments of this host's PEs are mapped through /proc/<pid>/fd/<fd>.
//      No name is ever created, so a killed PE leaves nothing in /dev/shm;
//   6. a barrier (everybody mapped), the memfds close, and the network
//      engine registers the heap and the globals with every peer.
//
// Atomics: an engine whose atomics are not CPU atomics at the target (mpi)
// gets every atomic, also to PEs of this host and to this PE, so that all
// updates of a word go one way.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "mpi_boot.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {

// What every PE tells the others at bootstrap.
struct PeInfo {
  int32_t pid;
  int32_t heap_fd;
  int32_t data_fd;  // -1: globals stay private
  int32_t host;
  int32_t machine;  // lowest rank of the PE's machine (MPI_COMM_TYPE_SHARED)
  uint64_t heap_bytes;
  uint64_t data_bytes;
  uint64_t data_image_offset;
};

int make_memfd(const char* name, size_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  CM_CHECK(fd >= 0, "check the open file limit (ulimit -n)", "memfd_create failed: {}",
           std::strerror(errno));
  CM_CHECK(ftruncate(fd, static_cast<off_t>(bytes)) == 0,
           "use a smaller heap (SHMEM_SYMMETRIC_SIZE) or free memory",
           "cannot size the {} to {} bytes: {}", name, bytes, std::strerror(errno));
  return fd;
}

std::byte* map_shared(int fd, size_t bytes, const char* what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CM_CHECK(p != MAP_FAILED, "use a smaller heap (SHMEM_SYMMETRIC_SIZE) or free memory",
           "cannot map the {} ({} bytes): {}", what, bytes, std::strerror(errno));
  return static_cast<std::byte*>(p);
}

// A peer's memfd, opened through /proc (same user, same machine).
std::byte* map_peer(const PeInfo& peer, int fd, size_t bytes, int pe, const char* what) {
  const std::string path = fmt::format("/proc/{}/fd/{}", peer.pid, fd);
  const int mine = open(path.c_str(), O_RDWR | O_CLOEXEC);
  CM_CHECK(mine >= 0,
           "PEs of one host map each other's memory through /proc/<pid>/fd; set "
           "COREMESH_PES_PER_HOST=1 to reach every PE through the network instead",
           "cannot open the {} of PE {} ({}): {}", what, pe, path, std::strerror(errno));
  std::byte* p = map_shared(mine, bytes, what);
  ::close(mine);
  return p;
}

// Host of every PE: machines, or blocks of COREMESH_PES_PER_HOST PEs.
int host_of(int pe, int machine) {
  if (!env::get("COREMESH_PES_PER_HOST")) return machine;
  const int64_t per_host = env::get_int("COREMESH_PES_PER_HOST", 1);
  CM_CHECK(per_host >= 1, "set COREMESH_PES_PER_HOST to a PE count >= 1 (or unset it)",
           "COREMESH_PES_PER_HOST={} is not a PE count", per_host);
  return static_cast<int>(pe / per_host);
}

void check_agreement(const std::vector<PeInfo>& all, int my_pe) {
  std::string heaps, datas, machines;
  bool same_heap = true, same_data = true, hosts_on_machines = true;
  const PeInfo& mine = all[static_cast<size_t>(my_pe)];
  for (size_t pe = 0; pe < all.size(); ++pe) {
    const PeInfo& p = all[pe];
    same_heap = same_heap && p.heap_bytes == mine.heap_bytes;
    same_data = same_data && p.data_bytes == mine.data_bytes &&
                p.data_image_offset == mine.data_image_offset;
    if (p.host == mine.host) hosts_on_machines = hosts_on_machines && p.machine == mine.machine;
    heaps += fmt::format("{}PE {}: {} B", pe ? ", " : "", pe, p.heap_bytes);
    datas += fmt::format("{}PE {}: {} B at image offset {:#x}", pe ? ", " : "", pe, p.data_bytes,
                         p.data_image_offset);
    machines += fmt::format("{}PE {}: host {} machine {}", pe ? ", " : "", pe, p.host, p.machine);
  }
  CM_CHECK(same_heap, "set the same SHMEM_SYMMETRIC_SIZE / COREMESH_HEAP_SIZE on every PE",
           "symmetric heap sizes differ: {}", heaps);
  CM_CHECK(same_data, "run the same executable on every PE, with the same COREMESH_SYMMETRIC_DATA",
           "the PEs' global data segments differ: {}", datas);
  CM_CHECK(hosts_on_machines,
           "COREMESH_PES_PER_HOST may only split machines, not join PEs of different machines",
           "a simulated host spans machines: {}", machines);
}

class HostTransport final : public Transport {
 public:
  HostTransport(size_t user_heap_bytes, const std::string& network);
  ~HostTransport() override { close(); }

  const char* name() const override { return net_->name(); }
  int my_pe() const override { return my_pe_; }
  int n_pes() const override { return n_pes_; }
  std::byte* local_base() const override { return shm_->local_base(); }
  size_t segment_bytes() const override { return shm_->segment_bytes(); }
  std::byte* local_data_base() const override { return shm_->local_data_base(); }
  size_t data_bytes() const override { return shm_->data_bytes(); }
  std::byte* peer_pointer(int pe, size_t offset) const override {
    return shm_->peer_pointer(pe, offset);
  }

  void put(int pe, size_t offset, const void* src, size_t bytes) override {
    path(pe, offset).put(pe, offset, src, bytes);
  }
  void get(void* dst, int pe, size_t offset, size_t bytes) override {
    path(pe, offset).get(dst, pe, offset, bytes);
  }
  void put_nbi(int pe, size_t offset, const void* src, size_t bytes) override {
    path(pe, offset).put_nbi(pe, offset, src, bytes);
  }
  void get_nbi(void* dst, int pe, size_t offset, size_t bytes) override {
    path(pe, offset).get_nbi(dst, pe, offset, bytes);
  }
  void put_signal(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                  uint64_t value, SignalOp op, bool nbi) override {
    Transport& data = path(pe, offset);
    Transport& signal = atomic_path(pe, signal_offset);
    if (&data == &signal || bytes == 0) {
      signal.put_signal(pe, offset, src, bytes, signal_offset, value, op, nbi);
      return;
    }
    data.put(pe, offset, src, bytes);
    data.quiet();  // delivered before the signal goes the other way
    signal.atomic(pe, signal_offset, op == SignalOp::add ? AmoOp::add : AmoOp::set, 8, value, 0);
    data.notify(pe);
  }
  void push(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
            uint64_t value) override {
    Transport& data = path(pe, offset);
    if (&data == &atomic_path(pe, signal_offset)) return data.push(pe, offset, src, bytes, signal_offset, value);
    Transport::push(pe, offset, src, bytes, signal_offset, value);
  }
  uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                  uint64_t compare) override {
    return atomic_path(pe, offset).atomic(pe, offset, op, width, operand, compare);
  }
  void quiet() override {
    shm_->quiet();
    net_->quiet();
  }
  void fence() override {
    shm_->fence();
    net_->fence();
  }
  void notify(int pe, Wake who) override { path(pe, 0).notify(pe, who); }
  bool cpu_atomics() const override { return net_->cpu_atomics(); }
  JobControl* job() const override { return nullptr; }  // mpirun watches the job
  void close() override;

 private:
  // Load/store where this PE maps the target's segment, else the network.
  Transport& path(int pe, size_t offset) const {
    return shm_->peer_pointer(pe, offset) != nullptr ? *shm_ : *net_;
  }
  Transport& atomic_path(int pe, size_t offset) const {
    return net_->cpu_atomics() ? path(pe, offset) : *net_;
  }

  int my_pe_ = 0;
  int n_pes_ = 1;
  bool owns_mpi_ = false;
  std::unique_ptr<Transport> shm_;
  std::unique_ptr<Transport> net_;
};

HostTransport::HostTransport(size_t user_heap_bytes, const std::string& network) {
  CM_CHECK(user_heap_bytes >= 4096, "use a heap of at least 4K",
           "symmetric heap size {} B is too small", user_heap_bytes);
  user_heap_bytes = (user_heap_bytes + 4095) / 4096 * 4096;
  // 1: globals into a memfd, while no other thread can write them.
  DataRange data = find_data_range();
  int data_fd = -1;
  if (data.bytes != 0 && count_threads() == 1) {
    data_fd = make_memfd("coremesh-globals", data.bytes);
    move_into_shm(data, data_fd);
  }
  // 2-3: MPI, then the heap.
  owns_mpi_ = start_mpi();
  my_pe_ = mpi_rank();
  n_pes_ = mpi_size();
  CM_CHECK(n_pes_ <= kMaxPes, "run at most 256 PEs", "{} MPI ranks exceed {} PEs", n_pes_, kMaxPes);
  set_wait_identity(my_pe_, nullptr);
  ShmSegments segments;
  segments.my_pe = my_pe_;
  segments.n_pes = n_pes_;
  segments.segment_bytes = user_heap_base(n_pes_) + user_heap_bytes;
  segments.data = data;
  segments.heaps.assign(static_cast<size_t>(n_pes_), nullptr);
  segments.datas.assign(static_cast<size_t>(n_pes_), nullptr);
  const int heap_fd = make_memfd("coremesh-heap", segments.segment_bytes);
  std::byte* base = map_heap_segment(heap_fd, segments.segment_bytes);
  CM_CHECK(base != nullptr, "use a smaller heap (SHMEM_SYMMETRIC_SIZE) or free memory",
           "cannot map the heap segment ({} bytes): {}", segments.segment_bytes, std::strerror(errno));
  auto* header = reinterpret_cast<HeapHeader*>(base);
  header->magic = kHeapMagic;
  header->segment_bytes = segments.segment_bytes;
  segments.heaps[static_cast<size_t>(my_pe_)] = base;
  segments.datas[static_cast<size_t>(my_pe_)] = data.base;

  // 4-5: who shares this host; map their segments.
  const int machine = mpi_machine();
  const PeInfo mine{static_cast<int32_t>(getpid()), heap_fd, data_fd, host_of(my_pe_, machine),
                    machine, user_heap_bytes, data.bytes, data.image_offset};
  const std::vector<PeInfo> all = allgather(mine);
  check_agreement(all, my_pe_);
  for (int pe = 0; pe < n_pes_; ++pe) {
    const PeInfo& peer = all[static_cast<size_t>(pe)];
    if (pe == my_pe_ || peer.host != mine.host) continue;
    segments.heaps[static_cast<size_t>(pe)] =
        map_peer(peer, peer.heap_fd, segments.segment_bytes, pe, "heap segment");
    if (peer.data_fd >= 0 && data_fd >= 0)
      segments.datas[static_cast<size_t>(pe)] =
          map_peer(peer, peer.data_fd, data.bytes, pe, "data segment");
  }
  // 6: everybody holds its mappings; the engine connects.
  mpi_barrier();
  ::close(heap_fd);
  if (data_fd >= 0) ::close(data_fd);
  const LocalMemory memory{my_pe_, n_pes_, base, segments.segment_bytes, data};
  shm_ = make_shm_transport(std::move(segments));
  net_ = network == "mpi" ? make_mpi_transport(memory) : make_ucx_transport(memory);
}

void HostTransport::close() {
  if (!net_) return;
  net_->close();  // collective: after it no peer reaches this PE's memory
  net_.reset();
  shm_->close();
  shm_.reset();
  if (owns_mpi_) stop_mpi();
}

}  // namespace

std::unique_ptr<Transport> make_host_transport(size_t user_heap_bytes, const std::string& network) {
  return std::make_unique<HostTransport>(user_heap_bytes, network);
}

}  // namespace coremesh::shmem::internal
