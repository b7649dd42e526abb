#include "plugin/torch/region_turns.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <utility>

#include "plugin/apply/dynaflow_apply.h"

namespace dynaflow {
namespace {

// No task waits for more tasks than there are streams.
constexpr int kMaxWaits = DYNAFLOW_APPLY_MAX_STREAMS;

std::atomic<uint64_t> next_serial{1};

}  // namespace

RegionTurns::RegionTurns(RegionAbi abi, std::vector<Task> tasks, bool staggered,
                         std::optional<c10::Device> device)
    : serial_(next_serial++), abi_(abi), tasks_(std::move(tasks)), device_(device) {
  if (abi_.region == nullptr || abi_.turn == nullptr || abi_.edges == nullptr ||
      abi_.reset == nullptr || abi_.finish == nullptr) {
    status_ = Status::BadInput("region turns: no region or a region function missing");
    return;
  }
  int streams = 0;
  for (const Task& t : tasks_) {
    if (t.segment < 0 || t.micro_batch < 0 || t.stream < 0 || t.stream >= kMaxWaits) {
      status_ = Status::BadInput("region turns: a task with a negative index, or a stream past " +
                                 std::to_string(kMaxWaits - 1));
      return;
    }
    segments_ = std::max(segments_, t.segment + 1);
    splits_ = std::max(splits_, t.micro_batch + 1);
    streams = std::max(streams, t.stream + 1);
  }
  task_of_.assign(segments_, std::vector<int>(splits_, -1));
  for (int i = 0; i < static_cast<int>(tasks_.size()); ++i) {
    int& slot = task_of_[tasks_[i].segment][tasks_[i].micro_batch];
    if (slot >= 0) {
      status_ = Status::BadInput("region turns: two tasks of one segment and micro-batch");
      return;
    }
    slot = i;
  }
  if (tasks_.empty() || static_cast<int>(tasks_.size()) != segments_ * splits_) {
    status_ = Status::BadInput("region turns: not every micro-batch has every segment");
    return;
  }
  if (staggered) {
    for (int i = 0; i < static_cast<int>(tasks_.size()); ++i) {
      std::array<int, kMaxWaits> waits{};
      int signal = 0, count = 0;
      std::array<char, 512> err{};
      if (abi_.edges(abi_.region, i, &signal, waits.data(), kMaxWaits, &count, err.data(),
                     err.size()) != 0) {
        status_ = Status::BadInput(std::string("region turns: ") + err.data());
        return;
      }
      signals_.push_back(signal != 0);
      waits_.emplace_back(waits.begin(), waits.begin() + count);
    }
  }
  micro_batches_.resize(splits_);
  was_issued_.resize(tasks_.size());
  if (device_) {
    guard_.emplace(device_->type());
    for (int s = 0; s < streams; ++s) {
      streams_.push_back(guard_->getStreamFromGlobalPool(*device_, /*isHighPriority=*/false));
    }
    for (size_t i = 0; i < tasks_.size(); ++i) events_.emplace_back(device_->type());
    for (int mb = 0; mb < splits_; ++mb) ends_.emplace_back(device_->type());
    fork_.emplace(device_->type());
  }
}

Status RegionTurns::CheckCall(int mb) const {
  if (abi_.region == nullptr) return Status::Failure("region turns: the region was freed");
  if (mb < 0 || mb >= splits_) {
    return Status::BadInput("region turns: no micro-batch " + std::to_string(mb));
  }
  return Status::Ok();
}

Status RegionTurns::StartCall(bool inline_call, std::optional<c10::Stream> caller) {
  DF_RETURN_IF_ERROR(CheckCall(0));
  if (device_ && !caller) return Status::BadInput("region turns: no caller stream on a device");
  inline_ = inline_call && !waits_.empty();
  if (!inline_) abi_.reset(abi_.region);
  std::fill(micro_batches_.begin(), micro_batches_.end(), MicroBatch{});
  std::fill(was_issued_.begin(), was_issued_.end(), false);
  issued_.clear();
  extra_ = 0;
  if (device_) fork_->record(*caller);
  return Status::Ok();
}

Status RegionTurns::NextInline(int mb, bool first, int* task, bool* signal,
                               std::vector<int>* waits) {
  const int segment = first ? 0 : tasks_[micro_batches_[mb].task].segment + 1;
  if (segment >= segments_) {
    ++extra_;
    *task = -1;
    return Status::Ok();
  }
  *task = task_of_[segment][mb];
  *signal = signals_[*task];
  // An earlier micro-batch that ended before this segment recorded no event
  // for it.
  for (int w : waits_[*task]) {
    if (was_issued_[w]) waits->push_back(w);
  }
  was_issued_[*task] = true;
  issued_.push_back(*task);
  return Status::Ok();
}

Status RegionTurns::Take(int mb, bool first) {
  int task = -1;
  bool signal = false;
  std::vector<int> waits;
  if (inline_) {
    DF_RETURN_IF_ERROR(NextInline(mb, first, &task, &signal, &waits));
  } else {
    std::array<int, kMaxWaits> buffer{};
    int flag = 0, count = 0;
    std::array<char, 512> err{};
    if (abi_.turn(abi_.region, mb, first ? 1 : 0, &task, &flag, buffer.data(), kMaxWaits,
                  &count, err.data(), err.size()) != 0) {
      return Status::Failure(err.data());
    }
    signal = flag != 0;
    waits.assign(buffer.begin(), buffer.begin() + count);
  }
  if (task < 0) return Status::Ok();  // past the last segment: stays in it (counted)
  MicroBatch& m = micro_batches_[mb];
  m.task = task;
  m.signal = signal;
  if (!device_) return Status::Ok();
  const c10::Stream& stream = streams_[tasks_[task].stream];
  if (!m.saved) m.saved = Saved{guard_->getDevice(), guard_->getStream(*device_)};
  guard_->setDevice(*device_);
  guard_->exchangeStream(stream);
  if (first) fork_->block(stream);
  for (int w : waits) events_[w].block(stream);
  return Status::Ok();
}

void RegionTurns::EndTask(int mb) {
  const MicroBatch& m = micro_batches_[mb];
  if (m.signal && device_) events_[m.task].record(streams_[tasks_[m.task].stream]);
}

Status RegionTurns::Begin(int mb) {
  DF_RETURN_IF_ERROR(CheckCall(mb));
  return Take(mb, /*first=*/true);
}

Status RegionTurns::Stage(int mb) {
  DF_RETURN_IF_ERROR(CheckCall(mb));
  if (!micro_batches_[mb].cut) {
    micro_batches_[mb].cut = true;  // the first stage call lies inside segment 0
    return Status::Ok();
  }
  return Boundary(mb);
}

Status RegionTurns::Boundary(int mb) {
  DF_RETURN_IF_ERROR(CheckCall(mb));
  if (micro_batches_[mb].task < 0) {
    return Status::BadInput("region turns: micro-batch " + std::to_string(mb) + " has not begun");
  }
  EndTask(mb);
  return Take(mb, /*first=*/false);
}

Status RegionTurns::End(int mb) {
  DF_RETURN_IF_ERROR(CheckCall(mb));
  MicroBatch& m = micro_batches_[mb];
  // Each step is tried whatever the one before did; the first failure is
  // the one reported.
  Status status;
  auto attempt = [&status](auto&& step) {
    try {
      step();
    } catch (const std::exception& e) {
      if (status.ok()) status = Status::Failure(std::string("region turns: ") + e.what());
    }
  };
  if (m.task >= 0) {
    attempt([&] {
      EndTask(mb);
      if (device_) ends_[mb].record(streams_[tasks_[m.task].stream]);
    });
  }
  if (m.saved) {
    attempt([&] { guard_->exchangeStream(m.saved->stream); });
    attempt([&] { guard_->setDevice(m.saved->device); });
    m.saved.reset();
  }
  if (!inline_) abi_.finish(abi_.region, mb);
  return status;
}

Status RegionTurns::EndCall(std::optional<c10::Stream> caller) {
  DF_RETURN_IF_ERROR(CheckCall(0));
  if (!device_) return Status::Ok();
  if (!caller) return Status::BadInput("region turns: no caller stream on a device");
  for (c10::Event& e : ends_) e.block(*caller);
  return Status::Ok();
}

}  // namespace dynaflow
