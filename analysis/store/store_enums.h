// The TEXT spellings of the model's enums in trace.db (schemas/trace.sql),
// shared by the store's writer and reader.
#pragma once

#include <string_view>

#include "analysis/model/trace.h"

namespace dynaflow {

const char* ApiKindName(ApiKind kind);
ApiKind ApiKindFromName(std::string_view name);  // kRuntime when unknown

const char* DomainName(RangeDomain domain);
RangeDomain DomainFromName(std::string_view name);  // kUser when unknown

const char* PassName(Pass pass);
Pass PassFromName(std::string_view name);  // kUnknown when unknown

}  // namespace dynaflow
