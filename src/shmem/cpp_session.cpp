// coremesh::shmem: session, teams and RMA of the C++ face.
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/team.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem {

Session::Session(const InitOptions& options) {
  owner_ = !internal::is_initialized();
  internal::init(options.heap_bytes);
}
Session::~Session() {
  if (!owner_) return;
  try {
    internal::finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coremesh::shmem: finalize failed: %s\n", e.what());
  }
}

bool initialized() { return internal::is_initialized(); }
void keep_heap_until_exit() {
  if (internal::is_initialized()) internal::state("keep_heap_until_exit").exiting = true;
}
int my_pe() { return internal::state("my_pe").my_pe; }
int n_pes() { return internal::state("n_pes").n_pes; }
const char* transport_name() { return internal::state("transport_name").transport->name(); }
void global_exit(int status) { internal::global_exit(status); }
void fence() { internal::fence(); }
void quiet() { internal::quiet(); }

void* peer_ptr(const void* sym, int pe) {
  internal::check_pe(pe, "peer_ptr");
  const size_t offset = internal::sym_offset(sym, 0, "peer_ptr");
  if (pe == internal::state().my_pe) return const_cast<void*>(sym);
  return internal::transport().peer_pointer(pe, offset);
}

namespace detail {
void put_bytes(void* dest, const void* src, size_t bytes, int pe, bool nbi) {
  if (nbi) internal::put_nbi(dest, src, bytes, pe, "put_nbi");
  else internal::put(dest, src, bytes, pe, "put");
}
void get_bytes(void* dest, const void* src, size_t bytes, int pe, bool nbi) {
  if (nbi) internal::get_nbi(dest, src, bytes, pe, "get_nbi");
  else internal::get(dest, src, bytes, pe, "get");
}
void put_signal_bytes(void* dest, const void* src, size_t bytes, uint64_t* signal,
                      uint64_t value, SignalOp op, int pe, bool nbi) {
  internal::put_signal(dest, src, bytes, signal, value, static_cast<int>(op), pe, nbi,
                       nbi ? "put_signal_nbi" : "put_signal");
}
uint64_t amo_bits(const void* sym, int width, int pe, Amo op, uint64_t operand, uint64_t compare,
                  const char* api) {
  return internal::atomic(const_cast<void*>(sym), pe, static_cast<internal::AmoOp>(op), width,
                          operand, compare, api);
}
int self() { return internal::state().my_pe; }

void wait_for(const void* sym, const char* api, const std::function<bool()>& ready,
              const std::function<std::string()>& current, double timeout_s) {
  internal::State& s = internal::state(api);
  // Local threads may write non-symmetric variables without ringing: the
  // sleep slices (100 ms) still see such writes.
  const auto* p = reinterpret_cast<const std::byte*>(sym);
  std::string where = "not symmetric";
  if (p >= s.base && p < s.base + s.segment_bytes)
    where = fmt::format("heap offset {}", p - s.base);
  else if (p >= s.data_base && p < s.data_base + s.data_bytes)
    where = fmt::format("global data offset {}", p - s.data_base);
  internal::wait_until_ready(internal::my_doorbell(), ready, [&] {
    return fmt::format("PE {} waits in {} on {} ({}), current value {}", s.my_pe, api, sym, where,
                       current());
  }, timeout_s);
}
}  // namespace detail

uint64_t signal_fetch(const uint64_t* signal) {
  internal::sym_offset(signal, sizeof(uint64_t), "signal_fetch");
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(signal)).load(std::memory_order_acquire);
}

uint64_t signal_wait_until(uint64_t* signal, Cmp cmp, uint64_t value, double timeout_s) {
  internal::sym_offset(signal, sizeof(uint64_t), "signal_wait_until");
  std::atomic_ref<uint64_t> ref(*signal);
  uint64_t seen = 0;
  detail::wait_for(
      signal, "signal_wait_until",
      [&] {
        seen = ref.load(std::memory_order_acquire);
        return detail::compare(seen, cmp, value);
      },
      [&] { return fmt::format("{} (waiting for cmp {} {})", ref.load(), static_cast<int>(cmp), value); },
      timeout_s);
  return seen;
}

// Teams. The world and shared teams live in the State; handles to them do
// not own them. Split teams are destroyed with their last handle.
namespace {
std::shared_ptr<internal::TeamData> borrowed(internal::TeamData* data) {
  return std::shared_ptr<internal::TeamData>(data, [](internal::TeamData*) {});
}
std::shared_ptr<internal::TeamData> owned(internal::TeamData* data) {
  if (data == nullptr) return nullptr;
  return std::shared_ptr<internal::TeamData>(data, [](internal::TeamData* t) {
    try {
      internal::team_destroy(t);
    } catch (...) {  // destroying after finalize: nothing left to free
    }
  });
}
}  // namespace

Team Team::world() { return Team(borrowed(&internal::state("Team::world").world)); }
Team Team::shared() { return Team(borrowed(&internal::state("Team::shared").shared)); }

internal::TeamData& Team::checked(const char* api) const {
  CM_CHECK(data_ != nullptr, "use a valid team (split returns an invalid Team on non-members)",
           "{} on an invalid team", api);
  return *data_;
}
int Team::my_pe() const { return checked("Team::my_pe").my_index; }
int Team::n_pes() const { return checked("Team::n_pes").size(); }
int Team::translate(int pe, const Team& other) const {
  return internal::team_translate(checked("Team::translate"), pe, other.checked("Team::translate"));
}
Team Team::split_strided(int start, int stride, int size) const {
  return Team(owned(internal::team_split_strided(checked("Team::split_strided"), start, stride,
                                                 size, 0)));
}
std::pair<Team, Team> Team::split_2d(int xrange) const {
  internal::TeamData *x = nullptr, *y = nullptr;
  internal::team_split_2d(checked("Team::split_2d"), xrange, 0, 0, &x, &y);
  return {Team(owned(x)), Team(owned(y))};
}
int Team::world_pe(int pe) const {
  const internal::TeamData& t = checked("Team::world_pe");
  return pe >= 0 && pe < t.size() ? t.world_pe(pe) : -1;
}
std::vector<int> Team::world_pes() const { return checked("Team::world_pes").pes; }
Team Team::from_pes(const Team& parent, const std::vector<int>& world_pes) {
  return Team(owned(internal::team_from_pes(parent.checked("Team::from_pes"), world_pes)));
}
Team Team::split(int color, int key) const {
  return Team(owned(internal::team_split_color(checked("Team::split"), color, key)));
}

}  // namespace coremesh::shmem
