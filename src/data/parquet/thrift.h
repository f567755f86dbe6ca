// A reader of Thrift's compact protocol, the encoding of parquet's footer and page headers. Bounds are
// checked on every read: a corrupt file is a ParquetError, never a read past the buffer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace soltrain::parquet {

// A malformed parquet file; the reader adds the file name.
struct ParquetError : UserError {
  using UserError::UserError;
};

[[noreturn]] void corrupt(const std::string& why);

class ThriftReader {
 public:
  explicit ThriftReader(std::string_view data) : data_(data) {}

  // Compact-protocol type codes of a field header.
  enum Type : uint8_t {
    kStop = 0,
    kTrue = 1,
    kFalse = 2,
    kByte = 3,
    kI16 = 4,
    kI32 = 5,
    kI64 = 6,
    kDouble = 7,
    kBinary = 8,
    kList = 9,
    kSet = 10,
    kMap = 11,
    kStruct = 12
  };

  // Reads a struct: calls `field(id, type)` for each field, which must read or skip() its value.
  void read_struct(const std::function<void(int16_t id, uint8_t type)>& field);
  int32_t i32(uint8_t type);
  int64_t i64(uint8_t type);
  bool boolean(uint8_t type);  // field-header booleans carry their value in the type
  std::string binary(uint8_t type);
  // A list header: element count and type; the caller reads the elements.
  uint32_t list(uint8_t type, uint8_t& elem_type);
  void skip(uint8_t type);

  size_t position() const { return pos_; }

 private:
  uint8_t byte();
  uint64_t varint();
  int64_t zigzag() {
    const uint64_t v = varint();
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  void expect(uint8_t type, std::initializer_list<uint8_t> ok);

  std::string_view data_;
  size_t pos_ = 0;
  int depth_ = 0;  // nesting of structs and lists: corrupt input must not recurse without bound
};

}  // namespace soltrain::parquet
