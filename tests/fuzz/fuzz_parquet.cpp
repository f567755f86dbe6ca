// Fuzz target: the parquet reader (footer, schema, page headers, levels, values, decompression) and the
// record assembly of every column, through the same path a dataset takes.
#include "data/parquet/reader.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  const auto path = fuzz::write_scratch("f.parquet", data, size);
  fuzz::expect_only_user_errors([&] {
    parquet::ParquetFile f(path);
    for (size_t g = 0; g < f.num_row_groups(); ++g) f.read_row_group(g, {});
  });
  return 0;
}
