#include "dist/communicator.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "dist/launch.h"

namespace soltrain {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  void all_reduce_sum(Tensor) override {}
  void all_reduce_max(Tensor) override {}
  void reduce_scatter_sum(Tensor out, const Tensor& in) override { same(out, in); }
  void all_gather(Tensor out, const Tensor& in) override { same(out, in); }
  void broadcast(Tensor, int root) override { SOLTRAIN_CHECK(root == 0); }
  void barrier() override {}
  int64_t all_max_host(int64_t v) override { return v; }

 private:
  static void same(Tensor out, const Tensor& in) {
    SOLTRAIN_CHECK(out.numel() == in.numel() && out.dtype == in.dtype);
    if (out.data == in.data) return;
    SOLTRAIN_CHECK(out.device == Device::CPU, "the single-process communicator copies host tensors only");
    std::memcpy(out.data, in.data, size_t(in.numel()) * dtype_size(in.dtype));
  }
};

}  // namespace

namespace {
std::string& prefix() {
  static std::string p;
  return p;
}
}  // namespace

const std::string& error_prefix() {
  return prefix();
}
void set_error_prefix(const std::string& p) {
  prefix() = p;
}
void print_error_line(const std::string& line) {
  const std::string all = prefix() + line + "\n";
  for (size_t done = 0; done < all.size();) {
    const ssize_t n = ::write(STDERR_FILENO, all.data() + done, all.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing else can report it
    done += size_t(n);
  }
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace soltrain
