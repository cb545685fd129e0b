// Stream capture, the runtime side of graph mode (src/graph builds, rewrites
// and replays the graph). CUDA's model:
//  - begin_stream_capture(origin): launches on the origin stream are recorded, not run;
//  - a stream joins the capture when it waits on an event recorded on a
//    capturing stream; its launches are recorded from then on;
//  - every joined stream must be joined back before end_capture(): the origin
//    waits on an event recorded on it after its last launch.
// Each recorded kernel keeps its LaunchInfo (with the op descriptor), its
// stream and the core limits in force at launch, and depends on the kernels
// its stream recorded before it and on those that the events it waited on
// had recorded: edges come from stream order and record/wait pairs only.
// An event record inside a capture is a capture-internal dependency; outside
// the capture the event keeps its last real recording.
//
// Refused with a CaptureError that says what to change (the capture is then
// invalid, and end_stream_capture() throws as well):
//  - a kernel without an op descriptor (LaunchInfo::op): nothing to match on;
//  - a wait on an event recorded outside the capture or in another one;
//  - a host synchronization: synchronize()/query() of a capturing stream or
//    of an event recorded in the capture, or synchronize() of a device one of
//    whose streams captures;
//  - at end_stream_capture(): a joined stream whose last work the origin does not wait for.
//
// Thread safety: a capture may be driven from several threads, but it is
// begun and ended once; launching on a stream while its capture ends is a race.
#pragma once

#include <memory>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime {

class CaptureError : public Error {
  using Error::Error;
};

struct CapturedKernel {
  Kernel kernel;            // info.op is set
  CoreLimits limits;        // in force at launch (stream > device > spec)
  CoreLimits stream_limit;  // the stream's own limit at launch, 0 = unset (the RFC's core_num attribute)
  int stream_id = 0;
  int priority = 0;
  std::vector<int> deps;    // earlier kernels this one waits for
};

struct Captured {
  Device* device = nullptr;
  int origin_stream = 0;
  std::vector<CapturedKernel> kernels;  // in launch order (deps point backwards)
};

struct CaptureSession;

// Starts a capture on `origin`; throws CaptureError if it already captures.
std::shared_ptr<CaptureSession> begin_stream_capture(Stream& origin);
// Ends it: checks that every joined stream was joined back, releases the
// streams (they run their launches again) and returns what was recorded.
Captured end_stream_capture(const std::shared_ptr<CaptureSession>& session);
bool is_capturing(const Stream& stream);

}  // namespace coremesh::runtime
