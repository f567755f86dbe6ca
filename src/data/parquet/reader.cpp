// Footer → schema tree → per-row-group column chunks → rows. Record assembly follows the Dremel scheme:
// a node is null (or an empty list) when its first leaf's definition level is below the node's own, and a
// repeated node continues while that leaf's next repetition level equals the node's.
#include "data/parquet/reader.h"

#include <cstring>
#include <functional>
#include <set>

#include "data/parquet/column.h"
#include "data/parquet/thrift.h"

namespace soltrain::parquet {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

constexpr char kMagic[] = "PAR1";
constexpr int kMaxSchemaDepth = 64;

bool is_list(const SchemaElement& e) {
  return e.converted_type == 3 || e.logical_list;
}

// Column cursors of one row group during assembly.
struct Cursors {
  std::vector<ColumnValues> cols;
  std::vector<size_t> at, value_at;

  void check(size_t c) const {
    if (at[c] >= cols[c].def.size()) corrupt("a column has fewer entries than its rows need (corrupt file)");
  }
  uint32_t def(size_t c) const { return check(c), cols[c].def[at[c]]; }
  uint32_t rep(size_t c) const { return check(c), cols[c].rep[at[c]]; }
  bool more(size_t c) const { return at[c] < cols[c].def.size(); }
};

}  // namespace

ParquetFile::ParquetFile(const fs::path& path) : path_(path) {
  in_.open(path, std::ios::binary);
  if (!in_) user_error(path.string(), ": cannot open (unreadable)");
  in_.seekg(0, std::ios::end);
  file_size_ = uint64_t(in_.tellg());
  try {
    if (file_size_ < 12) corrupt("not a parquet file: too short (truncated?)");
    char head[4], tail[8];
    in_.seekg(0);
    in_.read(head, 4);
    in_.seekg(std::streamoff(file_size_ - 8));
    in_.read(tail, 8);
    if (!in_) corrupt("cannot read the file");
    if (std::memcmp(head, kMagic, 4) != 0) corrupt("not a parquet file (it does not start with PAR1)");
    if (std::memcmp(tail + 4, kMagic, 4) != 0)
      corrupt("not a complete parquet file (it does not end with PAR1: truncated or still being written?)");
    uint32_t footer_len = 0;
    std::memcpy(&footer_len, tail, 4);
    if (footer_len > file_size_ - 12) corrupt("the footer length is larger than the file (corrupt file)");
    std::string footer(footer_len, '\0');
    in_.seekg(std::streamoff(file_size_ - 8 - footer_len));
    in_.read(footer.data(), footer_len);
    if (!in_) corrupt("cannot read the footer");
    meta_ = parse_file_metadata(footer);
    if (meta_.schema[0].num_children <= 0 && meta_.schema.size() > 1) corrupt("the schema root has no children");
    size_t next = 0;
    std::vector<std::string> p;
    build(next, 0, 0, 0, p);
    if (next != meta_.schema.size()) corrupt("the schema has elements outside its tree (corrupt file)");
    int64_t rows = 0;
    for (const RowGroup& g : meta_.row_groups) {
      if (g.columns.size() != leaf_paths_.size()) corrupt("a row group's column count differs from the schema");
      for (size_t c = 0; c < g.columns.size(); ++c) {
        const ColumnChunk& cc = g.columns[c];
        if (cc.path != leaf_paths_[c]) corrupt("a column chunk's path differs from the schema (corrupt file)");
        if (cc.num_values < 0 || cc.total_compressed_size < 0 || cc.start() < 4 ||
            uint64_t(cc.start()) + uint64_t(cc.total_compressed_size) > file_size_ - 8 - footer_len)
          corrupt("a column chunk lies outside the file (truncated or corrupt file)");
      }
      // Every row has at least one entry in every column: a larger count is corrupt (and would make the
      // reader produce rows without end when no column is read).
      if (g.num_rows < 0 || (!g.columns.empty() && g.num_rows > g.columns[0].num_values))
        corrupt("a row group's row count does not match its columns (corrupt file)");
      rows += g.num_rows;
    }
    if (rows != meta_.num_rows) corrupt("the row groups' rows do not add up to the file's (corrupt file)");
  } catch (const ParquetError& e) {
    user_error(path.string(), ": ", e.what());
  }
}

size_t ParquetFile::build(size_t& next, int def, int rep, int depth, std::vector<std::string>& path) {
  if (depth > kMaxSchemaDepth) corrupt("the schema is nested too deeply (corrupt file)");
  if (next >= meta_.schema.size()) corrupt("the schema ends early (corrupt file)");
  const size_t id = nodes_.size();
  nodes_.push_back({});
  nodes_[id].el = meta_.schema[next++];
  // A copy: the recursion below grows nodes_, which would leave a reference into it dangling.
  const SchemaElement el = nodes_[id].el;
  if (depth > 0) {  // the root's repetition says nothing
    if (el.repetition != Repetition::kRequired) ++def;
    if (el.repetition == Repetition::kRepeated) ++rep;
    path.push_back(el.name);
  }
  nodes_[id].def = def;
  nodes_[id].rep = rep;
  if (el.num_children < 0 || size_t(el.num_children) > meta_.schema.size())
    corrupt("a schema group has a bad child count (corrupt file)");
  if (el.num_children == 0 && depth > 0) {
    if (el.type == PhysicalType::kNone) corrupt("a schema leaf has no type (corrupt file)");
    nodes_[id].leaf = int(leaf_paths_.size());
    nodes_[id].leaves = {leaf_paths_.size()};
    leaf_paths_.push_back(path);
  }
  for (int32_t i = 0; i < el.num_children; ++i) {
    const size_t child = build(next, def, rep, depth + 1, path);
    nodes_[id].children.push_back(child);
    nodes_[id].leaves.insert(nodes_[id].leaves.end(), nodes_[child].leaves.begin(), nodes_[child].leaves.end());
  }
  if (nodes_[id].leaves.empty() && depth > 0) corrupt("a schema group has no columns (corrupt file)");
  if (depth > 0) path.pop_back();
  return id;
}

std::vector<std::string> ParquetFile::columns() const {
  std::vector<std::string> out;
  for (size_t c : nodes_[0].children) out.push_back(nodes_[c].el.name);
  return out;
}

void ParquetFile::read_chunks(const RowGroup& rg, const std::vector<size_t>& fields, std::vector<ColumnValues>& cols) {
  for (size_t f : fields)
    for (size_t leaf : nodes_[f].leaves) {
      const ColumnChunk& cc = rg.columns[leaf];
      std::string bytes(size_t(cc.total_compressed_size), '\0');
      in_.clear();
      in_.seekg(std::streamoff(cc.start()));
      in_.read(bytes.data(), std::streamsize(bytes.size()));
      if (!in_) corrupt("cannot read a column chunk (truncated file)");
      int max_def = 0, max_rep = 0;
      for (const Node& n : nodes_)
        if (n.leaf == int(leaf)) max_def = n.def, max_rep = n.rep;
      cols[leaf] = read_column_chunk(bytes, cc, max_rep, max_def);
      const ColumnValues& v = cols[leaf];
      if (v.rep.size() != v.def.size()) corrupt("a column's levels disagree in count (corrupt file)");
    }
}

std::vector<ordered_json> ParquetFile::read_row_group(size_t g, const std::vector<std::string>& wanted) {
  try {
    const RowGroup& rg = meta_.row_groups.at(g);
    const std::set<std::string> want(wanted.begin(), wanted.end());
    std::vector<size_t> fields;
    for (size_t c : nodes_[0].children)
      if (want.empty() || want.count(nodes_[c].el.name)) fields.push_back(c);
    Cursors cur;
    cur.cols.resize(leaf_paths_.size());
    cur.at.assign(leaf_paths_.size(), 0);
    cur.value_at.assign(leaf_paths_.size(), 0);
    read_chunks(rg, fields, cur.cols);

    const auto first = [&](size_t n) { return nodes_[n].leaves.front(); };
    // Skips one absent (null or empty) instance of a node: each leaf under it has one entry for it.
    const auto skip = [&](size_t n) {
      for (size_t leaf : nodes_[n].leaves) {
        cur.check(leaf);
        ++cur.at[leaf];
      }
    };
    std::function<ordered_json(size_t)> read, instance;
    const auto repeated = [&](size_t n, const std::function<ordered_json()>& element) {
      ordered_json arr = ordered_json::array();
      if (cur.def(first(n)) < uint32_t(nodes_[n].def)) {
        skip(n);
        return arr;
      }
      do arr.push_back(element());
      while (cur.more(first(n)) && cur.rep(first(n)) == uint32_t(nodes_[n].rep));
      return arr;
    };
    read = [&](size_t n) -> ordered_json {
      const Node& node = nodes_[n];
      if (node.el.repetition == Repetition::kRepeated) return repeated(n, [&] { return instance(n); });
      if (node.el.repetition == Repetition::kOptional && cur.def(first(n)) < uint32_t(node.def)) {
        skip(n);
        return nullptr;
      }
      return instance(n);
    };
    instance = [&](size_t n) -> ordered_json {
      const Node& node = nodes_[n];
      if (node.leaf >= 0) {
        const size_t c = size_t(node.leaf);
        cur.check(c);
        if (cur.cols[c].def[cur.at[c]] != uint32_t(node.def)) corrupt("inconsistent levels (corrupt file)");
        ++cur.at[c];
        if (cur.value_at[c] >= cur.cols[c].values.size()) corrupt("a column has fewer values than levels say");
        return cur.cols[c].values[cur.value_at[c]++];
      }
      // The standard LIST layout: <list> (LIST) { repeated group list { <element> } }; older writers'
      // two-level forms (repeated element directly, or a one-field group named "array" / "<list>_tuple")
      // are the element itself.
      if (is_list(node.el) && node.children.size() == 1 &&
          nodes_[node.children[0]].el.repetition == Repetition::kRepeated) {
        const size_t rg_node = node.children[0];
        const Node& r = nodes_[rg_node];
        const bool three_level =
            r.leaf < 0 && r.children.size() == 1 && r.el.name != "array" && r.el.name != node.el.name + "_tuple";
        return repeated(rg_node, [&] { return three_level ? read(r.children[0]) : instance(rg_node); });
      }
      ordered_json o = ordered_json::object();
      for (size_t ch : node.children) o[nodes_[ch].el.name] = read(ch);
      return o;
    };

    std::vector<ordered_json> rows;
    rows.reserve(size_t(std::max<int64_t>(rg.num_rows, 0)));
    for (int64_t r = 0; r < rg.num_rows; ++r) {
      ordered_json row = ordered_json::object();
      for (size_t f : fields) {
        for (size_t leaf : nodes_[f].leaves)
          if (cur.rep(leaf) != 0) corrupt("a row does not start where its levels say (corrupt file)");
        row[nodes_[f].el.name] = read(f);
      }
      rows.push_back(std::move(row));
    }
    for (size_t f : fields)
      for (size_t leaf : nodes_[f].leaves)
        if (cur.more(leaf)) corrupt("a column has more entries than the row group's rows (corrupt file)");
    return rows;
  } catch (const ParquetError& e) {
    user_error(path_.string(), ": row group ", g, ": ", e.what());
  }
}

}  // namespace soltrain::parquet
