// A CudaApi for tests on machines without a GPU. It hands out numbered handles
// (streams s1, s2, ...; s0 is the legacy stream; events e1, ...; graphs g1,
// ...; executables x1, ...; pools p1, ...), logs every call in order, and
// enforces the rules of stream capture that CUDA enforces, failing as CUDA
// would when they are broken:
//   - capture cannot begin on the legacy stream or on a stream already capturing;
//   - a stream joins a capture by waiting for an event recorded in it; a
//     capturing stream may not wait for an event recorded outside its capture;
//   - capture ends only on the stream that began it, and only when every
//     kernel captured on another stream is joined back: the origin has waited
//     for an event that stream recorded after the kernel. (Stricter than CUDA,
//     which also accepts a join through a third stream.)
//   - an event last recorded in a capture can be neither synchronized nor, once
//     the capture has ended, waited for.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_api.h"

namespace dynaflow::runtime::cuda {

class FakeCudaApi final : public CudaApi {
 public:
  // Stands in for a kernel launch: logs "Kernel(name, sN)" and, during
  // capture, adds "name@sN" to the graph being captured.
  void LaunchKernel(const std::string& name, Stream stream);
  // Makes the next call of `function` (e.g. "InstantiateGraph") fail with
  // cudaErrorUnknown.
  void FailNext(std::string function) { fail_next_ = std::move(function); }

  // Every call so far, e.g. "RecordEvent(e1, s2)", "EndCapture(s1) = g1";
  // a failed call ends in " -> cudaErrorX".
  const std::vector<std::string>& calls() const { return calls_; }
  void ClearCalls() { calls_.clear(); }
  // The kernels captured into the graph `exec` was instantiated from, in
  // capture order, e.g. {"attn/mb0@s1", "mlp/mb0@s2"}.
  const std::vector<std::string>& kernels(GraphExec exec) const { return execs_.at(exec.value); }
  // Handles created and not yet destroyed, of every kind.
  int live_handles() const;

  StatusOr<Stream> CreateStream() override;
  void DestroyStream(Stream stream) override;
  StatusOr<Event> CreateEvent() override;
  void DestroyEvent(Event event) override;
  Status RecordEvent(Event event, Stream stream) override;
  Status StreamWaitEvent(Stream stream, Event event) override;
  Status SynchronizeEvent(Event event) override;
  Status BeginCapture(Stream stream) override;
  StatusOr<Graph> EndCapture(Stream stream) override;
  StatusOr<GraphExec> InstantiateGraph(Graph graph) override;
  void DestroyGraph(Graph graph) override;
  Status LaunchGraph(GraphExec exec, Stream stream) override;
  void DestroyGraphExec(GraphExec exec) override;
  StatusOr<MemPool> CreateMemPool() override;
  void DestroyMemPool(MemPool pool) override;

 private:
  static constexpr int kNoCapture = 0;
  static constexpr int kEndedCapture = -1;  // an event recorded in a capture that has ended

  struct StreamState {
    int capture = kNoCapture;
    std::uint64_t last_kernel = 0;  // sequence number of its last kernel in the capture
  };
  struct EventState {
    int capture = kNoCapture;  // where it was last recorded
    std::uintptr_t stream = 0;
    std::uint64_t covers = 0;  // the recording stream's last kernel at record time
  };
  struct CaptureState {
    std::uintptr_t origin = 0;
    std::vector<std::uintptr_t> members;             // the streams that joined, origin excluded
    std::map<std::uintptr_t, std::uint64_t> joined;  // member -> last kernel joined back
    std::vector<std::string> kernels;
  };

  // Fails when `error` is set or FailNext named `function`: logs `call` with
  // the error and returns it as a Failure. Otherwise logs nothing: the caller
  // logs the call once it has succeeded.
  Status Check(const std::string& function, const std::string& call, const char* error = nullptr);
  std::uintptr_t NextHandle(char kind) { return ++last_handle_[kind]; }
  StreamState* FindStream(Stream stream);  // the legacy stream included
  void EndCaptureOf(int capture);

  std::vector<std::string> calls_;
  std::string fail_next_;
  std::uint64_t kernel_sequence_ = 0;
  int next_capture_ = 1;
  std::map<char, std::uintptr_t> last_handle_;  // per kind letter: 's', 'e', 'g', 'x', 'p'
  std::map<std::uintptr_t, StreamState> streams_;
  std::map<std::uintptr_t, EventState> events_;
  std::map<int, CaptureState> captures_;
  std::map<std::uintptr_t, std::vector<std::string>> graphs_;  // captured kernels
  std::map<std::uintptr_t, std::vector<std::string>> execs_;   // kernels of the graph
  std::set<std::uintptr_t> pools_;
  StreamState legacy_stream_;
};

}  // namespace dynaflow::runtime::cuda
