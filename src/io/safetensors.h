// safetensors: memory-mapped reading (single files and sharded checkpoints with an index) and writing.
// Every malformed input is a UserError naming the file and what is wrong; nothing is trusted unchecked.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors_writer.h"

namespace soltrain {

struct TensorEntry {
  DType dtype;
  Shape shape;
  const void* data;  // inside the mapping
  size_t bytes;
};

// One .safetensors file, mapped read-only for its lifetime.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorEntry>& entries() const { return entries_; }
  const TensorEntry* find(const std::string& name) const;
  // The entry, or a UserError naming the file when it is missing.
  const TensorEntry& at(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Copies an entry into fp32 (F32/BF16/F16 sources) after checking its shape; `what` names it in errors.
void read_as_f32(const TensorEntry& e, const Shape& expected, float* dst, const std::string& what);
// The same for its flat elements [first, first + count) alone: only those bytes of the mapping are read.
void read_range_as_f32(const TensorEntry& e, const Shape& expected, int64_t first, int64_t count, float* dst,
                       const std::string& what);
// Integer tensors (I32/I64) into int32, range-checked.
std::vector<int32_t> read_as_i32(const TensorEntry& e, const std::string& what);

// A Hugging Face model folder's weights: model.safetensors, or shards listed in
// model.safetensors.index.json.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& dir);
  // Its tensors under the names a model gives them: `rename` maps a stored name to the model's, or to "" for one
  // the model does not read (a vision-language checkpoint's vision tower: listed by outside(), not by names()).
  CheckpointReader(const std::filesystem::path& dir, const std::function<std::string(const std::string&)>& rename);
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorEntry& entry(const std::string& name) const;
  std::vector<std::string> names() const;
  std::vector<std::string> outside() const;  // stored names
  const TensorEntry& outside_entry(const std::string& stored_name) const;
  std::string describe(const std::string& name) const;  // "file: tensor name" (as stored) for messages

 private:
  std::string stored(const std::string& name) const;
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;        // tensor name -> index in files_
  std::map<std::string, std::string> stored_;  // a renamed tensor's name -> its stored name
  std::map<std::string, size_t> outside_;      // a tensor the model does not read -> index in files_
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // host memory
};

// Host tensors as the streaming writer's producers (io/safetensors_writer.h).
std::vector<StreamedTensor> as_streamed(const std::vector<NamedTensor>& tensors);
// Writes one file atomically.
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Writes `dir`/model.safetensors, or, past `max_shard_bytes`, model-0000i-of-0000n.safetensors and
// model.safetensors.index.json, as transformers' save_pretrained does.
void write_checkpoint(const std::filesystem::path& dir, const std::vector<NamedTensor>& tensors,
                      size_t max_shard_bytes);

}  // namespace soltrain
