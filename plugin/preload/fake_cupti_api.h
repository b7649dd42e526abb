// Test double of CuptiApi: no CUPTI, no GPU. Activity records are built in
// ordinary memory (FakeActivityBuffer) and delivered through the callbacks
// the code under test registered, the way CUPTI delivers completed buffers.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "plugin/preload/cupti_api.h"

namespace dynaflow {

// Records laid out back to back, each after an 8-byte size, 8-byte aligned:
// the layout FakeCuptiApi::ActivityGetNextRecord walks.
class FakeActivityBuffer {
 public:
  template <typename Record>
  FakeActivityBuffer& Add(const Record& record) {
    Append(&record, sizeof(Record));
    return *this;
  }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words_.data()); }
  size_t size() const { return words_.size() * sizeof(uint64_t); }
  size_t record_count() const { return records_; }

 private:
  void Append(const void* record, size_t size);
  std::vector<uint64_t> words_;
  size_t records_ = 0;
};

class FakeCuptiApi : public CuptiApi {
 public:
  // Simulates CUPTI completing a buffer now, on the calling thread: takes one
  // from the registered request callback, copies `records` into it and hands
  // it to the complete callback, which sees `dropped` dropped records. False
  // when no callbacks are registered or the buffer offered is too small.
  bool CompleteBuffer(const FakeActivityBuffer& records, size_t dropped = 0);
  // Makes the next ActivityFlushAll() complete `records`, as CUPTI delivers
  // the buffers it holds when flushed.
  void CompleteAtNextFlush(FakeActivityBuffer records);

  void FailEnable(CUpti_ActivityKind kind, CUptiResult result);
  void SetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, std::string name);

  bool enabled(CUpti_ActivityKind kind) const;
  // The driver and runtime APIs whose records were switched off.
  std::set<CUpti_CallbackId> disabled_driver_apis() const;
  std::set<CUpti_CallbackId> disabled_runtime_apis() const;
  // Makes ActivityEnable{Driver,Runtime}Api fail as a CUPTI without them does.
  void LackPerApiControl() { per_api_control_ = false; }
  bool callbacks_registered() const;

  // The callback API. Another tool holding CUPTI's one subscription makes
  // Subscribe fail with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED.
  void HoldSubscriptionElsewhere(bool held);
  bool subscribed() const;
  bool callback_enabled(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) const;
  // Simulates CUDA issuing resource callback `cbid` about graph objects, on
  // the calling thread: the subscriber gets a CUpti_ResourceData whose
  // descriptor is `data`. False when nobody subscribed it. Graph node
  // handles stand for their ids: GetGraphNodeId(node) is the handle's value.
  bool EmitGraphCallback(CUpti_CallbackIdResource cbid, CUpti_GraphData data);
  static CUgraphNode Node(uint64_t id) { return reinterpret_cast<CUgraphNode>(id); }
  // Simulates CUDA issuing runtime or driver API callback `cbid` (domain
  // CUPTI_CB_DOMAIN_RUNTIME_API or _DRIVER_API) at `site` on the calling
  // thread, with the call's parameters and, at the exit, its result
  // (cudaError_t or CUresult). False when nobody subscribed it.
  bool EmitApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                       CUpti_ApiCallbackSite site, const void* params, int result);
  // cudaStreamBeginCapture / cudaStreamEndCapture of stream handle `stream`
  // returning `result`, as CUPTI reports them: a callback at the entry and
  // one at the exit. False when nobody subscribed them.
  bool EmitBeginCapture(uintptr_t stream, int result = 0);
  bool EmitEndCapture(uintptr_t stream, int result = 0);
  bool timestamp_callback_registered() const;
  // The clock registered last (nullptr: none), to tell whose it is.
  CUpti_TimestampCallbackFunc timestamp_callback() const;
  int flush_count() const;
  int nvtx_initializations() const;
  // Every push (+id) and pop (-id) so far, in order.
  std::vector<int64_t> external_id_log() const;

  CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                        CUpti_BuffersCallbackCompleteFunc complete) override;
  CUptiResult ActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc clock) override;
  CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType type) override;
  CUptiResult ActivityEnable(CUpti_ActivityKind kind) override;
  CUptiResult ActivityDisable(CUpti_ActivityKind kind) override;
  CUptiResult ActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) override;
  CUptiResult ActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) override;
  CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                    CUpti_Activity** record) override;
  CUptiResult ActivityFlushAll(uint32_t flag) override;
  CUptiResult ActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                           size_t* dropped) override;
  CUptiResult ActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                uint64_t id) override;
  CUptiResult ActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                               uint64_t* id) override;
  CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                              const char** name) override;
  CUptiResult GetResultString(CUptiResult result, const char** text) override;
  CUptiResult GetVersion(uint32_t* version) override;
  // kFakeDriverVersion.
  CUresult DriverGetVersion(int* version) override;
  static constexpr int kFakeDriverVersion = 13020;
  int InitializeInjectionNvtx2(NvtxGetExportTable get_export_table) override;
  CUptiResult Subscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                        void* userdata) override;
  CUptiResult Unsubscribe(CUpti_SubscriberHandle subscriber) override;
  CUptiResult EnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                             CUpti_CallbackDomain domain, CUpti_CallbackId cbid) override;
  CUptiResult GetGraphNodeId(CUgraphNode node, uint64_t* id) override;

 private:
  mutable std::mutex mu_;
  CUpti_BuffersCallbackRequestFunc request_ = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete_ = nullptr;
  CUpti_TimestampCallbackFunc clock_ = nullptr;
  std::set<int> enabled_;
  std::map<int, CUptiResult> enable_failures_;
  std::map<std::pair<int, uint32_t>, std::string> callback_names_;
  std::vector<FakeActivityBuffer> at_next_flush_;
  std::vector<uint64_t> external_ids_;
  std::set<CUpti_CallbackId> disabled_driver_apis_;
  std::set<CUpti_CallbackId> disabled_runtime_apis_;
  bool per_api_control_ = true;
  std::vector<int64_t> external_id_log_;
  size_t dropped_ = 0;
  int flushes_ = 0;
  int nvtx_initializations_ = 0;
  bool held_elsewhere_ = false;
  CUpti_CallbackFunc subscriber_ = nullptr;
  void* subscriber_data_ = nullptr;
  std::set<std::pair<int, uint32_t>> enabled_callbacks_;
};

}  // namespace dynaflow
