// Thin wrappers over zlib, libzstd and snappy that turn every failure into one UserError line.
#include "io/compression.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <memory>

#include "core/error.h"
#include "core/host_memory.h"

namespace soltrain {

namespace {

// Output grows in steps of this; a stream's size is not known ahead.
constexpr size_t kChunk = size_t(1) << 20;

struct ZStream {
  z_stream s{};
  ZStream() {
    // 15 + 32: a window of 32 KiB and automatic gzip/zlib header detection.
    if (inflateInit2(&s, 15 + 32) != Z_OK) throw std::bad_alloc();
  }
  ~ZStream() { inflateEnd(&s); }
};

// Makes room for one more chunk of a stream's output. A few hundred KB of .gz or .zst can expand to many GB
// (a "bomb"), so each time the buffer would grow, the grown size (and the copy beside it) is checked against
// the host memory this process may use, naming the file, before the allocation is tried.
void add_chunk(std::string& out, const std::string& where) {
  const size_t need = out.size() + kChunk;
  if (need > out.capacity()) {
    const size_t grown = std::max(need, out.capacity() * 2);
    check_host_memory(grown + out.size(), cat(where, ": its decompressed text (", out.size() >> 20, " MiB so far)"),
                      kInputMemoryHint);
    try {
      out.reserve(grown);
    } catch (const std::bad_alloc&) {
      user_error(where, ": decompressing it needs more memory than this process may use (", out.size() >> 20,
                 " MiB so far); ", kInputMemoryHint);
    }
  }
  out.resize(need);
}

}  // namespace

std::string gunzip(std::string_view data, const std::string& where) {
  std::string out;
  ZStream z;
  z.s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  size_t left = data.size();
  int rc = Z_OK;
  while (true) {
    // avail_in is 32-bit: feed at most 1 GiB at a time.
    if (z.s.avail_in == 0 && left > 0) {
      const size_t n = std::min<size_t>(left, size_t(1) << 30);
      z.s.avail_in = uInt(n);
      left -= n;
    }
    const size_t had = out.size();
    add_chunk(out, where);
    z.s.next_out = reinterpret_cast<Bytef*>(out.data() + had);
    z.s.avail_out = uInt(kChunk);
    rc = inflate(&z.s, Z_NO_FLUSH);
    out.resize(had + (kChunk - z.s.avail_out));
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (concatenated files); trailing zero padding is ignored.
      if (z.s.avail_in == 0 && left == 0) break;
      if (static_cast<unsigned char>(*z.s.next_in) == 0) break;
      if (inflateReset(&z.s) != Z_OK) user_error(where, ": not a valid gzip file");
      continue;
    }
    if (rc == Z_BUF_ERROR && z.s.avail_in == 0 && left == 0)
      user_error(where, ": the gzip data is cut short (truncated file)");
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      user_error(where, ": not a valid gzip file (", z.s.msg ? z.s.msg : "corrupt data", ")");
  }
  return out;
}

std::string unzstd(std::string_view data, const std::string& where) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) throw std::bad_alloc();
  std::string out;
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t last = 0;
  while (in.pos < in.size) {
    const size_t had = out.size();
    add_chunk(out, where);
    ZSTD_outBuffer o{out.data() + had, kChunk, 0};
    last = ZSTD_decompressStream(ctx.get(), &o, &in);
    out.resize(had + o.pos);
    if (ZSTD_isError(last)) user_error(where, ": not a valid zstd file (", ZSTD_getErrorName(last), ")");
    if (o.pos == 0 && in.pos == in.size) break;
  }
  // Drain what the context still holds.
  while (last != 0) {
    const size_t had = out.size();
    add_chunk(out, where);
    ZSTD_outBuffer o{out.data() + had, kChunk, 0};
    last = ZSTD_decompressStream(ctx.get(), &o, &in);
    out.resize(had + o.pos);
    if (ZSTD_isError(last)) user_error(where, ": not a valid zstd file (", ZSTD_getErrorName(last), ")");
    if (o.pos == 0) break;
  }
  if (last != 0) user_error(where, ": the zstd data is cut short (truncated file)");
  return out;
}

std::string snappy_block(std::string_view data, size_t size, const std::string& where) {
  size_t n = 0;
  if (!snappy::GetUncompressedLength(data.data(), data.size(), &n) || n != size)
    user_error(where, ": corrupt snappy page (size ", n, ", header says ", size, ")");
  std::string out(size, '\0');
  if (!snappy::RawUncompress(data.data(), data.size(), out.data())) user_error(where, ": corrupt snappy page");
  return out;
}

std::string zstd_block(std::string_view data, size_t size, const std::string& where) {
  std::string out(size, '\0');
  const size_t n = ZSTD_decompress(out.data(), size, data.data(), data.size());
  if (ZSTD_isError(n)) user_error(where, ": corrupt zstd page (", ZSTD_getErrorName(n), ")");
  if (n != size) user_error(where, ": corrupt zstd page (size ", n, ", header says ", size, ")");
  return out;
}

std::string gzip_block(std::string_view data, size_t size, const std::string& where) {
  std::string out = gunzip(data, where);
  if (out.size() != size) user_error(where, ": corrupt gzip page (size ", out.size(), ", header says ", size, ")");
  return out;
}

}  // namespace soltrain
