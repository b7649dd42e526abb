#include "plugin/torch/region_turns.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "plugin/apply/dynaflow_apply.h"

namespace dynaflow {
namespace {

constexpr c10::DeviceType kFake = c10::DeviceType::PrivateUse1;

// A device whose streams and events are ids, and whose guard logs what a
// stream is asked to do, in order: "s<id> waits e<id>", "e<id> on s<id>"
// (a record). The thread's current device and stream are thread-local, as
// CUDA's are.
thread_local c10::DeviceIndex current_device = 0;
thread_local c10::StreamId current_stream = 0;

template <typename... Parts>
std::string Text(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

struct FakeLog {
  std::mutex mu;
  std::vector<std::string> lines;
  int next_event = 0;
  c10::StreamId next_stream = 100;

  void Add(std::string line) {
    std::lock_guard<std::mutex> lock(mu);
    if (fail_records && line.find(" on s") != std::string::npos) {
      TORCH_CHECK(false, "the fake device failed a record");
    }
    lines.push_back(std::move(line));
  }
  // Forgets what was logged; events recorded from now on are numbered anew.
  void Clear() {
    std::lock_guard<std::mutex> lock(mu);
    lines.clear();
    next_event = 0;
    fail_records = false;
  }
  void ClearLines() {
    std::lock_guard<std::mutex> lock(mu);
    lines.clear();
  }
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mu);
    return lines;
  }

  std::atomic<bool> fail_records{false};  // records throw, as after a device error
};
FakeLog& Log() {
  static FakeLog log;
  return log;
}

class FakeGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kFake; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kFake, current_device); }
  void setDevice(c10::Device d) const override { current_device = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, current_stream);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high*/) const override {
    std::lock_guard<std::mutex> lock(Log().mu);
    return c10::Stream(c10::Stream::UNSAFE, d, ++Log().next_stream);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream old = getStream(s.device());
    current_stream = s.id();
    return old;
  }
  void record(void** event, const c10::Stream& s, c10::DeviceIndex /*index*/,
              c10::EventFlag /*flag*/) const override {
    int id = 0;
    {
      std::lock_guard<std::mutex> lock(Log().mu);
      if (*event == nullptr) {
        *event = new int(++Log().next_event);
      }
      id = *static_cast<int*>(*event);
    }
    Log().Add(Text("e", id, " on s", s.id()));
  }
  void block(void* event, const c10::Stream& s) const override {
    Log().Add(Text("s", s.id(), " waits e", *static_cast<int*>(event)));
  }
  void destroyEvent(void* event, c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<int*>(event);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 2; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, FakeGuard);

// A region of libdynaflow_apply (its ABI compiled into this test), the one
// Python would make.
class Region {
 public:
  Region(int kind, int n, int splits) {
    char err[256] = {};
    handle_ = dynaflow_apply_region_new(kind, n, splits, err, sizeof(err));
    EXPECT_NE(handle_, nullptr) << err;
    const int count = dynaflow_apply_region_tasks(handle_, nullptr, nullptr, nullptr, nullptr, 0);
    std::vector<int> streams(count), segments(count), mbs(count);
    order_.resize(count);
    dynaflow_apply_region_tasks(handle_, streams.data(), segments.data(), mbs.data(),
                                order_.data(), count);
    for (int i = 0; i < count; ++i) tasks_.push_back({segments[i], mbs[i], streams[i]});
  }
  ~Region() { dynaflow_apply_region_free(handle_); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  RegionAbi abi() const {
    return RegionAbi{handle_, &dynaflow_apply_region_turn, &dynaflow_apply_region_edges,
                     &dynaflow_apply_region_reset, &dynaflow_apply_region_finish};
  }
  const std::vector<RegionTurns::Task>& tasks() const { return tasks_; }
  const std::vector<int>& order() const { return order_; }
  void* handle() const { return handle_; }
  std::vector<int> Executed() const {
    std::vector<int> out(tasks_.size());
    int skipped = 0, extra = 0;
    const int n = dynaflow_apply_region_executed(handle_, out.data(), static_cast<int>(out.size()),
                                                 &skipped, &extra);
    out.resize(n);
    return out;
  }
  // (signal, waits) of a task in the schedule.
  std::pair<bool, std::vector<int>> Edges(int task) const {
    int signal = 0, count = 0;
    std::vector<int> waits(64);
    char err[256] = {};
    EXPECT_EQ(dynaflow_apply_region_edges(handle_, task, &signal, waits.data(), 64, &count, err,
                                          sizeof(err)),
              DYNAFLOW_APPLY_OK);
    waits.resize(count);
    return {signal != 0, waits};
  }

 private:
  void* handle_ = nullptr;
  std::vector<RegionTurns::Task> tasks_;
  std::vector<int> order_;
};

// One micro-batch of a region call, as _apply's: Begin, a call of each of
// `stages` stage modules, End.
void RunMicroBatch(RegionTurns& turns, int mb, int stages) {
  ASSERT_TRUE(turns.Begin(mb).ok());
  for (int s = 0; s < stages; ++s) ASSERT_TRUE(turns.Stage(mb).ok());
  ASSERT_TRUE(turns.End(mb).ok());
}

TEST(RegionTurnsTest, RejectsAnAbiWithoutItsFunctionsOrAnIncompleteSchedule) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 2, 2);
  RegionAbi missing = region.abi();
  missing.finish = nullptr;
  EXPECT_EQ(RegionTurns(missing, region.tasks(), true, std::nullopt).status().code(),
            StatusCode::kBadInput);
  std::vector<RegionTurns::Task> partial = region.tasks();
  partial.pop_back();
  EXPECT_EQ(RegionTurns(region.abi(), partial, true, std::nullopt).status().code(),
            StatusCode::kBadInput);
  std::vector<RegionTurns::Task> twice = region.tasks();
  twice[1] = twice[0];
  EXPECT_EQ(RegionTurns(region.abi(), twice, true, std::nullopt).status().code(),
            StatusCode::kBadInput);
  EXPECT_TRUE(RegionTurns(region.abi(), region.tasks(), true, std::nullopt).status().ok());
}

// Two threads, one per micro-batch, started in reverse: the sequencer
// issues the tasks in the schedule's order all the same. A micro-batch's
// first stage call lies inside its first segment, so 4 segments take 4
// stage calls (3 turns after Begin).
TEST(RegionTurnsTest, TurnsThreadsThroughTheIssueOrder) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 4, 2);
  RegionTurns turns(region.abi(), region.tasks(), true, std::nullopt);
  ASSERT_TRUE(turns.status().ok());
  for (int call = 0; call < 3; ++call) {
    ASSERT_TRUE(turns.StartCall(false, std::nullopt).ok());
    std::thread second([&] { RunMicroBatch(turns, 1, 4); });
    std::thread first([&] { RunMicroBatch(turns, 0, 4); });
    second.join();
    first.join();
    EXPECT_EQ(region.Executed(), region.order()) << "call " << call;
    EXPECT_FALSE(turns.inline_call());
  }
}

TEST(RegionTurnsTest, InlineIssuesMicroBatchAfterMicroBatchAndCountsExtraBoundaries) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 3, 2);
  RegionTurns turns(region.abi(), region.tasks(), true, std::nullopt);
  ASSERT_TRUE(turns.StartCall(true, std::nullopt).ok());
  ASSERT_TRUE(turns.inline_call());
  RunMicroBatch(turns, 0, 3);
  RunMicroBatch(turns, 1, 5);  // two stage calls past its last segment
  // Task (segment j, micro-batch i) is j * 2 + i.
  EXPECT_EQ(turns.issued(), (std::vector<int>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(turns.extra(), 2);
  EXPECT_TRUE(region.Executed().empty()) << "an inline call does not turn the sequencer";

  // A dual-batch region has no inline calls: its turns stay.
  Region dual(DYNAFLOW_APPLY_DUAL_BATCH, 1, 2);
  RegionTurns dual_turns(dual.abi(), dual.tasks(), false, std::nullopt);
  ASSERT_TRUE(dual_turns.StartCall(true, std::nullopt).ok());
  EXPECT_FALSE(dual_turns.inline_call());
}

TEST(RegionTurnsTest, AnAbortedRegionFailsTheWaitingTurnWithItsReason) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 2, 2);
  RegionTurns turns(region.abi(), region.tasks(), true, std::nullopt);
  ASSERT_TRUE(turns.StartCall(false, std::nullopt).ok());
  Status waited;
  // Micro-batch 1's first task comes after micro-batch 0's; 0 never ends it.
  ASSERT_TRUE(turns.Begin(0).ok());
  std::thread blocked([&] { waited = turns.Begin(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  dynaflow_apply_region_abort(region.handle(), "micro-batch 0 failed");
  blocked.join();
  EXPECT_EQ(waited.code(), StatusCode::kFailure);
  EXPECT_NE(waited.message().find("micro-batch 0 failed"), std::string::npos) << waited.message();
  EXPECT_TRUE(turns.End(0).ok());
  EXPECT_TRUE(turns.End(1).ok());
  EXPECT_EQ(turns.Stage(7).code(), StatusCode::kBadInput);
}

// On a device, inline: what each stream waits for and records must be the
// schedule's edges, derived here from the region's own edges.
TEST(RegionTurnsTest, OnADeviceTasksRunOnTheirStreamsWithTheScheduleEdges) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 2, 2);
  const c10::Device device(kFake, 1);
  current_device = 0;
  current_stream = 7;  // the caller's
  Log().Clear();
  RegionTurns turns(region.abi(), region.tasks(), true, device);
  ASSERT_TRUE(turns.status().ok());
  const c10::Stream caller(c10::Stream::UNSAFE, c10::Device(kFake, 1), 7);
  ASSERT_TRUE(turns.StartCall(true, caller).ok());
  std::vector<std::pair<int, c10::StreamId>> ran;  // (micro-batch, stream) per segment
  for (int mb = 0; mb < 2; ++mb) {
    ASSERT_TRUE(turns.Begin(mb).ok());
    EXPECT_EQ(current_device, 1) << "the region's device is the thread's during the call";
    ran.emplace_back(mb, current_stream);
    ASSERT_TRUE(turns.Stage(mb).ok());  // inside segment 0
    current_device = 0;                 // the model's code moved the thread elsewhere
    ASSERT_TRUE(turns.Stage(mb).ok());  // segment 1
    EXPECT_EQ(current_device, 1) << "every task starts on the region's device";
    ran.emplace_back(mb, current_stream);
    ASSERT_TRUE(turns.End(mb).ok());
    EXPECT_EQ(current_stream, 7) << "End puts back the thread's stream";
    EXPECT_EQ(current_device, 0) << "and its device";
  }
  ASSERT_TRUE(turns.EndCall(caller).ok());

  // Each micro-batch on its own stream through both segments.
  ASSERT_EQ(ran.size(), 4u);
  EXPECT_EQ(ran[0].second, ran[1].second);
  EXPECT_EQ(ran[2].second, ran[3].second);
  EXPECT_NE(ran[0].second, ran[2].second);
  const c10::StreamId s0 = ran[0].second, s1 = ran[2].second;

  // The expected log from the schedule: events numbered as first recorded.
  std::map<std::string, int> ids;
  auto id = [&](const std::string& e) {
    return ids.emplace(e, static_cast<int>(ids.size()) + 1).first->second;
  };
  const std::string fork = "e" + std::to_string(id("fork"));
  std::vector<std::string> want = {fork + " on s7"};
  const std::vector<int> inline_order = {0, 2, 1, 3};  // mb 0's segments, then mb 1's
  for (int task : inline_order) {
    const int mb = region.tasks()[task].micro_batch;
    const std::string s = "s" + std::to_string(mb == 0 ? s0 : s1);
    if (region.tasks()[task].segment == 0) want.push_back(s + " waits " + fork);
    for (int w : region.Edges(task).second) {
      want.push_back(s + " waits e" + std::to_string(id("task" + std::to_string(w))));
    }
    if (region.Edges(task).first) {
      want.push_back("e" + std::to_string(id("task" + std::to_string(task))) + " on " + s);
    }
    if (region.tasks()[task].segment == 1) {
      want.push_back("e" + std::to_string(id("end" + std::to_string(mb))) + " on " + s);
    }
  }
  want.push_back("s7 waits e" + std::to_string(id("end0")));
  want.push_back("s7 waits e" + std::to_string(id("end1")));
  EXPECT_EQ(Log().Lines(), want);
  // The stagger: micro-batch 1's segment 0 (task 1) waits for micro-batch
  // 0's (task 0).
  EXPECT_EQ(region.Edges(1).second, std::vector<int>{0});
}

// On a device with turns: each micro-batch's thread runs on its own stream
// and gets its own back at End, and in every call each wait for a task's
// event comes after that event's record in the same call (the turn passed
// after the record; c10 drops a wait for an event never recorded, so only
// the call's own log is searched).
TEST(RegionTurnsTest, OnADeviceWithTurnsEveryWaitFollowsItsRecord) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 3, 2);
  Log().Clear();
  RegionTurns turns(region.abi(), region.tasks(), true, c10::Device(kFake, 0));
  const c10::Stream caller(c10::Stream::UNSAFE, c10::Device(kFake, 0), 7);
  int cross = 0;
  for (int task = 0; task < static_cast<int>(region.tasks().size()); ++task) {
    cross += static_cast<int>(region.Edges(task).second.size());
  }
  EXPECT_EQ(cross, 3);  // micro-batch 1's segments, each on micro-batch 0's
  for (int call = 0; call < 2; ++call) {
    Log().ClearLines();
    std::mutex mu;
    std::map<int, std::vector<c10::StreamId>> streams;  // per micro-batch, per segment
    std::map<int, c10::StreamId> after;                 // per micro-batch, after End
    ASSERT_TRUE(turns.StartCall(false, caller).ok());
    auto run = [&](int mb) {
      current_stream = 40 + mb;  // the worker thread's own
      ASSERT_TRUE(turns.Begin(mb).ok());
      std::vector<c10::StreamId> seen = {current_stream};
      ASSERT_TRUE(turns.Stage(mb).ok());  // inside segment 0
      for (int s = 1; s < 3; ++s) {
        ASSERT_TRUE(turns.Stage(mb).ok());
        seen.push_back(current_stream);
      }
      ASSERT_TRUE(turns.End(mb).ok());
      std::lock_guard<std::mutex> lock(mu);
      streams[mb] = seen;
      after[mb] = current_stream;
    };
    std::thread second(run, 1);
    std::thread first(run, 0);
    second.join();
    first.join();
    ASSERT_TRUE(turns.EndCall(caller).ok());
    EXPECT_EQ(region.Executed(), region.order()) << "call " << call;
    for (int mb = 0; mb < 2; ++mb) {
      ASSERT_EQ(streams[mb].size(), 3u);
      EXPECT_EQ(streams[mb][0], streams[mb][1]);
      EXPECT_EQ(streams[mb][0], streams[mb][2]);
      EXPECT_EQ(after[mb], 40 + mb) << "End puts back the thread's stream";
    }
    EXPECT_NE(streams[0][0], streams[1][0]);
    const std::vector<std::string> log = Log().Lines();
    int waits = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      const size_t at = log[i].find(" waits ");
      if (at == std::string::npos) continue;
      ++waits;
      const std::string event = log[i].substr(at + 7);
      bool recorded = false;
      for (size_t j = 0; j < i && !recorded; ++j) recorded = log[j].rfind(event + " on ", 0) == 0;
      EXPECT_TRUE(recorded) << log[i] << " at line " << i << " of call " << call
                            << ", before any record of " << event << " in it";
    }
    // The schedule's cross-stream waits, each micro-batch's wait for the
    // fork and the caller's for each end.
    EXPECT_EQ(waits, cross + 2 + 2) << "call " << call;
  }
}

// A device error in End (an event's record throws) still skips the
// micro-batch's remaining tasks, so the others' turns come, and puts back the
// thread's stream; End then says what failed.
TEST(RegionTurnsTest, AFailedRecordInEndStillLetsTheOthersRun) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 2, 2);
  Log().Clear();
  RegionTurns turns(region.abi(), region.tasks(), true, c10::Device(kFake, 0));
  const c10::Stream caller(c10::Stream::UNSAFE, c10::Device(kFake, 0), 7);
  ASSERT_TRUE(turns.StartCall(false, caller).ok());
  current_stream = 7;
  ASSERT_TRUE(turns.Begin(0).ok());
  Status second_began;
  std::thread second([&] {
    second_began = turns.Begin(1);  // its turn comes after micro-batch 0's first task
    Log().fail_records = false;
    EXPECT_TRUE(turns.End(1).ok());
  });
  Log().fail_records = true;
  const Status ended = turns.End(0);
  second.join();
  EXPECT_EQ(ended.code(), StatusCode::kFailure);
  EXPECT_NE(ended.message().find("the fake device failed a record"), std::string::npos)
      << ended.message();
  EXPECT_EQ(current_stream, 7) << "the thread's stream is back";
  EXPECT_TRUE(second_began.ok()) << second_began.message();
  EXPECT_EQ(region.Executed(), (std::vector<int>{0, 1}));
}

TEST(RegionTurnsTest, RefusesACallWithoutTheCallersStreamOnADeviceAndAfterDetach) {
  Region region(DYNAFLOW_APPLY_STAGGERED, 2, 2);
  RegionTurns turns(region.abi(), region.tasks(), true, c10::Device(kFake, 0));
  EXPECT_EQ(turns.StartCall(false, std::nullopt).code(), StatusCode::kBadInput);
  EXPECT_EQ(turns.EndCall(std::nullopt).code(), StatusCode::kBadInput);
  RegionTurns on_cpu(region.abi(), region.tasks(), true, std::nullopt);
  on_cpu.Detach();
  EXPECT_EQ(on_cpu.StartCall(false, std::nullopt).code(), StatusCode::kFailure);
  const Status began = on_cpu.Begin(0);
  EXPECT_EQ(began.code(), StatusCode::kFailure);
  EXPECT_NE(began.message().find("freed"), std::string::npos) << began.message();
  EXPECT_EQ(on_cpu.End(0).code(), StatusCode::kFailure);
}

}  // namespace
}  // namespace dynaflow
