// TensorBoard files: CRC32C known answers, TFRecord framing read back and its CRCs verified, and the
// Event protobuf decoded field by field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "test_util.h"
#include "train/tfevents.h"

namespace soltrain {
namespace {

TEST(TfEvents, Crc32cKnownAnswers) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720 / iSCSI)
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
}

uint64_t u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
uint32_t u32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

// Splits a file into TFRecord payloads, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size());
    const uint64_t len = u64(bytes, at);
    EXPECT_EQ(u32(bytes, at + 8), masked_crc32c(bytes.substr(at, 8)));
    const std::string data = bytes.substr(at + 12, len);
    EXPECT_EQ(u32(bytes, at + 12 + len), masked_crc32c(data));
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

TEST(TfEvents, ScalarEventEncoding) {
  const std::string e = event_scalar(1.5, 300, "train/loss", 2.25f);
  // wall_time: tag 0x09 + 8 bytes double
  ASSERT_EQ(uint8_t(e[0]), 0x09);
  double wt;
  std::memcpy(&wt, e.data() + 1, 8);
  EXPECT_EQ(wt, 1.5);
  // step: tag 0x10, varint 300 = 0xAC 0x02
  EXPECT_EQ(uint8_t(e[9]), 0x10);
  EXPECT_EQ(uint8_t(e[10]), 0xAC);
  EXPECT_EQ(uint8_t(e[11]), 0x02);
  // summary (field 5, bytes) → value (field 1, bytes) → tag (field 1) + simple_value (field 2, fixed32)
  EXPECT_EQ(uint8_t(e[12]), 0x2A);
  const size_t summary_len = uint8_t(e[13]);
  EXPECT_EQ(summary_len, e.size() - 14);
  EXPECT_EQ(uint8_t(e[14]), 0x0A);
  EXPECT_EQ(uint8_t(e[15]), summary_len - 2);
  EXPECT_EQ(uint8_t(e[16]), 0x0A);
  EXPECT_EQ(uint8_t(e[17]), 10);
  EXPECT_EQ(e.substr(18, 10), "train/loss");
  EXPECT_EQ(uint8_t(e[28]), 0x15);
  float v;
  std::memcpy(&v, e.data() + 29, 4);
  EXPECT_EQ(v, 2.25f);
}

TEST(TfEvents, WriterFileFramesEveryRecord) {
  test::TempDir t;
  std::filesystem::path file;
  {
    TfEventsWriter w(t.path);
    w.scalar("train/loss", 1, 3.0);
    w.scalar("train/loss", 2, 2.0);
    file = w.path();
  }
  EXPECT_TRUE(file.filename().string().starts_with("events.out.tfevents."));
  std::ifstream in(file, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  const std::vector<std::string> recs = read_records(bytes);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_NE(recs[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(recs[2].find("train/loss"), std::string::npos);
}

}  // namespace
}  // namespace soltrain
