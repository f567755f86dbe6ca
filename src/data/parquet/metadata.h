// Parquet's footer (FileMetaData) and page headers as far as a reader of whole columns needs them
// (parquet-format's parquet.thrift: field ids are the ones written there).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace soltrain::parquet {

enum class PhysicalType {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7,
  kNone = -1
};
enum class Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum class Codec { kUncompressed = 0, kSnappy = 1, kGzip = 2, kLzo = 3, kBrotli = 4, kLz4 = 5, kZstd = 6, kLz4Raw = 7 };
enum class Encoding {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kBitPacked = 4,
  kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7,
  kRleDictionary = 8,
  kByteStreamSplit = 9
};
enum class PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

struct SchemaElement {
  PhysicalType type = PhysicalType::kNone;  // kNone: a group
  Repetition repetition = Repetition::kRequired;
  std::string name;
  int32_t num_children = 0;
  int32_t converted_type = -1;  // 0 UTF8, 1 MAP, 2 MAP_KEY_VALUE, 3 LIST, ...
  bool logical_list = false, logical_map = false;
};

struct ColumnChunk {
  PhysicalType type = PhysicalType::kNone;
  std::vector<std::string> path;
  Codec codec = Codec::kUncompressed;
  int64_t num_values = 0, total_compressed_size = 0;
  int64_t data_page_offset = -1, dictionary_page_offset = -1;
  // The byte range the chunk's pages occupy.
  int64_t start() const {
    return dictionary_page_offset > 0 && dictionary_page_offset < data_page_offset ? dictionary_page_offset
                                                                                   : data_page_offset;
  }
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t num_rows = 0;
};

struct FileMetaData {
  std::vector<SchemaElement> schema;  // depth-first, the root first
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
};

struct PageHeader {
  PageType type = PageType::kDataPage;
  int32_t uncompressed_size = 0, compressed_size = 0;
  // Data pages (v1 and v2) and dictionary pages.
  int32_t num_values = 0;
  Encoding encoding = Encoding::kPlain;
  // v2 only: levels are stored uncompressed ahead of the values.
  int32_t def_levels_bytes = 0, rep_levels_bytes = 0;
  bool is_compressed = true;
  size_t header_size = 0;  // bytes the header itself took
};

// ParquetError on anything malformed.
FileMetaData parse_file_metadata(std::string_view footer);
PageHeader parse_page_header(std::string_view data);

}  // namespace soltrain::parquet
