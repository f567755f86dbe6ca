// Fuzz target: the dataset record readers of the text formats (CSV/TSV quoting, JSON arrays and objects,
// JSON Lines) and the .gz/.zst decompression in front of them. The first byte picks the file name.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  if (size == 0) return 0;
  static const char* names[] = {"f.csv",      "f.tsv",     "f.json",    "f.jsonl",
                                "f.jsonl.gz", "f.csv.zst", "f.json.gz", "f.tsv.gz"};
  const auto path = fuzz::write_scratch(names[data[0] % 8], data + 1, size - 1);
  fuzz::expect_only_user_errors([&] { fuzz::read_every_record(path); });
  return 0;
}
