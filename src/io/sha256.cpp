// SHA-256 through OpenSSL's libcrypto (its SHA-NI / AVX2 code: ~2 GB/s where the CPU has SHA-NI, several
// times a portable loop, which matters for checksumming checkpoints of many GB).
#include "io/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace soltrain {

void Sha256::CtxFree::operator()(evp_md_ctx_st* c) const {
  EVP_MD_CTX_free(c);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) throw std::bad_alloc();
}

void Sha256::update(std::string_view bytes) {
  EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size());
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_.get(), md, &n);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) out += digits[md[i] >> 4], out += digits[md[i] & 15];
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 s;
  s.update(bytes);
  return s.hex();
}

namespace {

// Hashes `len` bytes of f from `offset`.
void hash_range(std::ifstream& f, uint64_t offset, uint64_t len, Sha256& s, const std::filesystem::path& path) {
  std::vector<char> buf(size_t(1) << 20);
  f.seekg(std::streamoff(offset));
  while (len > 0) {
    const size_t take = size_t(std::min<uint64_t>(len, buf.size()));
    if (!f.read(buf.data(), std::streamsize(take))) user_error(path.string(), ": read failed");
    s.update(std::string_view(buf.data(), take));
    len -= take;
  }
}

}  // namespace

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) user_error(path.string(), ": cannot open (missing or unreadable)");
  Sha256 s;
  hash_range(f, 0, std::filesystem::file_size(path), s, path);
  return s.hex();
}

std::string sha256_file_edges(const std::filesystem::path& path, size_t edge) {
  const uint64_t size = std::filesystem::file_size(path);
  if (size <= 2 * uint64_t(edge)) return sha256_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) user_error(path.string(), ": cannot open (missing or unreadable)");
  Sha256 s;
  s.update(std::to_string(size) + ":");
  hash_range(f, 0, edge, s, path);
  hash_range(f, size - edge, edge, s, path);
  return s.hex();
}

}  // namespace soltrain
