// Decompression through the system libraries (zlib, libzstd, snappy): whole .gz/.zst files, and the
// pages of a parquet file (whose header gives the exact decompressed size).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace soltrain {

// A gzip (or zlib) stream, several concatenated gzip members included (what `cat a.gz b.gz` gives).
// UserError "<where>: ..." when the data is not gzip or is cut short.
std::string gunzip(std::string_view data, const std::string& where);
// A zstd stream (one or more frames); UserError as for gunzip.
std::string unzstd(std::string_view data, const std::string& where);

// A block that must decompress to exactly `size` bytes (parquet pages). UserError otherwise.
std::string snappy_block(std::string_view data, size_t size, const std::string& where);
std::string zstd_block(std::string_view data, size_t size, const std::string& where);
std::string gzip_block(std::string_view data, size_t size, const std::string& where);

}  // namespace soltrain
