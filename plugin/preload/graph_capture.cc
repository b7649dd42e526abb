#include "plugin/preload/graph_capture.h"

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <array>

namespace dynaflow {
namespace {

// The stream handle of a call's parameters (the structs of cupti.h's
// generated_cuda*_meta.h), as a number.
using StreamOfParams = uint64_t (*)(const void* params);

template <typename Params, auto kStream>
uint64_t StreamOf(const void* params) {
  return reinterpret_cast<uint64_t>(static_cast<const Params*>(params)->*kStream);
}

struct CaptureCall {
  CaptureCallback callback;
  bool begins;  // begins a capture; ends one otherwise
  StreamOfParams stream;
};

constexpr CUpti_CallbackDomain kRuntime = CUPTI_CB_DOMAIN_RUNTIME_API;
constexpr CUpti_CallbackDomain kDriver = CUPTI_CB_DOMAIN_DRIVER_API;

#define DF_RUNTIME_CAPTURE(name, begins)                                   \
  CaptureCall {                                                            \
    {kRuntime, CUPTI_RUNTIME_TRACE_CBID_##name}, begins,                   \
        &StreamOf<name##_params, &name##_params::stream>                   \
  }
#define DF_DRIVER_CAPTURE(name, begins)                                    \
  CaptureCall {                                                            \
    {kDriver, CUPTI_DRIVER_TRACE_CBID_##name}, begins,                     \
        &StreamOf<name##_params, &name##_params::hStream>                  \
  }

constexpr std::array kCaptureCalls = {
    DF_RUNTIME_CAPTURE(cudaStreamBeginCapture_v10000, true),
    DF_RUNTIME_CAPTURE(cudaStreamBeginCapture_ptsz_v10000, true),
    DF_RUNTIME_CAPTURE(cudaStreamBeginCaptureToGraph_v12030, true),
    DF_RUNTIME_CAPTURE(cudaStreamBeginCaptureToGraph_ptsz_v12030, true),
    DF_RUNTIME_CAPTURE(cudaStreamEndCapture_v10000, false),
    DF_RUNTIME_CAPTURE(cudaStreamEndCapture_ptsz_v10000, false),
    DF_DRIVER_CAPTURE(cuStreamBeginCapture, true),
    DF_DRIVER_CAPTURE(cuStreamBeginCapture_ptsz, true),
    DF_DRIVER_CAPTURE(cuStreamBeginCapture_v2, true),
    DF_DRIVER_CAPTURE(cuStreamBeginCapture_v2_ptsz, true),
    DF_DRIVER_CAPTURE(cuStreamBeginCaptureToGraph, true),
    DF_DRIVER_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, true),
    DF_DRIVER_CAPTURE(cuStreamEndCapture, false),
    DF_DRIVER_CAPTURE(cuStreamEndCapture_ptsz, false),
};

#undef DF_RUNTIME_CAPTURE
#undef DF_DRIVER_CAPTURE

constexpr std::array<CaptureCallback, kCaptureCalls.size()> kCaptureCallbacks = [] {
  std::array<CaptureCallback, kCaptureCalls.size()> callbacks{};
  for (size_t i = 0; i < kCaptureCalls.size(); ++i) callbacks[i] = kCaptureCalls[i].callback;
  return callbacks;
}();

const CaptureCall* FindCall(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  for (const CaptureCall& call : kCaptureCalls) {
    if (call.callback.domain == domain && call.callback.cbid == cbid) return &call;
  }
  return nullptr;
}

// Handles that name the calling thread's own stream: 0 in the _ptsz calls
// (and, never capturable, the legacy default stream elsewhere) and
// cudaStreamPerThread.
constexpr uint64_t kDefaultStream = 0;
constexpr uint64_t kPerThreadStream = 0x2;  // cudaStreamPerThread, CU_STREAM_PER_THREAD

// cudaError_t and CUresult agree on success (0) and on this code.
constexpr int kSuccess = 0;
constexpr int kWrongThread = 908;  // cudaErrorStreamCaptureWrongThread
static_assert(static_cast<int>(cudaErrorStreamCaptureWrongThread) == kWrongThread);
static_assert(static_cast<int>(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) == kWrongThread);

}  // namespace

std::span<const CaptureCallback> GraphCaptureTracker::Callbacks() { return kCaptureCallbacks; }

void GraphCaptureTracker::OnApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                        const CUpti_CallbackData& data) {
  if (data.callbackSite != CUPTI_API_EXIT || data.functionParams == nullptr) return;
  const CaptureCall* call = FindCall(domain, cbid);
  if (call == nullptr) return;
  // Both APIs return a 32-bit enum; an unknown result reads as a failure.
  const int result = data.functionReturnValue != nullptr
                         ? *static_cast<const int*>(data.functionReturnValue)
                         : -1;
  const uint64_t stream = call->stream(data.functionParams);
  if (call->begins) {
    OnBeginCapture(stream, result == kSuccess);
  } else {
    OnEndCapture(stream, result == kWrongThread);
  }
}

GraphCaptureTracker::StreamKey GraphCaptureTracker::KeyOf(uint64_t stream) {
  const bool own = stream == kDefaultStream || stream == kPerThreadStream;
  return {stream, own ? std::this_thread::get_id() : std::thread::id()};
}

void GraphCaptureTracker::OnBeginCapture(uint64_t stream, bool succeeded) {
  if (!succeeded) return;
  std::lock_guard<std::mutex> lock(mu_);
  capturing_[KeyOf(stream)] = std::this_thread::get_id();
  count_.store(capturing_.size());
}

void GraphCaptureTracker::OnEndCapture(uint64_t stream, bool wrong_thread) {
  if (wrong_thread) return;
  std::lock_guard<std::mutex> lock(mu_);
  capturing_.erase(KeyOf(stream));
  count_.store(capturing_.size());
}

bool GraphCaptureTracker::CallingThreadCapturing() const {
  if (count_.load(std::memory_order_relaxed) == 0) return false;
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [stream, thread] : capturing_) {
    if (thread == self) return true;
  }
  return false;
}

size_t GraphCaptureTracker::capturing_streams() const {
  return count_.load(std::memory_order_relaxed);
}

void GraphCaptureTracker::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_.clear();
  count_.store(0);
}

}  // namespace dynaflow
