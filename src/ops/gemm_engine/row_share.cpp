#include "row_share.hpp"

namespace coremesh::ops::detail {
namespace {

// state = current piece (12 bits) | end of the list (12) | front item (20) | back item (20)
struct State {
  uint64_t cur, end, front, back;
};

constexpr uint64_t kItemMask = (uint64_t{1} << 20) - 1, kPieceMask = (uint64_t{1} << 12) - 1;

uint64_t pack(const State& s) { return s.cur << 52 | s.end << 40 | s.front << 20 | s.back; }
State unpack(uint64_t v) { return {v >> 52, v >> 40 & kPieceMask, v >> 20 & kItemMask, v & kItemMask}; }

// Applies `change` (State& -> bool: false leaves the state alone) atomically,
// calling it again on a fresh state whenever another block got in first;
// returns whether it applied.
template <typename Change>
bool update(std::atomic<uint64_t>& word, Change change) {
  uint64_t old = word.load(std::memory_order_acquire);
  for (;;) {
    State s = unpack(old);
    if (!change(s)) return false;
    if (word.compare_exchange_weak(old, pack(s), std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  }
}

}  // namespace

RowShare::RowShare(int parts) : parts_(parts), slots_(std::make_unique<Slot[]>(static_cast<size_t>(parts))) {}

void RowShare::publish(int p, std::vector<GemmPiece> pieces) {
  const auto n = static_cast<uint64_t>(pieces.size());
  slots_[p].pieces = std::move(pieces);
  slots_[p].state.store(pack({0, n, 0, 0}), std::memory_order_release);
}

void RowShare::open(int p, int64_t items) {
  update(slots_[p].state, [&](State& s) {
    s.front = 0, s.back = static_cast<uint64_t>(items);
    return true;
  });
}

int64_t RowShare::take_front(int p) {
  int64_t item = -1;
  const bool took = update(slots_[p].state, [&](State& s) {
    if (s.front >= s.back) return false;
    item = static_cast<int64_t>(s.front++);
    return true;
  });
  return took ? item : -1;
}

int64_t RowShare::advance(int p) {
  int64_t next = -1;
  const bool moved = update(slots_[p].state, [&](State& s) {
    if (s.cur + 1 >= s.end) return false;
    next = static_cast<int64_t>(++s.cur);
    s.front = s.back = 0;
    return true;
  });
  return moved ? next : -1;
}

RowShare::Take RowShare::take_back(int p) {
  Take t;
  const bool took = update(slots_[p].state, [&](State& s) {
    if (s.end > s.cur + 1) {  // a whole piece nobody started
      t = {static_cast<int64_t>(--s.end), -1};
      return true;
    }
    if (s.front < s.back) {
      t = {static_cast<int64_t>(s.cur), static_cast<int64_t>(--s.back)};
      return true;
    }
    return false;
  });
  if (took) stolen_.fetch_add(1, std::memory_order_relaxed);
  return took ? t : Take{};
}

}  // namespace coremesh::ops::detail
