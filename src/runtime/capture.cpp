// Stream capture (capture.hpp): the hooks Stream::launch, Event::record,
// Event::wait and the host synchronizations call while a stream captures.
#include "coremesh/runtime/capture.hpp"

#include <algorithm>

#include "internal.hpp"

namespace coremesh::runtime {
namespace {

const char* const kSyncHint =
    "a capture records work without running it: end_capture() first (then replay), or synchronize "
    "before begin_capture()";

// Adds `from` to `into` without duplicates.
void merge_deps(std::vector<int>& into, const std::vector<int>& from) {
  for (int d : from)
    if (std::find(into.begin(), into.end(), d) == into.end()) into.push_back(d);
}

void attach(CaptureSession& session, StreamImpl& s, std::vector<int> deps) {
  {
    std::lock_guard lock(s.mutex);
    s.capture = session.shared_from_this();
  }
  s.capture_deps = std::move(deps);
  session.streams.push_back(s.shared_from_this());
  s.device->capturing_streams.fetch_add(1);
  s.capturing.store(true, std::memory_order_release);
}

void detach(StreamImpl& s) {
  s.capturing.store(false, std::memory_order_release);
  if (!s.device_gone.load(std::memory_order_acquire)) s.device->capturing_streams.fetch_sub(1);  // else it dangles
  s.capture_deps.clear();
  std::lock_guard lock(s.mutex);
  s.capture.reset();
}

}  // namespace

void CaptureSession::refuse(std::string message, std::string hint) {
  if (error.empty()) error = message;
  throw CaptureError(std::move(message), std::move(hint), __FILE__, __LINE__);
}

std::shared_ptr<CaptureSession> capture_of(StreamImpl& s) {
  std::lock_guard lock(s.mutex);
  return s.capture;
}

void capture_launch(StreamImpl& s, const LaunchInfo& info, KernelBody body, CoreLimits limits) {
  auto session = capture_of(s);
  CM_ASSERT(session != nullptr);
  std::lock_guard lock(session->mutex);
  if (!info.op)
    session->refuse(fmt::format("kernel '{}' launched on capturing stream {} has no op descriptor, so it "
                                "cannot be captured",
                                info.name, s.id),
                    "launch it outside the capture, or give its LaunchInfo an OpDesc (the ops library "
                    "does): a graph needs to know what each kernel reads and writes");
  CapturedKernel k;
  k.kernel = {info, std::move(body)};
  k.limits = limits;
  k.stream_limit = {s.cube_limit.load(), s.vector_limit.load()};
  k.stream_id = s.id;
  k.priority = s.priority;
  k.deps = s.capture_deps;
  s.capture_deps = {static_cast<int>(session->kernels.size())};
  session->kernels.push_back(std::move(k));
}

bool capture_record(StreamImpl& s, EventImpl& e) {
  if (!s.capturing.load(std::memory_order_acquire)) {
    std::lock_guard lock(e.mutex);
    e.captured_in.reset();  // a real record supersedes a captured one
    return false;
  }
  auto session = capture_of(s);
  CM_ASSERT(session != nullptr);
  std::lock_guard lock(session->mutex);
  std::lock_guard event_lock(e.mutex);
  e.captured_in = session;
  e.captured_deps = s.capture_deps;
  return true;
}

bool capture_wait(StreamImpl& s, EventImpl& e) {
  std::shared_ptr<CaptureSession> recorded_in;
  std::vector<int> deps;
  bool recorded_outside = false;
  {
    std::lock_guard lock(e.mutex);
    recorded_in = e.captured_in;
    deps = e.captured_deps;
    recorded_outside = e.latest != nullptr;
  }
  if (recorded_in) {
    std::lock_guard lock(recorded_in->mutex);
    if (recorded_in->ended) recorded_in.reset();  // a finished capture's record: ignored
  }
  const bool capturing = s.capturing.load(std::memory_order_acquire);
  if (!capturing && !recorded_in) return false;  // plain eager wait
  if (!capturing) {  // the stream forks off the capture the event belongs to
    std::lock_guard lock(recorded_in->mutex);
    if (s.device != recorded_in->device)
      recorded_in->refuse(fmt::format("stream {} of another device waits on event {} of a capture", s.id, e.id),
                          "keep a capture's streams on one device");
    attach(*recorded_in, s, std::move(deps));
    return true;
  }
  auto session = capture_of(s);
  CM_ASSERT(session != nullptr);
  std::lock_guard lock(session->mutex);
  if (recorded_in == session) {
    merge_deps(s.capture_deps, deps);
  } else if (recorded_in) {
    session->refuse(fmt::format("capturing stream {} waits on event {}, recorded in another capture", s.id, e.id),
                    "order two captures through the streams they replay on, not through events");
  } else if (recorded_outside) {
    session->refuse(fmt::format("capturing stream {} waits on event {}, recorded outside the capture", s.id, e.id),
                    "record the event on a capturing stream inside the capture, or make the stream wait "
                    "for it before begin_capture()");
  }
  return true;  // a never-recorded event: nothing to wait for (CUDA semantics)
}

void capture_refuse_sync(StreamImpl& s, const char* what) {
  auto session = capture_of(s);
  if (!session) return;  // the capture just ended
  std::lock_guard lock(session->mutex);
  session->refuse(fmt::format("{} on stream {}, which is capturing", what, s.id), kSyncHint);
}

void capture_refuse_event_sync(EventImpl& e, const char* what) {
  std::shared_ptr<CaptureSession> session;
  {
    std::lock_guard lock(e.mutex);
    session = e.captured_in;
  }
  if (!session) return;
  std::lock_guard lock(session->mutex);
  if (session->ended) return;
  session->refuse(fmt::format("{} of event {}, recorded inside a capture", what, e.id), kSyncHint);
}

void capture_refuse_device_sync(Device::Impl& device) {
  std::vector<std::shared_ptr<StreamImpl>> streams;
  {
    std::lock_guard lock(device.streams_mutex);
    for (auto& weak : device.streams)
      if (auto s = weak.lock()) streams.push_back(std::move(s));
  }
  for (auto& s : streams)
    if (s->capturing.load(std::memory_order_acquire)) capture_refuse_sync(*s, "Device::synchronize()");
}

std::shared_ptr<CaptureSession> begin_stream_capture(Stream& origin) {
  StreamImpl& s = *origin.impl();
  CM_CHECK(!s.capturing.load(), "end the running capture first",
           "stream {} is already capturing", s.id);
  auto session = std::make_shared<CaptureSession>();
  session->device = s.device;
  session->origin = origin.impl();
  std::lock_guard lock(session->mutex);
  attach(*session, s, {});
  return session;
}

Captured end_stream_capture(const std::shared_ptr<CaptureSession>& session) {
  CM_CHECK(session != nullptr, "pass the session begin_capture returned", "no capture to end");
  std::lock_guard lock(session->mutex);
  CM_CHECK(!session->ended, "end a capture once", "the capture has already ended");
  session->ended = true;
  // Kernels the origin's next launch would wait for: its deps and their ancestors.
  std::vector<char> joined(session->kernels.size(), 0);
  std::vector<int> to_visit = session->origin->capture_deps;
  while (!to_visit.empty()) {
    const int k = to_visit.back();
    to_visit.pop_back();
    if (joined[size_t(k)]) continue;
    joined[size_t(k)] = 1;
    for (int d : session->kernels[size_t(k)].deps) to_visit.push_back(d);
  }
  std::string unjoined;
  for (auto& s : session->streams)
    for (int k : s->capture_deps)
      if (!joined[size_t(k)] && unjoined.empty())
        unjoined = fmt::format("stream {} (its last kernel '{}')", s->id, session->kernels[size_t(k)].kernel.info.name);
  for (auto& s : session->streams) detach(*s);
  session->streams.clear();  // events recorded in the capture may keep the session alive
  CM_CHECK(!session->origin->device_gone.load(std::memory_order_acquire), "end a capture before its device goes",
           "the capture on stream {} ended after its device was destroyed", session->origin->id);
  if (!session->error.empty())
    throw CaptureError("the capture was invalidated: " + session->error,
                       "fix the refused call (its own error said what to change) and capture again", __FILE__,
                       __LINE__);
  if (!unjoined.empty())
    throw CaptureError(fmt::format("{} forked from the capture but was not joined back into origin stream {}",
                                   unjoined, session->origin->id),
                       "record an event on that stream after its last launch and make the origin stream wait "
                       "on it before end_capture()",
                       __FILE__, __LINE__);
  Captured out;
  out.device = session->device->owner;
  out.origin_stream = session->origin->id;
  out.kernels = std::move(session->kernels);
  return out;
}

bool is_capturing(const Stream& stream) { return stream.impl()->capturing.load(std::memory_order_acquire); }

}  // namespace coremesh::runtime
