// Parquet's RLE / bit-packed hybrid encoding: repetition and definition levels, dictionary indices and
// RLE booleans all use it.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace soltrain::parquet {

// Appends `count` values of `bit_width` bits (0..32) decoded from `data` to `out`; ParquetError when
// the data ends before `count` values.
void decode_hybrid(std::string_view data, int bit_width, size_t count, std::vector<uint32_t>& out);

// Bits needed for values 0..max_value.
int bit_width_for(uint32_t max_value);

}  // namespace soltrain::parquet
