#include "analysis/importers/kineto/json_tokenizer.h"

#include <gtest/gtest.h>

#include <vector>

#include "analysis/importers/io/byte_stream.h"

namespace dynaflow {
namespace {

class Collect : public ChromeJsonTokenizer::Sink {
 public:
  void OnEvent(std::string_view json) override { events.emplace_back(json); }
  void OnTopLevel(std::string_view key, std::string_view json) override {
    top.emplace_back(std::string(key) + "=" + std::string(json));
  }
  void OnNonObjectEvent() override { ++non_objects; }
  std::vector<std::string> events;
  std::vector<std::string> top;
  int non_objects = 0;
};

// Feeds `doc` in pieces cut at `cuts`, each padded as ByteStream pads chunks.
Status FeedInPieces(const std::string& doc, std::vector<size_t> cuts, Collect* sink,
                    ChromeJsonTokenizer* tok) {
  cuts.push_back(doc.size());
  size_t from = 0;
  for (size_t to : cuts) {
    std::string piece = doc.substr(from, to - from);
    const size_t n = piece.size();
    piece.append(kChunkPadding, '\0');
    DF_RETURN_IF_ERROR(tok->Feed(std::string_view(piece.data(), n)));
    from = to;
  }
  return tok->Finish();
}

const std::string kDoc =
    "\xEF\xBB\xBF {\"schemaVersion\": 1, \"deviceProperties\": [{\"id\": 0, \"name\": \"H200\"}],\n"
    " \"traceEvents\": [\n"
    "  {\"ph\": \"X\", \"name\": \"a}{\\\"]\", \"ts\": 1.5, \"args\": {\"grid\": [1, 2, 3]}},\n"
    "  {\"ph\": \"M\", \"name\": \"process_name\", \"args\": {\"name\": \"py\\\\\"}},\n"
    "  {}\n"
    " ],\n"
    " \"traceName\": \"x\", \"flag\": true, \"n\": -1.5e3}\n";

TEST(ChromeJsonTokenizerTest, SplitsEventsAndTopLevelValues) {
  Collect sink;
  ChromeJsonTokenizer tok(&sink);
  ASSERT_TRUE(FeedInPieces(kDoc, {}, &sink, &tok).ok());
  ASSERT_EQ(sink.events.size(), 3u);
  EXPECT_EQ(sink.events[0],
            "{\"ph\": \"X\", \"name\": \"a}{\\\"]\", \"ts\": 1.5, \"args\": {\"grid\": [1, 2, 3]}}");
  EXPECT_EQ(sink.events[2], "{}");
  ASSERT_EQ(sink.top.size(), 5u);
  EXPECT_EQ(sink.top[0], "schemaVersion=1");
  EXPECT_EQ(sink.top[1], "deviceProperties=[{\"id\": 0, \"name\": \"H200\"}]");
  EXPECT_EQ(sink.top[2], "traceName=\"x\"");
  EXPECT_EQ(sink.top[3], "flag=true");
  EXPECT_EQ(sink.top[4], "n=-1.5e3");
  EXPECT_EQ(tok.events(), 3);
}

// An event longer than the limit is refused, whether it straddles chunks or
// not; memory stays bounded (the carry is dropped). At the limit it passes.
TEST(ChromeJsonTokenizerTest, RefusesAnEventLongerThanTheLimit) {
  auto doc = [](size_t string_bytes) {
    return "{\"traceEvents\": [{\"ph\": \"X\"}, {\"name\": \"" + std::string(string_bytes, 'x') +
           "\"}]}";
  };
  const size_t overhead = std::string("{\"name\": \"\"}").size();
  for (const std::vector<size_t>& cuts : {std::vector<size_t>{}, std::vector<size_t>{30, 200, 700}}) {
    Collect at_limit;
    ChromeJsonTokenizer ok(&at_limit, 1000);
    EXPECT_TRUE(FeedInPieces(doc(1000 - overhead), cuts, &at_limit, &ok).ok());
    EXPECT_EQ(at_limit.events.size(), 2u);
    Collect past;
    ChromeJsonTokenizer refused(&past, 1000);
    const Status st = FeedInPieces(doc(1001 - overhead), cuts, &past, &refused);
    EXPECT_EQ(st.code(), StatusCode::kBadInput);
    EXPECT_EQ(st.message(),
              "the trace event at byte 30 is longer than 1000 bytes: refused, to bound memory");
  }
  EXPECT_EQ(ChromeJsonTokenizer::kMaxEventBytes, size_t{64} << 20);
}

// A key past 64 KiB is refused before it is buffered further; one at the
// bound is read. (A 3 GB key in a .gz once took 4 GB of memory.)
TEST(ChromeJsonTokenizerTest, RefusesATopLevelKeyLongerThan64KiB) {
  auto doc = [](size_t key_bytes) {
    return "{\"" + std::string(key_bytes, 'k') + "\": 1, \"traceEvents\": []}";
  };
  Collect at_bound;
  ChromeJsonTokenizer ok(&at_bound);
  EXPECT_TRUE(FeedInPieces(doc(64 << 10), {1000, 40000}, &at_bound, &ok).ok());
  ASSERT_EQ(at_bound.top.size(), 1u);
  EXPECT_EQ(at_bound.top[0].size(), (64u << 10) + 2);  // "kkk...=1"
  Collect past;
  ChromeJsonTokenizer refused(&past);
  const Status st = FeedInPieces(doc((64 << 10) + 1), {1000, 40000}, &past, &refused);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_EQ(st.message(),
            "a top-level key is longer than 64 KiB: not a trace, refused to bound memory");
}

TEST(ChromeJsonTokenizerTest, EveryChunkBoundaryGivesTheSameResult) {
  Collect whole;
  ChromeJsonTokenizer ref(&whole);
  ASSERT_TRUE(FeedInPieces(kDoc, {}, &whole, &ref).ok());
  for (size_t cut = 1; cut < kDoc.size(); ++cut) {
    for (size_t second : {cut + 1, cut + 7}) {
      std::vector<size_t> cuts = {cut};
      if (second < kDoc.size()) cuts.push_back(second);
      Collect sink;
      ChromeJsonTokenizer tok(&sink);
      ASSERT_TRUE(FeedInPieces(kDoc, cuts, &sink, &tok).ok()) << "cut at " << cut;
      EXPECT_EQ(sink.events, whole.events) << "cut at " << cut;
      EXPECT_EQ(sink.top, whole.top) << "cut at " << cut;
    }
  }
}

TEST(ChromeJsonTokenizerTest, TopLevelArrayAndNonObjects) {
  Collect sink;
  ChromeJsonTokenizer tok(&sink);
  ASSERT_TRUE(FeedInPieces("[{\"ph\":\"X\"}, 3, \"s\", [1], {\"ph\":\"i\"}]", {}, &sink, &tok).ok());
  EXPECT_EQ(sink.events.size(), 2u);
  EXPECT_EQ(sink.non_objects, 3);
}

TEST(ChromeJsonTokenizerTest, RejectsWhatIsNotATrace) {
  struct Case {
    std::string doc;
    std::string message;
  } cases[] = {
      {"", "empty"},
      {"   \n", "empty"},
      {"hello", "does not start"},
      {"{\"foo\": 1}", "traceEvents"},
      {"[1, 2, 3]", "without trace events"},
      {"{\"traceEvents\": [{\"ph\": \"X\"}, {\"ph\"", "truncated"},
      {"{\"traceEvents\": [{\"ph\": \"X\"}]", "truncated"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"traceEvents\": [{}, }]}", "unexpected '}'"},
      {"{\"a\": }", "without a value"},
  };
  for (const Case& c : cases) {
    Collect sink;
    ChromeJsonTokenizer tok(&sink);
    Status st = FeedInPieces(c.doc, {}, &sink, &tok);
    EXPECT_EQ(st.code(), StatusCode::kBadInput) << c.doc;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.doc << " -> " << st.message();
  }
}

TEST(ChromeJsonTokenizerTest, EmptyEventArrayIsAValidEmptyTrace) {
  Collect sink;
  ChromeJsonTokenizer tok(&sink);
  EXPECT_TRUE(FeedInPieces("{\"traceEvents\": []}", {}, &sink, &tok).ok());
  EXPECT_TRUE(sink.events.empty());
}

}  // namespace
}  // namespace dynaflow
