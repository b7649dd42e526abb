// Turns the host threads of a region call, one per micro-batch, through a
// schedule's issue order: one task (segment) at a time, so the segments of
// different micro-batches are issued in exactly the order the schedule (and
// the simulator, which predicts it) says, on every call and on every rank.
//
// Protocol, per call: Reset; then each micro-batch's thread calls Begin(mb)
// once, Next(mb) at each stage boundary it reaches, and Finish(mb) when its
// part of the region returns or fails. Begin and Next block until the task
// they start has its turn: every task before it in the issue order has ended
// (its thread reached its next boundary) or was skipped (its micro-batch
// finished without reaching it). A thread holds the turn from Begin/Next
// until its next Next/Finish, so on the CPU, where work runs as it is
// issued, a task's dependencies have finished when it starts; on CUDA the
// caller records an event at the end of each task that `Turn::signal` names
// and makes its stream wait for `Turn::waits`, whose records were issued
// before the turn passed.
//
// A region whose micro-batches reach more boundaries than the schedule has
// segments keeps each in its last segment (counted in extra_boundaries());
// fewer, and the missing tasks are skipped (counted in skipped()). Neither
// deadlocks: a thread waits only for tasks earlier in the issue order, and
// every one of those is owned by a thread that is running or will finish.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "analysis/base/status.h"
#include "runtime/schedule.h"

namespace dynaflow::runtime {

class RegionSequencer {
 public:
  // A task that a micro-batch's thread now issues.
  struct Turn {
    TaskId task = -1;            // -1: none (past the micro-batch's last task)
    bool signal = false;         // another stream waits for it: record an event at its end
    std::vector<TaskId> waits;   // tasks on other streams it waits for, that ran in this call
  };

  // `schedule` must outlive the sequencer; its tasks' micro_batch fields name
  // the thread that issues each of them.
  explicit RegionSequencer(const Schedule& schedule);

  int micro_batches() const { return static_cast<int>(own_.size()); }

  // Starts a call. Not while threads of the previous call still run.
  void Reset();

  // The micro-batch's first task, once it has its turn. Failure after Abort,
  // BadInput for a micro-batch outside the schedule or begun twice.
  StatusOr<Turn> Begin(int mb);
  // Ends the micro-batch's task and returns its next one, once that has its
  // turn; a Turn with task -1 past its last task.
  StatusOr<Turn> Next(int mb);
  // Ends the micro-batch's task and skips those it never began.
  void Finish(int mb);
  // Wakes every waiting thread with a Failure carrying `why`; later Begin and
  // Next fail at once, until Reset.
  void Abort(const std::string& why);

  // This call's tasks in the order they began (their turns came).
  std::vector<TaskId> executed() const;
  int skipped() const;
  int extra_boundaries() const;

 private:
  void EndLocked(int mb);
  StatusOr<Turn> AwaitLocked(std::unique_lock<std::mutex>& lock, TaskId task);

  const Schedule& schedule_;
  std::vector<std::vector<TaskId>> own_;  // each micro-batch's tasks, in issue order
  mutable std::mutex mu_;
  std::condition_variable turn_changed_;
  size_t cursor_ = 0;               // position in the issue order of the task that has the turn
  std::vector<bool> done_;          // per task: ended or skipped
  std::vector<bool> ran_;           // per task: began in this call
  std::vector<int> position_;       // per micro-batch: index into own_ of its current task, -1 not begun
  std::vector<bool> finished_;
  std::vector<TaskId> executed_;
  int skipped_ = 0;
  int extra_boundaries_ = 0;
  std::string aborted_;
};

}  // namespace dynaflow::runtime
