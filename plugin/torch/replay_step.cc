#include "plugin/torch/replay_step.h"

#include <utility>

#include <c10/util/Exception.h>

namespace dynaflow {

ReplayStep::ReplayStep(std::vector<at::Tensor> inputs, std::vector<int64_t> flags,
                       int64_t padded)
    : inputs_(std::move(inputs)), flags_(std::move(flags)), padded_(padded) {
  TORCH_CHECK(inputs_.size() == flags_.size(), "ReplayStep: ", inputs_.size(),
              " inputs and ", flags_.size(), " flags");
  TORCH_CHECK(padded_ >= 1, "ReplayStep: padded rows must be at least 1, not ", padded_);
  for (size_t k = 0; k < inputs_.size(); ++k) {
    if (flags_[k] & kBound) {
      inputs_[k] = at::Tensor();
      continue;
    }
    TORCH_CHECK(inputs_[k].defined(), "ReplayStep: leaf ", k, " has no static input");
    TORCH_CHECK(!(flags_[k] & kRows) || (inputs_[k].dim() >= 1 && inputs_[k].size(0) == padded_),
                "ReplayStep: leaf ", k, "'s static input does not hold ", padded_, " rows");
  }
}

void ReplayStep::SetOutputs(std::vector<at::Tensor> outputs) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& o = outputs[k];
    TORCH_CHECK(o.defined() && o.dim() >= 1 && o.size(0) % padded_ == 0, "ReplayStep: output ",
                k, " does not hold a multiple of ", padded_, " rows");
  }
  outputs_ = std::move(outputs);
}

void ReplayStep::CheckRows(int64_t rows) const {
  TORCH_CHECK(rows >= 1 && rows <= padded_, "ReplayStep: a call of ", rows,
              " rows cannot replay a graph of ", padded_);
}

void ReplayStep::CopyIn(std::vector<at::Tensor> leaves, int64_t rows) const {
  CheckRows(rows);
  TORCH_CHECK(leaves.size() == inputs_.size(), "ReplayStep: ", leaves.size(),
              " leaves for a graph of ", inputs_.size());
  for (size_t k = 0; k < leaves.size(); ++k) {
    if (flags_[k] & kBound) continue;
    const at::Tensor& s = inputs_[k];
    if ((flags_[k] & kRows) && rows != padded_) {
      s.narrow(0, 0, rows).copy_(leaves[k]);
    } else {
      s.copy_(leaves[k]);
    }
  }
}

std::vector<at::Tensor> ReplayStep::CopyOut(int64_t rows) const {
  CheckRows(rows);
  std::vector<at::Tensor> out;
  out.reserve(outputs_.size());
  for (const at::Tensor& o : outputs_) {
    out.push_back(o.narrow(0, 0, rows * (o.size(0) / padded_)).clone());
  }
  return out;
}

}  // namespace dynaflow
