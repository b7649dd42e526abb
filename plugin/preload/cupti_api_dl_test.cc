#include "plugin/preload/cupti_api_dl.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

TEST(CuptiApiDlTest, CandidatesStartWithTheEnvironmentsChoice) {
  const std::vector<std::string> c = CuptiLibraryCandidates("/opt/cupti/libcupti.so.13");
  ASSERT_GE(c.size(), 4u);
  EXPECT_EQ(c[0], "/opt/cupti/libcupti.so.13");
  EXPECT_EQ(c[1], "libcupti.so");
  EXPECT_EQ(c[2], "libcupti.so.13");
  EXPECT_EQ(c[3], "libcupti.so.12");
  EXPECT_EQ(CuptiLibraryCandidates(nullptr)[0], "libcupti.so");
  EXPECT_EQ(CuptiLibraryCandidates("")[0], "libcupti.so");
}

TEST(CuptiApiDlTest, MissingLibraryIsAnErrorNotACrash) {
  std::string error;
  EXPECT_EQ(LoadCuptiLibrary({"/nonexistent/libcupti.so", "libcupti-not-here.so.1"}, &error),
            nullptr);
  EXPECT_NE(error.find("cannot load libcupti"), std::string::npos);
  EXPECT_NE(error.find("/nonexistent/libcupti.so"), std::string::npos);
}

TEST(CuptiApiDlTest, LibraryWithoutCuptiEntryPointsIsRefused) {
  std::string error;
  EXPECT_EQ(LoadCuptiLibrary({"libm.so.6"}, &error), nullptr);
  EXPECT_NE(error.find("libm.so.6 lacks cuptiActivityRegisterCallbacks"), std::string::npos);
}

// Where the toolkit's libcupti exists (this build found it), loading it needs
// no GPU and no driver, and decoding an error goes through it.
TEST(CuptiApiDlTest, ToolkitLibraryLoadsWithoutADriver) {
  const std::string toolkit_library = CuptiLibraryCandidates(nullptr).back();
  if (toolkit_library.find('/') == std::string::npos) {
    GTEST_SKIP() << "no libcupti found at build time";
  }
  std::string error;
  std::unique_ptr<CuptiApi> cupti = LoadCuptiLibrary({toolkit_library}, &error);
  ASSERT_NE(cupti, nullptr) << error;
  const char* text = nullptr;
  ASSERT_EQ(cupti->GetResultString(CUPTI_ERROR_NOT_INITIALIZED, &text), CUPTI_SUCCESS);
  EXPECT_STREQ(text, "CUPTI_ERROR_NOT_INITIALIZED");
}

}  // namespace
}  // namespace dynaflow
