#include "plugin/preload/fake_cupti_api.h"

#include <cupti_runtime_cbid.h>

#include <cstring>

namespace dynaflow {
namespace {

size_t PaddedSize(size_t size) { return (size + 7) / 8 * 8; }

}  // namespace

void FakeActivityBuffer::Append(const void* record, size_t size) {
  const size_t at = words_.size();
  words_.resize(at + 1 + PaddedSize(size) / 8, 0);
  words_[at] = size;
  std::memcpy(&words_[at + 1], record, size);
  ++records_;
}

bool FakeCuptiApi::CompleteBuffer(const FakeActivityBuffer& records, size_t dropped) {
  CUpti_BuffersCallbackRequestFunc request;
  CUpti_BuffersCallbackCompleteFunc complete;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request = request_;
    complete = complete_;
    dropped_ = dropped;
  }
  if (request == nullptr || complete == nullptr) return false;
  uint8_t* buffer = nullptr;
  size_t size = 0;
  size_t max_records = 0;
  request(&buffer, &size, &max_records);
  if (buffer == nullptr || size < records.size()) {
    complete(nullptr, 0, buffer, size, 0);  // CUPTI returns every buffer it was given
    return false;
  }
  std::memcpy(buffer, records.data(), records.size());
  complete(nullptr, 0, buffer, size, records.size());
  return true;
}

void FakeCuptiApi::CompleteAtNextFlush(FakeActivityBuffer records) {
  std::lock_guard<std::mutex> lock(mu_);
  at_next_flush_.push_back(std::move(records));
}

void FakeCuptiApi::FailEnable(CUpti_ActivityKind kind, CUptiResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  enable_failures_[kind] = result;
}

void FakeCuptiApi::SetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  callback_names_[{domain, cbid}] = std::move(name);
}

bool FakeCuptiApi::enabled(CUpti_ActivityKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return enabled_.count(kind) > 0;
}

bool FakeCuptiApi::callbacks_registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return request_ != nullptr && complete_ != nullptr;
}

bool FakeCuptiApi::timestamp_callback_registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clock_ != nullptr;
}

CUpti_TimestampCallbackFunc FakeCuptiApi::timestamp_callback() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clock_;
}

int FakeCuptiApi::flush_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushes_;
}

int FakeCuptiApi::nvtx_initializations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nvtx_initializations_;
}

std::vector<int64_t> FakeCuptiApi::external_id_log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return external_id_log_;
}

CUptiResult FakeCuptiApi::ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete) {
  std::lock_guard<std::mutex> lock(mu_);
  request_ = request;
  complete_ = complete;
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc clock) {
  std::lock_guard<std::mutex> lock(mu_);
  clock_ = clock;
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::SetThreadIdType(CUpti_ActivityThreadIdType) { return CUPTI_SUCCESS; }

CUptiResult FakeCuptiApi::ActivityEnable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = enable_failures_.find(kind); it != enable_failures_.end()) return it->second;
  enabled_.insert(kind);
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!per_api_control_) return CUPTI_ERROR_NOT_SUPPORTED;
  if (enable != 0) {
    disabled_driver_apis_.erase(cbid);
  } else {
    disabled_driver_apis_.insert(cbid);
  }
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!per_api_control_) return CUPTI_ERROR_NOT_SUPPORTED;
  if (enable != 0) {
    disabled_runtime_apis_.erase(cbid);
  } else {
    disabled_runtime_apis_.insert(cbid);
  }
  return CUPTI_SUCCESS;
}

std::set<CUpti_CallbackId> FakeCuptiApi::disabled_driver_apis() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disabled_driver_apis_;
}

std::set<CUpti_CallbackId> FakeCuptiApi::disabled_runtime_apis() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disabled_runtime_apis_;
}

CUptiResult FakeCuptiApi::ActivityDisable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_.erase(kind);
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                                CUpti_Activity** record) {
  size_t at = 0;
  if (*record != nullptr) {
    const uint8_t* current = reinterpret_cast<const uint8_t*>(*record);
    uint64_t size;
    std::memcpy(&size, current - sizeof(uint64_t), sizeof(size));
    at = static_cast<size_t>(current - buffer) + PaddedSize(size);
  }
  if (at + sizeof(uint64_t) > valid_size) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + at + sizeof(uint64_t));
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityFlushAll(uint32_t) {
  std::vector<FakeActivityBuffer> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++flushes_;
    pending.swap(at_next_flush_);
  }
  for (const FakeActivityBuffer& records : pending) CompleteBuffer(records);
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  *dropped = dropped_;
  dropped_ = 0;
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind,
                                                            uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  external_ids_.push_back(id);
  external_id_log_.push_back(static_cast<int64_t>(id));
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::ActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind,
                                                           uint64_t* id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (external_ids_.empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  *id = external_ids_.back();
  external_ids_.pop_back();
  external_id_log_.push_back(-static_cast<int64_t>(*id));
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                                          const char** name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = callback_names_.find({domain, cbid});
  if (it == callback_names_.end()) return CUPTI_ERROR_INVALID_PARAMETER;
  *name = it->second.c_str();
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::GetResultString(CUptiResult, const char** text) {
  *text = "CUPTI_ERROR_FAKE";
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::GetVersion(uint32_t* version) {
  *version = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

CUresult FakeCuptiApi::DriverGetVersion(int* version) {
  *version = kFakeDriverVersion;
  return CUDA_SUCCESS;
}

int FakeCuptiApi::InitializeInjectionNvtx2(NvtxGetExportTable) {
  std::lock_guard<std::mutex> lock(mu_);
  ++nvtx_initializations_;
  return 1;
}

void FakeCuptiApi::HoldSubscriptionElsewhere(bool held) {
  std::lock_guard<std::mutex> lock(mu_);
  held_elsewhere_ = held;
}

bool FakeCuptiApi::subscribed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return subscriber_ != nullptr;
}

bool FakeCuptiApi::callback_enabled(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return enabled_callbacks_.count({domain, cbid}) > 0;
}

bool FakeCuptiApi::EmitGraphCallback(CUpti_CallbackIdResource cbid, CUpti_GraphData data) {
  CUpti_CallbackFunc callback;
  void* userdata;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (subscriber_ == nullptr || !enabled_callbacks_.count({CUPTI_CB_DOMAIN_RESOURCE, cbid})) {
      return false;
    }
    callback = subscriber_;
    userdata = subscriber_data_;
  }
  CUpti_ResourceData resource = {};
  resource.resourceDescriptor = &data;
  callback(userdata, CUPTI_CB_DOMAIN_RESOURCE, cbid, &resource);
  return true;
}

bool FakeCuptiApi::EmitApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                   CUpti_ApiCallbackSite site, const void* params, int result) {
  CUpti_CallbackFunc callback;
  void* userdata;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (subscriber_ == nullptr || !enabled_callbacks_.count({domain, cbid})) return false;
    callback = subscriber_;
    userdata = subscriber_data_;
  }
  CUpti_CallbackData data = {};
  data.callbackSite = site;
  data.functionParams = params;
  data.functionReturnValue = site == CUPTI_API_EXIT ? &result : nullptr;
  callback(userdata, domain, cbid, &data);
  return true;
}

bool FakeCuptiApi::EmitBeginCapture(uintptr_t stream, int result) {
  const cudaStreamBeginCapture_v10000_params p = {reinterpret_cast<cudaStream_t>(stream),
                                                  cudaStreamCaptureModeGlobal};
  constexpr CUpti_CallbackId kBegin = CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000;
  return EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, kBegin, CUPTI_API_ENTER, &p, 0) &&
         EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, kBegin, CUPTI_API_EXIT, &p, result);
}

bool FakeCuptiApi::EmitEndCapture(uintptr_t stream, int result) {
  cudaGraph_t graph = nullptr;
  const cudaStreamEndCapture_v10000_params p = {reinterpret_cast<cudaStream_t>(stream), &graph};
  constexpr CUpti_CallbackId kEnd = CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_v10000;
  return EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, kEnd, CUPTI_API_ENTER, &p, 0) &&
         EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, kEnd, CUPTI_API_EXIT, &p, result);
}

CUptiResult FakeCuptiApi::Subscribe(CUpti_SubscriberHandle* subscriber,
                                    CUpti_CallbackFunc callback, void* userdata) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_elsewhere_ || subscriber_ != nullptr) {
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  subscriber_ = callback;
  subscriber_data_ = userdata;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(this);
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::Unsubscribe(CUpti_SubscriberHandle subscriber) {
  std::lock_guard<std::mutex> lock(mu_);
  if (subscriber != reinterpret_cast<CUpti_SubscriberHandle>(this) || subscriber_ == nullptr) {
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  subscriber_ = nullptr;
  subscriber_data_ = nullptr;
  enabled_callbacks_.clear();
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::EnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                         CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (subscriber != reinterpret_cast<CUpti_SubscriberHandle>(this) || subscriber_ == nullptr) {
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  if (enable != 0) {
    enabled_callbacks_.insert({domain, cbid});
  } else {
    enabled_callbacks_.erase({domain, cbid});
  }
  return CUPTI_SUCCESS;
}

CUptiResult FakeCuptiApi::GetGraphNodeId(CUgraphNode node, uint64_t* id) {
  if (node == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  *id = reinterpret_cast<uint64_t>(node);
  return CUPTI_SUCCESS;
}

}  // namespace dynaflow
