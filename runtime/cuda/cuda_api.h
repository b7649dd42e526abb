// The one interface in front of the CUDA runtime calls the CUDA executor
// makes. CudartApi (cudart_api.h) calls the real runtime; FakeCudaApi
// (fake_cuda_api.h) records the calls and models stream capture for tests on
// machines without a GPU. No CUDA header is needed to use this interface.
#pragma once

#include <cstdint>

#include "analysis/base/status.h"

namespace dynaflow::runtime::cuda {

// An opaque CUDA handle (cudaStream_t, cudaEvent_t, ...) as an integer, typed
// so that handles of different kinds cannot be mixed up.
template <typename Kind>
struct Handle {
  std::uintptr_t value = 0;
  explicit operator bool() const { return value != 0; }
  friend bool operator==(Handle, Handle) = default;
};
using Stream = Handle<struct StreamKind>;  // value 0: the legacy default stream
using Event = Handle<struct EventKind>;
using Graph = Handle<struct GraphKind>;
using GraphExec = Handle<struct GraphExecKind>;
using MemPool = Handle<struct MemPoolKind>;

// Each call does what the CUDA runtime function of the same name does on the
// current device; errors come back as Failure with the function's name and
// the decoded CUDA error. Destroy* calls report nothing: they run at teardown,
// where no caller can act on an error (and after the CUDA context is gone at
// process exit every one of them fails).
class CudaApi {
 public:
  virtual ~CudaApi() = default;

  // A non-blocking stream: no implicit synchronization with the legacy stream.
  virtual StatusOr<Stream> CreateStream() = 0;
  // The executor is done with `stream`. An implementation over a framework's
  // caching allocator keeps it alive for reuse (CudartApi: torch may still
  // record events on it).
  virtual void DestroyStream(Stream stream) = 0;

  // An event without timing, the cheapest kind to record and wait for.
  virtual StatusOr<Event> CreateEvent() = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual Status RecordEvent(Event event, Stream stream) = 0;
  virtual Status StreamWaitEvent(Stream stream, Event event) = 0;
  virtual Status SynchronizeEvent(Event event) = 0;

  // Capture in thread-local mode: work other threads issue is not affected.
  virtual Status BeginCapture(Stream stream) = 0;
  virtual StatusOr<Graph> EndCapture(Stream stream) = 0;
  virtual StatusOr<GraphExec> InstantiateGraph(Graph graph) = 0;
  virtual void DestroyGraph(Graph graph) = 0;
  virtual Status LaunchGraph(GraphExec exec, Stream stream) = 0;
  virtual void DestroyGraphExec(GraphExec exec) = 0;

  // A stream-ordered memory pool on the current device (cudaMemPoolCreate).
  virtual StatusOr<MemPool> CreateMemPool() = 0;
  virtual void DestroyMemPool(MemPool pool) = 0;
};

}  // namespace dynaflow::runtime::cuda
