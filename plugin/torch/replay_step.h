// The tensor work of replaying one planned call from its CUDA graph
// (plugin/python/dynaflow/_graphs.py): copying the call's arguments into the
// graph's static inputs and its static outputs out, in one C++ call each
// instead of a Python loop over the tensors.
//
// A graph is captured on static inputs, one per tensor ("leaf") of the call's
// arguments, `padded` rows deep where a leaf's first dimension holds the
// batch's rows; a leaf the call writes in place is "bound": the graph uses the
// program's own tensor and nothing is copied (the caller checks beforehand
// that the call passes that memory again). A replay of a call of `rows` rows
// (rows <= padded) copies each unbound leaf into the first `rows` rows of its
// static input, launches the graph, and returns a copy of the first rows of
// each static output (an output of k * padded rows gives k * rows: a
// flattened [batch * seq, ...] tensor). The copies are issued on the current
// stream, as torch's own copies are.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dynaflow {

class ReplayStep {
 public:
  // Flags of a leaf, or'ed.
  static constexpr int64_t kRows = 1;   // its first dimension holds the rows
  static constexpr int64_t kBound = 2;  // the graph uses the program's tensor

  // `inputs[k]` is leaf k's static input, or the program's tensor where
  // flags[k] has kBound (not kept: the graph does not own it). Throws
  // c10::Error when the lists differ in length, padded < 1, or a row
  // leaf's static input does not hold `padded` rows.
  ReplayStep(std::vector<at::Tensor> inputs, std::vector<int64_t> flags, int64_t padded);

  // The capture's outputs, in map_outputs' order; each must hold a multiple
  // of `padded` rows (c10::Error otherwise).
  void SetOutputs(std::vector<at::Tensor> outputs);

  // Copies the call's leaves (same count, shapes at `rows` rows) into the
  // static inputs; bound leaves are skipped. Throws c10::Error on a count or
  // a row count out of range; a shape mismatch throws from copy_.
  void CopyIn(std::vector<at::Tensor> leaves, int64_t rows) const;

  // A copy of the first rows of each static output for a call of `rows` rows.
  std::vector<at::Tensor> CopyOut(int64_t rows) const;

  int64_t padded() const { return padded_; }

 private:
  void CheckRows(int64_t rows) const;

  std::vector<at::Tensor> inputs_;  // undefined where bound
  std::vector<int64_t> flags_;
  std::vector<at::Tensor> outputs_;
  int64_t padded_;
};

}  // namespace dynaflow
