// TensorBoard event files written directly: TFRecord framing (length, masked CRC32C, data, masked
// CRC32C) around a hand-encoded Event protobuf holding scalar summaries. No TensorFlow or protobuf needed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace soltrain {

uint32_t crc32c(std::string_view data);
// TFRecord's mask: rotate right by 15 and add a constant, so CRCs of CRCs stay well distributed.
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: u64 length, u32 masked crc of the length bytes, data, u32 masked crc of the data.
std::string tfrecord(std::string_view data);

// Serialized Event messages: the file_version header and one scalar summary.
std::string event_file_version(double wall_time);
std::string event_scalar(double wall_time, int64_t step, const std::string& tag, float value);

// An events.out.tfevents.* file in `dir`, flushed after every record so a live TensorBoard sees it.
class TfEventsWriter {
 public:
  explicit TfEventsWriter(const std::filesystem::path& dir);
  void scalar(const std::string& tag, int64_t step, double value);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace soltrain
