// Which threads are capturing CUDA work into a graph (stream capture), so
// that the operators they begin meanwhile are marked as capture-time
// operators: their launches were recorded into a graph, not run, and the
// GPU time they stand for appears later, in the graph's replays.
//
// The contract: a thread is capturing from the return of a successful
// cudaStreamBeginCapture / cuStreamBeginCapture (any variant: _ptsz, _v2,
// ...ToGraph) it called until the matching cudaStreamEndCapture /
// cuStreamEndCapture of that stream returns, on whichever thread (relaxed
// mode allows another). CUPTI's runtime and driver API callbacks at those
// calls' exits say so; the calls are rare, so enabling their callbacks costs
// nothing elsewhere, and asking whether the calling thread captures costs an
// atomic load while nobody captures. A stream is keyed by its handle
// (cudaStream_t and CUstream are the same), so the runtime call and the
// driver call it makes count once, and a thread capturing several streams
// captures until the last ends; a per-thread default stream (handle 0 of the
// _ptsz calls, cudaStreamPerThread) is each thread's own. A begin that fails
// captures nothing; an end that fails with "wrong thread" leaves the capture
// on (CUDA does too), any other end ends it. Work a thread launches into a
// stream another thread captures is not seen. Captures in progress when
// CUPTI stops reporting them (the tracer unsubscribes while torch.profiler
// holds CUPTI) are forgotten (Forget()): their end would go unseen.
//
// What the capturing thread sees is exact: CUPTI runs the callbacks on the
// thread making the CUDA call, before the call returns.
#pragma once

#include <cupti.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

namespace dynaflow {

// A CUPTI API callback that starts or ends a stream capture.
struct CaptureCallback {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
};

class GraphCaptureTracker {
 public:
  // Every begin and end capture call of the runtime and driver APIs, to
  // enable on CUPTI's subscriber.
  static std::span<const CaptureCallback> Callbacks();

  // A runtime or driver API callback of Callbacks(); others, and entries
  // (CUPTI_API_ENTER), are ignored. Throws only std::bad_alloc (the caller,
  // inside CUDA's call, swallows it: that capture goes unmarked).
  void OnApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                     const CUpti_CallbackData& data);

  // The calling thread began capturing `stream` (at the call's exit;
  // `succeeded`: it returned success).
  void OnBeginCapture(uint64_t stream, bool succeeded);
  // A call ended the capture of `stream` and returned `wrong_thread` when it
  // was not allowed to (then the capture goes on).
  void OnEndCapture(uint64_t stream, bool wrong_thread);

  // Whether the calling thread is capturing. Any thread; lock-free while no
  // thread captures.
  bool CallingThreadCapturing() const;
  // Streams being captured by any thread.
  size_t capturing_streams() const;
  // Every capture is over: CUPTI stops reporting them (Unsubscribe).
  void Forget();

 private:
  // A stream: its handle, and the thread it belongs to for per-thread
  // default streams (a default id for the others).
  using StreamKey = std::pair<uint64_t, std::thread::id>;
  static StreamKey KeyOf(uint64_t stream);

  mutable std::mutex mu_;
  std::map<StreamKey, std::thread::id> capturing_;  // stream -> capturing thread
  std::atomic<size_t> count_{0};  // capturing_.size(), read without the lock
};

}  // namespace dynaflow
