// SHA-256 (FIPS 180-4, OpenSSL's libcrypto): hub downloads checked against their ETag, dataset inputs and
// tokenizers fingerprinted in shard manifests, checkpoint files checked at resume.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace soltrain {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // finishes the hash; the object is spent afterwards

 private:
  struct CtxFree {
    void operator()(evp_md_ctx_st* c) const;
  };
  std::unique_ptr<evp_md_ctx_st, CtxFree> ctx_;
};

std::string sha256_hex(std::string_view bytes);
// The hash of a whole file (UserError if it cannot be read).
std::string sha256_file(const std::filesystem::path& path);
// For big files: the hash of the size, the first and the last `edge` bytes (the whole file when it is
// smaller than 2 × edge), so that checking a 100 GB corpus for changes costs two reads.
std::string sha256_file_edges(const std::filesystem::path& path, size_t edge = size_t(1) << 20);

}  // namespace soltrain
