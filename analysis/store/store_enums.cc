#include "analysis/store/store_enums.h"

namespace dynaflow {

const char* ApiKindName(ApiKind kind) {
  switch (kind) {
    case ApiKind::kRuntime: return "runtime";
    case ApiKind::kDriver: return "driver";
    case ApiKind::kSync: return "sync";
  }
  return "runtime";
}

ApiKind ApiKindFromName(std::string_view name) {
  if (name == "driver") return ApiKind::kDriver;
  if (name == "sync") return ApiKind::kSync;
  return ApiKind::kRuntime;
}

const char* DomainName(RangeDomain domain) {
  switch (domain) {
    case RangeDomain::kUser: return "user";
    case RangeDomain::kGpuUser: return "gpu_user";
    case RangeDomain::kNvtx: return "nvtx";
  }
  return "user";
}

RangeDomain DomainFromName(std::string_view name) {
  if (name == "gpu_user") return RangeDomain::kGpuUser;
  if (name == "nvtx") return RangeDomain::kNvtx;
  return RangeDomain::kUser;
}

const char* PassName(Pass pass) {
  switch (pass) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kUnknown: return "unknown";
  }
  return "unknown";
}

Pass PassFromName(std::string_view name) {
  if (name == "forward") return Pass::kForward;
  if (name == "backward") return Pass::kBackward;
  return Pass::kUnknown;
}

}  // namespace dynaflow
