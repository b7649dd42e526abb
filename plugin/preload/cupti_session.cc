#include "plugin/preload/cupti_session.h"

#include <array>
#include <utility>

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
  const CUptiResult result = cupti_.ActivityRegisterCallbacks(&RequestBuffer, &CompleteBuffer);
  if (result != CUPTI_SUCCESS) {
    g_session.store(nullptr);
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
  enabled_.store(true);
  return Status::Ok();
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
