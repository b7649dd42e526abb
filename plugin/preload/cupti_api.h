// The CUPTI calls the tracer makes, behind one interface: the real library is
// loaded with dlopen at run time (cupti_api_dl.h), and tests substitute
// FakeCuptiApi, which feeds activity records built in ordinary memory.
#pragma once

#include <cupti.h>

#include <cstddef>
#include <cstdint>

namespace dynaflow {

// The NVTX loader's NvtxGetExportTableFunc_t (nvtx3/nvtxDetail/nvtxTypes.h).
using NvtxGetExportTable = const void* (*)(uint32_t export_table_id);

// The external-correlation kind the tracer pushes its operator ids as.
// libkineto (torch.profiler) pushes its own as CUSTOM0 (its default flow) and
// CUSTOM1 (user annotations): with another kind, a program that runs
// torch.profiler beside the tracer keeps both tools' kernels linked to their
// own operators.
inline constexpr CUpti_ExternalCorrelationKind kOperatorCorrelationKind =
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

// Each method forwards to the CUPTI function of the same name (cupti prefix
// dropped) and returns its result unchanged.
class CuptiApi {
 public:
  virtual ~CuptiApi() = default;

  virtual CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                CUpti_BuffersCallbackCompleteFunc complete) = 0;
  // CUPTI_ERROR_NOT_SUPPORTED when this CUPTI predates the call.
  virtual CUptiResult ActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc clock) = 0;
  virtual CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType type) = 0;
  virtual CUptiResult ActivityEnable(CUpti_ActivityKind kind) = 0;
  virtual CUptiResult ActivityDisable(CUpti_ActivityKind kind) = 0;
  // Records of one driver or runtime API on or off, after its kind was
  // enabled. CUPTI_ERROR_NOT_SUPPORTED when this CUPTI predates the calls.
  virtual CUptiResult ActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) = 0;
  virtual CUptiResult ActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) = 0;
  // CUPTI_ERROR_MAX_LIMIT_REACHED after the last record of the buffer.
  virtual CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                            CUpti_Activity** record) = 0;
  virtual CUptiResult ActivityFlushAll(uint32_t flag) = 0;
  virtual CUptiResult ActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                                   size_t* dropped) = 0;
  virtual CUptiResult ActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                        uint64_t id) = 0;
  virtual CUptiResult ActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                       uint64_t* id) = 0;
  virtual CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                                      const char** name) = 0;
  virtual CUptiResult GetResultString(CUptiResult result, const char** text) = 0;
  // CUPTI's API version (CUPTI_API_VERSION of the loaded library).
  virtual CUptiResult GetVersion(uint32_t* version) = 0;
  // The callback API, for the resource callbacks of CUDA graph nodes. CUPTI
  // allows one subscriber per process: Subscribe returns
  // CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED while another tool
  // (torch.profiler's Kineto) holds it. CUPTI_ERROR_NOT_SUPPORTED when this
  // CUPTI lacks a call.
  virtual CUptiResult Subscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                void* userdata) = 0;
  virtual CUptiResult Unsubscribe(CUpti_SubscriberHandle subscriber) = 0;
  virtual CUptiResult EnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                     CUpti_CallbackDomain domain, CUpti_CallbackId cbid) = 0;
  // The id CUPTI gives a graph node: CUpti_ActivityKernel10::graphNodeId of
  // the kernels it launches.
  virtual CUptiResult GetGraphNodeId(CUgraphNode node, uint64_t* id) = 0;
  // The one CUDA driver call, which CUPTI has no equivalent of:
  // cuDriverGetVersion of the libcuda already loaded in the process (the
  // tracer starts CUPTI once CUDA initialises; it never loads a driver
  // itself), e.g. 13020 for a driver that supports CUDA 13.2.
  // CUDA_ERROR_NOT_INITIALIZED when no libcuda is loaded.
  virtual CUresult DriverGetVersion(int* version) = 0;

  // CUPTI's NVTX injection entry point, InitializeInjectionNvtx2: routes NVTX
  // ranges to CUPTI (CUPTI_ACTIVITY_KIND_MARKER records). Returns 0 when
  // CUPTI refuses or lacks it, as the NVTX loader expects.
  virtual int InitializeInjectionNvtx2(NvtxGetExportTable get_export_table) = 0;
};

}  // namespace dynaflow
