// Streaming safetensors writer: the header is written from the tensors' names, dtypes and shapes, then each
// tensor's bytes as its producer fills them, through one reusable staging buffer, into a temporary sibling
// renamed into place at the end. Memory held is the largest tensor, not the file: a 4B model's checkpoint
// no longer needs its weights and moments twice in host memory.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace soltrain {

struct StreamedTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::function<void(void* dst)> fill;  // writes exactly numel × dtype_size bytes
};

void write_safetensors_streamed(const std::filesystem::path& path, const std::vector<StreamedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

// model.safetensors, or model-0000i-of-0000n.safetensors shards past `max_shard_bytes` with
// model.safetensors.index.json, as transformers' save_pretrained lays them out.
void write_checkpoint_streamed(const std::filesystem::path& dir, const std::vector<StreamedTensor>& tensors,
                               size_t max_shard_bytes);

}  // namespace soltrain
