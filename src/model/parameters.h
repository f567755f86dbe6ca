// ParameterStore: the model's trainable tensors by Hugging Face name: fp32 master values, fp32 gradients
// and the compute copy the forward/backward read (the master itself on CPU, bf16 on CUDA). Each lives in
// one flat buffer laid out as [decayed (2-D) params | the rest], so clipping and the optimizer run over two
// contiguous ranges instead of one launch per tensor. Frozen parameters (a LoRA run's base weights) keep
// only the compute copy, in a buffer of their own: no master, no gradient, nothing for the optimizer.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace soltrain {

struct Parameter {
  std::string name;  // HF name, e.g. model.layers.0.self_attn.q_proj.weight
  Shape shape;
  bool decay;      // weight decay applies (matrices and embeddings; not norms or biases)
  bool trainable;  // false: frozen, `master` and `grad` stay undefined
  Tensor master;   // F32, what the optimizer updates and checkpoints hold
  Tensor value;    // activation dtype, what the model computes with (aliases master when that is F32)
  Tensor grad;     // F32
};

class ParameterStore {
 public:
  void add(const std::string& name, Shape shape, bool trainable = true);
  // Allocates the flat buffers on the ops' device (zeroed).
  void allocate(Ops& ops);
  // Refreshes the compute copy from the masters (after loading; the optimizer does it itself).
  void sync_values(Ops& ops);

  Parameter& at(const std::string& name);
  const Parameter& at(const std::string& name) const;
  Parameter* find(const std::string& name);
  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  // Trainable elements (what the optimizer and clipping see); frozen ones are counted apart.
  int64_t numel() const { return decay_numel_ + other_numel_; }
  int64_t frozen_numel() const { return frozen_numel_; }

  // Sets a parameter from fp32 host values (master and compute copy, or the frozen compute copy).
  void upload(Ops& ops, Parameter& p, const float* host);
  // Reads a parameter back as fp32 (the master, or the frozen compute copy widened).
  void download(Ops& ops, const Parameter& p, float* host) const;

  // Flat views over the trainable parameters: every gradient, and the masters / compute values /
  // gradients of the decayed or the other ones.
  Tensor all_grads() const;
  Tensor masters(bool decayed) const;
  Tensor values(bool decayed) const;
  Tensor grads(bool decayed) const;
  bool values_alias_masters() const { return !values_.data(); }

 private:
  std::vector<Parameter> params_;
  std::map<std::string, size_t> index_;
  int64_t decay_numel_ = 0, other_numel_ = 0, frozen_numel_ = 0;
  Buffer masters_, values_, grads_;  // values_ stays empty when the activation dtype is F32
  Buffer frozen_;                    // frozen compute copies, activation dtype
  DType values_dtype_ = DType::F32;
};

}  // namespace soltrain
