// RegionTurns: the work at every boundary of a region call, in C++ where
// Python ran it from a forward pre-hook of each stage module: the sequencer's
// turn, and on a device the schedule's streams and events. Used by apply's
// staggered and dual-batch regions (plugin/python/dynaflow/_apply.py,
// _Region, which keeps a Python twin of it for when the replay module is
// not built).
//
// One sequencer: the region's in libdynaflow_apply (runtime/sequencer.h),
// reached through the C ABI functions Python's loader found there
// (RegionAbi), so the ctypes side and this class turn the same object.
//
// Protocol, per call: StartCall on the caller's thread; then on each
// micro-batch's thread Begin(mb), Stage(mb) at each call of a stage module,
// Boundary(mb) before and after a collective, End(mb) when its part of the
// region returns or fails (also when Begin failed); then EndCall. A thread
// waits for its turn without holding anything of this class. Detach() before
// the region is freed (not while a call runs): every later call fails.
// - Turns (the default): each micro-batch on its own thread, turned by the
//   sequencer through the schedule's issue order.
// - Inline (under a CUDA graph capture, or on one thread; staggered regions
//   only): the micro-batches run one after the other on the caller's
//   thread, each task waiting only for the events of tasks issued before it
//   in this call. The graph then holds the predicted schedule whatever
//   order the host issued it in.
//
// On a device (c10 streams and events through the device type's guard
// implementation, as torch's generic code uses them; CUDA in practice):
// - a task runs on its schedule stream, made the thread's current stream
//   (and the region's device the thread's current device, as
//   torch.cuda.set_stream does) when the task starts;
// - a micro-batch's first task waits for the caller's stream as it was at
//   StartCall, and each task for the events of the tasks it depends on on
//   other streams (the schedule's edges);
// - a task another waits for records its event when it ends;
// - End records the micro-batch's end and puts back the thread's device and
//   stream; EndCall makes the caller's stream wait for every end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "analysis/base/status.h"

namespace dynaflow {

// The region functions of plugin/apply/dynaflow_apply.h, and the region.
struct RegionAbi {
  void* region = nullptr;
  int (*turn)(void* region, int mb, int first, int* task, int* signal, int* waits,
              int max_waits, int* num_waits, char* err, size_t err_len) = nullptr;
  int (*edges)(const void* region, int task, int* signal, int* waits, int max_waits,
               int* num_waits, char* err, size_t err_len) = nullptr;
  void (*reset)(void* region) = nullptr;
  void (*finish)(void* region, int mb) = nullptr;
};

class RegionTurns {
 public:
  struct Task {
    int segment = 0;
    int micro_batch = 0;
    int stream = 0;
  };

  // `tasks`: the region's schedule (dynaflow_apply_region_tasks), every
  // micro-batch with the same segments 0..n-1. `staggered`: inline calls are
  // allowed (the edges are read once, here). `device`: where the streams
  // and events are made; none on the CPU. BadInput through `status()` for
  // an ABI without its functions or tasks that are not such a schedule.
  RegionTurns(RegionAbi abi, std::vector<Task> tasks, bool staggered,
              std::optional<c10::Device> device);

  const Status& status() const { return status_; }
  // Unique in the process, also after this object is gone (an address may be
  // reused): what a thread's binding to a region call names.
  uint64_t serial() const { return serial_; }

  // Starts a call; `caller`: the caller's current stream, required on a
  // device (BadInput without it).
  Status StartCall(bool inline_call, std::optional<c10::Stream> caller);
  // Micro-batch `mb`'s first task, once it has its turn.
  Status Begin(int mb);
  // A call of a stage module: the first lies inside the micro-batch's first
  // segment; every later one ends its task and takes the next.
  Status Stage(int mb);
  // Ends the micro-batch's task and takes the next (around a collective).
  Status Boundary(int mb);
  // The micro-batch returned or failed: its task ends, its remaining tasks
  // are skipped, and the thread gets its device and stream back, whatever
  // fails on the way (a device error in an event's record: Failure, after
  // all of that, so that the other micro-batches' turns still come).
  Status End(int mb);
  // The caller's stream waits for every micro-batch's end (BadInput on a
  // device without it).
  Status EndCall(std::optional<c10::Stream> caller);
  // The region is about to be freed: no call may reach it any more.
  void Detach() { abi_.region = nullptr; }

  bool inline_call() const { return inline_; }
  // An inline call's tasks in the order they were issued, and its
  // boundaries past a micro-batch's last segment (the sequencer counts a
  // call with turns).
  const std::vector<int>& issued() const { return issued_; }
  int extra() const { return extra_; }

 private:
  struct Saved {
    c10::Device device;
    c10::Stream stream;
  };
  // A micro-batch's part of a call, touched by its thread only (one struct
  // each: no two threads write one word).
  struct MicroBatch {
    int task = -1;        // the task it runs, or -1 before its first
    bool signal = false;  // that task records its event at its end
    bool cut = false;     // a stage module has been called
    std::optional<Saved> saved;  // the thread's device and stream, on a device
  };

  Status Take(int mb, bool first);
  Status NextInline(int mb, bool first, int* task, bool* signal, std::vector<int>* waits);
  // Records the micro-batch's task's event where another task waits for it.
  void EndTask(int mb);
  // BadInput for a micro-batch outside the region, Failure once detached.
  Status CheckCall(int mb) const;

  const uint64_t serial_;
  RegionAbi abi_;
  std::vector<Task> tasks_;
  int splits_ = 0;
  int segments_ = 0;
  std::vector<std::vector<int>> task_of_;  // [segment][micro-batch]
  std::vector<bool> signals_;              // staggered: per task, the schedule's
  std::vector<std::vector<int>> waits_;    // staggered: per task, the schedule's
  Status status_;

  // This call's. Inline, one thread has them all.
  bool inline_ = false;
  std::vector<MicroBatch> micro_batches_;
  std::vector<int> issued_;         // inline
  std::vector<bool> was_issued_;    // inline, per task
  int extra_ = 0;                   // inline

  // On a device.
  std::optional<c10::Device> device_;
  std::optional<c10::impl::VirtualGuardImpl> guard_;
  std::vector<c10::Stream> streams_;
  std::vector<c10::Event> events_;  // per task
  std::vector<c10::Event> ends_;    // per micro-batch
  std::optional<c10::Event> fork_;
};

}  // namespace dynaflow
