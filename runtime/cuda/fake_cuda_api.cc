#include "runtime/cuda/fake_cuda_api.h"

#include <algorithm>
#include <utility>

namespace dynaflow::runtime::cuda {
namespace {

constexpr const char* kInvalidHandle = "cudaErrorInvalidResourceHandle";

std::string Name(char kind, std::uintptr_t value) { return kind + std::to_string(value); }
std::string Name(Stream h) { return Name('s', h.value); }
std::string Name(Event h) { return Name('e', h.value); }
std::string Name(Graph h) { return Name('g', h.value); }
std::string Name(GraphExec h) { return Name('x', h.value); }
std::string Name(MemPool h) { return Name('p', h.value); }

}  // namespace

Status FakeCudaApi::Check(const std::string& function, const std::string& call, const char* error) {
  if (error == nullptr && fail_next_ == function) {
    fail_next_.clear();
    error = "cudaErrorUnknown";
  }
  if (error == nullptr) return Status::Ok();
  calls_.push_back(call + " -> " + error);
  return Status::Failure(call + ": " + error);
}

FakeCudaApi::StreamState* FakeCudaApi::FindStream(Stream stream) {
  if (!stream) return &legacy_stream_;
  auto it = streams_.find(stream.value);
  return it == streams_.end() ? nullptr : &it->second;
}

int FakeCudaApi::live_handles() const {
  return static_cast<int>(streams_.size() + events_.size() + graphs_.size() + execs_.size() +
                          pools_.size());
}

void FakeCudaApi::LaunchKernel(const std::string& name, Stream stream) {
  std::string call = "Kernel(" + name + ", " + Name(stream) + ")";
  StreamState* s = FindStream(stream);
  if (s == nullptr) {
    calls_.push_back(call + " -> " + kInvalidHandle);
    return;
  }
  if (s->capture != kNoCapture) {
    s->last_kernel = ++kernel_sequence_;
    captures_[s->capture].kernels.push_back(name + "@" + Name(stream));
  }
  calls_.push_back(call);
}

StatusOr<Stream> FakeCudaApi::CreateStream() {
  DF_RETURN_IF_ERROR(Check("CreateStream", "CreateStream()"));
  Stream stream{NextHandle('s')};
  streams_[stream.value] = StreamState{};
  calls_.push_back("CreateStream() = " + Name(stream));
  return stream;
}

void FakeCudaApi::DestroyStream(Stream stream) {
  std::string call = "DestroyStream(" + Name(stream) + ")";
  calls_.push_back(streams_.erase(stream.value) ? call : call + " -> " + kInvalidHandle);
}

StatusOr<Event> FakeCudaApi::CreateEvent() {
  DF_RETURN_IF_ERROR(Check("CreateEvent", "CreateEvent()"));
  Event event{NextHandle('e')};
  events_[event.value] = EventState{};
  calls_.push_back("CreateEvent() = " + Name(event));
  return event;
}

void FakeCudaApi::DestroyEvent(Event event) {
  std::string call = "DestroyEvent(" + Name(event) + ")";
  calls_.push_back(events_.erase(event.value) ? call : call + " -> " + kInvalidHandle);
}

Status FakeCudaApi::RecordEvent(Event event, Stream stream) {
  std::string call = "RecordEvent(" + Name(event) + ", " + Name(stream) + ")";
  StreamState* s = FindStream(stream);
  auto e = events_.find(event.value);
  bool valid = s != nullptr && e != events_.end();
  DF_RETURN_IF_ERROR(Check("RecordEvent", call, valid ? nullptr : kInvalidHandle));
  e->second = EventState{s->capture, stream.value, s->last_kernel};
  calls_.push_back(call);
  return Status::Ok();
}

Status FakeCudaApi::StreamWaitEvent(Stream stream, Event event) {
  std::string call = "StreamWaitEvent(" + Name(stream) + ", " + Name(event) + ")";
  StreamState* s = FindStream(stream);
  auto e = events_.find(event.value);
  const char* error = nullptr;
  if (s == nullptr || e == events_.end()) {
    error = kInvalidHandle;
  } else if (e->second.capture == kEndedCapture) {
    error = "cudaErrorCapturedEvent";
  } else if (s->capture != kNoCapture && s->capture != e->second.capture) {
    error = "cudaErrorStreamCaptureIsolation";  // waits on work outside its capture
  }
  DF_RETURN_IF_ERROR(Check("StreamWaitEvent", call, error));
  const EventState& recorded = e->second;
  if (recorded.capture != kNoCapture) {
    CaptureState& capture = captures_[recorded.capture];
    if (s->capture == kNoCapture) {  // joins the capture
      s->capture = recorded.capture;
      s->last_kernel = 0;
      capture.members.push_back(stream.value);
    }
    if (stream.value == capture.origin) {
      std::uint64_t& joined = capture.joined[recorded.stream];
      joined = std::max(joined, recorded.covers);
    }
  }
  calls_.push_back(call);
  return Status::Ok();
}

Status FakeCudaApi::SynchronizeEvent(Event event) {
  std::string call = "SynchronizeEvent(" + Name(event) + ")";
  auto e = events_.find(event.value);
  const char* error = nullptr;
  if (e == events_.end()) {
    error = kInvalidHandle;
  } else if (e->second.capture != kNoCapture) {
    error = "cudaErrorCapturedEvent";
  }
  DF_RETURN_IF_ERROR(Check("SynchronizeEvent", call, error));
  calls_.push_back(call);
  return Status::Ok();
}

Status FakeCudaApi::BeginCapture(Stream stream) {
  std::string call = "BeginCapture(" + Name(stream) + ")";
  StreamState* s = FindStream(stream);
  const char* error = nullptr;
  if (s == nullptr) {
    error = kInvalidHandle;
  } else if (!stream) {
    error = "cudaErrorStreamCaptureUnsupported";  // the legacy stream
  } else if (s->capture != kNoCapture) {
    error = "cudaErrorIllegalState";
  }
  DF_RETURN_IF_ERROR(Check("BeginCapture", call, error));
  int capture = next_capture_++;
  captures_[capture].origin = stream.value;
  *s = StreamState{capture, 0};
  calls_.push_back(call);
  return Status::Ok();
}

void FakeCudaApi::EndCaptureOf(int capture) {
  for (auto& [handle, stream] : streams_) {
    if (stream.capture == capture) stream = StreamState{};
  }
  for (auto& [handle, event] : events_) {
    if (event.capture == capture) event.capture = kEndedCapture;
  }
  captures_.erase(capture);
}

StatusOr<Graph> FakeCudaApi::EndCapture(Stream stream) {
  std::string call = "EndCapture(" + Name(stream) + ")";
  StreamState* s = FindStream(stream);
  if (s == nullptr || s->capture == kNoCapture) {
    return Check("EndCapture", call, s == nullptr ? kInvalidHandle : "cudaErrorIllegalState");
  }
  CaptureState& capture = captures_[s->capture];
  if (capture.origin != stream.value) {
    return Check("EndCapture", call, "cudaErrorStreamCaptureUnmatched");
  }
  bool unjoined = std::any_of(
      capture.members.begin(), capture.members.end(),
      [&](std::uintptr_t member) { return streams_[member].last_kernel > capture.joined[member]; });
  std::vector<std::string> kernels = std::move(capture.kernels);
  EndCaptureOf(s->capture);  // even on failure, as CUDA does
  DF_RETURN_IF_ERROR(
      Check("EndCapture", call, unjoined ? "cudaErrorStreamCaptureUnjoined" : nullptr));
  Graph graph{NextHandle('g')};
  graphs_[graph.value] = std::move(kernels);
  calls_.push_back(call + " = " + Name(graph));
  return graph;
}

StatusOr<GraphExec> FakeCudaApi::InstantiateGraph(Graph graph) {
  std::string call = "InstantiateGraph(" + Name(graph) + ")";
  auto g = graphs_.find(graph.value);
  DF_RETURN_IF_ERROR(
      Check("InstantiateGraph", call, g == graphs_.end() ? kInvalidHandle : nullptr));
  GraphExec exec{NextHandle('x')};
  execs_[exec.value] = g->second;
  calls_.push_back(call + " = " + Name(exec));
  return exec;
}

void FakeCudaApi::DestroyGraph(Graph graph) {
  std::string call = "DestroyGraph(" + Name(graph) + ")";
  calls_.push_back(graphs_.erase(graph.value) ? call : call + " -> " + kInvalidHandle);
}

Status FakeCudaApi::LaunchGraph(GraphExec exec, Stream stream) {
  std::string call = "LaunchGraph(" + Name(exec) + ", " + Name(stream) + ")";
  bool valid = execs_.count(exec.value) && FindStream(stream) != nullptr;
  DF_RETURN_IF_ERROR(Check("LaunchGraph", call, valid ? nullptr : kInvalidHandle));
  calls_.push_back(call);
  return Status::Ok();
}

void FakeCudaApi::DestroyGraphExec(GraphExec exec) {
  std::string call = "DestroyGraphExec(" + Name(exec) + ")";
  calls_.push_back(execs_.erase(exec.value) ? call : call + " -> " + kInvalidHandle);
}

StatusOr<MemPool> FakeCudaApi::CreateMemPool() {
  DF_RETURN_IF_ERROR(Check("CreateMemPool", "CreateMemPool()"));
  MemPool pool{NextHandle('p')};
  pools_.insert(pool.value);
  calls_.push_back("CreateMemPool() = " + Name(pool));
  return pool;
}

void FakeCudaApi::DestroyMemPool(MemPool pool) {
  std::string call = "DestroyMemPool(" + Name(pool) + ")";
  calls_.push_back(pools_.erase(pool.value) ? call : call + " -> " + kInvalidHandle);
}

}  // namespace dynaflow::runtime::cuda
