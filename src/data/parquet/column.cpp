// Page decoding: decompression (whole page in v1, values only in v2), levels, PLAIN and dictionary values.
#include "data/parquet/column.h"

#include <cstring>

#include "core/host_memory.h"
#include "data/parquet/hybrid.h"
#include "data/parquet/thrift.h"
#include "io/compression.h"
#include "tokenizer/utf8.h"

namespace soltrain::parquet {

namespace {

using nlohmann::ordered_json;

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::kLzo: return "LZO";
    case Codec::kBrotli: return "BROTLI";
    case Codec::kLz4: return "LZ4";
    case Codec::kLz4Raw: return "LZ4_RAW";
    default: return "unknown";
  }
}

std::string decompress(Codec codec, std::string_view data, size_t size) {
  try {
    switch (codec) {
      case Codec::kUncompressed:
        if (data.size() != size) corrupt("an uncompressed page's size differs from its header (corrupt file)");
        return std::string(data);
      case Codec::kSnappy: return snappy_block(data, size, "page");
      case Codec::kGzip: return gzip_block(data, size, "page");
      case Codec::kZstd: return zstd_block(data, size, "page");
      default: break;
    }
  } catch (const ParquetError&) {
    throw;
  } catch (const UserError& e) {
    corrupt(e.what());
  }
  corrupt(cat("pages compressed with ", codec_name(codec),
              " are not supported (snappy, zstd, gzip or none are; rewrite the file with one of them)"));
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// PLAIN-encoded values: fixed-width little-endian numbers, bit-packed booleans, length-prefixed strings.
void decode_plain(std::string_view data, PhysicalType type, size_t count, std::vector<ordered_json>& out) {
  size_t pos = 0;
  auto need = [&](size_t n) {
    if (n > data.size() - pos) corrupt("values end early (truncated or corrupt page)");
  };
  for (size_t i = 0; i < count; ++i) {
    switch (type) {
      case PhysicalType::kBoolean:
        if (i / 8 >= data.size()) corrupt("values end early (truncated or corrupt page)");
        out.emplace_back(bool((uint8_t(data[i / 8]) >> (i % 8)) & 1));
        break;
      case PhysicalType::kInt32:
        need(4);
        out.emplace_back(load<int32_t>(data.data() + pos));
        pos += 4;
        break;
      case PhysicalType::kInt64:
        need(8);
        out.emplace_back(load<int64_t>(data.data() + pos));
        pos += 8;
        break;
      case PhysicalType::kFloat:
        need(4);
        out.emplace_back(double(load<float>(data.data() + pos)));
        pos += 4;
        break;
      case PhysicalType::kDouble:
        need(8);
        out.emplace_back(load<double>(data.data() + pos));
        pos += 8;
        break;
      case PhysicalType::kByteArray: {
        need(4);
        const uint32_t n = load<uint32_t>(data.data() + pos);
        pos += 4;
        need(n);
        // Text reaches JSON values and the tokenizer, which need UTF-8 (a JSONL line with invalid UTF-8 is
        // refused by its parser the same way).
        if (!utf8_valid(data.substr(pos, n))) corrupt("a string column holds text that is not valid UTF-8");
        out.emplace_back(std::string(data.substr(pos, n)));
        pos += n;
        break;
      }
      default:
        corrupt(cat("columns of physical type ", int(type),
                    " (INT96 / FIXED_LEN_BYTE_ARRAY) are not supported: a dataset's text and numbers are expected"));
    }
  }
}

// Reads `count` levels, prefixed by their byte length in v1 pages; returns the bytes used.
size_t read_levels(std::string_view data, bool length_prefixed, int max_level, size_t count,
                   std::vector<uint32_t>& out) {
  const size_t before = out.size();
  if (max_level == 0) {
    out.resize(before + count, 0);
    return 0;
  }
  size_t used = data.size();
  if (length_prefixed) {
    if (data.size() < 4) corrupt("levels end early (truncated or corrupt page)");
    const uint32_t n = load<uint32_t>(data.data());
    if (n > data.size() - 4) corrupt("levels run past the page (corrupt page)");
    data = data.substr(4, n);
    used = 4 + size_t(n);
  }
  decode_hybrid(data, bit_width_for(uint32_t(max_level)), count, out);
  for (size_t i = before; i < out.size(); ++i)
    if (out[i] > uint32_t(max_level)) corrupt("a level is above the column's maximum (corrupt page)");
  return used;
}

// Host bytes of a decoded value (its JSON node and a string's characters).
uint64_t value_bytes(const ordered_json& v) {
  return sizeof(ordered_json) + (v.is_string() ? v.get_ref<const std::string&>().size() : 0);
}

void decode_values(std::string_view data, Encoding enc, PhysicalType type, size_t count,
                   const std::vector<ordered_json>* dict, std::vector<ordered_json>& out) {
  switch (enc) {
    case Encoding::kPlain: decode_plain(data, type, count, out); return;
    case Encoding::kPlainDictionary:
    case Encoding::kRleDictionary: {
      if (!dict) corrupt("a dictionary-encoded page without a dictionary page (corrupt file)");
      if (count == 0) return;
      if (data.empty()) corrupt("dictionary indices end early (truncated or corrupt page)");
      std::vector<uint32_t> idx;
      decode_hybrid(data.substr(1), uint8_t(data[0]), count, idx);
      // One page's run of indices can ask for gigabytes on its own (see ExpansionBudget): checked first.
      uint64_t bytes = 0;
      for (uint32_t i : idx) bytes += i < dict->size() ? value_bytes((*dict)[i]) : 0;
      if (bytes > (uint64_t(256) << 20))
        if (const std::string no = host_memory_refusal(2 * bytes, read_host_memory(),
                                                       "a page's dictionary-coded values", kInputMemoryHint);
            !no.empty())
          corrupt(no);
      for (uint32_t i : idx) {
        if (i >= dict->size()) corrupt("a dictionary index is out of range (corrupt page)");
        out.push_back((*dict)[i]);
      }
      return;
    }
    case Encoding::kRle:
      if (type == PhysicalType::kBoolean) {
        std::vector<uint32_t> bits;
        read_levels(data, true, 1, count, bits);
        for (uint32_t b : bits) out.emplace_back(b != 0);
        return;
      }
      break;
    default: break;
  }
  corrupt(cat("values in encoding ", int(enc),
              " (DELTA_* / BYTE_STREAM_SPLIT) are not supported yet (PLAIN and dictionary encodings are)"));
}

// A few bytes of run-length dictionary indices can repeat one long string millions of times (a 184-byte file
// asking for 67 GB): the values a chunk has expanded to are checked against host memory at every 256 MiB,
// twice over for the records made from them, so a bomb is one line naming the file, not the OOM killer.
class ExpansionBudget {
 public:
  void add(const std::vector<ordered_json>& values, size_t from) {
    for (size_t i = from; i < values.size(); ++i) bytes_ += value_bytes(values[i]);
    if (bytes_ < next_check_) return;
    next_check_ = bytes_ + (uint64_t(256) << 20);
    const std::string no =
        host_memory_refusal(2 * bytes_, read_host_memory(), "a column's decoded values", kInputMemoryHint);
    if (!no.empty()) corrupt(no);
  }

 private:
  uint64_t bytes_ = 0, next_check_ = uint64_t(256) << 20;
};

}  // namespace

ColumnValues read_column_chunk(std::string_view chunk, const ColumnChunk& meta, int max_rep, int max_def) {
  ColumnValues c;
  ExpansionBudget budget;
  std::vector<ordered_json> dict;
  bool has_dict = false;
  size_t pos = 0;
  while (c.def.size() < size_t(meta.num_values)) {
    if (pos >= chunk.size()) corrupt("a column chunk ends before all its values (truncated or corrupt file)");
    const PageHeader h = parse_page_header(chunk.substr(pos));
    pos += h.header_size;
    // Levels are run-length coded, so a tiny corrupt page could claim billions of entries: a page holds at
    // most what the chunk has left, and writers keep pages far below 2^26 entries.
    if (h.type == PageType::kDataPage || h.type == PageType::kDataPageV2)
      if (size_t(h.num_values) > size_t(meta.num_values) - c.def.size() || h.num_values > (1 << 26))
        corrupt("a page holds more values than its column chunk (corrupt file)");
    if (h.uncompressed_size > (1 << 29)) corrupt("a page larger than 512 MiB (corrupt file)");
    if (h.type == PageType::kDictionaryPage && size_t(h.num_values) > size_t(h.uncompressed_size))
      corrupt("a dictionary page holds more values than bytes (corrupt file)");
    if (size_t(h.compressed_size) > chunk.size() - pos) corrupt("a page runs past its column chunk (truncated file)");
    const std::string_view body = chunk.substr(pos, size_t(h.compressed_size));
    pos += size_t(h.compressed_size);
    switch (h.type) {
      case PageType::kIndexPage: continue;
      case PageType::kDictionaryPage: {
        if (h.encoding != Encoding::kPlain && h.encoding != Encoding::kPlainDictionary)
          corrupt("a dictionary page not in PLAIN encoding (corrupt file)");
        const std::string data = decompress(meta.codec, body, size_t(h.uncompressed_size));
        dict.clear();
        decode_plain(data, meta.type, size_t(h.num_values), dict);
        has_dict = true;
        continue;
      }
      case PageType::kDataPage: {
        const std::string data = decompress(meta.codec, body, size_t(h.uncompressed_size));
        std::string_view rest = data;
        const size_t n = size_t(h.num_values);
        rest.remove_prefix(read_levels(rest, true, max_rep, n, c.rep));
        const size_t d0 = c.def.size();
        rest.remove_prefix(read_levels(rest, true, max_def, n, c.def));
        size_t present = 0;
        for (size_t i = d0; i < c.def.size(); ++i) present += c.def[i] == uint32_t(max_def);
        const size_t v0 = c.values.size();
        decode_values(rest, h.encoding, meta.type, present, has_dict ? &dict : nullptr, c.values);
        budget.add(c.values, v0);
        break;
      }
      case PageType::kDataPageV2: {
        const size_t levels = size_t(h.rep_levels_bytes) + size_t(h.def_levels_bytes);
        if (levels > body.size() || levels > size_t(h.uncompressed_size))
          corrupt("a page's levels run past the page (corrupt file)");
        const size_t n = size_t(h.num_values);
        read_levels(body.substr(0, size_t(h.rep_levels_bytes)), false, max_rep, n, c.rep);
        const size_t d0 = c.def.size();
        read_levels(body.substr(size_t(h.rep_levels_bytes), size_t(h.def_levels_bytes)), false, max_def, n, c.def);
        const std::string_view packed = body.substr(levels);
        const std::string data = h.is_compressed ? decompress(meta.codec, packed, size_t(h.uncompressed_size) - levels)
                                                 : std::string(packed);
        size_t present = 0;
        for (size_t i = d0; i < c.def.size(); ++i) present += c.def[i] == uint32_t(max_def);
        const size_t v0 = c.values.size();
        decode_values(data, h.encoding, meta.type, present, has_dict ? &dict : nullptr, c.values);
        budget.add(c.values, v0);
        break;
      }
      default: corrupt(cat("unknown page type ", int(h.type), " (corrupt file)"));
    }
  }
  if (c.def.size() != size_t(meta.num_values)) corrupt("a column chunk holds more values than its metadata says");
  return c;
}

}  // namespace soltrain::parquet
