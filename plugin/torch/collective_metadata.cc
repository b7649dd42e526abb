#include "plugin/torch/collective_metadata.h"

#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <cstdio>
#include <string_view>
#include <vector>

namespace dynaflow {
namespace {

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", u);
      out->append(escaped);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

// Appends ,"key": (no comma before the first member).
void AppendKey(std::string_view key, std::string* out) {
  if (!out->empty()) out->push_back(',');
  AppendJsonString(key, out);
  out->push_back(':');
}

void AppendString(std::string_view key, std::string_view value, std::string* out) {
  AppendKey(key, out);
  AppendJsonString(value, out);
}

void AppendInt(std::string_view key, int64_t value, std::string* out) {
  AppendKey(key, out);
  out->append(std::to_string(value));
}

void AppendInts(std::string_view key, const std::vector<int64_t>& values, std::string* out) {
  AppendKey(key, out);
  out->push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out->push_back(',');
    out->append(std::to_string(values[i]));
  }
  out->push_back(']');
}

}  // namespace

std::string EncodeCollective(const torch::ParamCommsDebugInfo& info) {
  std::string out;
  AppendString("Collective name", info.getCollectiveName(), &out);
  AppendString("Process Group Name", info.getProcessGroupName(), &out);
  AppendString("Process Group Description", info.getProcessGroupDesc(), &out);
  AppendInt("In msg nelems", info.getInMessageNelems(), &out);
  AppendInt("Out msg nelems", info.getOutMessageNelems(), &out);
  AppendString("dtype", c10::toString(info.getDType()), &out);
  AppendInt("Group size", info.getWorldSize(), &out);
  AppendInts("In split size", info.getInputSplitSizes(), &out);
  AppendInts("Out split size", info.getOutputSplitSizes(), &out);
  AppendInt("Global rank start", info.getGlobalRankStart(), &out);
  AppendInt("Global rank stride", info.getGlobalRankStride(), &out);
  return out;
}

std::string CollectiveOf(const at::RecordFunction& fn) {
  if (at::kParamCommsCallName != fn.name()) return {};
  const auto* info = dynamic_cast<const torch::ParamCommsDebugInfo*>(
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PARAM_COMMS_INFO));
  return info != nullptr ? EncodeCollective(*info) : std::string();
}

}  // namespace dynaflow
