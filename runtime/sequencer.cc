#include "runtime/sequencer.h"

namespace dynaflow::runtime {

RegionSequencer::RegionSequencer(const Schedule& schedule) : schedule_(schedule) {
  int mbs = 0;
  for (const Task& t : schedule.tasks()) mbs = std::max(mbs, t.micro_batch + 1);
  own_.resize(static_cast<size_t>(mbs));
  for (TaskId id : schedule.issue_order()) {
    own_[static_cast<size_t>(schedule.task(id).micro_batch)].push_back(id);
  }
  Reset();
}

void RegionSequencer::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  cursor_ = 0;
  done_.assign(static_cast<size_t>(schedule_.size()), false);
  ran_.assign(static_cast<size_t>(schedule_.size()), false);
  position_.assign(own_.size(), -1);
  finished_.assign(own_.size(), false);
  executed_.clear();
  skipped_ = 0;
  extra_boundaries_ = 0;
  aborted_.clear();
}

// Marks the micro-batch's current task ended and moves the turn past every
// ended or skipped task.
void RegionSequencer::EndLocked(int mb) {
  const int at = position_[static_cast<size_t>(mb)];
  if (at >= 0) {
    const TaskId current = own_[static_cast<size_t>(mb)][static_cast<size_t>(at)];
    done_[static_cast<size_t>(current)] = true;
  }
  const auto order = schedule_.issue_order();
  while (cursor_ < order.size() && done_[static_cast<size_t>(order[cursor_])]) ++cursor_;
  turn_changed_.notify_all();
}

StatusOr<RegionSequencer::Turn> RegionSequencer::AwaitLocked(std::unique_lock<std::mutex>& lock,
                                                             TaskId task) {
  const auto order = schedule_.issue_order();
  turn_changed_.wait(lock, [&] {
    return !aborted_.empty() || (cursor_ < order.size() && order[cursor_] == task);
  });
  if (!aborted_.empty()) return Status::Failure(aborted_);
  ran_[static_cast<size_t>(task)] = true;
  executed_.push_back(task);
  Turn turn;
  turn.task = task;
  turn.signal = schedule_.signals(task);
  for (TaskId dep : schedule_.cross_stream_waits(task)) {
    if (ran_[static_cast<size_t>(dep)]) turn.waits.push_back(dep);
  }
  return turn;
}

StatusOr<RegionSequencer::Turn> RegionSequencer::Begin(int mb) {
  std::unique_lock<std::mutex> lock(mu_);
  if (mb < 0 || mb >= micro_batches() || own_[static_cast<size_t>(mb)].empty()) {
    return Status::BadInput("micro-batch " + std::to_string(mb) + " is not in the schedule");
  }
  if (position_[static_cast<size_t>(mb)] >= 0 || finished_[static_cast<size_t>(mb)]) {
    return Status::BadInput("micro-batch " + std::to_string(mb) + " began twice in one call");
  }
  if (!aborted_.empty()) return Status::Failure(aborted_);
  position_[static_cast<size_t>(mb)] = 0;
  return AwaitLocked(lock, own_[static_cast<size_t>(mb)].front());
}

StatusOr<RegionSequencer::Turn> RegionSequencer::Next(int mb) {
  std::unique_lock<std::mutex> lock(mu_);
  if (mb < 0 || mb >= micro_batches() || position_[static_cast<size_t>(mb)] < 0 ||
      finished_[static_cast<size_t>(mb)]) {
    return Status::BadInput("micro-batch " + std::to_string(mb) + " is not running");
  }
  if (!aborted_.empty()) return Status::Failure(aborted_);
  const std::vector<TaskId>& own = own_[static_cast<size_t>(mb)];
  int& at = position_[static_cast<size_t>(mb)];
  if (at + 1 >= static_cast<int>(own.size())) {
    ++extra_boundaries_;
    return Turn{};
  }
  EndLocked(mb);
  ++at;
  return AwaitLocked(lock, own[static_cast<size_t>(at)]);
}

void RegionSequencer::Finish(int mb) {
  std::lock_guard<std::mutex> lock(mu_);
  if (mb < 0 || mb >= micro_batches() || finished_[static_cast<size_t>(mb)]) return;
  finished_[static_cast<size_t>(mb)] = true;
  const std::vector<TaskId>& own = own_[static_cast<size_t>(mb)];
  const size_t first_not_begun = static_cast<size_t>(position_[static_cast<size_t>(mb)] + 1);
  for (size_t i = first_not_begun; i < own.size(); ++i) {
    done_[static_cast<size_t>(own[i])] = true;
    ++skipped_;
  }
  EndLocked(mb);
}

void RegionSequencer::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = why.empty() ? "the region call was aborted" : why;
  turn_changed_.notify_all();
}

std::vector<TaskId> RegionSequencer::executed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return executed_;
}

int RegionSequencer::skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

int RegionSequencer::extra_boundaries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return extra_boundaries_;
}

}  // namespace dynaflow::runtime
