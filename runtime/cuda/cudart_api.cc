#include "runtime/cuda/cudart_api.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dynaflow::runtime::cuda {
namespace {

Status Check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Failure(std::string(call) + ": " + cudaGetErrorName(error) + " (" +
                         cudaGetErrorString(error) + ")");
}

// The call's source text names it in the error message.
#define DF_CUDA(call) Check((call), #call)

template <typename Native, typename Kind>
Native ToNative(Handle<Kind> handle) {
  return reinterpret_cast<Native>(handle.value);
}

template <typename H, typename Native>
H FromNative(Native native) {
  return H{reinterpret_cast<std::uintptr_t>(native)};
}

// Streams are never destroyed, only handed to the next executor: torch's
// caching allocator keeps the stream of every tensor allocated on one of ours
// or recorded on it (record_stream), and records an event on it when that
// tensor is freed, which may be after its executor is gone. A destroyed stream
// there ended the program ("invalid device context" at a tensor's free, seen
// on an H200). torch's own stream pool keeps its streams for the process too.
// Kept per device: a stream belongs to the device current at its creation.
std::mutex released_mutex;
auto* released = new std::map<int, std::vector<cudaStream_t>>;  // never freed

}  // namespace

StatusOr<Stream> CudartApi::CreateStream() {
  int device = 0;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaGetDevice(&device)));
  {
    std::lock_guard<std::mutex> lock(released_mutex);
    std::vector<cudaStream_t>& kept = (*released)[device];
    if (!kept.empty()) {
      cudaStream_t stream = kept.back();
      kept.pop_back();
      return FromNative<Stream>(stream);
    }
  }
  cudaStream_t stream = nullptr;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  return FromNative<Stream>(stream);
}

void CudartApi::DestroyStream(Stream stream) {
  int device = 0;
  if (cudaStreamGetDevice(ToNative<cudaStream_t>(stream), &device) != cudaSuccess) return;
  std::lock_guard<std::mutex> lock(released_mutex);
  (*released)[device].push_back(ToNative<cudaStream_t>(stream));
}

StatusOr<Event> CudartApi::CreateEvent() {
  cudaEvent_t event = nullptr;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)));
  return FromNative<Event>(event);
}

void CudartApi::DestroyEvent(Event event) { cudaEventDestroy(ToNative<cudaEvent_t>(event)); }

Status CudartApi::RecordEvent(Event event, Stream stream) {
  return DF_CUDA(cudaEventRecord(ToNative<cudaEvent_t>(event), ToNative<cudaStream_t>(stream)));
}

Status CudartApi::StreamWaitEvent(Stream stream, Event event) {
  return DF_CUDA(
      cudaStreamWaitEvent(ToNative<cudaStream_t>(stream), ToNative<cudaEvent_t>(event), 0));
}

Status CudartApi::SynchronizeEvent(Event event) {
  return DF_CUDA(cudaEventSynchronize(ToNative<cudaEvent_t>(event)));
}

Status CudartApi::BeginCapture(Stream stream) {
  return DF_CUDA(
      cudaStreamBeginCapture(ToNative<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
}

StatusOr<Graph> CudartApi::EndCapture(Stream stream) {
  cudaGraph_t graph = nullptr;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaStreamEndCapture(ToNative<cudaStream_t>(stream), &graph)));
  return FromNative<Graph>(graph);
}

StatusOr<GraphExec> CudartApi::InstantiateGraph(Graph graph) {
  cudaGraphExec_t exec = nullptr;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaGraphInstantiate(&exec, ToNative<cudaGraph_t>(graph), 0)));
  return FromNative<GraphExec>(exec);
}

void CudartApi::DestroyGraph(Graph graph) { cudaGraphDestroy(ToNative<cudaGraph_t>(graph)); }

Status CudartApi::LaunchGraph(GraphExec exec, Stream stream) {
  return DF_CUDA(cudaGraphLaunch(ToNative<cudaGraphExec_t>(exec), ToNative<cudaStream_t>(stream)));
}

void CudartApi::DestroyGraphExec(GraphExec exec) {
  cudaGraphExecDestroy(ToNative<cudaGraphExec_t>(exec));
}

StatusOr<MemPool> CudartApi::CreateMemPool() {
  int device = 0;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaGetDevice(&device)));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  DF_RETURN_IF_ERROR(DF_CUDA(cudaMemPoolCreate(&pool, &props)));
  return FromNative<MemPool>(pool);
}

void CudartApi::DestroyMemPool(MemPool pool) { cudaMemPoolDestroy(ToNative<cudaMemPool_t>(pool)); }

}  // namespace dynaflow::runtime::cuda
