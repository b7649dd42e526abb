// A tracer that keeps records in memory, for the tests of the operator
// recorder: fake_tracer_abi_testing.cc defines the tracer's C ABI
// (plugin/preload/dynaflow_tracer.h). A test executable lists that file among
// its sources and exports its symbols (ENABLE_EXPORTS), so FindTracerAbi
// resolves them as it resolves libdynaflow_preload.so's in a traced process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dynaflow::testing_abi {

struct Recorded {
  uint64_t id;
  int64_t start_ns, end_ns, sequence;
  int32_t tid, pass;
  std::string name, shapes, types, module_path, collective;
};

struct FakeTracer {
  std::atomic<int> active{1};
  std::atomic<int> active_queries{0};
  std::atomic<uint64_t> next_id{1};
  std::atomic<int64_t> clock{0};
  std::atomic<int64_t> unbalanced{0};  // records whose id was not the last popped one
  std::mutex mutex;
  std::vector<Recorded> records;
};
extern FakeTracer g_tracer;

// Operator ids pushed on the calling thread and not popped yet.
size_t PushedOnThisThread();

}  // namespace dynaflow::testing_abi
