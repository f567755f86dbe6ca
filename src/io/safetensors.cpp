#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/json_file.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace soltrain {

namespace {
// Headers of real checkpoints are a few hundred KB; anything near this is corruption.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void bad(const fs::path& p, const std::string& why) {
  user_error(p.string(), ": not a valid safetensors file: ", why);
}
}  // namespace

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) user_error(path.string(), ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    user_error(path.string(), ": not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    bad(path, cat("truncated (", size_, " bytes; the 8-byte header length is missing)"));
  }
  map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    user_error(path.string(), ": cannot map (", std::strerror(errno), ")");
  }
  try {
    uint64_t header_len;
    std::memcpy(&header_len, map_, 8);
    if (header_len > kMaxHeaderBytes || header_len > size_ - 8)
      bad(path, cat("header length ", header_len, " exceeds the file size ", size_, " (truncated?)"));
    const char* base = static_cast<const char*>(map_);
    json header;
    try {
      const std::string text(base + 8, base + 8 + header_len);
      if (json_nesting_depth(text) > kMaxJsonDepth) throw json::other_error::create(600, "nested too deep", nullptr);
      header = json::parse(text);
    } catch (const json::exception& e) {  // syntax, or a number out of range
      bad(path, cat("header is not JSON (", e.what(), ")"));
    }
    if (!header.is_object()) bad(path, "header is not a JSON object");
    const size_t data_start = 8 + header_len, data_size = size_ - data_start;
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> spans;  // [begin, end) and the name
    for (auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) bad(path, "__metadata__ is not an object");
        for (auto& [k, s] : v.items())
          if (s.is_string()) metadata_[k] = s.get<std::string>();
        continue;
      }
      const std::string where = cat("tensor '", name, "': ");
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        bad(path, where + "needs dtype, shape and data_offsets");
      if (!v["dtype"].is_string()) bad(path, where + "dtype is not a string");
      const auto dt = dtype_from_name(v["dtype"].get<std::string>());
      if (!dt)
        bad(path, where + cat("unsupported dtype ", v["dtype"].get<std::string>(), " (F32, BF16, F16, I32, I64)"));
      if (!v["shape"].is_array()) bad(path, where + "shape is not a list");
      Shape shape;
      uint64_t numel = 1;
      for (auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) bad(path, where + "shape has a non-integer or negative dimension");
        const uint64_t x = d.get<uint64_t>();
        if (x && numel > std::numeric_limits<uint64_t>::max() / 8 / x) bad(path, where + "shape overflows");
        numel *= x;
        shape.push_back(int64_t(x));
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        bad(path, where + "data_offsets must be two non-negative integers");
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e || e > data_size)
        bad(path,
            where + cat("data_offsets [", b, ", ", e, "] out of range (data is ", data_size, " bytes; truncated?)"));
      if (e - b != numel * dtype_size(*dt))
        bad(path, where + cat("shape ", shape_str(shape), " of ", dtype_name(*dt), " needs ", numel * dtype_size(*dt),
                              " bytes, data_offsets give ", e - b));
      entries_[name] = TensorEntry{*dt, shape, base + data_start + b, size_t(e - b)};
      spans.push_back({{b, e}, name});
    }
    // The format's data is exactly the tensors laid end to end: an overlap would let two tensors share
    // bytes, a gap hides bytes no tensor owns. Sorting by offset allows any order of the header's keys.
    std::sort(spans.begin(), spans.end());
    uint64_t covered = 0;
    for (const auto& [span, name] : spans) {
      if (span.first < covered)
        bad(path, cat("tensor '", name, "': data_offsets [", span.first, ", ", span.second,
                      "] overlap the previous tensor's bytes (which end at ", covered, ")"));
      if (span.first > covered)
        bad(path, cat("bytes [", covered, ", ", span.first, ") of the data belong to no tensor (before tensor '", name,
                      "')"));
      covered = span.second;
    }
    if (covered != data_size)
      bad(path, cat("bytes [", covered, ", ", data_size, ") at the end of the data belong to no tensor"));
  } catch (...) {
    munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  const TensorEntry* e = find(name);
  if (!e) user_error(path_.string(), ": tensor '", name, "' is missing");
  return *e;
}

void read_as_f32(const TensorEntry& e, const Shape& expected, float* dst, const std::string& what) {
  read_range_as_f32(e, expected, 0, shape_numel(expected), dst, what);
}

void read_range_as_f32(const TensorEntry& e, const Shape& expected, int64_t first, int64_t count, float* dst,
                       const std::string& what) {
  if (e.shape != expected)
    user_error(what, ": shape ", shape_str(e.shape), " does not match the expected ", shape_str(expected));
  SOLTRAIN_CHECK(first >= 0 && count >= 0 && first + count <= shape_numel(e.shape), what, ": elements [", first, ", ",
                 first + count, ")");
  const size_t n = size_t(count);
  switch (e.dtype) {
    case DType::F32: std::memcpy(dst, static_cast<const float*>(e.data) + first, n * 4); break;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(e.data) + first;
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(e.data) + first;
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::F8E4M3:
    case DType::F8E5M2:  // FP8 values mean something only with their scales (model/fp8_checkpoint.h)
      user_error(what, ": dtype ", dtype_name(e.dtype), " without a weight_scale_inv next to it is not supported");
    default: user_error(what, ": dtype ", dtype_name(e.dtype), " is not a floating-point type");
  }
}

std::vector<int32_t> read_as_i32(const TensorEntry& e, const std::string& what) {
  const size_t n = size_t(shape_numel(e.shape));
  std::vector<int32_t> out(n);
  if (e.dtype == DType::I32) {
    std::memcpy(out.data(), e.data, n * 4);
  } else if (e.dtype == DType::I64) {
    auto* s = static_cast<const int64_t*>(e.data);
    for (size_t i = 0; i < n; ++i) {
      if (s[i] < std::numeric_limits<int32_t>::min() || s[i] > std::numeric_limits<int32_t>::max())
        user_error(what, ": value ", s[i], " does not fit in 32 bits");
      out[i] = int32_t(s[i]);
    }
  } else {
    user_error(what, ": dtype ", dtype_name(e.dtype), " is not an integer type (I32 or I64)");
  }
  return out;
}

CheckpointReader::CheckpointReader(const fs::path& dir) : dir_(dir) {
  const fs::path index = dir / "model.safetensors.index.json", single = dir / "model.safetensors";
  if (fs::exists(index)) {
    const json j = read_json_file(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      user_error(index.string(), ": missing \"weight_map\" object");
    std::map<std::string, size_t> file_index;
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) user_error(index.string(), ": weight_map entry '", tensor, "' is not a file name");
      const std::string f = file.get<std::string>();
      if (!file_index.count(f)) {
        file_index[f] = files_.size();
        files_.push_back(std::make_unique<SafetensorsFile>(dir / f));
      }
      const size_t fi = file_index[f];
      if (!files_[fi]->find(tensor))
        user_error(index.string(), ": lists '", tensor, "' in ", f, ", which does not contain it");
      where_[tensor] = fi;
    }
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (auto& [name, e] : files_[0]->entries()) where_[name] = 0;
  } else {
    user_error(dir.string(), ": no model.safetensors or model.safetensors.index.json (is this a model folder?)");
  }
}

CheckpointReader::CheckpointReader(const fs::path& dir, const std::function<std::string(const std::string&)>& rename)
    : CheckpointReader(dir) {
  std::map<std::string, size_t> renamed;
  for (const auto& [name, file] : where_) {
    const std::string ours = rename(name);
    if (ours.empty()) {
      outside_[name] = file;
      continue;
    }
    if (ours != name) stored_[ours] = name;
    renamed[ours] = file;
  }
  where_ = std::move(renamed);
}

std::vector<std::string> CheckpointReader::outside() const {
  std::vector<std::string> r;
  for (const auto& [n, i] : outside_) r.push_back(n);
  return r;
}

const TensorEntry& CheckpointReader::outside_entry(const std::string& stored_name) const {
  return files_[outside_.at(stored_name)]->entries().at(stored_name);
}

std::string CheckpointReader::stored(const std::string& name) const {
  const auto it = stored_.find(name);
  return it == stored_.end() ? name : it->second;
}

const TensorEntry& CheckpointReader::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) user_error(dir_.string(), ": checkpoint has no tensor '", stored(name), "'");
  return files_[it->second]->entries().at(stored(name));
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> r;
  for (auto& [n, i] : where_) r.push_back(n);
  return r;
}

std::string CheckpointReader::describe(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? cat(dir_.string(), ": ", stored(name))
                            : cat(files_[it->second]->path().string(), ": tensor '", stored(name), "'");
}

std::vector<StreamedTensor> as_streamed(const std::vector<NamedTensor>& tensors) {
  std::vector<StreamedTensor> out;
  for (const auto& t : tensors) {
    SOLTRAIN_CHECK(t.tensor.device == Device::CPU, "writing a device tensor: ", t.name);
    out.push_back({t.name, t.tensor.dtype, t.tensor.shape,
                   [p = t.tensor.data, n = t.tensor.bytes()](void* dst) { std::memcpy(dst, p, n); }});
  }
  return out;
}

void write_safetensors(const fs::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors_streamed(path, as_streamed(tensors), metadata);
}

void write_checkpoint(const fs::path& dir, const std::vector<NamedTensor>& tensors, size_t max_shard_bytes) {
  write_checkpoint_streamed(dir, as_streamed(tensors), max_shard_bytes);
}

}  // namespace soltrain
