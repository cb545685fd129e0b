// Symmetric global and static variables (OpenSHMEM "symmetric data objects").
//
// Every PE runs the same executable, so a global lies at the same offset from
// the start of the executable's writable data on every PE; only the base
// differs (ASLR). At init each PE copies that range into a POSIX shm object
// and maps the object over the same addresses (the program keeps using its
// globals, now in shared memory); peers map it elsewhere and translate
// `addr - local_base + peer_base`, as for the heap (shm transport).
//
// Which range: the PF_W PT_LOAD segment of the main program (first object of
// dl_iterate_phdr) minus its PT_GNU_RELRO part. RELRO (.got, .dynamic,
// .data.rel.ro, init arrays, TLS images) is read-only after relocation and holds
// no user data; remapping it would make it writable again. The loader protects
// [relro start, page_down(relro end)), so we start at page_down(relro end): the
// rest of that page is already writable. The range may hold .got.plt (lazy
// binding): it is copied with everything else, and the switch below happens
// with one mmap call, so no PLT call ever sees a half-moved GOT.
//
// Not symmetric: shared libraries' globals (the spec allows that),
// thread-local storage, stack and malloc memory.
#include "data_segment.hpp"

#include <dirent.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh::shmem::internal {

namespace {

uintptr_t page_size() { return static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)); }

int visit_main_program(dl_phdr_info* info, size_t, void* out) {
  const ElfW(Phdr)* writable = nullptr;
  const ElfW(Phdr)* relro = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_W) && writable == nullptr) writable = &ph;
    if (ph.p_type == PT_GNU_RELRO) relro = &ph;
  }
  auto& range = *static_cast<DataRange*>(out);
  if (writable != nullptr) {
    const uintptr_t page = page_size();
    uintptr_t start = info->dlpi_addr + writable->p_vaddr;
    const uintptr_t end = start + writable->p_memsz;
    if (relro != nullptr) {
      const uintptr_t relro_end = info->dlpi_addr + relro->p_vaddr + relro->p_memsz;
      if (relro_end > start) start = relro_end < end ? relro_end : end;
    }
    start = start / page * page;
    const uintptr_t stop = (end + page - 1) / page * page;
    if (stop > start) {
      range.base = reinterpret_cast<std::byte*>(start);
      range.bytes = stop - start;
      range.image_offset = start - info->dlpi_addr;
    }
  }
  return 1;  // the first object is the main program; stop there
}

// Copies page by page, skipping pages of zeros: the destination is fresh
// (zero) memory, and a large untouched .bss then costs no memory at all.
// It reads whole pages, AddressSanitizer's redzones between globals
// included, so it is not instrumented and copies word by word (no memcpy,
// which the sanitizer intercepts; relaxed atomic loads keep the compiler
// from turning the loop back into one).
__attribute__((no_sanitize("address"))) void copy_nonzero_pages(std::byte* dst,
                                                                 const std::byte* src,
                                                                 size_t bytes) {
  const size_t page = page_size(), words_per_page = page / sizeof(uint64_t);
  for (size_t at = 0; at < bytes; at += page) {
    const auto* from = reinterpret_cast<const uint64_t*>(src + at);
    auto* to = reinterpret_cast<uint64_t*>(dst + at);
    size_t i = 0;
    while (i < words_per_page && __atomic_load_n(&from[i], __ATOMIC_RELAXED) == 0) ++i;
    for (; i < words_per_page; ++i) to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
  }
}

}  // namespace

int count_threads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 1;  // no /proc: cannot tell
  int n = 0;
  while (const dirent* e = readdir(dir))
    if (e->d_name[0] != '.') ++n;
  closedir(dir);
  return n;
}

namespace {

// The range moved by the last move_into_shm, for the fork handler.
DataRange g_moved;

// In a forked child: replace the shared mapping by a private copy (one
// mremap, so nothing runs with the range half-replaced).
void privatise_in_child() {
  std::byte* const base = g_moved.base;
  const size_t bytes = g_moved.bytes;
  if (bytes == 0) return;
  void* copy = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) _exit(127);  // cannot keep the parent's globals safe
  copy_nonzero_pages(static_cast<std::byte*>(copy), base, bytes);
  // The system call itself: UCX's memory hooks (UCM, under mpirun) replace
  // mremap with a wrapper that drops MREMAP_FIXED's new address.
  const long moved = syscall(SYS_mremap, copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, base);
  if (moved != reinterpret_cast<long>(base)) _exit(127);
}

}  // namespace

DataRange find_data_range() {
  DataRange range;
  if (env::get_int("COREMESH_SYMMETRIC_DATA", 1) == 0) return range;
  dl_iterate_phdr(visit_main_program, &range);
  return range;
}

void move_into_shm(const DataRange& range, int fd) {
  const int threads = count_threads();
  CM_CHECK(threads == 1,
           "call shmem_init before starting threads (or set COREMESH_SYMMETRIC_DATA=0; then "
           "global variables are not symmetric)",
           "shmem init: {} threads run; making global variables symmetric needs the program to "
           "be single-threaded at init (another thread's writes to globals could be lost)",
           threads);
  void* staging = mmap(nullptr, range.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CM_CHECK(staging != MAP_FAILED, "check free memory in /dev/shm (df -h /dev/shm)",
           "cannot map the data segment copy ({} bytes): {}", range.bytes, std::strerror(errno));
  // From the copy to the switch nothing may write globals: this thread calls
  // only mmap (already resolved through the PLT by the call above) and memcpy
  // (with lazy binding, a first call's GOT write may be lost in the switch;
  // the entry then just resolves again).
  copy_nonzero_pages(static_cast<std::byte*>(staging), range.base, range.bytes);
  void* moved = mmap(range.base, range.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  const int err = errno;
  munmap(staging, range.bytes);
  CM_CHECK(moved == range.base, "set COREMESH_SYMMETRIC_DATA=0 to keep globals private",
           "cannot map the data segment copy over [{}, +{}): {}",
           static_cast<void*>(range.base), range.bytes, std::strerror(err));
  static const bool registered = pthread_atfork(nullptr, nullptr, privatise_in_child) == 0;
  (void)registered;
  g_moved = range;
}

}  // namespace coremesh::shmem::internal
