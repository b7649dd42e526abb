#include "plugin/preload/activity_converter.h"

#include <cxxabi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstdlib>

#include "analysis/roofline/device_table.h"

namespace dynaflow {
namespace {

// CUpti_ActivityMemcpyKind, spelled as the nsys importer spells copy kinds.
constexpr std::array<std::string_view, 11> kCopyKinds = {
    "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};

// The CUDA call a CUpti_ActivitySynchronizationType stands for, as the nsys
// importer names synchronization records.
std::string_view SyncName(CUpti_ActivitySynchronizationType type) {
  switch (type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "cudaStreamWaitEvent";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "cudaDeviceSynchronize";
    default: return "cudaSynchronize";
  }
}

// `name` without CUPTI's API version suffix: cudaLaunchKernel_v7000 -> cudaLaunchKernel.
std::string_view StripApiVersion(std::string_view name) {
  const size_t v = name.rfind("_v");
  if (v == std::string_view::npos || v == 0 || v + 2 == name.size()) return name;
  const std::string_view digits = name.substr(v + 2);
  const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  return all_digits ? name.substr(0, v) : name;
}

// The demangled form of an Itanium-mangled name, or the name itself.
std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = (status == 0 && demangled != nullptr) ? demangled : name;
  std::free(demangled);
  return out;
}

int64_t OptionalId(uint64_t id) { return id == 0 ? -1 : static_cast<int64_t>(id); }

TimeNs Ns(uint64_t timestamp) { return static_cast<TimeNs>(timestamp); }

// CUDA event ids are unique within their context.
uint64_t EventKey(uint32_t context, uint32_t event) {
  return (static_cast<uint64_t>(context) << 32) | event;
}

// The fields every CUPTI record of GPU work has (kernel, memcpy, memset).
template <typename Record>
GpuActivity GpuFields(GpuKind kind, const Record& r, uint32_t device_index) {
  GpuActivity g;
  g.kind = kind;
  g.start = Ns(r.start);
  g.end = Ns(r.end);
  g.device_index = device_index;
  g.stream = static_cast<int32_t>(r.streamId);
  g.graph_id = OptionalId(r.graphId);  // 0: not launched from a CUDA graph
  g.graph_node = OptionalId(r.graphNodeId);
  return g;
}

Pass PassOf(int32_t pass) {
  switch (pass) {
    case DYNAFLOW_PASS_FORWARD: return Pass::kForward;
    case DYNAFLOW_PASS_BACKWARD: return Pass::kBackward;
    default: return Pass::kUnknown;
  }
}

template <typename T>
void EraseMarked(std::vector<T>* records, const std::vector<bool>& marked) {
  size_t kept = 0;
  for (size_t i = 0; i < records->size(); ++i) {
    if (!marked[i]) (*records)[kept++] = (*records)[i];
  }
  records->resize(kept);
}

}  // namespace

CorrelationTable::CorrelationTable(size_t slots)
    : slots_(std::bit_ceil(std::max<size_t>(slots, 1))),
      mask_(static_cast<uint32_t>(slots_.size() - 1)) {}

const CorrelationTable::Link* CorrelationTable::Find(uint32_t correlation) const {
  const Slot& slot = slots_[correlation & mask_];
  return slot.correlation == correlation && correlation != 0 ? &slot.link : nullptr;
}

CorrelationTable::Link& CorrelationTable::Upsert(uint32_t correlation) {
  Slot& slot = slots_[correlation & mask_];
  if (slot.correlation != correlation) slot = Slot{correlation, Link{}};
  return slot.link;
}

ActivityConverter::ActivityConverter(ConverterOptions options)
    : options_(options),
      links_(options.correlation_slots),
      recorded_events_(std::bit_ceil(std::max<size_t>(options.event_slots, 1))) {}

void ActivityConverter::AddBuffer(uint8_t* buffer, size_t valid_size) {
  CUpti_Activity* record = nullptr;
  CUptiResult result = CUPTI_ERROR_NOT_INITIALIZED;
  while (cupti_ != nullptr &&
         (result = cupti_->ActivityGetNextRecord(buffer, valid_size, &record)) == CUPTI_SUCCESS) {
    AddRecord(*record);
  }
  if (result != CUPTI_ERROR_MAX_LIMIT_REACHED) {
    Count("cupti_unreadable_buffer", "data_loss",
          "CUPTI buffers whose records could not all be read; the rest was skipped");
  }
}

void ActivityConverter::AddRecord(const CUpti_Activity& record) {
  // Every CUPTI record starts with its kind; the layout follows from it.
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return AddKernel(reinterpret_cast<const CUpti_ActivityKernel10&>(record));
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return AddMemcpy(reinterpret_cast<const CUpti_ActivityMemcpy6&>(record));
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
      return AddPeerMemcpy(reinterpret_cast<const CUpti_ActivityMemcpyPtoP4&>(record));
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return AddMemset(reinterpret_cast<const CUpti_ActivityMemset4&>(record));
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
      return AddApi(reinterpret_cast<const CUpti_ActivityAPI&>(record));
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      return AddSynchronization(reinterpret_cast<const CUpti_ActivitySynchronization2&>(record));
    case CUPTI_ACTIVITY_KIND_CUDA_EVENT:
      return AddCudaEvent(reinterpret_cast<const CUpti_ActivityCudaEvent2&>(record));
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
      return AddExternalCorrelation(
          reinterpret_cast<const CUpti_ActivityExternalCorrelation&>(record));
    case CUPTI_ACTIVITY_KIND_MARKER:
      return AddMarker(reinterpret_cast<const CUpti_ActivityMarker2&>(record));
    case CUPTI_ACTIVITY_KIND_DEVICE:
      return AddDevice(reinterpret_cast<const CUpti_ActivityDevice5&>(record));
    default:
      Count("cupti_unknown_activity_kind", "info",
            "CUPTI activity records of kinds the tracer does not convert; skipped");
  }
}

void ActivityConverter::AddOperator(const DynaflowOperatorRecord& op, bool in_graph_capture) {
  Operator o;
  o.start = op.start_ns;
  o.end = op.end_ns;
  o.external_id = OptionalId(op.id);
  o.sequence = op.sequence;
  o.rank = options_.rank;
  o.pid = options_.pid;
  o.tid = op.tid;
  o.name = batch_.strings.Intern(op.name != nullptr ? op.name : "");
  o.input_shapes = batch_.strings.Intern(op.input_shapes != nullptr ? op.input_shapes : "");
  o.input_types = batch_.strings.Intern(op.input_types != nullptr ? op.input_types : "");
  o.module_path = batch_.strings.Intern(op.module_path != nullptr ? op.module_path : "");
  o.collective = batch_.strings.Intern(op.collective != nullptr ? op.collective : "");
  o.pass = PassOf(op.pass);
  o.in_graph_capture = in_graph_capture;
  batch_.ops.push_back(o);
}

size_t ActivityConverter::batch_rows() const {
  return batch_.gpu.size() + batch_.api.size() + batch_.ops.size() + batch_.ranges.size();
}

Trace ActivityConverter::TakeBatch(bool release_all) {
  Trace taken = std::move(batch_);
  batch_ = Trace();
  if (release_all) {
    waiting_.clear();
    waiting_count_ = 0;
  } else {
    CarryOverWaiting(&taken);
  }
  return taken;
}

void ActivityConverter::EndOfTrace() {
  if (open_ranges_.empty()) return;
  batch_.stats.Add("nvtx_unterminated_range", "data_loss",
                   "NVTX ranges that never ended before the trace did; skipped",
                   static_cast<int64_t>(open_ranges_.size()));
  open_ranges_.clear();
}

void ActivityConverter::AddKernel(const CUpti_ActivityKernel10& k) {
  context_devices_[k.contextId] = k.deviceId;
  GpuActivity g = GpuFields(GpuKind::kKernel, k, DeviceIndex(k.deviceId));
  g.name = KernelName(k.name);
  g.grid[0] = k.gridX;
  g.grid[1] = k.gridY;
  g.grid[2] = k.gridZ;
  g.block[0] = k.blockX;
  g.block[1] = k.blockY;
  g.block[2] = k.blockZ;
  g.registers = k.registersPerThread;
  g.shared_memory = k.staticSharedMemory + k.dynamicSharedMemory;
  AddGpu(g, k.correlationId);
}

void ActivityConverter::AddMemcpy(const CUpti_ActivityMemcpy6& m) {
  const std::string_view kind = kCopyKinds[m.copyKind < kCopyKinds.size() ? m.copyKind : 0];
  GpuActivity g = GpuFields(GpuKind::kMemcpy, m, DeviceIndex(m.deviceId));
  g.name = batch_.strings.Intern("Memcpy " + std::string(kind));
  g.copy_kind = batch_.strings.Intern(kind);
  g.bytes = static_cast<int64_t>(m.bytes);
  AddGpu(g, m.correlationId);
}

void ActivityConverter::AddPeerMemcpy(const CUpti_ActivityMemcpyPtoP4& m) {
  GpuActivity g = GpuFields(GpuKind::kMemcpy, m, DeviceIndex(m.deviceId));
  g.name = batch_.strings.Intern("Memcpy PtoP");
  g.copy_kind = batch_.strings.Intern("PtoP");
  g.bytes = static_cast<int64_t>(m.bytes);
  AddGpu(g, m.correlationId);
}

void ActivityConverter::AddMemset(const CUpti_ActivityMemset4& m) {
  GpuActivity g = GpuFields(GpuKind::kMemset, m, DeviceIndex(m.deviceId));
  g.name = batch_.strings.Intern("Memset");
  g.bytes = static_cast<int64_t>(m.bytes);
  AddGpu(g, m.correlationId);
}

void ActivityConverter::AddApi(const CUpti_ActivityAPI& r) {
  const bool driver = r.kind == CUPTI_ACTIVITY_KIND_DRIVER;
  ApiCall a;
  a.kind = driver ? ApiKind::kDriver : ApiKind::kRuntime;
  a.start = Ns(r.start);
  a.end = Ns(r.end);
  a.rank = options_.rank;
  a.pid = static_cast<int32_t>(r.processId);
  a.tid = static_cast<int32_t>(r.threadId);
  a.name = ApiName(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, r.cbid);
  if (r.correlationId != 0) {
    // Synchronization records of this call learn its thread from here.
    links_.Upsert(r.correlationId).tid = a.tid;
    Relink(r.correlationId);
  }
  AddApiCall(a, r.correlationId);
}

void ActivityConverter::AddSynchronization(const CUpti_ActivitySynchronization2& s) {
  ApiCall a;
  a.kind = ApiKind::kSync;
  a.start = Ns(s.start);
  a.end = Ns(s.end);
  a.rank = options_.rank;
  a.pid = options_.pid;
  a.name = batch_.strings.Intern(SyncName(s.type));
  if (s.streamId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) {
    a.sync_stream = static_cast<int32_t>(s.streamId);
  }
  if (auto it = context_devices_.find(s.contextId); it != context_devices_.end()) {
    a.sync_device = static_cast<int32_t>(it->second);
  }
  FillEventWait(s, &a);
  AddApiCall(a, s.correlationId);
}

void ActivityConverter::FillEventWait(const CUpti_ActivitySynchronization2& s, ApiCall* a) {
  if (s.cudaEventId == CUPTI_SYNCHRONIZATION_INVALID_VALUE ||
      (s.type != CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT &&
       s.type != CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE)) {
    return;
  }
  a->wait_event_id = s.cudaEventId;
  const uint64_t key = EventKey(s.contextId, s.cudaEventId);
  const EventRecord& recorded = EventSlot(key);
  if (!recorded.used || recorded.key != key) {
    Count("cupti_wait_on_unrecorded_event", "info",
          "event waits and syncs on an event whose cudaEventRecord the trace did not see; "
          "written without the stream they wait for");
    return;
  }
  a->wait_on_stream = static_cast<int32_t>(recorded.stream);
  a->wait_event_correlation = OptionalId(recorded.correlation);
  if (a->sync_device < 0) a->sync_device = static_cast<int32_t>(recorded.device);
}

ActivityConverter::EventRecord& ActivityConverter::EventSlot(uint64_t key) {
  return recorded_events_[key & (recorded_events_.size() - 1)];
}

void ActivityConverter::AddCudaEvent(const CUpti_ActivityCudaEvent2& e) {
  context_devices_[e.contextId] = e.deviceId;
  const uint64_t key = EventKey(e.contextId, e.eventId);
  EventSlot(key) = EventRecord{true, key, e.correlationId, e.streamId, e.deviceId};
}

void ActivityConverter::AddExternalCorrelation(const CUpti_ActivityExternalCorrelation& e) {
  // The tracer pushes its operator ids as kOperatorCorrelationKind; other
  // kinds belong to other tools in the process (torch.profiler's Kineto).
  if (e.externalKind != kOperatorCorrelationKind) {
    Count("cupti_foreign_external_correlation", "info",
          "external correlation records of other tools (torch.profiler's, say); ignored");
    return;
  }
  if (e.correlationId == 0) return;
  links_.Upsert(e.correlationId).external_id = static_cast<int64_t>(e.externalId);
  Relink(e.correlationId);
}

void ActivityConverter::AddMarker(const CUpti_ActivityMarker2& m) {
  if (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
    Count("nvtx_mark", "info", "NVTX marks (instants, not ranges); not stored");
    return;
  }
  if (m.timestamp == 0) {
    Count("nvtx_marker_without_timestamp", "data_loss",
          "NVTX range starts or ends CUPTI could not time; skipped");
    return;
  }
  if (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
    if (open_ranges_.size() >= options_.max_open_ranges) {
      Count("nvtx_too_many_open_ranges", "data_loss",
            "NVTX ranges started while too many others were open; skipped");
      return;
    }
    const bool on_thread = m.objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ||
                           m.objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS;
    open_ranges_[m.id] = OpenRange{Ns(m.timestamp), m.name != nullptr ? m.name : "",
                                   on_thread ? static_cast<int32_t>(m.objectId.pt.processId) : 0,
                                   on_thread ? static_cast<int32_t>(m.objectId.pt.threadId) : 0};
    return;
  }
  if (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
    auto it = open_ranges_.find(m.id);
    if (it == open_ranges_.end()) {
      Count("nvtx_unmatched_range_end", "data_loss", "NVTX range ends without a start; skipped");
      return;
    }
    Range r;
    r.start = it->second.start;
    r.end = Ns(m.timestamp);
    r.rank = options_.rank;
    r.pid = it->second.pid;
    r.tid = it->second.tid;
    r.name = batch_.strings.Intern(it->second.name);
    r.domain = RangeDomain::kNvtx;
    batch_.ranges.push_back(r);
    open_ranges_.erase(it);
  }
}

void ActivityConverter::AddDevice(const CUpti_ActivityDevice5& d) {
  if (!described_devices_.insert(d.id).second) return;  // properties are written once
  DeviceInfo& info = batch_.devices[DeviceIndex(d.id)];
  info.name = d.name != nullptr ? d.name : "";
  info.sm_count = static_cast<int32_t>(d.numMultiprocessors);
  info.cc_major = static_cast<int32_t>(d.computeCapabilityMajor);
  info.cc_minor = static_cast<int32_t>(d.computeCapabilityMinor);
  info.memory_bytes = static_cast<int64_t>(d.globalMemorySize);
  info.clock_khz = static_cast<int32_t>(d.coreClockRate);
  info.memory_bandwidth_gbps = static_cast<double>(d.globalMemoryBandwidth) / 1e6;  // from KB/s
  FillFromDeviceTable(&info);  // peak FLOP/s per dtype, which CUPTI does not report
  // The model has no L2 column; the roofline may want it, so it goes in meta.
  batch_.metadata["device" + std::to_string(d.id) + ".l2_cache_bytes"] =
      std::to_string(d.l2CacheSize);
}

// A record CUPTI handed over before the GPU filled in its times (a forced
// flush at exit returns incomplete records) has a zero start or ends before it
// starts: written as it is, it would stretch the timeline to the epoch.
bool Untimed(TimeNs start, TimeNs end) { return start <= 0 || end < start; }

void ActivityConverter::AddGpu(GpuActivity g, uint32_t correlation) {
  if (Untimed(g.start, g.end)) {
    Count("cupti_untimed_record", "data_loss",
          "GPU or API records without valid timestamps (flushed before they completed); dropped");
    return;
  }
  g.correlation = OptionalId(correlation);
  g.pid = options_.pid;
  if (g.graph_node >= 0 && options_.graph_node_operator) {
    g.external_id = options_.graph_node_operator(static_cast<uint64_t>(g.graph_node));
  }
  const CorrelationTable::Link* link = links_.Find(correlation);
  const bool linked = link != nullptr && ApplyLink(*link, &g);
  batch_.gpu.push_back(g);
  if (!linked && correlation != 0) {
    Wait(correlation, {false, static_cast<uint32_t>(batch_.gpu.size() - 1), false});
  }
}

void ActivityConverter::AddApiCall(ApiCall a, uint32_t correlation) {
  if (Untimed(a.start, a.end)) {
    Count("cupti_untimed_record", "data_loss",
          "GPU or API records without valid timestamps (flushed before they completed); dropped");
    return;
  }
  a.correlation = OptionalId(correlation);
  const CorrelationTable::Link* link = links_.Find(correlation);
  const bool linked = link != nullptr && ApplyLink(*link, &a);
  batch_.api.push_back(a);
  if (!linked && correlation != 0) {
    Wait(correlation, {true, static_cast<uint32_t>(batch_.api.size() - 1), false});
  }
}

bool ActivityConverter::ApplyLink(const CorrelationTable::Link& link, GpuActivity* g) const {
  if (g->external_id < 0) g->external_id = link.external_id;
  return g->external_id >= 0;
}

bool ActivityConverter::ApplyLink(const CorrelationTable::Link& link, ApiCall* a) const {
  if (a->external_id < 0) a->external_id = link.external_id;
  if (a->tid == 0) a->tid = link.tid;
  return a->external_id >= 0 && a->tid != 0;
}

void ActivityConverter::Wait(uint32_t correlation, WaitingRecord record) {
  if (waiting_count_ >= options_.max_waiting_records) {
    Count("tracer_unlinked_records", "info",
          "GPU activities and API calls written without waiting for a late external "
          "correlation id, because too many were waiting");
    return;
  }
  waiting_[correlation].push_back(record);
  ++waiting_count_;
}

void ActivityConverter::Relink(uint32_t correlation) {
  auto it = waiting_.find(correlation);
  const CorrelationTable::Link* link = links_.Find(correlation);
  if (it == waiting_.end() || link == nullptr) return;
  std::erase_if(it->second, [&](const WaitingRecord& w) {
    const bool done = w.is_api ? ApplyLink(*link, &batch_.api[w.index])
                               : ApplyLink(*link, &batch_.gpu[w.index]);
    waiting_count_ -= done ? 1 : 0;
    return done;
  });
  if (it->second.empty()) waiting_.erase(it);
}

void ActivityConverter::CarryOverWaiting(Trace* taken) {
  std::vector<bool> moved_gpu(taken->gpu.size(), false);
  std::vector<bool> moved_api(taken->api.size(), false);
  std::unordered_map<uint32_t, std::vector<WaitingRecord>> still_waiting;
  size_t still_count = 0;
  for (const auto& [correlation, records] : waiting_) {
    for (const WaitingRecord& w : records) {
      if (w.carried) continue;  // waited one batch already: written unlinked
      uint32_t index;
      if (w.is_api) {
        ApiCall a = taken->api[w.index];
        a.name = batch_.strings.Intern(taken->strings.Get(a.name));
        index = static_cast<uint32_t>(batch_.api.size());
        batch_.api.push_back(a);
        moved_api[w.index] = true;
      } else {
        GpuActivity g = taken->gpu[w.index];
        const DeviceInfo& device = taken->devices[g.device_index];
        g.device_index = batch_.DeviceIndex(device.rank, device.device);
        g.name = batch_.strings.Intern(taken->strings.Get(g.name));
        g.copy_kind = batch_.strings.Intern(taken->strings.Get(g.copy_kind));
        index = static_cast<uint32_t>(batch_.gpu.size());
        batch_.gpu.push_back(g);
        moved_gpu[w.index] = true;
      }
      still_waiting[correlation].push_back({w.is_api, index, true});
      ++still_count;
    }
  }
  waiting_ = std::move(still_waiting);
  waiting_count_ = still_count;
  EraseMarked(&taken->gpu, moved_gpu);
  EraseMarked(&taken->api, moved_api);
}

uint32_t ActivityConverter::DeviceIndex(uint32_t device_id) {
  return batch_.DeviceIndex(options_.rank, static_cast<int32_t>(device_id));
}

StringId ActivityConverter::KernelName(const char* name) {
  if (name == nullptr) return batch_.strings.Intern("unknown_kernel");
  const std::string_view mangled(name);
  if (!mangled.starts_with("_Z")) return batch_.strings.Intern(mangled);
  auto it = demangled_.find(mangled);
  if (it == demangled_.end()) it = demangled_.emplace(mangled, Demangle(name)).first;
  return batch_.strings.Intern(it->second);
}

StringId ActivityConverter::ApiName(CUpti_CallbackDomain domain, uint32_t cbid) {
  const uint64_t key = (static_cast<uint64_t>(domain) << 32) | cbid;
  auto it = api_names_.find(key);
  if (it == api_names_.end()) {
    const char* name = nullptr;
    std::string resolved;
    if (cupti_ != nullptr && cupti_->GetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS &&
        name != nullptr) {
      resolved = StripApiVersion(name);
    } else {
      resolved = std::string(domain == CUPTI_CB_DOMAIN_DRIVER_API ? "CUDA driver API "
                                                                  : "CUDA runtime API ") +
                 std::to_string(cbid);
    }
    it = api_names_.emplace(key, std::move(resolved)).first;
  }
  return batch_.strings.Intern(it->second);
}

void ActivityConverter::Count(std::string_view stat, std::string_view severity,
                              std::string_view description) {
  batch_.stats.Add(stat, severity, description);
}

size_t CountActivityRecords(CuptiApi& cupti, uint8_t* buffer, size_t valid_size) {
  size_t n = 0;
  CUpti_Activity* record = nullptr;
  while (cupti.ActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) ++n;
  return n;
}

}  // namespace dynaflow
