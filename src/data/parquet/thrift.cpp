// Thrift compact protocol (thrift/doc/specs/thrift-compact-protocol.md): varints, zigzag integers,
// field-id deltas, list headers with the size in the high nibble.
#include "data/parquet/thrift.h"

namespace soltrain::parquet {

namespace {
// Parquet's metadata nests a handful of levels (FileMetaData > RowGroup > ColumnChunk > ColumnMetaData
// > Statistics); more is a corrupt or hostile file.
constexpr int kMaxDepth = 32;
}  // namespace

void corrupt(const std::string& why) {
  throw ParquetError(why);
}

uint8_t ThriftReader::byte() {
  if (pos_ >= data_.size()) corrupt("metadata ends early (truncated or corrupt file)");
  return uint8_t(data_[pos_++]);
}

uint64_t ThriftReader::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const uint8_t b = byte();
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  corrupt("metadata holds an over-long integer (corrupt file)");
}

void ThriftReader::expect(uint8_t type, std::initializer_list<uint8_t> ok) {
  for (uint8_t t : ok)
    if (t == type) return;
  corrupt(cat("metadata field has type ", int(type), " where another was expected (corrupt file)"));
}

void ThriftReader::read_struct(const std::function<void(int16_t, uint8_t)>& field) {
  if (++depth_ > kMaxDepth) corrupt("metadata nested too deeply (corrupt file)");
  int16_t last = 0;
  while (true) {
    const uint8_t h = byte();
    const uint8_t type = h & 0x0f;
    if (type == kStop) break;
    const uint8_t delta = h >> 4;
    const int16_t id = delta ? int16_t(last + delta) : int16_t(zigzag());
    last = id;
    field(id, type);
  }
  --depth_;
}

int32_t ThriftReader::i32(uint8_t type) {
  expect(type, {kByte, kI16, kI32});
  if (type == kByte) return int8_t(byte());
  return int32_t(zigzag());
}

int64_t ThriftReader::i64(uint8_t type) {
  expect(type, {kByte, kI16, kI32, kI64});
  if (type == kByte) return int8_t(byte());
  return zigzag();
}

bool ThriftReader::boolean(uint8_t type) {
  expect(type, {kTrue, kFalse});
  return type == kTrue;
}

std::string ThriftReader::binary(uint8_t type) {
  expect(type, {kBinary});
  const uint64_t n = varint();
  if (n > data_.size() - pos_) corrupt("metadata string runs past the end (truncated or corrupt file)");
  std::string s(data_.substr(pos_, n));
  pos_ += n;
  return s;
}

uint32_t ThriftReader::list(uint8_t type, uint8_t& elem_type) {
  expect(type, {kList, kSet});
  const uint8_t h = byte();
  elem_type = h & 0x0f;
  uint64_t n = h >> 4;
  if (n == 15) n = varint();
  // Every element takes at least one byte (booleans in a list are one byte each).
  if (n > data_.size() - pos_) corrupt("metadata list longer than the file (corrupt file)");
  return uint32_t(n);
}

void ThriftReader::skip(uint8_t type) {
  switch (type) {
    case kTrue:
    case kFalse: return;
    case kByte: byte(); return;
    case kI16:
    case kI32:
    case kI64: varint(); return;
    case kDouble:
      if (data_.size() - pos_ < 8) corrupt("metadata ends early (truncated or corrupt file)");
      pos_ += 8;
      return;
    case kBinary: binary(type); return;
    case kList:
    case kSet: {
      if (++depth_ > kMaxDepth) corrupt("metadata nested too deeply (corrupt file)");
      uint8_t et = 0;
      const uint32_t n = list(type, et);
      for (uint32_t i = 0; i < n; ++i) et == kTrue || et == kFalse ? void(byte()) : skip(et);
      --depth_;
      return;
    }
    case kMap: {
      if (++depth_ > kMaxDepth) corrupt("metadata nested too deeply (corrupt file)");
      const uint64_t n = varint();
      if (n > data_.size() - pos_) corrupt("metadata map longer than the file (corrupt file)");
      if (n > 0) {
        const uint8_t kv = byte();
        for (uint64_t i = 0; i < n; ++i) {
          for (uint8_t t : {uint8_t(kv >> 4), uint8_t(kv & 0x0f)}) t == kTrue || t == kFalse ? void(byte()) : skip(t);
        }
      }
      --depth_;
      return;
    }
    case kStruct: read_struct([&](int16_t, uint8_t t) { skip(t); }); return;
    default: corrupt(cat("metadata has unknown type ", int(type), " (corrupt file)"));
  }
}

}  // namespace soltrain::parquet
