#include "io/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/deferred_writes.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
size_t bytes_of(const StreamedTensor& t) {
  return size_t(shape_numel(t.shape)) * dtype_size(t.dtype);
}
}  // namespace

void write_safetensors_streamed(const fs::path& path, const std::vector<StreamedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  if (DeferredWrites* d = DeferredWrites::active()) return d->add(path, tensors, metadata);  // a snapshot
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0, largest = 0;
  for (const auto& t : tensors) {
    header[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes_of(t)}}};
    offset += bytes_of(t);
    largest = std::max(largest, bytes_of(t));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as the reference writer does
  AtomicFileWriter out(path);
  const uint64_t n = h.size();
  out.write(&n, 8);
  out.write(h.data(), h.size());
  std::vector<char> staging(largest);
  for (const auto& t : tensors) {
    t.fill(staging.data());
    out.write(staging.data(), bytes_of(t));
  }
  out.commit();
}

void write_checkpoint_streamed(const fs::path& dir, const std::vector<StreamedTensor>& tensors,
                               size_t max_shard_bytes) {
  std::vector<std::vector<StreamedTensor>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    if (in_shard > 0 && in_shard + bytes_of(t) > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes_of(t);
    total += bytes_of(t);
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors_streamed(dir / "model.safetensors", tensors, meta);
    return;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors_streamed(dir / name, shards[i], meta);
    for (const auto& t : shards[i]) map[t.name] = name;
  }
  index["weight_map"] = map;
  write_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace soltrain
