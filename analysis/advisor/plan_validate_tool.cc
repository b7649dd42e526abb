// plan_validate FILE...: ValidatePlanJson's verdict on each file, one line
// each: "FILE<TAB>ok" or "FILE<TAB><the first error>". A file that is not
// JSON gets "not JSON". Exit 0 when every file was read, 2 otherwise.
// plan_schema_test compares these verdicts with Python jsonschema's on
// schemas/plan.schema.json.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "analysis/advisor/plan.h"

int main(int argc, char** argv) {
  int rc = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i]);
    if (!in) {
      std::cerr << "plan_validate: cannot read " << argv[i] << "\n";
      rc = 2;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      std::cout << argv[i] << "\tnot JSON\n";
      continue;
    }
    const dynaflow::Status st = dynaflow::ValidatePlanJson(j);
    std::cout << argv[i] << "\t" << (st.ok() ? std::string("ok") : st.message()) << "\n";
  }
  return rc;
}
