// A parquet file as rows of JSON values: columns are read and decoded only when asked for, one row
// group at a time. Nested columns (lists, structs, lists of structs such as chat `messages`) are
// assembled from their repetition and definition levels.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/parquet/column.h"
#include "data/parquet/metadata.h"

namespace soltrain::parquet {

class ParquetFile {
 public:
  // Reads the footer; UserError "<path>: ..." when the file is not parquet, truncated or corrupt.
  explicit ParquetFile(const std::filesystem::path& path);

  size_t num_row_groups() const { return meta_.row_groups.size(); }
  int64_t num_rows() const { return meta_.num_rows; }
  // The top-level column names, in schema order.
  std::vector<std::string> columns() const;
  // The rows of row group `g`, each an object with the top-level `columns` that exist in the file (all
  // of them when `columns` is empty), in schema order. UserError "<path>: ..." on corrupt data.
  std::vector<nlohmann::ordered_json> read_row_group(size_t g, const std::vector<std::string>& columns);

 private:
  // The chunks of `fields`' leaf columns in row group `rg`, read from disk and decoded into cols[leaf].
  void read_chunks(const RowGroup& rg, const std::vector<size_t>& fields, std::vector<ColumnValues>& cols);
  struct Node {
    SchemaElement el;
    std::vector<size_t> children;
    std::vector<size_t> leaves;  // leaf columns under this node, by column index
    int def = 0, rep = 0;        // the definition / repetition level this node is present / repeats at
    int leaf = -1;               // column index for a leaf
  };
  size_t build(size_t& next, int def, int rep, int depth, std::vector<std::string>& path);

  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t file_size_ = 0;
  FileMetaData meta_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<std::vector<std::string>> leaf_paths_;
};

}  // namespace soltrain::parquet
