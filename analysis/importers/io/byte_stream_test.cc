#include "analysis/importers/io/byte_stream.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

std::string Gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Reads everything, checking the padding promise of every chunk.
StatusOr<std::string> ReadAll(const std::string& path) {
  auto stream = ByteStream::Open(path);
  if (!stream.ok()) return stream.status();
  std::string all;
  for (;;) {
    auto chunk = (*stream)->Next();
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) break;
    for (size_t i = 0; i < kChunkPadding; ++i) EXPECT_EQ(chunk->data()[chunk->size() + i], 0);
    all.append(*chunk);
  }
  return all;
}

std::string RandomText(size_t n) {
  std::mt19937 rng(7);
  std::string s(n, ' ');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

TEST(ByteStreamTest, PlainFileAcrossManyChunks) {
  const std::string data = RandomText(3'500'000);
  const std::string path = TempPath("plain.json");
  WriteFile(path, data);
  auto all = ReadAll(path);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, data);
  std::filesystem::remove(path);
}

TEST(ByteStreamTest, GzipAcrossBuffersAndConcatenatedMembers) {
  const std::string a = RandomText(9'000'000);  // more than two inflate buffers
  const std::string b = "{\"traceEvents\": []}";
  const std::string path = TempPath("multi.json.gz");
  WriteFile(path, Gzip(a) + Gzip(b));
  auto all = ReadAll(path);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->size(), a.size() + b.size());
  EXPECT_EQ(*all, a + b);
  std::filesystem::remove(path);
}

TEST(ByteStreamTest, TruncatedGzipIsBadInput) {
  const std::string gz = Gzip(RandomText(200'000));
  const std::string path = TempPath("truncated.json.gz");
  WriteFile(path, gz.substr(0, gz.size() / 2));
  auto all = ReadAll(path);
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kBadInput);
  EXPECT_NE(all.status().message().find("truncated gzip"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(ByteStreamTest, CorruptGzipIsBadInput) {
  std::string gz = Gzip(RandomText(200'000));
  for (size_t i = 20; i < 200; ++i) gz[i] = static_cast<char>(gz[i] ^ 0x5a);
  const std::string path = TempPath("corrupt.json.gz");
  WriteFile(path, gz);
  auto all = ReadAll(path);
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kBadInput);
  std::filesystem::remove(path);
}

TEST(ByteStreamTest, MissingFileAndDirectoryAreBadInput) {
  auto missing = ByteStream::Open("/nonexistent/trace.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kBadInput);
  auto dir = ByteStream::Open(std::filesystem::temp_directory_path().string());
  EXPECT_EQ(dir.status().code(), StatusCode::kBadInput);
}

TEST(ByteStreamTest, ReadHeadDecompresses) {
  const std::string path = TempPath("head.json.gz");
  WriteFile(path, Gzip("{\"traceEvents\": [" + RandomText(10000)));
  auto head = ReadHead(path, 16);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, "{\"traceEvents\": ");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dynaflow
