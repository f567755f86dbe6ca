// SHA-256 as specified in FIPS 180-4, section 6.2.
#include "io/sha256.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace soltrain {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

}  // namespace

Sha256::Sha256() : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const unsigned char* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
}

void Sha256::update(std::string_view bytes) {
  total_ += bytes.size();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  while (n > 0) {
    const size_t take = std::min(n, buf_.size() - used_);
    std::copy(p, p + take, buf_.begin() + used_);
    used_ += take, p += take, n -= take;
    if (used_ == buf_.size()) {
      block(buf_.data());
      used_ = 0;
    }
  }
}

std::string Sha256::hex() {
  const uint64_t bits = total_ * 8;
  const unsigned char one = 0x80, zero = 0;
  update(std::string_view(reinterpret_cast<const char*>(&one), 1));
  while (used_ != 56) update(std::string_view(reinterpret_cast<const char*>(&zero), 1));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
  update(std::string_view(reinterpret_cast<const char*>(len), 8));
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h_[i]);
  return std::string(out, 64);
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 s;
  s.update(bytes);
  return s.hex();
}

namespace {

// Hashes `len` bytes of f from `offset`.
void hash_range(std::ifstream& f, uint64_t offset, uint64_t len, Sha256& s, const std::filesystem::path& path) {
  std::vector<char> buf(size_t(1) << 16);
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
