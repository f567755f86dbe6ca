// One column chunk of one row group → its repetition levels, definition levels and values.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "data/parquet/metadata.h"

namespace soltrain::parquet {

// Entry i of the column: rep[i], def[i]; a value exists only where def[i] == max_def, in order.
struct ColumnValues {
  std::vector<uint32_t> rep, def;
  std::vector<nlohmann::ordered_json> values;
};

// `chunk` is the chunk's bytes (dictionary page, then data pages v1/v2). ParquetError on corrupt data or
// an encoding / codec / type outside PLAIN, dictionary, RLE booleans; snappy, gzip, zstd, none.
ColumnValues read_column_chunk(std::string_view chunk, const ColumnChunk& meta, int max_rep, int max_def);

}  // namespace soltrain::parquet
