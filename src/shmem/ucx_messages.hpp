// The ucx engine's own messages (ucx_transport.cpp): their ids and
// headers on the wire, and the state of this PE's operations in flight.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <fmt/core.h>

#include "layout.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal::ucx {

// Active message ids and headers. A put's header travels in front of its
// data, a get reply's in front of the data asked for; acknowledgements and
// get requests are headers only.
enum AmId : unsigned { kAmPut = 1, kAmAck = 2, kAmGet = 3, kAmGetReply = 4, kAmWakeSync = 5 };
struct AmPut {
  uint64_t offset = 0, signal_offset = 0, signal_value = 0;
  uint32_t origin = 0;
  uint16_t signal = 0;  // 0 none, 1 set, 2 add
  uint16_t ack = 0;     // Ack
  // When the target acknowledges: after its progress call, coalesced per
  // origin (put_nbi); at once (a blocking put: its quiet is likely near);
  // never (a push: the signal is its completion).
  enum Ack : uint16_t { kAckLater = 0, kAckNow = 1, kAckNever = 2 };
};
struct AmAck {
  uint64_t count = 0;
  uint32_t origin = 0, pad = 0;
};
struct AmGet {
  uint64_t offset = 0, bytes = 0, token = 0;  // token: the origin's MessageGet
  uint32_t origin = 0, pad = 0;
};
struct AmGetReply {
  uint64_t token = 0;
};
struct AmWakeSync {
  uint64_t origin = 0;
};

// A message get of this PE, on the heap until its reply comes. Who frees
// it: a blocking get, once the reply's handler has copied the data to dst
// and marked it done; the handler itself for a get_nbi (quiet waits for
// the count of those outstanding) and for a get whose caller gave up (the
// watchdog): the late reply is dropped, nothing is written to dst.
struct MessageGet {
  enum class Owner { caller, handler, abandoned };
  void* dst = nullptr;
  size_t bytes = 0;
  Owner owner = Owner::caller;
  std::atomic<bool> done{false};
};

// One blocking ucp operation: its callback marks it done and rings `bell`.
// It lives on the heap, with the buffers UCX writes until the request
// completes: a caller that gives up (the watchdog) leaves it to UCX, so that
// a late completion writes nothing on the caller's stack.
struct Completion {
  std::atomic<bool> done{false};
  ucs_status_t status = UCS_OK;
  Bell* bell = nullptr;
  uint64_t operand = 0, result = 0;  // an atomic's (4 or 8 bytes at the start)
  AmPut header{};                     // a blocking message put's
};
inline void on_complete(void*, ucs_status_t status, void* user) {
  auto* c = static_cast<Completion*>(user);
  c->status = status;
  c->done.store(true, std::memory_order_release);
  ring(*c->bell);
}

// A received message's header; a malformed one aborts (inside UCX's
// progress nothing can be thrown). Messages are sent eager: never rendezvous.
template <typename Header>
Header received(const void* header, size_t header_bytes, const ucp_am_recv_param_t* param, int pe,
                const char* what) {
  if (header_bytes != sizeof(Header) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    fmt::print(stderr, "coremesh: PE {} received a malformed {}; aborting\n", pe, what);
    std::abort();
  }
  Header h;
  std::memcpy(&h, header, sizeof h);
  return h;
}

}  // namespace coremesh::shmem::internal::ucx
