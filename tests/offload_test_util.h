// AdamW updates run resident and offloaded (masters and/or moments in host memory, streamed through the
// device in chunks) on any backend, for tests that hold the two bit for bit (test_offload.cpp on the CPU,
// gpu/test_cuda_offload.cpp on CUDA).
#pragma once
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "test_util.h"
#include "train/optimizer.h"

namespace soltrain::test {

struct UpdateResult {
  std::vector<float> masters;   // every trainable parameter's fp32 master, in store order
  std::vector<uint8_t> values;  // the compute copies' bytes (bf16 on CUDA; the masters on the CPU)
  std::string state;            // AdamW::save's file, bytes
  double last_sumsq = 0;        // Σg² of the last step's gradients (the test checks clipping was active)
};

// Three groups (two decoder-like layers and an embedding group) of matrices, norms and a bias, whose ranges
// are cut into several `offload.chunk`-sized chunks with ragged ends. Masters and each step's gradients come
// from `seed`, so runs with the same seed see the same numbers whatever the offload. With 8-bit moments the
// 97 x 67 matrix (over bitsandbytes' 4096 elements: 25 whole blocks and a ragged one) is quantised, the rest
// keep fp32 moments, and chunks are whole blocks (at least one).
inline UpdateResult run_updates(Ops& ops, uint32_t seed, Offload offload, int steps,
                                const std::filesystem::path& state_file, Moments moments = Moments::F32) {
  std::mt19937 rng(seed);
  ParameterStore ps;
  for (int g = 0; g < 2; ++g) {
    const std::string l = "model.layers." + std::to_string(g) + ".";
    ps.add(l + "self_attn.q_proj.weight", {24, 20}, true, g);
    ps.add(l + "self_attn.q_proj.bias", {24}, true, g);
    ps.add(l + "input_layernorm.weight", {20}, true, g);
    ps.add(l + "mlp.down_proj.weight", {20, 33}, true, g);
  }
  ps.add("model.layers.1.mlp.up_proj.weight", {97, 67}, true, 1);
  ps.add("model.embed_tokens.weight", {50, 20}, true, 2);
  ps.add("model.norm.weight", {20}, true, 2);
  ps.allocate(ops);
  for (Parameter& p : ps.all()) ps.upload(ops, p, random_vec(size_t(shape_numel(p.shape)), rng, 0.5f).data());
  if (offload.grads) ps.move_layer_grads_to_host(ops, 2);  // (as GradOffload does; the groups' grad are their homes)
  AdamW adamw(ps, ops, moments, offload);
  OptimizerConfig cfg;
  cfg.lr = 3e-2f;
  cfg.weight_decay = 0.1f;
  cfg.max_grad_norm = 1.0f;  // the gradients below have norm ~ 3·sqrt(9500): clipped every step
  Buffer sumsq_buf = ops.alloc(sizeof(double));
  const Tensor sumsq{sumsq_buf.data(), DType::F64, {1}, sumsq_buf.device()};
  UpdateResult r;
  for (int s = 0; s < steps; ++s) {
    for (Parameter& p : ps.all()) {
      std::vector<float> g = random_vec(size_t(shape_numel(p.shape)), rng, 3.0f);
      ops.copy(p.grad, Tensor{g.data(), DType::F32, p.shape, Device::CPU});
    }
    // by group (all_grads() is refused with host gradients), in one order whatever the offload
    for (int g = 0; g < ps.groups(); ++g)
      ops.reduce_sum(sumsq, ps.group_grads(g), /*squares=*/true, /*accumulate=*/g > 0);
    adamw.step(cfg, cfg.lr * float(s + 1) / float(steps), 1.0f, &sumsq);
  }
  ops.copy(Tensor{&r.last_sumsq, DType::F64, {1}, Device::CPU}, sumsq);
  for (const Parameter& p : ps.all()) {
    std::vector<float> m(size_t(shape_numel(p.shape)));
    ps.download(ops, p, m.data());
    r.masters.insert(r.masters.end(), m.begin(), m.end());
    std::vector<uint8_t> v(p.value.bytes());
    ops.copy(Tensor{v.data(), p.value.dtype, p.value.shape, Device::CPU}, p.value);
    r.values.insert(r.values.end(), v.begin(), v.end());
  }
  adamw.save(state_file);
  std::ifstream in(state_file, std::ios::binary);
  r.state.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

// Offload settings worth comparing: each kind alone and both, with chunks smaller than every range (8-bit:
// one block, 256; and 768, three blocks, so a piece holds several blocks and the last one is ragged).
inline std::vector<std::pair<std::string, Offload>> offload_cases() {
  const int64_t chunk = 37;  // a prime: chunk edges fall inside parameters and at ragged range ends
  return {{"master", {true, false, chunk}},
          {"optimizer", {false, true, chunk}},
          {"both", {true, true, chunk}},
          {"both, chunks of 800", {true, true, 800}},
          {"both, one chunk per range", {true, true, int64_t(1) << 30}},
          // offload_grads: the layers' gradients staged up from host memory, alone and with everything else
          {"grads", {false, false, chunk, true}},
          {"all three", {true, true, chunk, true}},
          {"all three, one chunk per range", {true, true, int64_t(1) << 30, true}}};
}

// Runs the resident update, then every offload_cases() setting on `ops`, and expects each to equal the resident
// one bit for bit (masters, the compute copy the update writes, the saved optimizer state); returns the
// resident result for further checks.
inline UpdateResult expect_offloaded_updates_equal_resident(Ops& ops, uint32_t seed, const std::filesystem::path& dir,
                                                            Moments moments) {
  const UpdateResult resident = run_updates(ops, seed, {}, 5, dir / "resident.safetensors", moments);
  EXPECT_GT(resident.last_sumsq, 4.0);  // ‖g‖ > 2 × max_grad_norm: clipping scaled every update
  for (const auto& [name, offload] : offload_cases()) {
    SCOPED_TRACE(name);
    const UpdateResult o = run_updates(ops, seed, offload, 5, dir / (name + ".safetensors"), moments);
    EXPECT_EQ(o.masters.size(), resident.masters.size());
    for (size_t i = 0; i < std::min(o.masters.size(), resident.masters.size()); ++i)
      if (std::bit_cast<uint32_t>(o.masters[i]) != std::bit_cast<uint32_t>(resident.masters[i])) {
        ADD_FAILURE() << "master element " << i << ": " << o.masters[i] << " vs " << resident.masters[i];
        break;
      }
    EXPECT_EQ(o.values, resident.values);  // the compute copy written by the update
    EXPECT_EQ(o.state, resident.state);    // moments (8-bit: codes and absmax) and step count, as saved
  }
  return resident;
}

}  // namespace soltrain::test
