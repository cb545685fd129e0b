// The per-PE copy engine: a thread that performs non-blocking puts and gets
// in submission order, so that *_nbi calls return at once and quiet() waits
// for them. Started on first use; sleeps when idle.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "layout.hpp"

namespace coremesh::shmem::internal {

struct CopyOp {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  size_t bytes = 0;
  std::atomic<uint64_t>* signal = nullptr;  // updated after the copy, if set
  uint64_t signal_value = 0;
  bool signal_add = false;
  Bell* bell = nullptr;  // rung after the copy (the target PE's doorbell)
};

class CopyEngine {
 public:
  CopyEngine() = default;
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  void submit(const CopyOp& op);
  // Blocks until every submitted op has been performed.
  void drain();
  uint64_t submitted() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<CopyOp> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

// Performs one op on the calling thread.
void perform(const CopyOp& op);

}  // namespace coremesh::shmem::internal
