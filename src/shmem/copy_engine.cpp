#include "copy_engine.hpp"

#include <cstring>

#include "wait.hpp"

namespace coremesh::shmem::internal {

void perform(const CopyOp& op) {
  if (op.bytes > 0) std::memcpy(op.dst, op.src, op.bytes);
  if (op.signal != nullptr) {
    // Release: the data above is visible to whoever reads the signal.
    if (op.signal_add) op.signal->fetch_add(op.signal_value, std::memory_order_release);
    else op.signal->store(op.signal_value, std::memory_order_release);
  }
  if (op.bell != nullptr) ring(*op.bell);
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CopyEngine::submit(const CopyOp& op) {
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(op);
    ++submitted_;
  }
  work_cv_.notify_one();
}

void CopyEngine::drain() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return completed_ == submitted_; });
}

uint64_t CopyEngine::submitted() const {
  std::lock_guard lock(mutex_);
  return submitted_;
}

void CopyEngine::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and nothing left
    CopyOp op = queue_.front();
    queue_.pop_front();
    lock.unlock();
    perform(op);
    lock.lock();
    if (++completed_ == submitted_) done_cv_.notify_all();
  }
}

}  // namespace coremesh::shmem::internal
