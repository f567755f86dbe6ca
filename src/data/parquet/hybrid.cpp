// parquet-format Encodings.md, "Run Length Encoding / Bit-Packing Hybrid": a varint header whose low bit
// says bit-packed (groups of 8 values, LSB first) or RLE (one value, little-endian in ceil(width/8) bytes).
#include "data/parquet/hybrid.h"

#include "data/parquet/thrift.h"

namespace soltrain::parquet {

int bit_width_for(uint32_t max_value) {
  int w = 0;
  while (w < 32 && (uint64_t(1) << w) <= max_value) ++w;
  return w;
}

void decode_hybrid(std::string_view data, int bit_width, size_t count, std::vector<uint32_t>& out) {
  if (bit_width < 0 || bit_width > 32) corrupt(cat("bit width ", bit_width, " is out of range (corrupt page)"));
  const size_t target = out.size() + count;
  if (bit_width == 0) {  // every value is 0 and takes no bits
    out.resize(target, 0);
    return;
  }
  size_t pos = 0;
  auto ends = [] { corrupt("levels or indices end early (truncated or corrupt page)"); };
  while (out.size() < target) {
    uint64_t header = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= data.size() || shift > 35) ends();
      const uint8_t b = uint8_t(data[pos++]);
      header |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    if ((header >> 1) == 0) corrupt("an empty run (corrupt page)");
    if (header & 1) {  // bit-packed: header >> 1 groups of 8
      const uint64_t values = (header >> 1) * 8;
      const uint64_t bytes = (header >> 1) * uint64_t(bit_width);
      // A final run may stop short of its padding; only the values still wanted must be present.
      const uint64_t wanted = std::min<uint64_t>(values, target - out.size());
      if ((wanted * uint64_t(bit_width) + 7) / 8 > data.size() - pos) ends();
      const uint64_t mask = bit_width == 32 ? 0xffffffffu : (uint64_t(1) << bit_width) - 1;
      for (uint64_t i = 0; i < wanted; ++i) {
        const uint64_t bit = i * uint64_t(bit_width);
        uint64_t v = 0;
        const size_t first = pos + bit / 8;
        // Gather up to 5 bytes covering this value (32 bits + up to 7 bits of offset).
        for (size_t k = 0; k < 5 && first + k < data.size(); ++k) v |= uint64_t(uint8_t(data[first + k])) << (8 * k);
        out.push_back(uint32_t((v >> (bit % 8)) & mask));
      }
      pos += std::min<uint64_t>(bytes, data.size() - pos);
    } else {  // RLE: header >> 1 copies of one value
      const uint64_t n = header >> 1;
      const size_t width = size_t(bit_width + 7) / 8;
      if (width > data.size() - pos) ends();
      uint32_t v = 0;
      for (size_t k = 0; k < width; ++k) v |= uint32_t(uint8_t(data[pos + k])) << (8 * k);
      pos += width;
      out.resize(out.size() + std::min<uint64_t>(n, target - out.size()), v);
    }
  }
}

}  // namespace soltrain::parquet
