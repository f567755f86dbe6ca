// A model from config.json alone, its base weights drawn instead of read: what `soltrain bench --random-weights`
// times, so a model as large as Qwen3-30B-A3B (61 GB in bf16) is measured without a checkpoint on the disk.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>

#include "model/transformer.h"

namespace soltrain {

// As load_pretrained (LoRA base frozen, fresh adapters; quantised base formats quantised on upload), with every
// base weight drawn as transformers initialises one: matrices normal(0, initializer_range), norms ones, biases
// zeros. The draws are tiled from one pool of normals (each parameter from its own random start): weights for
// timing a step, not for training.
std::unique_ptr<Transformer> random_pretrained(const std::filesystem::path& dir, Ops& ops,
                                               std::optional<LoraConfig> lora, StoreOptions store, uint64_t seed);

// Every base weight of `model` drawn again, each value on its own, as transformers' _init_weights draws a model built
// from its config (Axolotl's reinit_weights: pretraining from scratch): matrices and the embedding normal(0,
// initializer_range), the embedding's padding_idx row zero, norms ones, biases zeros; the adapters keep theirs.
void init_weights(Transformer& model, uint64_t seed);

}  // namespace soltrain
