#include "plugin/preload/cupti_session.h"

#include <array>
#include <utility>

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include "plugin/preload/realtime_clock.h"

namespace dynaflow {
namespace {

// The session CUPTI's callbacks deliver to.
std::atomic<CuptiSession*> g_session{nullptr};

// Kernels are what the tracer is for: without them CUPTI counts as unavailable.
constexpr CUpti_ActivityKind kRequiredKind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;

struct OptionalKind {
  CUpti_ActivityKind kind;
  const char* name;
};

// DEVICE first, so that device records precede the activity they describe.
// CUDA_EVENT gives the stream each event is recorded on, which cross-stream
// waits (SYNCHRONIZATION) name only by event.
constexpr std::array<OptionalKind, 10> kOptionalKinds = {{
    {CUPTI_ACTIVITY_KIND_DEVICE, "DEVICE"},
    {CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY"},
    {CUPTI_ACTIVITY_KIND_MEMCPY2, "MEMCPY2"},
    {CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET"},
    {CUPTI_ACTIVITY_KIND_RUNTIME, "RUNTIME"},
    {CUPTI_ACTIVITY_KIND_DRIVER, "DRIVER"},
    {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "SYNCHRONIZATION"},
    {CUPTI_ACTIVITY_KIND_CUDA_EVENT, "CUDA_EVENT"},
    {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, "EXTERNAL_CORRELATION"},
    {CUPTI_ACTIVITY_KIND_MARKER, "MARKER"},
}};

// Driver and runtime calls that launch, copy and synchronise nothing but run
// around every launch (torch asks for the current device and capture state
// before each one, the runtime resolves its context and kernel attributes):
// recording them costs CUPTI a record per call and tells the analysis nothing
// (a launch's host time is measured between launches). Their records are
// switched off; every launch, copy, memset, event and synchronising call
// stays.
constexpr std::array<CUpti_CallbackId, 23> kHotDriverApis = {
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent,       CUPTI_DRIVER_TRACE_CBID_cuCtxSetCurrent,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetDevice,        CUPTI_DRIVER_TRACE_CBID_cuCtxGetId,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetStreamPriorityRange,
    CUPTI_DRIVER_TRACE_CBID_cuDeviceGet,           CUPTI_DRIVER_TRACE_CBID_cuDeviceGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuDevicePrimaryCtxGetState,
    CUPTI_DRIVER_TRACE_CBID_cuFuncGetAttribute,    CUPTI_DRIVER_TRACE_CBID_cuKernelGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuKernelGetFunction,   CUPTI_DRIVER_TRACE_CBID_cuLibraryGetKernel,
    CUPTI_DRIVER_TRACE_CBID_cuGetProcAddress,      CUPTI_DRIVER_TRACE_CBID_cuGetProcAddress_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGetErrorString,      CUPTI_DRIVER_TRACE_CBID_cuStreamIsCapturing,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCaptureInfo,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCaptureInfo_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCaptureInfo_v3,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetId,         CUPTI_DRIVER_TRACE_CBID_cuStreamGetCtx,
    CUPTI_DRIVER_TRACE_CBID_cuPointerGetAttribute, CUPTI_DRIVER_TRACE_CBID_cuPointerGetAttributes,
};
constexpr std::array<CUpti_CallbackId, 18> kHotRuntimeApis = {
    CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaSetDevice_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetDeviceCount_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetErrorString_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaDeviceGetAttribute_v5000,
    CUPTI_RUNTIME_TRACE_CBID_cudaFuncGetAttributes_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetFuncBySymbol_v11000,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamIsCapturing_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamGetCaptureInfo_v10010,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamGetCaptureInfo_v12030,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamGetCaptureInfo_v2_v11030,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamGetPriority_v5050,
    CUPTI_RUNTIME_TRACE_CBID_cudaPointerGetAttributes_v4000,
    CUPTI_RUNTIME_TRACE_CBID_cudaDriverGetVersion_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaRuntimeGetVersion_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetDriverEntryPoint_v11030,
};

std::string Describe(CuptiApi& cupti, CUptiResult result) {
  const char* text = nullptr;
  if (cupti.GetResultString(result, &text) == CUPTI_SUCCESS && text != nullptr) return text;
  return "CUPTI error " + std::to_string(static_cast<int>(result));
}

}  // namespace

CuptiSession::CuptiSession(CuptiApi& cupti, CuptiSink sink)
    : cupti_(cupti), sink_(std::move(sink)) {}

CuptiSession::~CuptiSession() {
  Disable();
  CuptiSession* self = this;
  g_session.compare_exchange_strong(self, nullptr);
}

Status CuptiSession::Start() {
  CuptiSession* current = nullptr;
  if (!g_session.compare_exchange_strong(current, this) && current != this) {
    return Status::Failure("another CUPTI session is active in this process");
  }
  Status registered = RegisterCallbacks();
  if (!registered.ok()) g_session.store(nullptr);
  return registered;
}

Status CuptiSession::RegisterCallbacks() {
  const CUptiResult result = cupti_.ActivityRegisterCallbacks(&RequestBuffer, &CompleteBuffer);
  if (result != CUPTI_SUCCESS) {
    return Status::Failure("cuptiActivityRegisterCallbacks: " + Describe(cupti_, result));
  }
  // CLOCK_REALTIME is CUPTI's default clock on Linux except under WSL;
  // registering it makes it so everywhere. A CUPTI that predates the call
  // keeps its default.
  (void)cupti_.ActivityRegisterTimestampCallback(&RealtimeClock);
  (void)cupti_.SetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);  // gettid(), as operators
  return Status::Ok();
}

Status CuptiSession::Enable() {
  Status enabled = EnableKinds();
  if (enabled.ok()) enabled_.store(true);
  return enabled;
}

Status CuptiSession::EnableKinds() {
  const CUptiResult result = cupti_.ActivityEnable(kRequiredKind);
  if (result != CUPTI_SUCCESS) {
    return Status::Failure("cuptiActivityEnable(CONCURRENT_KERNEL): " + Describe(cupti_, result));
  }
  unavailable_kinds_.clear();
  for (const OptionalKind& k : kOptionalKinds) {
    if (cupti_.ActivityEnable(k.kind) != CUPTI_SUCCESS) {
      unavailable_kinds_ += (unavailable_kinds_.empty() ? "" : ",") + std::string(k.name);
    }
  }
  SkipHotApis();
  return Status::Ok();
}

Status CuptiSession::Reclaim() {
  Status reclaimed = RegisterCallbacks();
  if (reclaimed.ok() && enabled()) reclaimed = EnableKinds();
  if (!reclaimed.ok()) enabled_.store(false);
  return reclaimed;
}

void CuptiSession::SkipHotApis() {
  skipped_apis_ = 0;
  for (CUpti_CallbackId cbid : kHotDriverApis) {
    skipped_apis_ += cupti_.ActivityEnableDriverApi(cbid, 0) == CUPTI_SUCCESS ? 1 : 0;
  }
  for (CUpti_CallbackId cbid : kHotRuntimeApis) {
    skipped_apis_ += cupti_.ActivityEnableRuntimeApi(cbid, 0) == CUPTI_SUCCESS ? 1 : 0;
  }
}

void CuptiSession::Disable() {
  if (!enabled_.exchange(false)) return;
  (void)cupti_.ActivityDisable(kRequiredKind);
  for (const OptionalKind& k : kOptionalKinds) (void)cupti_.ActivityDisable(k.kind);
  Flush(/*forced=*/true);
}

void CuptiSession::Flush(bool forced) {
  (void)cupti_.ActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
}

void CuptiSession::PushExternalId(uint64_t id) {
  (void)cupti_.ActivityPushExternalCorrelationId(kOperatorCorrelationKind, id);
}

void CuptiSession::PopExternalId() {
  uint64_t id = 0;
  (void)cupti_.ActivityPopExternalCorrelationId(kOperatorCorrelationKind, &id);
}

void CUPTIAPI CuptiSession::RequestBuffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers. Without memory it gets none and
  // counts the records it drops, which CompleteBuffer reports.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI CuptiSession::CompleteBuffer(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                           size_t size, size_t valid_size) {
  BufferMemory memory(buffer);
  CuptiSession* session = g_session.load();
  if (session == nullptr) return;  // no session any more: the records go with the memory
  try {
    size_t dropped = 0;
    if (session->cupti_.ActivityGetNumDroppedRecords(context, stream_id, &dropped) ==
            CUPTI_SUCCESS &&
        dropped > 0) {
      session->sink_.dropped(dropped);
    }
    if (valid_size > 0) session->sink_.buffer(ActivityBuffer{std::move(memory), size, valid_size});
  } catch (...) {
    // CUPTI's thread is no place for an exception; the buffer is lost.
  }
}

uint64_t CUPTIAPI CuptiSession::RealtimeClock() { return static_cast<uint64_t>(RealtimeNs()); }

}  // namespace dynaflow
