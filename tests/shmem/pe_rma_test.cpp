// RMA: put/get, p/g, strided, non-blocking + quiet, checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }
}  // namespace

TEST(Rma, RingPutAndGet) {
  constexpr size_t kCount = 1000;
  auto* buf = static_cast<int64_t*>(shmem::sym_malloc(kCount * sizeof(int64_t)));
  std::vector<int64_t> mine(kCount);
  std::iota(mine.begin(), mine.end(), int64_t{me()} * 1'000'000);
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  shmem::put(buf, mine.data(), kCount, right);
  shmem::barrier();
  for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(buf[i], int64_t{left} * 1'000'000 + int64_t(i));
  std::vector<int64_t> got(kCount);
  shmem::get(got.data(), buf, kCount, right);  // right holds what I put
  EXPECT_EQ(got, mine);
  shmem::barrier();
  shmem::sym_free(buf);
}

TEST(Rma, ScalarPAndG) {
  auto* cell = static_cast<int*>(shmem::sym_calloc(npes(), sizeof(int)));
  for (int pe = 0; pe < npes(); ++pe) shmem::p(&cell[me()], me() * 10 + pe, pe);
  shmem::barrier();
  for (int pe = 0; pe < npes(); ++pe) EXPECT_EQ(cell[pe], pe * 10 + me());
  for (int pe = 0; pe < npes(); ++pe) EXPECT_EQ(shmem::g(&cell[pe], pe), pe * 10 + pe);
  shmem::barrier();
  shmem::sym_free(cell);
}

TEST(Rma, NonBlockingPutsCompleteAtQuiet) {
  constexpr size_t kBytes = 4 << 20;  // large enough that the engine is still busy on return
  auto* dst = static_cast<unsigned char*>(shmem::sym_malloc(kBytes * npes()));
  auto* flags = static_cast<uint64_t*>(shmem::sym_calloc(npes(), sizeof(uint64_t)));
  std::vector<unsigned char> src(kBytes, static_cast<unsigned char>(me() + 1));
  for (int pe = 0; pe < npes(); ++pe) shmem::put_nbi(dst + me() * kBytes, src.data(), kBytes, pe);
  shmem::quiet();  // complete: now tell everybody
  for (int pe = 0; pe < npes(); ++pe) shmem::atomic_set<uint64_t>(&flags[me()], 1, pe);
  for (int pe = 0; pe < npes(); ++pe) shmem::wait_until<uint64_t>(&flags[pe], shmem::Cmp::eq, 1);
  for (int pe = 0; pe < npes(); ++pe) {
    size_t bad = 0;
    for (size_t i = 0; i < kBytes; ++i) bad += dst[pe * kBytes + i] != pe + 1;
    EXPECT_EQ(bad, 0u) << "from PE " << pe;
  }
  // get_nbi into local memory completes at quiet too.
  std::vector<unsigned char> back(kBytes, 0);
  const int right = (me() + 1) % npes();
  shmem::get_nbi(back.data(), dst + me() * kBytes, kBytes, right);
  shmem::quiet();
  EXPECT_EQ(back, src);
  shmem::barrier();
  shmem::sym_free(flags);
  shmem::sym_free(dst);
}

// A PE that has just made blocking calls and then computes, calling nothing,
// still serves its peers (on the ucx engine its progress thread, which
// stands aside while the PE's own calls progress UCX, must take over).
TEST(Rma, PeThatComputesAfterBlockingCallsStillServesPeers) {
  if (npes() == 1) GTEST_SKIP() << "needs two PEs";
  if (std::string(shmem::transport_name()) == "mpi")  // docs/shmem.md, "Choices and limits"
    GTEST_SKIP() << "the mpi engine applies a peer's RMA only while the target calls SHMEM";
  auto* cells = static_cast<int64_t*>(shmem::sym_calloc(3, sizeof(int64_t)));
  int64_t& value = cells[0];
  int64_t& computing = cells[1];  // PE 0 -> PE 1: "from now on I call nothing"
  int64_t& done = cells[2];       // PE 1 -> PE 0: "I reached you meanwhile"
  value = 100 + me();
  shmem::barrier();
  if (me() == 0) {
    for (int i = 0; i < 100; ++i) EXPECT_EQ(shmem::g(&value, 1), 101);  // blocking calls
    shmem::p(&computing, int64_t{1}, 1);
    shmem::quiet();
    // Compute: read `done` by plain loads, no SHMEM call, for at most 30 s.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int64_t seen = 0;
    while ((seen = std::atomic_ref<int64_t>(done).load(std::memory_order_acquire)) == 0 &&
           std::chrono::steady_clock::now() < give_up) {
    }
    EXPECT_EQ(seen, 1) << "PE 1 could not reach PE 0 while PE 0 computed";
    EXPECT_EQ(value, 7);
  } else if (me() == 1) {
    shmem::wait_until<int64_t>(&computing, shmem::Cmp::eq, 1);
    EXPECT_EQ(shmem::g(&value, 0), 100);  // served while PE 0 computes
    shmem::p(&value, int64_t{7}, 0);
    shmem::quiet();
    EXPECT_EQ(shmem::g(&value, 0), 7);
    shmem::p(&done, int64_t{1}, 0);
    shmem::quiet();
  }
  shmem::barrier();
  shmem::sym_free(cells);
}

TEST(Rma, OutOfRangePeAndNonSymmetricAddressAreErrors) {
  auto* buf = static_cast<int*>(shmem::sym_malloc(16 * sizeof(int)));
  int local[16] = {};
  EXPECT_THROW(shmem::put(buf, local, 16, npes()), coremesh::InvalidArgument);
  EXPECT_THROW(shmem::put(buf, local, 16, -1), coremesh::InvalidArgument);
  EXPECT_THROW(shmem::put(local, local, 16, 0), coremesh::InvalidArgument);
  try {
    shmem::get(local, local, 4, 0);
    ADD_FAILURE() << "expected an error";
  } catch (const coremesh::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is not symmetric on PE"), std::string::npos) << e.what();
  }
  // The end of the range counts too: 1 element past a 16-element block is in
  // the heap, but a transfer crossing the heap's end is not.
  shmem::barrier();
  shmem::sym_free(buf);
}

// The PEs this one should reach by load/store, from the environment alone:
// every PE on shm, itself on shm-rma, the PEs of its host under mpirun
// (one machine here; COREMESH_PES_PER_HOST=k makes hosts of k PEs).
std::vector<int> expected_shared() {
  const std::string transport = shmem::transport_name();
  const char* per_host = std::getenv("COREMESH_PES_PER_HOST");
  const int k = transport == "shm-rma" ? 1
                : transport == "shm" || per_host == nullptr ? npes()
                                                            : std::atoi(per_host);
  std::vector<int> pes;
  for (int pe = 0; pe < npes(); ++pe)
    if (pe / k == me() / k) pes.push_back(pe);
  return pes;
}

// The load/store fast path reaches exactly SHMEM_TEAM_SHARED, and stores
// through it arrive; shmem_ptr is NULL for every other PE.
TEST(Rma, PeerPointersReachTheSharedTeam) {
  auto* v = static_cast<int*>(shmem::sym_calloc(static_cast<size_t>(npes()), sizeof(int)));
  const std::vector<int> shared = expected_shared();
  EXPECT_EQ(shmem::Team::shared().world_pes(), shared);
  EXPECT_EQ(shmem::peer_ptr(v, me()), v);
  for (int pe = 0; pe < npes(); ++pe) {
    const bool near = std::find(shared.begin(), shared.end(), pe) != shared.end();
    EXPECT_EQ(shmem::peer_ptr(v, pe) != nullptr, near) << "PE " << pe;
  }
  shmem::barrier();
  for (int pe : shared) static_cast<int*>(shmem::peer_ptr(v, pe))[me()] = 100 + me();
  shmem::barrier();
  for (int pe = 0; pe < npes(); ++pe) {
    const bool near = std::find(shared.begin(), shared.end(), pe) != shared.end();
    EXPECT_EQ(v[pe], near ? 100 + pe : 0) << "PE " << pe;
  }
  shmem::barrier();
  shmem::sym_free(v);
}

// A zero-length transfer is a no-op whatever its addresses.
TEST(Rma, ZeroLengthWithNullAddressesIsANoOp) {
  shmem::put<int>(nullptr, nullptr, 0, 0);
  shmem::get<int>(nullptr, nullptr, 0, 0);
  shmem::put_nbi<int>(nullptr, nullptr, 0, 0);
  shmem::get_nbi<int>(nullptr, nullptr, 0, 0);
  shmem::quiet();
  shmem::barrier();
}

// Every kind of transfer at sizes on both sides of the network engine's
// switch from active messages to zero-copy RMA (64 KiB), and fence
// ordering between the two kinds to one address: each PE reaches its right
// neighbour, which checks what arrived.
TEST(Rma, SizesAroundTheMessageLimitAndFenceAcrossKinds) {
  const size_t sizes[] = {1, 8, 4095, 65535, 65536, 65537, 262147};
  constexpr size_t kMax = 262147;
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  auto* put_dst = static_cast<unsigned char*>(shmem::sym_malloc(kMax));
  auto* nbi_dst = static_cast<unsigned char*>(shmem::sym_malloc(kMax));
  auto* sig_dst = static_cast<unsigned char*>(shmem::sym_malloc(kMax));
  auto* signal = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  auto byte = [](int pe, size_t size, size_t i, int kind) {
    return static_cast<unsigned char>(pe * 31 + size * 7 + i * 13 + kind);
  };
  uint64_t rounds = 0;
  for (const size_t size : sizes) {
    SCOPED_TRACE(::testing::Message() << "size " << size);
    std::vector<unsigned char> src[3];
    for (int kind = 0; kind < 3; ++kind)
      for (size_t i = 0; i < size; ++i) src[kind].push_back(byte(me(), size, i, kind));
    shmem::put(put_dst, src[0].data(), size, right);
    shmem::put_nbi(nbi_dst, src[1].data(), size, right);
    shmem::put_signal(sig_dst, src[2].data(), size, signal, 1, shmem::SignalOp::add, right, size % 2 == 1);
    shmem::signal_wait_until(signal, shmem::Cmp::eq, ++rounds);  // the left PE's data is here
    size_t bad = 0;
    for (size_t i = 0; i < size; ++i) bad += sig_dst[i] != byte(left, size, i, 2);
    EXPECT_EQ(bad, 0u) << "put_signal";
    shmem::quiet();
    shmem::barrier();
    for (size_t i = 0; i < size; ++i) bad += put_dst[i] != byte(left, size, i, 0) || nbi_dst[i] != byte(left, size, i, 1);
    EXPECT_EQ(bad, 0u) << "put / put_nbi";
    // The right PE holds what this PE put: read it back both ways.
    std::vector<unsigned char> got(size), got_nbi(size);
    shmem::get(got.data(), put_dst, size, right);
    shmem::get_nbi(got_nbi.data(), nbi_dst, size, right);
    shmem::quiet();
    EXPECT_EQ(got, src[0]) << "get";
    EXPECT_EQ(got_nbi, src[1]) << "get_nbi";
    shmem::barrier();
  }
  // A large put, a fence, a small one over its start (and the reverse):
  // the later one wins where they overlap.
  std::vector<unsigned char> big(kMax, static_cast<unsigned char>(0xA0 + me()));
  const std::vector<unsigned char> small(8, static_cast<unsigned char>(0x50 + me()));
  shmem::put_nbi(put_dst, big.data(), kMax, right);
  shmem::fence();
  shmem::put_nbi(put_dst, small.data(), small.size(), right);
  shmem::put_nbi(nbi_dst, small.data(), small.size(), right);
  shmem::fence();
  shmem::put_nbi(nbi_dst, big.data(), kMax, right);
  shmem::quiet();
  shmem::barrier();
  EXPECT_EQ(put_dst[0], 0x50 + left);
  EXPECT_EQ(put_dst[7], 0x50 + left);
  EXPECT_EQ(put_dst[8], 0xA0 + left);
  EXPECT_EQ(nbi_dst[0], 0xA0 + left);
  shmem::barrier();
  shmem::sym_free(signal);
  shmem::sym_free(sig_dst);
  shmem::sym_free(nbi_dst);
  shmem::sym_free(put_dst);
}
