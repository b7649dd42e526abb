// CUPTI activity records (CUDA 13 layouts) and framework operators into
// batches of the dynaflow Trace model, ready for TraceDbWriter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "analysis/model/trace.h"
#include "plugin/preload/cupti_api.h"
#include "plugin/preload/dynaflow_tracer.h"

namespace dynaflow {

struct ConverterOptions {
  int32_t rank = 0;
  int32_t pid = 0;  // the traced process: synchronization records name none
  // Correlation ids remembered for linking (rounded up to a power of two).
  size_t correlation_slots = size_t{1} << 18;
  // Records kept aside while they wait for an external correlation id.
  size_t max_waiting_records = size_t{1} << 18;
  // NVTX ranges started and not yet ended.
  size_t max_open_ranges = size_t{1} << 16;
  // CUDA events whose last record is remembered for the waits on them
  // (rounded up to a power of two): a program that creates events as it runs
  // gets new event ids, so the table keeps the most recent ones only.
  size_t event_slots = size_t{1} << 16;
  // The operator that captured CUDA graph node `id`, -1 when unknown
  // (GraphAttribution::OperatorOf): a replayed kernel, memcpy or memset links
  // to it instead of the operator of its cudaGraphLaunch. Unset: none.
  std::function<int64_t(uint64_t id)> graph_node_operator;
};

// What other records tell about one CUDA correlation id. CUDA hands out
// correlation ids in increasing order, so a fixed table indexed by the id's
// low bits remembers the most recent `slots` ids in bounded memory.
class CorrelationTable {
 public:
  struct Link {
    int64_t external_id = -1;  // from an ExternalCorrelation record
    int32_t tid = 0;           // from the runtime/driver API record
  };

  explicit CorrelationTable(size_t slots);
  // The link of `correlation`, or nullptr when unknown or overwritten.
  const Link* Find(uint32_t correlation) const;
  // The link of `correlation`, replacing whatever older id held its slot.
  Link& Upsert(uint32_t correlation);

 private:
  struct Slot {
    uint32_t correlation = 0;  // 0: empty (CUDA never uses 0)
    Link link;
  };
  std::vector<Slot> slots_;
  uint32_t mask_;
};

// Converts on one thread (the writer's). Names are resolved as records
// arrive: kernel names (owned by CUPTI) are copied and demangled, API names
// come from cuptiGetCallbackName without CUPTI's "_vNNNN" suffix. A kernel,
// memcpy, memset or API call is linked to the framework operator that
// launched it through the ExternalCorrelation record of its correlation id,
// in whichever order the two arrive: a record whose link is still unknown
// when its batch is taken waits in the next batch, once, before it is
// written unlinked. Synchronization records, which name no thread, take the
// thread of the API call with their correlation id the same way. They carry
// their stream and, for cudaStreamWaitEvent and cudaEventSynchronize, the
// stream and correlation id of the cudaEventRecord they wait for, as
// libkineto fills its cuda_sync args (the ApiCall sync fields): CUDA_EVENT
// records, which come at the record call, before any wait on it, say which
// (context, event) was last recorded where; they are not rows themselves. A
// wait on an event never seen recorded keeps -1 there and is counted. NVTX ranges
// are paired from start and end markers, their names kept verbatim (NCCL's
// included); a device is described by its first Device record, completed
// from the roofline's device table. Records of unknown kinds are counted in
// the batch's statistics, never fatal.
class ActivityConverter {
 public:
  explicit ActivityConverter(ConverterOptions options);

  // The CUPTI that reads buffers and names API calls. Until it is set (it
  // may never be, without CUPTI) only operators may be added.
  void set_cupti(CuptiApi* cupti) { cupti_ = cupti; }

  // Converts every record of a completed CUPTI buffer.
  void AddBuffer(uint8_t* buffer, size_t valid_size);
  void AddRecord(const CUpti_Activity& record);
  // An operator of this process; an id of 0 means "no external id".
  // `in_graph_capture`: it began during a CUDA graph capture.
  void AddOperator(const DynaflowOperatorRecord& op, bool in_graph_capture = false);

  // Records (rows) in the batch being built.
  size_t batch_rows() const;

  // Moves out the records built so far. Unless `release_all`, records still
  // waiting for their external correlation id for the first time move to the
  // next batch instead.
  Trace TakeBatch(bool release_all);

  // Counts the NVTX ranges still open as unterminated. Call once, before the
  // last TakeBatch.
  void EndOfTrace();

 private:
  struct WaitingRecord {
    bool is_api;     // else GPU activity
    uint32_t index;  // into batch_.api or batch_.gpu
    bool carried;    // already moved over from a previous batch
  };
  struct OpenRange {
    TimeNs start;
    std::string name;
    int32_t pid;
    int32_t tid;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void AddKernel(const CUpti_ActivityKernel10& k);
  void AddMemcpy(const CUpti_ActivityMemcpy6& m);
  void AddPeerMemcpy(const CUpti_ActivityMemcpyPtoP4& m);
  void AddMemset(const CUpti_ActivityMemset4& m);
  void AddApi(const CUpti_ActivityAPI& a);
  void AddSynchronization(const CUpti_ActivitySynchronization2& s);
  void AddCudaEvent(const CUpti_ActivityCudaEvent2& e);
  void FillEventWait(const CUpti_ActivitySynchronization2& s, ApiCall* a);
  void AddExternalCorrelation(const CUpti_ActivityExternalCorrelation& e);
  void AddMarker(const CUpti_ActivityMarker2& m);
  void AddDevice(const CUpti_ActivityDevice5& d);

  void AddGpu(GpuActivity g, uint32_t correlation);
  void AddApiCall(ApiCall a, uint32_t correlation);
  // Applies what is known of `correlation` to a record; true when the record
  // needs nothing more.
  bool ApplyLink(const CorrelationTable::Link& link, GpuActivity* g) const;
  bool ApplyLink(const CorrelationTable::Link& link, ApiCall* a) const;
  void Wait(uint32_t correlation, WaitingRecord record);
  void Relink(uint32_t correlation);
  void CarryOverWaiting(Trace* taken);

  uint32_t DeviceIndex(uint32_t device_id);
  StringId KernelName(const char* name);
  StringId ApiName(CUpti_CallbackDomain domain, uint32_t cbid);
  void Count(std::string_view stat, std::string_view severity, std::string_view description);

  CuptiApi* cupti_ = nullptr;
  ConverterOptions options_;
  Trace batch_;
  CorrelationTable links_;
  std::unordered_map<uint32_t, std::vector<WaitingRecord>> waiting_;
  size_t waiting_count_ = 0;
  std::unordered_map<uint32_t, OpenRange> open_ranges_;
  std::unordered_set<uint32_t> described_devices_;
  // The last cudaEventRecord of each (context << 32 | event id), from
  // CUDA_EVENT records, in a table indexed by the key's low bits: an event
  // whose slot a newer one took is forgotten (its waits are counted).
  struct EventRecord {
    bool used = false;
    uint64_t key = 0;
    uint32_t correlation = 0;
    uint32_t stream = 0;
    uint32_t device = 0;
  };
  std::vector<EventRecord> recorded_events_;
  EventRecord& EventSlot(uint64_t key);
  // The device of each CUDA context, learnt from kernels and CUDA_EVENT
  // records (synchronization records name a context, not a device).
  std::unordered_map<uint32_t, uint32_t> context_devices_;
  std::unordered_map<std::string, std::string, StringHash, std::equal_to<>> demangled_;
  std::unordered_map<uint64_t, std::string> api_names_;
};

// The number of records in a CUPTI buffer, e.g. to count a dropped one.
size_t CountActivityRecords(CuptiApi& cupti, uint8_t* buffer, size_t valid_size);

}  // namespace dynaflow
