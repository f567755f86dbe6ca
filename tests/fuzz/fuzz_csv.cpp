// Fuzz target: the CSV/TSV reader (RFC 4180 quoting, line ends \n, \r\n and a lone \r, a byte order mark,
// invalid UTF-8 as a bad record). The first byte picks the delimiter. Every row is parsed to the end.
#include "data/csv.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  if (size == 0) return 0;
  const bool tab = data[0] & 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  CsvParser p(text, tab ? '\t' : ',');
  CsvRow row;
  size_t last_line = 0;
  while (p.next(row)) {
    if (row.line < last_line) std::abort();  // rows come in order
    last_line = row.line;
  }
  const auto path = fuzz::write_scratch(tab ? "f.tsv" : "f.csv", data + 1, size - 1);
  fuzz::expect_only_user_errors([&] { fuzz::read_every_record(path); });
  return 0;
}
