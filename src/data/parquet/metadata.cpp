// The thrift structs of parquet.thrift that the reader uses; every other field is skipped.
#include "data/parquet/metadata.h"

#include "data/parquet/thrift.h"

namespace soltrain::parquet {

namespace {

using T = ThriftReader;

template <typename F>
void each(ThriftReader& r, uint8_t type, F elem) {
  uint8_t et = 0;
  const uint32_t n = r.list(type, et);
  for (uint32_t i = 0; i < n; ++i) elem(et);
}

SchemaElement schema_element(ThriftReader& r) {
  SchemaElement e;
  r.read_struct([&](int16_t id, uint8_t t) {
    switch (id) {
      case 1: {
        const int32_t v = r.i32(t);
        if (v < 0 || v > 7) corrupt(cat("schema has unknown physical type ", v));
        e.type = PhysicalType(v);
        break;
      }
      case 3: {
        const int32_t v = r.i32(t);
        if (v < 0 || v > 2) corrupt(cat("schema has unknown repetition ", v));
        e.repetition = Repetition(v);
        break;
      }
      case 4: e.name = r.binary(t); break;
      case 5: e.num_children = r.i32(t); break;
      case 6: e.converted_type = r.i32(t); break;
      case 10:  // LogicalType, a union: 2 MAP, 3 LIST
        if (t != T::kStruct) corrupt("schema logical type is not a struct");
        r.read_struct([&](int16_t lid, uint8_t lt) {
          if (lid == 2) e.logical_map = true;
          if (lid == 3) e.logical_list = true;
          r.skip(lt);
        });
        break;
      default: r.skip(t);
    }
  });
  return e;
}

ColumnChunk column_metadata(ThriftReader& r) {
  ColumnChunk c;
  r.read_struct([&](int16_t id, uint8_t t) {
    switch (id) {
      case 1: c.type = PhysicalType(std::min(std::max(r.i32(t), -1), 7)); break;
      case 3: each(r, t, [&](uint8_t et) { c.path.push_back(r.binary(et)); }); break;
      case 4: c.codec = Codec(r.i32(t)); break;
      case 5: c.num_values = r.i64(t); break;
      case 7: c.total_compressed_size = r.i64(t); break;
      case 9: c.data_page_offset = r.i64(t); break;
      case 11: c.dictionary_page_offset = r.i64(t); break;
      default: r.skip(t);
    }
  });
  return c;
}

RowGroup row_group(ThriftReader& r) {
  RowGroup g;
  r.read_struct([&](int16_t id, uint8_t t) {
    if (id == 1) {
      each(r, t, [&](uint8_t et) {
        if (et != T::kStruct) corrupt("row group column is not a struct");
        ColumnChunk c;
        bool has_meta = false;
        r.read_struct([&](int16_t cid, uint8_t ct) {
          if (cid == 1) {
            if (!r.binary(ct).empty()) corrupt("columns stored in another file (file_path) are not supported");
          } else if (cid == 3) {
            if (ct != T::kStruct) corrupt("column metadata is not a struct");
            c = column_metadata(r);
            has_meta = true;
          } else {
            r.skip(ct);
          }
        });
        if (!has_meta) corrupt("a column chunk has no metadata");
        g.columns.push_back(std::move(c));
      });
    } else if (id == 3) {
      g.num_rows = r.i64(t);
    } else {
      r.skip(t);
    }
  });
  return g;
}

}  // namespace

FileMetaData parse_file_metadata(std::string_view footer) {
  ThriftReader r(footer);
  FileMetaData m;
  r.read_struct([&](int16_t id, uint8_t t) {
    switch (id) {
      case 2:
        each(r, t, [&](uint8_t et) {
          if (et != T::kStruct) corrupt("schema element is not a struct");
          m.schema.push_back(schema_element(r));
        });
        break;
      case 3: m.num_rows = r.i64(t); break;
      case 4:
        each(r, t, [&](uint8_t et) {
          if (et != T::kStruct) corrupt("row group is not a struct");
          m.row_groups.push_back(row_group(r));
        });
        break;
      default: r.skip(t);
    }
  });
  if (m.schema.empty()) corrupt("the file has no schema");
  return m;
}

PageHeader parse_page_header(std::string_view data) {
  ThriftReader r(data);
  PageHeader h;
  auto encoding = [&](uint8_t t) {
    const int32_t v = r.i32(t);
    if (v < 0 || v > 9) corrupt(cat("page has unknown encoding ", v));
    return Encoding(v);
  };
  r.read_struct([&](int16_t id, uint8_t t) {
    switch (id) {
      case 1: h.type = PageType(r.i32(t)); break;
      case 2: h.uncompressed_size = r.i32(t); break;
      case 3: h.compressed_size = r.i32(t); break;
      case 5:  // DataPageHeader: num_values, encoding, then level encodings (always RLE in practice)
      case 7:  // DictionaryPageHeader: num_values, encoding
        if (t != T::kStruct) corrupt("page header is malformed");
        r.read_struct([&](int16_t sid, uint8_t st) {
          if (sid == 1)
            h.num_values = r.i32(st);
          else if (sid == 2)
            h.encoding = encoding(st);
          else
            r.skip(st);
        });
        break;
      case 8:  // DataPageHeaderV2
        if (t != T::kStruct) corrupt("page header is malformed");
        r.read_struct([&](int16_t sid, uint8_t st) {
          switch (sid) {
            case 1: h.num_values = r.i32(st); break;
            case 4: h.encoding = encoding(st); break;
            case 5: h.def_levels_bytes = r.i32(st); break;
            case 6: h.rep_levels_bytes = r.i32(st); break;
            case 7: h.is_compressed = r.boolean(st); break;
            default: r.skip(st);
          }
        });
        break;
      default: r.skip(t);
    }
  });
  if (h.uncompressed_size < 0 || h.compressed_size < 0 || h.num_values < 0 || h.def_levels_bytes < 0 ||
      h.rep_levels_bytes < 0)
    corrupt("page header has a negative size");
  h.header_size = r.position();
  return h;
}

}  // namespace soltrain::parquet
