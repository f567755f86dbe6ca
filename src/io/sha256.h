// SHA-256 (FIPS 180-4), used to fingerprint dataset inputs and tokenizers in shard manifests; small
// enough that pulling in a crypto library for it is not worth a dependency.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace soltrain {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // finishes the hash; the object is spent afterwards

 private:
  void block(const unsigned char* p);
  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// The hash of a whole file (UserError if it cannot be read).
std::string sha256_file(const std::filesystem::path& path);
// For big files: the hash of the size, the first and the last `edge` bytes (the whole file when it is
// smaller than 2 × edge), so that checking a 100 GB corpus for changes costs two reads.
std::string sha256_file_edges(const std::filesystem::path& path, size_t edge = size_t(1) << 20);

}  // namespace soltrain
