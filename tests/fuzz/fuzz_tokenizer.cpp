// Fuzz target: tokenizer.json loading, then encoding and decoding a fixed text with what was loaded.
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  const auto path = fuzz::write_scratch("tokenizer.json", data, size);
  fuzz::expect_only_user_errors([&] {
    Tokenizer t = Tokenizer::load(path);
    const auto ids = t.encode("Hello world! 123 \xc3\xbc\xe2\x9c\x93 <|im_start|>user\n  tabs\tand\r\nlines");
    (void)t.decode(ids, false);
    (void)t.decode(ids, true);
    (void)t.encode_with_special_tokens("Hello");  // the post_processor's specials
  });
  return 0;
}
