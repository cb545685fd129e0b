// Work sharing between the blocks of one GEMM launch (one block per core),
// so that they finish together: cores run at different speeds from call to
// call (and start at different times), which left one idle for ~5% of every
// GEMM when each block ran a fixed share.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace coremesh::ops::detail {

// One GEMM of a block's list: C (m, n) = op(A) op(B) + beta C, with n, the
// transposes, beta and the leading dimensions common to the launch.
struct GemmPiece {
  const float* a = nullptr;  // op(A)'s first row
  const float* b = nullptr;
  float* c = nullptr;  // C's first row
  int64_t m = 0, k = 0;
};

// The blocks' lists of pieces. Each block runs its own pieces front to back
// and opens the last K step of each as items (row block x 16 columns) that
// it takes from the front. A block that is done takes from the back of the
// others' lists: first whole pieces not yet started, then items of the piece
// being run. Nobody waits for anybody: a block that finds nothing leaves.
// Lock-free: one atomic word per block holds (current piece, end of its
// list, front item, back item). A later run of the same launch (a replayed
// graph) may reuse the RowShare: a run leaves every list drained, which
// reads as empty until its owner publishes again.
class RowShare {
 public:
  static constexpr int64_t kMaxPieces = (int64_t{1} << 12) - 1;
  static constexpr int64_t kMaxItems = (int64_t{1} << 20) - 1;

  explicit RowShare(int parts);
  int parts() const { return parts_; }
  // Pieces and items run by a block other than their owner, so far.
  int64_t stolen() const { return stolen_.load(std::memory_order_relaxed); }

  // Owner of part p, in this order: publish (1..kMaxPieces pieces; the
  // current piece is 0), then for each piece it gets: open (at most
  // kMaxItems), take_front until -1, advance (-1: the rest were taken).
  void publish(int p, std::vector<GemmPiece> pieces);
  void open(int p, int64_t items);
  int64_t take_front(int p);
  int64_t advance(int p);

  // Another block: a whole piece (item -1) or an item of the current piece;
  // piece -1 when p has nothing left to take.
  struct Take {
    int64_t piece = -1, item = -1;
  };
  Take take_back(int p);

  const GemmPiece& piece(int p, int64_t i) const { return slots_[p].pieces[static_cast<size_t>(i)]; }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> state{0};  // see pack(); 0: nothing published
    std::vector<GemmPiece> pieces;   // set before state, never changed after
  };
  int parts_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<int64_t> stolen_{0};
};

}  // namespace coremesh::ops::detail
