// The process's CUPTI activity session: buffers handed to CUPTI and back,
// the activity kinds the tracer converts, and operator ids pushed as external
// correlation ids.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "analysis/base/status.h"
#include "plugin/preload/activity_buffer.h"
#include "plugin/preload/cupti_api.h"

namespace dynaflow {

// Where completed buffers and CUPTI's dropped-record counts go. Called on
// CUPTI's threads (or on a thread that flushes), concurrently; must not block
// for long.
struct CuptiSink {
  std::function<void(ActivityBuffer)> buffer;
  std::function<void(size_t dropped)> dropped;
};

// CUPTI takes plain function pointers for its buffer callbacks, so at most
// one session may be started in a process at a time.
class CuptiSession {
 public:
  // Bytes of each buffer handed to CUPTI.
  static constexpr size_t kBufferBytes = size_t{4} << 20;

  CuptiSession(CuptiApi& cupti, CuptiSink sink);
  CuptiSession(const CuptiSession&) = delete;
  CuptiSession& operator=(const CuptiSession&) = delete;
  // Disables the kinds it enabled; CUPTI keeps the callbacks, which then
  // return buffers unconverted.
  ~CuptiSession();

  // Registers the buffer callbacks, CLOCK_REALTIME as CUPTI's clock (the
  // clock of dynaflow_now_ns) and OS thread ids in records. Failure when
  // another session is started or CUPTI refuses the callbacks.
  Status Start();

  // Enables every kind the tracer converts. Failure, with CUPTI's reason,
  // when kernels cannot be traced; other kinds that fail are listed in
  // unavailable_kinds() and the session goes on without them.
  Status Enable();
  // Disables what Enable() enabled and flushes what CUPTI still holds.
  void Disable();

  // Takes CUPTI back from another client of this process (torch.profiler's
  // Kineto), which registers its own buffer callbacks and clock when it
  // starts and disables its kinds, ours among them, when it stops: registers
  // this session's callbacks, clock and thread id type again and, when
  // enabled, enables its kinds and switches the hot APIs off again.
  // Precondition: Start() succeeded. Failure, with CUPTI's reason, when CUPTI
  // refuses the callbacks or the kernel kind; the session is then disabled.
  Status Reclaim();
  bool enabled() const { return enabled_.load(); }
  // In a forked child, which inherits a copy of the parent's CUPTI state but
  // has no CUDA of its own yet: forgets being enabled, without calling CUPTI,
  // so that the child enables CUPTI again when it initialises CUDA.
  void ForgetAfterFork() { enabled_.store(false); }
  const std::string& unavailable_kinds() const { return unavailable_kinds_; }
  // How many hot driver and runtime APIs' records Enable() switched off (0
  // where this CUPTI cannot switch single APIs).
  int skipped_apis() const { return skipped_apis_; }

  // Asks CUPTI to complete its buffers; `forced` includes records of work
  // still running (for the end of a trace).
  void Flush(bool forced);

  // Tags the GPU work this thread launches until the matching pop with
  // operator `id` (kOperatorCorrelationKind).
  void PushExternalId(uint64_t id);
  void PopExternalId();

 private:
  static void CUPTIAPI RequestBuffer(uint8_t** buffer, size_t* size, size_t* max_records);
  static void CUPTIAPI CompleteBuffer(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                      size_t size, size_t valid_size);
  static uint64_t CUPTIAPI RealtimeClock();
  // The callbacks, clock and thread id type of Start() and Reclaim().
  Status RegisterCallbacks();
  // The kinds of Enable() and Reclaim(); does not change enabled().
  Status EnableKinds();
  // Switches off the records of the driver and runtime calls that run around
  // every launch and matter to no analysis (cupti_session.cc).
  void SkipHotApis();

  CuptiApi& cupti_;
  CuptiSink sink_;
  std::atomic<bool> enabled_{false};
  std::string unavailable_kinds_;
  int skipped_apis_ = 0;
};

}  // namespace dynaflow
