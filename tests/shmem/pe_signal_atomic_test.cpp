// Put with signal, waits, atomics under contention, locks.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }
}  // namespace

// Data is visible once the signal is: the receiver checks every element
// right after the wait, many rounds, blocking and nbi.
TEST(Signal, DataVisibleOnceSignalIs) {
  constexpr size_t kCount = 64 * 1024;
  constexpr int kRounds = 20;
  auto* data = static_cast<uint32_t*>(shmem::sym_malloc(kCount * sizeof(uint32_t)));
  auto* sig = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  auto* ack = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  std::vector<uint32_t> src(kCount);
  for (int round = 1; round <= kRounds; ++round) {
    for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<uint32_t>(round * 7919 + i + me());
    const bool nbi = round % 2 == 0;
    shmem::put_signal(data, src.data(), kCount, sig, round, shmem::SignalOp::set, right, nbi);
    const uint64_t seen = shmem::signal_wait_until(sig, shmem::Cmp::ge, uint64_t(round));
    EXPECT_EQ(seen, uint64_t(round));
    size_t bad = 0;
    for (size_t i = 0; i < kCount; ++i) bad += data[i] != static_cast<uint32_t>(round * 7919 + i + left);
    EXPECT_EQ(bad, 0u) << "round " << round;
    if (nbi) shmem::quiet();  // src is reused next round
    // The left PE may overwrite `data` only after we checked it.
    shmem::atomic_set<uint64_t>(ack, round, left);
    shmem::signal_wait_until(ack, shmem::Cmp::eq, uint64_t(round));
  }
  shmem::barrier();
  shmem::sym_free(ack);
  shmem::sym_free(sig);
  shmem::sym_free(data);
}

TEST(Signal, AddFromEveryPe) {
  auto* sig = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  auto* slots = static_cast<int*>(shmem::sym_calloc(npes(), sizeof(int)));
  const int value = 1000 + me();
  for (int pe = 0; pe < npes(); ++pe)
    shmem::put_signal(&slots[me()], &value, 1, sig, 1, shmem::SignalOp::add, pe);
  EXPECT_EQ(shmem::signal_wait_until(sig, shmem::Cmp::eq, uint64_t(npes())), uint64_t(npes()));
  for (int pe = 0; pe < npes(); ++pe) EXPECT_EQ(slots[pe], 1000 + pe);
  EXPECT_EQ(shmem::signal_fetch(sig), uint64_t(npes()));
  shmem::barrier();
  shmem::sym_free(slots);
  shmem::sym_free(sig);
}

TEST(Signal, WaitTimesOutWithDiagnostic) {
  auto* sig = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  const auto start = std::chrono::steady_clock::now();
  try {
    shmem::signal_wait_until(sig, shmem::Cmp::eq, uint64_t(42), 0.2);
    ADD_FAILURE() << "expected a timeout";
  } catch (const coremesh::TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("PE " + std::to_string(me()) + " waits in signal_wait_until"), std::string::npos) << what;
    EXPECT_NE(what.find("current value 0"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  shmem::barrier();
  shmem::sym_free(sig);
}

// Every PE increments one counter on PE 0; no update may be lost and
// fetch_add hands out every ticket exactly once.
TEST(Atomic, ContendedCounter) {
  // Fewer rounds over the network path, where each AMO is a round trip.
  const int kIters = std::string(shmem::transport_name()).rfind("shm", 0) != 0 ? 300 : 2000;
  auto* counter = static_cast<int64_t*>(shmem::sym_calloc(2, sizeof(int64_t)));
  std::vector<int64_t> tickets;
  for (int i = 0; i < kIters; ++i) {
    shmem::atomic_inc<int64_t>(&counter[0], 0);
    tickets.push_back(shmem::atomic_fetch_add<int64_t>(&counter[1], 1, 0));
  }
  shmem::barrier();
  EXPECT_EQ(shmem::atomic_fetch(&counter[0], 0), int64_t{kIters} * npes());
  auto* all = static_cast<int64_t*>(shmem::sym_malloc(sizeof(int64_t) * kIters * npes()));
  auto* mine = static_cast<int64_t*>(shmem::sym_malloc(sizeof(int64_t) * kIters));
  std::copy(tickets.begin(), tickets.end(), mine);
  shmem::allgather(shmem::Team::world(), all, mine, kIters);
  std::set<int64_t> unique(all, all + kIters * npes());
  EXPECT_EQ(unique.size(), size_t(kIters) * npes());
  EXPECT_EQ(*unique.rbegin(), int64_t{kIters} * npes() - 1);
  shmem::barrier();
  shmem::sym_free(mine);
  shmem::sym_free(all);
  shmem::sym_free(counter);
}

TEST(Atomic, SwapCompareSwapBitwiseAndFloat) {
  auto* u = static_cast<uint64_t*>(shmem::sym_calloc(4, sizeof(uint64_t)));
  auto* f = static_cast<double*>(shmem::sym_calloc(1, sizeof(double)));
  // Each PE sets its own bit on PE 0 with fetch_or; the xor of all bits too.
  shmem::atomic_fetch_or<uint64_t>(&u[0], uint64_t{1} << me(), 0);
  shmem::atomic_fetch_xor<uint64_t>(&u[1], uint64_t{1} << me(), 0);
  // Exactly one PE wins the compare-and-swap from 0.
  const uint64_t before = shmem::atomic_compare_swap<uint64_t>(&u[2], 0, me() + 1, 0);
  shmem::barrier();
  const uint64_t all_bits = npes() == 64 ? ~uint64_t{0} : (uint64_t{1} << npes()) - 1;
  EXPECT_EQ(shmem::atomic_fetch(&u[0], 0), all_bits);
  EXPECT_EQ(shmem::atomic_fetch(&u[1], 0), all_bits);
  const uint64_t winner = shmem::atomic_fetch(&u[2], 0);
  EXPECT_TRUE(winner >= 1 && winner <= uint64_t(npes()));
  EXPECT_EQ(before == 0, winner == uint64_t(me() + 1));
  shmem::barrier();
  shmem::atomic_fetch_and<uint64_t>(&u[0], ~(uint64_t{1} << me()), 0);
  shmem::atomic_set<double>(f, 0.5 * me(), (me() + 1) % npes());
  shmem::barrier();
  EXPECT_EQ(shmem::atomic_fetch(&u[0], 0), 0u);
  EXPECT_EQ(*f, 0.5 * ((me() + npes() - 1) % npes()));
  EXPECT_EQ(shmem::atomic_swap<double>(f, 9.0, me()), 0.5 * ((me() + npes() - 1) % npes()));
  shmem::barrier();
  shmem::sym_free(f);
  shmem::sym_free(u);
}

TEST(Wait, WaitUntilWakesOnRemoteAtomic) {
  auto* flag = static_cast<int32_t*>(shmem::sym_calloc(1, sizeof(int32_t)));
  // A token goes around the ring twice; each hop wakes a sleeping PE.
  for (int hop = 0; hop < 2 * npes(); ++hop) {
    if (hop % npes() == me()) {
      if (hop > 0) shmem::wait_until<int32_t>(flag, shmem::Cmp::ge, hop);
      shmem::atomic_set<int32_t>(flag, hop + 1, (me() + 1) % npes());
    }
  }
  shmem::barrier();
  EXPECT_TRUE(shmem::test<int32_t>(flag, shmem::Cmp::gt, 0));
  shmem::barrier();
  shmem::sym_free(flag);
}
