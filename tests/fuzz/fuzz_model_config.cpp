// Fuzz target: config.json → ModelConfig, through the reader the CLI uses.
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  fuzz::write_scratch("config.json", data, size);
  fuzz::expect_only_user_errors([&] {
    const ModelConfig c = load_model_config(fuzz::scratch_dir());
    // what the model is built from: the RoPE table for a plausible head (the checkpoint bounds the rest)
    if (c.head_dim <= 4096) (void)rope_inv_freq(c.rope, c.head_dim);
  });
  return 0;
}
