// CudaApi over the CUDA runtime library (libcudart). The only runtime code
// that includes a CUDA header; it compiles and links without a GPU.
#pragma once

#include "runtime/cuda/cuda_api.h"

namespace dynaflow::runtime::cuda {

class CudartApi final : public CudaApi {
 public:
  StatusOr<Stream> CreateStream() override;
  void DestroyStream(Stream stream) override;
  StatusOr<Event> CreateEvent() override;
  void DestroyEvent(Event event) override;
  Status RecordEvent(Event event, Stream stream) override;
  Status StreamWaitEvent(Stream stream, Event event) override;
  Status SynchronizeEvent(Event event) override;
  Status BeginCapture(Stream stream) override;
  StatusOr<Graph> EndCapture(Stream stream) override;
  StatusOr<GraphExec> InstantiateGraph(Graph graph) override;
  void DestroyGraph(Graph graph) override;
  Status LaunchGraph(GraphExec exec, Stream stream) override;
  void DestroyGraphExec(GraphExec exec) override;
  StatusOr<MemPool> CreateMemPool() override;
  void DestroyMemPool(MemPool pool) override;
};

}  // namespace dynaflow::runtime::cuda
