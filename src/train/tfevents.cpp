// Protobuf wire format by hand: Event {1: wall_time double, 2: step int64, 3: file_version string,
// 5: summary}; Summary {1: repeated Value}; Value {1: tag string, 2: simple_value float}.
#include "train/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "io/checked_write.h"

namespace soltrain {

namespace {

// Castagnoli polynomial, reflected (0x82F63B78), one table lookup per byte: ample for a few records a step.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as protobuf's fixed fields are
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_varint(out, (uint64_t(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_head(double wall_time, int64_t step) {
  std::string e;
  e.push_back(char(0x09));  // field 1, fixed64
  put_fixed(e, wall_time);
  if (step != 0) {
    e.push_back(char(0x10));  // field 2, varint
    put_varint(e, uint64_t(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = t[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string r;
  put_fixed(r, uint64_t(data.size()));
  put_fixed(r, masked_crc32c(r));
  r.append(data);
  put_fixed(r, masked_crc32c(data));
  return r;
}

std::string event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_scalar(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  v.push_back(char(0x15));  // field 2, fixed32
  put_fixed(v, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TfEventsWriter::TfEventsWriter(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  // TensorBoard orders files of one folder by name: the timestamp first, the pid against collisions.
  path_ = dir / cat("events.out.tfevents.", int64_t(now_seconds()), ".", host, ".", ::getpid());
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) user_error(path_.string(), ": cannot create the TensorBoard event file");
  append_checked(out_, tfrecord(event_file_version(now_seconds())), path_, "the TensorBoard event file");
}

void TfEventsWriter::scalar(const std::string& tag, int64_t step, double value) {
  append_checked(out_, tfrecord(event_scalar(now_seconds(), step, tag, float(value))), path_,
                 "the TensorBoard event file");
}

}  // namespace soltrain
