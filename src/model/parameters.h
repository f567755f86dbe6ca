// ParameterStore: the model's trainable tensors by Hugging Face name, with their gradients. Values and
// gradients each live in one flat buffer laid out as [decayed (2-D) params | the rest], so clipping and the
// optimizer run over two contiguous ranges instead of one launch per tensor.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace soltrain {

struct Parameter {
  std::string name;  // HF name, e.g. model.layers.0.self_attn.q_proj.weight
  Shape shape;
  bool decay;  // weight decay applies (matrices and embeddings; not norms or biases)
  Tensor value, grad;
};

class ParameterStore {
 public:
  void add(const std::string& name, Shape shape);
  // Allocates the flat value and gradient buffers on the ops' device (zeroed).
  void allocate(Ops& ops);

  Parameter& at(const std::string& name);
  const Parameter& at(const std::string& name) const;
  Parameter* find(const std::string& name);
  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  int64_t numel() const { return decay_numel_ + other_numel_; }

  // Flat views: every gradient, and the values / gradients of the decayed or the other parameters.
  Tensor all_grads() const;
  Tensor values(bool decayed) const;
  Tensor grads(bool decayed) const;

 private:
  std::vector<Parameter> params_;
  std::map<std::string, size_t> index_;
  int64_t decay_numel_ = 0, other_numel_ = 0;
  Buffer values_, grads_;
};

}  // namespace soltrain
