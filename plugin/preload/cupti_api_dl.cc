#include "plugin/preload/cupti_api_dl.h"

#include <dlfcn.h>

#include <atomic>
#include <string_view>

#include "plugin/preload/log.h"

#ifndef DYNAFLOW_CUPTI_BUILD_PATH
#define DYNAFLOW_CUPTI_BUILD_PATH ""
#endif

namespace dynaflow {
namespace {

// One CUPTI function resolved with dlsym; `reported` makes its failures
// reach stderr once.
template <typename Fn>
struct Entry {
  explicit Entry(const char* entry_name) : name(entry_name) {}
  const char* name;
  Fn fn = nullptr;
  std::atomic<bool> reported{false};
};

// Calls entry point `entry` with the arguments that follow. A result other
// than CUPTI_SUCCESS and `expected` is reported once per entry point, with
// CUPTI's decoded error; the result is returned unchanged either way.
#define DF_CUPTI_CALL_EXPECTING(expected, entry, ...) \
  Check((entry), (expected), (entry).fn(__VA_ARGS__))
#define DF_CUPTI_CALL(entry, ...) DF_CUPTI_CALL_EXPECTING(CUPTI_SUCCESS, entry, __VA_ARGS__)

class DlCuptiApi final : public CuptiApi {
 public:
  explicit DlCuptiApi(void* handle) : handle_(handle) {
    Resolve(register_callbacks_);
    Resolve(register_timestamp_);
    Resolve(set_thread_id_type_);
    Resolve(enable_);
    Resolve(disable_);
    Resolve(next_record_);
    Resolve(flush_all_);
    Resolve(dropped_);
    Resolve(push_external_);
    Resolve(pop_external_);
    Resolve(callback_name_);
    Resolve(result_string_);
    Resolve(version_);
    Resolve(nvtx_init_);
    Resolve(subscribe_);
    Resolve(unsubscribe_);
    Resolve(enable_callback_);
    Resolve(graph_node_id_);
  }

  // The first required entry point the library lacks, or nullptr. The
  // timestamp callback and NVTX injection are optional: older CUPTIs lack
  // the first, and NVTX ranges are a bonus.
  const char* MissingEntry() const {
    return FirstMissing(register_callbacks_, set_thread_id_type_, enable_, disable_, next_record_,
                        flush_all_, dropped_, push_external_, pop_external_, callback_name_,
                        result_string_, version_);
  }

  CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                        CUpti_BuffersCallbackCompleteFunc complete) override {
    return DF_CUPTI_CALL(register_callbacks_, request, complete);
  }
  CUptiResult ActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc clock) override {
    if (register_timestamp_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(register_timestamp_, clock);
  }
  CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType type) override {
    return DF_CUPTI_CALL(set_thread_id_type_, type);
  }
  CUptiResult ActivityEnable(CUpti_ActivityKind kind) override {
    return DF_CUPTI_CALL(enable_, kind);
  }
  CUptiResult ActivityDisable(CUpti_ActivityKind kind) override {
    return DF_CUPTI_CALL(disable_, kind);
  }
  CUptiResult ActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) override {
    if (enable_driver_api_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(enable_driver_api_, cbid, enable);
  }
  CUptiResult ActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) override {
    if (enable_runtime_api_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(enable_runtime_api_, cbid, enable);
  }
  CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                    CUpti_Activity** record) override {
    return DF_CUPTI_CALL_EXPECTING(CUPTI_ERROR_MAX_LIMIT_REACHED, next_record_, buffer,
                                   valid_size, record);
  }
  CUptiResult ActivityFlushAll(uint32_t flag) override {
    return DF_CUPTI_CALL(flush_all_, flag);
  }
  CUptiResult ActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                           size_t* dropped) override {
    return DF_CUPTI_CALL(dropped_, context, stream_id, dropped);
  }
  CUptiResult ActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                uint64_t id) override {
    return DF_CUPTI_CALL(push_external_, kind, id);
  }
  CUptiResult ActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                               uint64_t* id) override {
    return DF_CUPTI_CALL(pop_external_, kind, id);
  }
  CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                              const char** name) override {
    return DF_CUPTI_CALL(callback_name_, domain, cbid, name);
  }
  CUptiResult GetResultString(CUptiResult result, const char** text) override {
    return result_string_.fn(result, text);  // unchecked: the checker itself uses it
  }
  CUptiResult GetVersion(uint32_t* version) override {
    return DF_CUPTI_CALL(version_, version);
  }
  CUresult DriverGetVersion(int* version) override {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (cuda == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    auto get = reinterpret_cast<decltype(&cuDriverGetVersion)>(dlsym(cuda, "cuDriverGetVersion"));
    const CUresult result = get != nullptr ? get(version) : CUDA_ERROR_NOT_FOUND;
    dlclose(cuda);  // drops only the reference NOLOAD took
    return result;
  }
  CUptiResult Subscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                        void* userdata) override {
    if (subscribe_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    // Another tool's subscription is expected, and said in the metadata.
    return DF_CUPTI_CALL_EXPECTING(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, subscribe_,
                                   subscriber, callback, userdata);
  }
  CUptiResult Unsubscribe(CUpti_SubscriberHandle subscriber) override {
    if (unsubscribe_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(unsubscribe_, subscriber);
  }
  CUptiResult EnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                             CUpti_CallbackDomain domain, CUpti_CallbackId cbid) override {
    if (enable_callback_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(enable_callback_, enable, subscriber, domain, cbid);
  }
  CUptiResult GetGraphNodeId(CUgraphNode node, uint64_t* id) override {
    if (graph_node_id_.fn == nullptr) return CUPTI_ERROR_NOT_SUPPORTED;
    return DF_CUPTI_CALL(graph_node_id_, node, id);
  }
  int InitializeInjectionNvtx2(NvtxGetExportTable get_export_table) override {
    return nvtx_init_.fn == nullptr ? 0 : nvtx_init_.fn(get_export_table);
  }

 private:
  template <typename... Entries>
  static const char* FirstMissing(const Entries&... entries) {
    const char* missing = nullptr;
    ((missing = (missing == nullptr && entries.fn == nullptr) ? entries.name : missing), ...);
    return missing;
  }

  template <typename Fn>
  void Resolve(Entry<Fn>& entry) {
    entry.fn = reinterpret_cast<Fn>(dlsym(handle_, entry.name));
  }

  template <typename Fn>
  CUptiResult Check(Entry<Fn>& entry, CUptiResult expected, CUptiResult result) {
    if (result != CUPTI_SUCCESS && result != expected && !entry.reported.load()) {
      LogOnce(entry.reported, std::string(entry.name) + " failed: " + Describe(result));
    }
    return result;
  }

  std::string Describe(CUptiResult result) {
    const char* text = nullptr;
    if (result_string_.fn(result, &text) == CUPTI_SUCCESS && text != nullptr) return text;
    return "CUPTI error " + std::to_string(static_cast<int>(result));
  }

  void* handle_;  // never dlclose()d: CUPTI calls back into us until exit
  Entry<decltype(&cuptiActivityRegisterCallbacks)> register_callbacks_{
      "cuptiActivityRegisterCallbacks"};
  Entry<decltype(&cuptiActivityRegisterTimestampCallback)> register_timestamp_{
      "cuptiActivityRegisterTimestampCallback"};
  Entry<decltype(&cuptiSetThreadIdType)> set_thread_id_type_{"cuptiSetThreadIdType"};
  Entry<decltype(&cuptiActivityEnable)> enable_{"cuptiActivityEnable"};
  Entry<decltype(&cuptiActivityDisable)> disable_{"cuptiActivityDisable"};
  // Optional (CUPTI 12.x and later).
  Entry<decltype(&cuptiActivityEnableDriverApi)> enable_driver_api_{
      "cuptiActivityEnableDriverApi"};
  Entry<decltype(&cuptiActivityEnableRuntimeApi)> enable_runtime_api_{
      "cuptiActivityEnableRuntimeApi"};
  Entry<decltype(&cuptiActivityGetNextRecord)> next_record_{"cuptiActivityGetNextRecord"};
  Entry<decltype(&cuptiActivityFlushAll)> flush_all_{"cuptiActivityFlushAll"};
  Entry<decltype(&cuptiActivityGetNumDroppedRecords)> dropped_{
      "cuptiActivityGetNumDroppedRecords"};
  Entry<decltype(&cuptiActivityPushExternalCorrelationId)> push_external_{
      "cuptiActivityPushExternalCorrelationId"};
  Entry<decltype(&cuptiActivityPopExternalCorrelationId)> pop_external_{
      "cuptiActivityPopExternalCorrelationId"};
  Entry<decltype(&cuptiGetCallbackName)> callback_name_{"cuptiGetCallbackName"};
  Entry<decltype(&cuptiGetResultString)> result_string_{"cuptiGetResultString"};
  Entry<decltype(&cuptiGetVersion)> version_{"cuptiGetVersion"};
  Entry<int (*)(NvtxGetExportTable)> nvtx_init_{"InitializeInjectionNvtx2"};
  // Optional: without them CUDA graph nodes are not attributed.
  Entry<decltype(&cuptiSubscribe)> subscribe_{"cuptiSubscribe"};
  Entry<decltype(&cuptiUnsubscribe)> unsubscribe_{"cuptiUnsubscribe"};
  Entry<decltype(&cuptiEnableCallback)> enable_callback_{"cuptiEnableCallback"};
  Entry<decltype(&cuptiGetGraphNodeId)> graph_node_id_{"cuptiGetGraphNodeId"};
};

// The API over `handle`, or nullptr with *why set when an entry is missing.
std::unique_ptr<CuptiApi> Adopt(void* handle, std::string_view library, std::string* why) {
  auto api = std::make_unique<DlCuptiApi>(handle);
  if (const char* missing = api->MissingEntry()) {
    *why = std::string(library) + " lacks " + missing;
    return nullptr;
  }
  return api;
}

}  // namespace

std::vector<std::string> CuptiLibraryCandidates(const char* env_path) {
  std::vector<std::string> out;
  if (env_path != nullptr && *env_path != '\0') out.emplace_back(env_path);
  for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"}) {
    out.emplace_back(name);
  }
  if (*DYNAFLOW_CUPTI_BUILD_PATH != '\0') out.emplace_back(DYNAFLOW_CUPTI_BUILD_PATH);
  return out;
}

std::unique_ptr<CuptiApi> LoadCuptiLibrary(const std::vector<std::string>& candidates,
                                           std::string* error) {
  for (const std::string& library : candidates) {
    if (void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      return Adopt(handle, library, error);
    }
  }
  std::string tried;
  for (const std::string& library : candidates) {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why;
    if (handle == nullptr) {
      const char* dl_error = dlerror();
      why = dl_error != nullptr ? dl_error : library + ": cannot load";
    } else if (std::unique_ptr<CuptiApi> api = Adopt(handle, library, &why)) {
      return api;
    } else {
      dlclose(handle);  // nothing was registered with it
    }
    tried += (tried.empty() ? "" : "; ") + why;
  }
  *error = "cannot load libcupti (" + tried + ")";
  return nullptr;
}

}  // namespace dynaflow
