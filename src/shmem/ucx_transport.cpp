// The UCX engine: the network path between hosts on UCX's own API (ucp), as
// OpenMPI's OSHMEM (spml ucx) does; host_transport.cpp creates it once MPI
// is up and this PE's memory exists.
//
// Keys: ucp_mem_map registers the heap segment and the program's writable
// data; worker addresses, base addresses and packed rkeys go to every PE
// over MPI (allgather), and every PE connects an endpoint to every other.
//
// Data path:
//   put, put_nbi       up to kAmPutMax bytes: one active message that the
//                      target applies and acknowledges (below); larger:
//                      ucp_put_nbx, blocking ones returning at local completion
//   get, get_nbi       ucp_get_nbx (blocking: returns when the data is here)
//   atomic             ucp_atomic_op_nbx with a reply, returns with it
//   put_signal         up to kAmPutMax bytes: the put's message carries the
//                      signal, which the target updates after the data;
//                      larger: put, then the atomic on the signal
//   fence / quiet      ucp_worker_fence / ucp_worker_flush_nbx, and every
//                      message put acknowledged
// A put completes only locally, so a later get or atomic to the same PE
// first orders it (fence, or waits for the PE's acknowledgements): the
// table's contract (an atomic is ordered after this PE's earlier blocking
// operations) and a get seeing an earlier put hold.
//
// Message puts. Over TCP, UCX emulates a put with an active message and a
// flush with another round trip, so put + quiet took two round trips (as
// in OSHMEM). A message put is one message the target's handler copies into
// its memory, and the target acknowledges what it applied once per progress
// call and origin (acknowledgements of a burst coalesce): put + quiet is one
// round trip, and put_signal's signal needs none of its own.
//
// Progress. Without RMA hardware (TCP) the target applies puts, answers gets
// and performs atomics inside its own ucp_worker_progress. MPI passive-target
// RMA does that only while the target calls MPI; here a progress thread
// sleeps on the worker's event fd and progresses as soon as data arrives, so
// a PE that computes, or sleeps in a wait, still serves its peers. After
// progress it rings this PE's bells, so waits sleep on futexes as on shm.
// Atomics run on the target's CPU (UCX_ATOMIC_MODE=cpu), so they are atomic
// with respect to the PEs of its host, which use CPU atomics on the word.
//
// Who progresses. A caller waiting for its operation progresses the worker
// itself, spinning as OSHMEM's callers do while the network moves (until
// kNetSpinNs pass without an event: a TCP round trip takes tens of us); the
// progress thread stays parked meanwhile. A PE's
// threads share its core (mpirun binds a rank to one), so a progress thread
// woken by every reply would preempt the caller it serves and then queue on
// its mutex. The thread serves again once no caller has progressed for
// a linger (kLingerMinNs, doubling up to kLingerMaxNs while callers keep
// coming: every look costs the caller its core for a moment), or at once
// when a caller hands over (it stops spinning and sleeps until its callback
// rings) or a wait of this PE goes to sleep (the sleep hook, wait.hpp).
// A wait of this PE (a barrier, a signal) progresses the worker itself
// while it spins (the spin hook), as a caller does: a peer's atomic or
// signal lands, and its requests are served, without a thread hand-over.
// After an event it keeps polling for kNetSpinNs before it sleeps on the
// event fd, so a peer's next request in an exchange finds it awake. Neither
// spins when the wait policy does not (more PEs than CPUs).
//
// Threads: every ucp call is made under one mutex (the worker is
// UCS_THREAD_MODE_SERIALIZED); the progress thread waits without it.
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "mpi_boot.hpp"
#include "ucx_messages.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {

using namespace ucx;  // the engine's messages and operations in flight

// How long a caller spins progressing before it hands over and sleeps, and
// the progress thread polls after an event before it sleeps (a TCP round
// trip, loopback included, takes tens of us); at least the wait policy's
// spin, none when that is 0.
constexpr int64_t kNetSpinNs = 200'000;
// How long no caller must have progressed before the progress thread serves
// again, unless one hands over: the first look, and the longest interval
// between looks while callers keep coming.
constexpr int64_t kLingerMinNs = 100'000;
constexpr int64_t kLingerMaxNs = 1'600'000;
// The largest put or get sent as active messages (eager, copied on both
// sides); larger ones go zero-copy through ucp_put_nbx / ucp_get_nbx.
constexpr size_t kAmPutMax = 64 << 10;
constexpr size_t kAmGetMax = 64 << 10;
static_assert(kLandingChunkBytes <= kAmPutMax, "an allreduce's part must be one message (push)");

int64_t net_spin_ns() {
  const int64_t spin = wait_policy().spin_ns;
  return spin == 0 ? 0 : std::max(spin, kNetSpinNs);
}

// `pe`: the peer the operation went to (-1: none), so that a peer that died
// is named by the PEs that notice it first.
void check_ucs(ucs_status_t status, const char* what, int pe = -1) {
  if (status == UCS_OK) return;
  CM_THROW(Error, "check the UCX settings (UCX_TLS, UCX_NET_DEVICES) and the peers' output",
           "UCX transport: {}{} failed: {}", what, pe >= 0 ? fmt::format(" to PE {}", pe) : "",
           ucs_status_string(status));
}

// A registered region of every PE: its base address there and its rkey.
struct Region {
  ucp_mem_h memh = nullptr;
  std::vector<uint64_t> bases;   // [pe]
  std::vector<ucp_rkey_h> keys;  // [pe]; null for this PE
};

class UcxTransport;
// The engine of this process, for the sleep hook (one per process).
std::atomic<UcxTransport*> g_ucx{nullptr};

class UcxTransport final : public Transport {
  // A thread inside a blocking operation: it holds the mutex and, until it
  // hands over, progresses the worker itself while the progress thread stays
  // parked.
  class Caller {
   public:
    explicit Caller(UcxTransport& t) : t_(t) {
      t_.callers_.fetch_add(1, std::memory_order_seq_cst);
      t_.turn_.seq.fetch_add(1, std::memory_order_seq_cst);  // "a caller was here"
      lock_ = std::unique_lock(t_.mutex_);
    }
    ~Caller() {
      if (progressing_) t_.callers_.fetch_sub(1, std::memory_order_seq_cst);
    }
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;
    std::unique_lock<std::mutex>& lock() { return lock_; }
    // Stops progressing (the caller is about to sleep): the progress thread
    // takes over at once.
    void hand_over() {
      if (!progressing_) return;
      progressing_ = false;
      t_.callers_.fetch_sub(1, std::memory_order_seq_cst);
      t_.wake_progress_thread();
    }

   private:
    UcxTransport& t_;
    std::unique_lock<std::mutex> lock_;
    bool progressing_ = true;
  };

 public:
  explicit UcxTransport(const LocalMemory& memory);
  ~UcxTransport() override { close(); }

  const char* name() const override { return "ucx"; }
  int my_pe() const override { return mem_.my_pe; }
  int n_pes() const override { return mem_.n_pes; }
  std::byte* local_base() const override { return mem_.base; }
  size_t segment_bytes() const override { return mem_.segment_bytes; }
  std::byte* local_data_base() const override { return mem_.data.base; }
  size_t data_bytes() const override { return mem_.data.bytes; }
  std::byte* peer_pointer(int, size_t) const override { return nullptr; }

  void put(int pe, size_t offset, const void* src, size_t bytes) override {
    if (bytes <= kAmPutMax) return message_put(pe, offset, src, bytes, AmPut{.ack = AmPut::kAckNow});
    Caller caller(*this);
    auto c = completion();
    const auto param = waited(*c);
    wait(ucp_put_nbx(eps_[pe], src, bytes, remote(pe, offset), key(pe, offset), &param), c,
         caller, "ucp_put_nbx", pe);
    unordered_ = true;
  }
  void get(void* dst, int pe, size_t offset, size_t bytes) override {
    Caller caller(*this);
    order_puts(caller, pe);
    if (bytes <= kAmGetMax) {
      std::unique_ptr<MessageGet> got(new MessageGet{dst, bytes});
      send_message(pe, kAmGet, AmGet{offset, bytes, reinterpret_cast<uint64_t>(got.get()), me()}, nullptr, 0);
      if (!wait_until(caller, [&] { return got->done.load(std::memory_order_acquire); }, &got->done)) {
        got->owner = MessageGet::Owner::abandoned;  // mutex_ held: the handler sees it, and frees it
        (void)got.release();
        timed_out(caller, "a get", pe);
      }
      return;
    }
    // A zero-copy get that times out still owns dst: UCX may write it
    // when the peer answers (docs/shmem.md, "Transports and many machines").
    auto c = completion();
    const auto param = waited(*c);
    wait(ucp_get_nbx(eps_[pe], dst, bytes, remote(pe, offset), key(pe, offset), &param), c,
         caller, "ucp_get_nbx", pe);
  }
  void put_nbi(int pe, size_t offset, const void* src, size_t bytes) override {
    if (bytes <= kAmPutMax) return message_put(pe, offset, src, bytes, AmPut{.ack = AmPut::kAckLater});
    std::lock_guard lock(mutex_);
    release(ucp_put_nbx(eps_[pe], src, bytes, remote(pe, offset), key(pe, offset), &nbi_),
            "ucp_put_nbx", pe);
    unordered_ = true;
  }
  void get_nbi(void* dst, int pe, size_t offset, size_t bytes) override {
    Caller caller(*this);
    order_puts(caller, pe);
    if (bytes <= kAmGetMax) {
      std::unique_ptr<MessageGet> got(new MessageGet{dst, bytes, MessageGet::Owner::handler});
      send_message(pe, kAmGet, AmGet{offset, bytes, reinterpret_cast<uint64_t>(got.get()), me()}, nullptr, 0);
      // mutex_ held: the reply's handler, which frees it, runs after the count
      gets_outstanding_.fetch_add(1, std::memory_order_relaxed);
      (void)got.release();
      return;
    }
    release(ucp_get_nbx(eps_[pe], dst, bytes, remote(pe, offset), key(pe, offset), &nbi_),
            "ucp_get_nbx", pe);
  }
  void put_signal(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
                  uint64_t value, SignalOp op, bool nbi) override {
    if (bytes <= kAmPutMax) {
      const AmPut signal{.signal_offset = signal_offset, .signal_value = value,
                         .signal = static_cast<uint16_t>(op == SignalOp::add ? 2 : 1),
                         .ack = nbi ? AmPut::kAckLater : AmPut::kAckNow};
      return message_put(pe, offset, src, bytes, signal);
    }
    if (bytes != 0) {
      if (nbi) put_nbi(pe, offset, src, bytes);
      else put(pe, offset, src, bytes);
    }
    atomic(pe, signal_offset, op == SignalOp::add ? AmoOp::add : AmoOp::set, 8, value, 0);
  }
  // Unacknowledged: nothing waits for it but the receiver, on the signal.
  void push(int pe, size_t offset, const void* src, size_t bytes, size_t signal_offset,
            uint64_t value) override {
    if (bytes > kAmPutMax) return Transport::push(pe, offset, src, bytes, signal_offset, value);
    message_put(pe, offset, src, bytes,
                AmPut{.signal_offset = signal_offset, .signal_value = value, .signal = 1, .ack = AmPut::kAckNever});
  }
  uint64_t atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                  uint64_t compare) override;
  void quiet() override {
    Caller caller(*this);
    flush(caller);
  }
  // A message put may overtake a ucp put: both are completed, which the
  // puts in flight over TCP cost anyway.
  void fence() override {
    Caller caller(*this);
    flush(caller);
  }
  // Data waiters are rung by whoever progresses after any event (a put or
  // an atomic UCX applied may have changed what they wait on). A barrier's
  // arrival is told by a message, so that a PE asleep in a barrier is not
  // woken by every other message.
  void notify(int pe, Wake who) override {
    if (who != Wake::sync) return;
    std::lock_guard lock(mutex_);
    send_message(pe, kAmWakeSync, AmWakeSync{me()}, nullptr, 0);
  }
  JobControl* job() const override { return nullptr; }  // mpirun watches the job
  void close() override;

 private:
  uint64_t remote(int pe, size_t offset) const {
    return offset < mem_.segment_bytes ? heap_.bases[pe] + offset
                                       : data_.bases[pe] + (offset - mem_.segment_bytes);
  }
  ucp_rkey_h key(int pe, size_t offset) const {
    return offset < mem_.segment_bytes ? heap_.keys[pe] : data_.keys[pe];
  }
  std::unique_ptr<Completion> completion() {
    auto c = std::make_unique<Completion>();
    c->bell = &done_;
    return c;
  }
  ucp_request_param_t waited(Completion& c) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = on_complete;
    p.user_data = &c;
    return p;
  }
  uint32_t me() const { return static_cast<uint32_t>(mem_.my_pe); }
  std::byte* local(uint64_t offset) const {
    return offset < mem_.segment_bytes ? mem_.base + offset : mem_.data.base + (offset - mem_.segment_bytes);
  }
  // Puts to `pe` before a get or an atomic to it: ucp ones fenced, message
  // ones acknowledged.
  void order_puts(Caller& caller, int pe) {
    if (unordered_) {
      check_ucs(ucp_worker_fence(worker_), "ucp_worker_fence");
      unordered_ = false;
    }
    wait_acknowledged(caller, pe);
  }
  void wait_acknowledged(Caller& caller, int pe) {
    const uint64_t sent = sent_[pe].load(std::memory_order_relaxed);
    if (acked_[pe].load(std::memory_order_acquire) >= sent) return;
    if (!wait_until(caller, [&] { return acked_[pe].load(std::memory_order_acquire) >= sent; }))
      timed_out(caller, "the acknowledgement of a put");
  }
  void flush(Caller& caller);
  void message_put(int pe, uint64_t offset, const void* src, size_t bytes, AmPut header);
  template <typename Header>
  void send_message(int pe, AmId id, const Header& header, const void* data, size_t bytes);
  void acknowledge(int origin);
  void acknowledge_all();
  static ucs_status_t on_am_put(void* arg, const void* header, size_t header_bytes, void* data, size_t bytes,
                                const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_ack(void* arg, const void* header, size_t header_bytes, void* data, size_t bytes,
                                const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_get(void* arg, const void* header, size_t header_bytes, void* data, size_t bytes,
                                const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_get_reply(void* arg, const void* header, size_t header_bytes, void* data,
                                      size_t bytes, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_wake_sync(void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
    ring(static_cast<UcxTransport*>(arg)->header().sync_bell);
    return UCS_OK;
  }
  HeapHeader& header() const { return *reinterpret_cast<HeapHeader*>(mem_.base); }
  // An nbi request: UCX frees it when it completes; quiet waits for it.
  static void release(ucs_status_ptr_t request, const char* what, int pe) {
    if (UCS_PTR_IS_ERR(request)) check_ucs(UCS_PTR_STATUS(request), what, pe);
    if (request != nullptr) ucp_request_free(request);
  }
  void wait(ucs_status_ptr_t request, std::unique_ptr<Completion>& c, Caller& caller, const char* what,
            int pe = -1);
  template <typename Done>
  bool wait_until(Caller& caller, Done done, const std::atomic<bool>* stop = nullptr);
  [[noreturn]] void timed_out(Caller& caller, const char* what, int pe = -1);
  unsigned progress_locked(const std::atomic<bool>* stop = nullptr);
  void park_while_callers_progress();
  void wake_progress_thread() {
    handed_over_.store(true, std::memory_order_seq_cst);
    ring(turn_);
  }
  static void on_wait_sleeps();
  static void on_wait_spins();
  void progress_loop();
  Region register_region(std::byte* base, size_t bytes, const std::vector<ucp_ep_h>& eps);
  void destroy_region(Region& region);

  LocalMemory mem_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;  // [pe]; null for this PE
  Region heap_, data_;
  ucp_request_param_t nbi_{};
  bool unordered_ = false;  // ucp puts issued since the last fence or flush
  // Message puts: sent to and acknowledged by each PE; applied here for each
  // origin and not acknowledged yet, and those origins.
  std::unique_ptr<std::atomic<uint64_t>[]> sent_, acked_;
  std::vector<uint64_t> applied_;
  std::vector<int> ack_due_;
  std::atomic<int64_t> gets_outstanding_{0};    // this PE's message get_nbi
  std::atomic<int> nbi_status_{UCS_OK};         // the first failed message send's
  std::atomic<int> nbi_pe_{-1};                 // ... and its peer
  std::mutex mutex_;        // every ucp call
  Bell done_;               // rung by operation callbacks
  // The hand-over between callers and the progress thread (Caller).
  std::atomic<int> callers_{0};          // callers progressing the worker now
  std::atomic<bool> handed_over_{false};  // a caller stopped progressing to sleep
  Bell turn_;                             // seq: bumped by callers; the progress thread parks on it
  uint32_t served_seq_ = 0;               // turn_.seq when the progress thread last served
  int event_fd_ = -1;       // the worker's
  int stop_fd_ = -1;        // eventfd that stops the progress thread
  std::thread progress_;
};

UcxTransport::UcxTransport(const LocalMemory& memory) : mem_(memory) {
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  // Atomics on the target's CPU: coherent with its host's load/store path.
  ucp_config_modify(config, "ATOMIC_MODE", "cpu");
  // UCX's TCP transport sends 8 KiB segments by default, each a system call
  // and an active message the target handles: 64 KiB ones (its receive
  // segment size) move 2-4x more from 64 KiB on, and 256 KiB ones (sent and
  // received) another 1.2-1.3x in a 1 MiB network allreduce, where both
  // PEs send and receive at once. A user's setting wins; a UCX without the
  // key keeps its default.
  if (!env::get("UCX_TCP_TX_SEG_SIZE")) (void)ucp_config_modify(config, "TX_SEG_SIZE", "256k");
  if (!env::get("UCX_TCP_RX_SEG_SIZE")) (void)ucp_config_modify(config, "RX_SEG_SIZE", "256k");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  const ucs_status_t status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check_ucs(status, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  check_ucs(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
  check_ucs(ucp_worker_get_efd(worker_, &event_fd_), "ucp_worker_get_efd");
  const auto n = static_cast<size_t>(mem_.n_pes);
  sent_ = std::make_unique<std::atomic<uint64_t>[]>(n);
  acked_ = std::make_unique<std::atomic<uint64_t>[]>(n);
  applied_.assign(n, 0);
  for (const auto& [id, handler] : {std::pair{kAmPut, &on_am_put}, std::pair{kAmAck, &on_am_ack},
                                    std::pair{kAmGet, &on_am_get}, std::pair{kAmGetReply, &on_am_get_reply},
                                    std::pair{kAmWakeSync, &on_am_wake_sync}}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = handler;
    hp.arg = this;
    check_ucs(ucp_worker_set_am_recv_handler(worker_, &hp), "ucp_worker_set_am_recv_handler");
  }

  // Connect to every peer.
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  check_ucs(ucp_worker_get_address(worker_, &address, &address_bytes), "ucp_worker_get_address");
  const auto addresses =
      allgather_bytes({reinterpret_cast<const std::byte*>(address), address_bytes});
  ucp_worker_release_address(worker_, address);
  eps_.assign(static_cast<size_t>(mem_.n_pes), nullptr);
  for (int pe = 0; pe < mem_.n_pes; ++pe) {
    if (pe == mem_.my_pe) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[pe].data());
    check_ucs(ucp_ep_create(worker_, &ep, &eps_[pe]), "ucp_ep_create");
  }
  heap_ = register_region(mem_.base, mem_.segment_bytes, eps_);
  if (mem_.data.bytes != 0) data_ = register_region(mem_.data.base, mem_.data.bytes, eps_);

  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  CM_CHECK(stop_fd_ >= 0, "raise the open file limit (ulimit -n)", "eventfd failed");
  progress_ = std::thread([this] { progress_loop(); });
  g_ucx.store(this, std::memory_order_release);
  set_sleep_hook(on_wait_sleeps);
  set_spin_hook(on_wait_spins, kNetSpinNs);
}

Region UcxTransport::register_region(std::byte* base, size_t bytes,
                                     const std::vector<ucp_ep_h>& eps) {
  Region region;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = bytes;
  check_ucs(ucp_mem_map(context_, &mp, &region.memh), "ucp_mem_map");
  void* packed = nullptr;
  size_t packed_bytes = 0;
  check_ucs(ucp_rkey_pack(context_, region.memh, &packed, &packed_bytes), "ucp_rkey_pack");
  // Each PE's entry: its base address, then its packed key.
  std::vector<std::byte> mine(sizeof(uint64_t) + packed_bytes);
  const auto at = reinterpret_cast<uint64_t>(base);
  std::memcpy(mine.data(), &at, sizeof at);
  std::memcpy(mine.data() + sizeof at, packed, packed_bytes);
  ucp_rkey_buffer_release(packed);
  const auto all = allgather_bytes(mine);
  region.bases.assign(eps.size(), 0);
  region.keys.assign(eps.size(), nullptr);
  for (size_t pe = 0; pe < eps.size(); ++pe) {
    std::memcpy(&region.bases[pe], all[pe].data(), sizeof(uint64_t));
    if (eps[pe] == nullptr) continue;
    check_ucs(ucp_ep_rkey_unpack(eps[pe], all[pe].data() + sizeof(uint64_t), &region.keys[pe]),
              "ucp_ep_rkey_unpack");
  }
  return region;
}

void UcxTransport::destroy_region(Region& region) {
  for (ucp_rkey_h k : region.keys)
    if (k != nullptr) ucp_rkey_destroy(k);
  region.keys.clear();
  if (region.memh != nullptr) ucp_mem_unmap(context_, region.memh);
  region.memh = nullptr;
}

uint64_t UcxTransport::atomic(int pe, size_t offset, AmoOp op, int width, uint64_t operand,
                              uint64_t compare) {
  ucp_atomic_op_t code = UCP_ATOMIC_OP_ADD;
  switch (op) {
    case AmoOp::fetch: code = UCP_ATOMIC_OP_OR, operand = 0; break;  // old | 0 == old
    case AmoOp::set:
    case AmoOp::swap: code = UCP_ATOMIC_OP_SWAP; break;
    case AmoOp::compare_swap: code = UCP_ATOMIC_OP_CSWAP; break;
    case AmoOp::add: code = UCP_ATOMIC_OP_ADD; break;
    case AmoOp::band: code = UCP_ATOMIC_OP_AND; break;
    case AmoOp::bor: code = UCP_ATOMIC_OP_OR; break;
    case AmoOp::bxor: code = UCP_ATOMIC_OP_XOR; break;
  }
  // CSWAP compares with the operand and swaps in the reply buffer's value,
  // which returns the old one. Both are the first `width` bytes of theirs.
  Caller caller(*this);
  order_puts(caller, pe);
  auto c = completion();
  Completion& state = *c;
  const auto store = [width](uint64_t& to, uint64_t value) {
    if (width == 4) {
      const auto narrow = static_cast<uint32_t>(value);
      std::memcpy(&to, &narrow, sizeof narrow);
    } else {
      to = value;
    }
  };
  store(state.operand, op == AmoOp::compare_swap ? compare : operand);
  store(state.result, op == AmoOp::compare_swap ? operand : 0);
  auto param = waited(state);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  param.datatype = ucp_dt_make_contig(static_cast<size_t>(width));
  param.reply_buffer = &state.result;
  wait(ucp_atomic_op_nbx(eps_[pe], code, &state.operand, 1, remote(pe, offset), key(pe, offset), &param),
       c, caller, "ucp_atomic_op_nbx", pe);
  if (width == 8) return state.result;
  uint32_t old = 0;
  std::memcpy(&old, &state.result, sizeof old);
  return old;
}

// Progresses until nothing more happens (at most 64 rounds), or `stop` is
// set: a waiting caller's operation completed (one system call less on its
// way back).
unsigned UcxTransport::progress_locked(const std::atomic<bool>* stop) {
  unsigned events = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned n = ucp_worker_progress(worker_);
    if (!ack_due_.empty()) acknowledge_all();
    if (n == 0) break;
    events += n;
    if (stop != nullptr && stop->load(std::memory_order_acquire)) break;
  }
  if (events != 0) ring(header().doorbell);  // something may have landed in this PE's memory
  return events;
}

// Spins progressing the worker until done(), or no event came for
// net_spin_ns; then hands over to the progress thread and sleeps until
// done() (the callbacks that make it true ring done_). `stop`: ends a
// progress call early once set. False when the watchdog expired first
// (the caller still holds mutex_, so a handler cannot run meanwhile).
template <typename Done>
bool UcxTransport::wait_until(Caller& caller, Done done, const std::atomic<bool>* stop) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto spin = std::chrono::nanoseconds(net_spin_ns());
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(wait_policy().timeout_s));
  auto& lock = caller.lock();
  // Spin while the network moves (a long transfer keeps producing events);
  // let another caller of this PE in between.
  for (auto idle_end = start + spin; !done();) {
    const bool moved = progress_locked(stop) != 0;
    const auto now = clock::now();
    if (moved) idle_end = now + spin;
    if (now >= idle_end || now >= deadline) break;
    if (callers_.load(std::memory_order_relaxed) > 1) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
  if (!done()) caller.hand_over();
  while (!done()) {
    if (clock::now() >= deadline) return false;
    const uint32_t seq = done_.seq.load(std::memory_order_seq_cst);
    lock.unlock();
    done_.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!done()) futex_wait(&done_.seq, seq, 100'000'000);
    done_.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    lock.lock();
  }
  return true;
}

void UcxTransport::timed_out(Caller& caller, const char* what, int pe) {
  caller.lock().unlock();
  throw_wait_timeout([&] {
    return fmt::format("PE {} waits for {}{} to complete", mem_.my_pe, what,
                       pe >= 0 ? fmt::format(" with PE {}", pe) : "");
  }, wait_policy().timeout_s);
}

void UcxTransport::wait(ucs_status_ptr_t request, std::unique_ptr<Completion>& c, Caller& caller,
                        const char* what, int pe) {
  if (request == nullptr) return;  // completed at once
  if (UCS_PTR_IS_ERR(request)) check_ucs(UCS_PTR_STATUS(request), what, pe);
  if (!wait_until(caller, [&] { return c->done.load(std::memory_order_acquire); }, &c->done)) {
    // The request stays with UCX, which may still complete it, writing *c
    // (an atomic's result) but calling nothing: c is left to it.
    ucp_request_free(request);
    (void)c.release();
    timed_out(caller, what, pe);
  }
  ucp_request_free(request);
  check_ucs(c->status, what, pe);
}

// Completes every ucp operation, then waits for every message put's
// acknowledgement.
void UcxTransport::flush(Caller& caller) {
  auto c = completion();
  const auto param = waited(*c);
  wait(ucp_worker_flush_nbx(worker_, &param), c, caller, "ucp_worker_flush_nbx");
  unordered_ = false;
  for (int pe = 0; pe < mem_.n_pes; ++pe) wait_acknowledged(caller, pe);
  // A get_nbi that times out still owns its dst, as the standard has it
  // until a quiet returns.
  if (!wait_until(caller, [&] { return gets_outstanding_.load(std::memory_order_acquire) == 0; }))
    timed_out(caller, "the replies of non-blocking gets");
  if (const int status = nbi_status_.exchange(UCS_OK); status != UCS_OK)
    check_ucs(static_cast<ucs_status_t>(status), "a message send (ucp_am_send_nbx)", nbi_pe_.exchange(-1));
}

// A header that lives until UCX has sent its message: freed by the send's
// callback, or at once when the send completes inside the call.
template <typename Header>
struct InFlight {
  UcxTransport* transport;
  Header header;
  int pe;
};

// A put (kAckLater: non-blocking) as a message; header: its signal and ack.
void UcxTransport::message_put(int pe, uint64_t offset, const void* src, size_t bytes, AmPut header) {
  header.offset = offset;
  header.origin = me();
  if (header.ack != AmPut::kAckLater) {  // returns once src may be reused (UCX copies small messages at once)
    Caller caller(*this);
    if (header.ack == AmPut::kAckNow) sent_[pe].fetch_add(1, std::memory_order_relaxed);
    auto c = completion();
    c->header = header;
    auto param = waited(*c);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    wait(ucp_am_send_nbx(eps_[pe], kAmPut, &c->header, sizeof header, src, bytes, &param), c, caller,
         "ucp_am_send_nbx", pe);
    return;
  }
  std::lock_guard lock(mutex_);  // no Caller: nothing to wait for, the progress thread stays on duty
  sent_[pe].fetch_add(1, std::memory_order_relaxed);
  send_message(pe, kAmPut, header, src, bytes);
}

// Sends a message whose header lives until UCX has sent it (data: until
// the caller's quiet, or the target's memory); a failure is reported by
// the next quiet. mutex_ held.
template <typename Header>
void UcxTransport::send_message(int pe, AmId id, const Header& header, const void* data, size_t bytes) {
  auto* sending = new InFlight<Header>{this, header, pe};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.user_data = sending;
  param.cb.send = [](void*, ucs_status_t status, void* user) {
    auto* done = static_cast<InFlight<Header>*>(user);
    if (status != UCS_OK) {
      int ok = UCS_OK;
      if (done->transport->nbi_status_.compare_exchange_strong(ok, status)) done->transport->nbi_pe_ = done->pe;
    }
    delete done;
  };
  const ucs_status_ptr_t request = ucp_am_send_nbx(eps_[pe], id, &sending->header, sizeof(Header),
                                                   data, bytes, &param);
  if (!UCS_PTR_IS_PTR(request)) delete sending;  // completed (or failed) inside the call
  if (UCS_PTR_IS_ERR(request)) check_ucs(UCS_PTR_STATUS(request), "ucp_am_send_nbx", pe);
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
}

// Runs inside ucp_worker_progress (mutex_ held): applies a message put,
// data first, then its signal, and counts it for the origin's
// acknowledgement (a push's is never sent).
ucs_status_t UcxTransport::on_am_put(void* arg, const void* header, size_t header_bytes, void* data,
                                     size_t bytes, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  const auto put = received<AmPut>(header, header_bytes, param, t->mem_.my_pe, "put message");
  if (bytes != 0) std::memcpy(t->local(put.offset), data, bytes);
  if (put.signal != 0) {
    std::atomic_ref<uint64_t> signal(*reinterpret_cast<uint64_t*>(t->local(put.signal_offset)));
    if (put.signal == 2) signal.fetch_add(put.signal_value, std::memory_order_seq_cst);
    else signal.store(put.signal_value, std::memory_order_seq_cst);
  }
  if (put.ack == AmPut::kAckNever) return UCS_OK;
  const int origin = static_cast<int>(put.origin);
  if (t->applied_[origin]++ == 0) t->ack_due_.push_back(origin);
  if (put.ack == AmPut::kAckNow) t->acknowledge(origin);
  return UCS_OK;
}

ucs_status_t UcxTransport::on_am_ack(void* arg, const void* header, size_t header_bytes, void*, size_t,
                                     const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  const auto ack = received<AmAck>(header, header_bytes, param, t->mem_.my_pe, "acknowledgement");
  t->acked_[ack.origin].fetch_add(ack.count, std::memory_order_release);
  ring(t->done_);
  return UCS_OK;
}

// A get request (mutex_ held): answered at once, with the data as it is
// when UCX copies it (a handler may send; it may not progress).
ucs_status_t UcxTransport::on_am_get(void* arg, const void* header, size_t header_bytes, void*, size_t,
                                     const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  const auto get = received<AmGet>(header, header_bytes, param, t->mem_.my_pe, "get request");
  t->send_message(static_cast<int>(get.origin), kAmGetReply, AmGetReply{get.token}, t->local(get.offset),
                  get.bytes);
  return UCS_OK;
}

ucs_status_t UcxTransport::on_am_get_reply(void* arg, const void* header, size_t header_bytes, void* data,
                                           size_t bytes, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  const auto reply = received<AmGetReply>(header, header_bytes, param, t->mem_.my_pe, "get reply");
  auto* got = reinterpret_cast<MessageGet*>(reply.token);
  if (bytes != got->bytes) {
    fmt::print(stderr, "coremesh: PE {} got {} bytes for a get of {}; aborting\n", t->mem_.my_pe, bytes,
               got->bytes);
    std::abort();
  }
  switch (got->owner) {
    case MessageGet::Owner::caller:
      if (bytes != 0) std::memcpy(got->dst, data, bytes);
      got->done.store(true, std::memory_order_release);
      break;
    case MessageGet::Owner::handler:
      if (bytes != 0) std::memcpy(got->dst, data, bytes);
      delete got;
      t->gets_outstanding_.fetch_sub(1, std::memory_order_release);
      break;
    case MessageGet::Owner::abandoned:
      delete got;
      break;
  }
  ring(t->done_);
  return UCS_OK;
}

// Acknowledges the puts applied for `origin` (mutex_ held).
void UcxTransport::acknowledge(int origin) {
  if (applied_[origin] == 0) return;
  send_message(origin, kAmAck, AmAck{applied_[origin], me(), 0}, nullptr, 0);
  applied_[origin] = 0;
}

// After a progress call (mutex_ held): one acknowledgement per origin for
// the non-blocking puts applied.
void UcxTransport::acknowledge_all() {
  for (const int origin : ack_due_) acknowledge(origin);
  ack_due_.clear();
}

// Returns at once when no caller came since the progress thread last
// served; else once none has progressed for a linger, or on a hand-over.
// Callers that come and go do not wake it: it wakes after each linger to look.
void UcxTransport::park_while_callers_progress() {
  uint32_t seen = turn_.seq.load(std::memory_order_seq_cst);
  if (seen == served_seq_ && callers_.load(std::memory_order_seq_cst) == 0) return;
  for (int64_t linger = kLingerMinNs;; linger = std::min(2 * linger, kLingerMaxNs)) {
    if (callers_.load(std::memory_order_seq_cst) == 0 && handed_over_.exchange(false)) break;
    turn_.sleepers.fetch_add(1, std::memory_order_seq_cst);
    futex_wait(&turn_.seq, seen, linger);
    turn_.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    const uint32_t now = turn_.seq.load(std::memory_order_seq_cst);
    if (callers_.load(std::memory_order_seq_cst) == 0 && now == seen) break;
    seen = now;
  }
  served_seq_ = turn_.seq.load(std::memory_order_seq_cst);
}

// A wait of this PE sleeps: nobody progresses unless the progress thread does.
void UcxTransport::on_wait_sleeps() {
  if (UcxTransport* t = g_ucx.load(std::memory_order_acquire)) t->wake_progress_thread();
}

// A wait of this PE spins: it progresses, unless another thread of this PE
// does, and keeps the progress thread parked ("a caller was here").
void UcxTransport::on_wait_spins() {
  UcxTransport* t = g_ucx.load(std::memory_order_acquire);
  if (t == nullptr) return;
  t->turn_.seq.fetch_add(1, std::memory_order_seq_cst);
  std::unique_lock lock(t->mutex_, std::try_to_lock);
  if (lock.owns_lock()) t->progress_locked();
}

void UcxTransport::progress_loop() {
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::nanoseconds(net_spin_ns());
  auto awake_until = clock::time_point{};
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    park_while_callers_progress();
    ucs_status_t armed = UCS_OK;
    {
      std::lock_guard lock(mutex_);
      const auto now = clock::now();
      if (progress_locked() != 0) awake_until = now + spin;
      if (now < awake_until) continue;  // stay awake for the peer's next request
      armed = ucp_worker_arm(worker_);
    }
    if (armed == UCS_ERR_BUSY) continue;  // more events already: progress again
    poll(fds, 2, 100);
    if (fds[1].revents != 0) return;
  }
}

void UcxTransport::close() {
  if (worker_ == nullptr) return;
  quiet();
  set_sleep_hook(nullptr);
  set_spin_hook(nullptr, 0);
  g_ucx.store(nullptr, std::memory_order_release);
  // Endpoints close (flushed) while both sides still progress; nobody sends
  // after the barrier.
  {
    std::unique_lock lock(mutex_);
    destroy_region(heap_);
    destroy_region(data_);
  }
  for (ucp_ep_h& ep : eps_) {
    if (ep == nullptr) continue;
    Caller caller(*this);
    auto c = completion();
    const auto param = waited(*c);
    wait(ucp_ep_close_nbx(ep, &param), c, caller, "ucp_ep_close_nbx");
    ep = nullptr;
  }
  mpi_barrier();
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof one);
  progress_.join();
  ::close(stop_fd_);
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  ucp_cleanup(context_);
  context_ = nullptr;
}

}  // namespace

std::unique_ptr<Transport> make_ucx_transport(const LocalMemory& memory) {
  return std::make_unique<UcxTransport>(memory);
}

}  // namespace coremesh::shmem::internal
