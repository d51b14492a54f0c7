// Memory of the wrong space given to a communicator must not compile (tests/comm/compile_fail.cmake
// compiles this file once per case and expects the static_assert's message, and the control
// case to compile). Communicators that model nothing but the front-end stand in for the
// backends: the check lives in the front-end every backend shares.
#include <span>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

template <class Space>
struct stand_in : trident::collectives<stand_in<Space>, Space> {
  struct req {
    void wait() {}
    bool test() { return true; }
  };
  static constexpr trident::nan_in_max_min max_min_nan = trident::nan_in_max_min::propagate;
  int rank() const { return 0; }
  int size() const { return 1; }
  void execute(const trident::collective_call&) {}
  req start(const trident::collective_call&) { return {}; }
  void execute(std::span<const trident::p2p_op<Space>>) {}
  req start(std::span<const trident::p2p_op<Space>>) { return {}; }
  void barrier() {}
  void synchronize() {}
  stand_in split(int, int) { return {}; }
};
static_assert(trident::communicator<stand_in<trident::host_space>>);
static_assert(trident::communicator<stand_in<trident::cuda_space>>);

void cases(stand_in<trident::host_space>& host_comm, stand_in<trident::cuda_space>& device_comm,
           std::vector<float>& host_vector, trident::buffer<float, trident::cuda_space>& device_buffer) {
#if defined(CASE_host_range_to_device_comm)
  device_comm.all_reduce(host_vector);  // like handing a std::vector to the NCCL backend
#elif defined(CASE_device_buffer_to_host_comm)
  host_comm.all_reduce(device_buffer);  // like handing device memory to the thread or MPI backend
#elif defined(CASE_mixed_element_types)
  std::vector<double> doubles(4);
  host_comm.all_reduce(host_vector, doubles);
#elif defined(CASE_zero_stage_4)
  trident::model_spec spec;
  trident::zero::zero_optimizer<4, trident::optim::sgd, stand_in<trident::host_space>> z(host_comm, spec, {});
#elif defined(CASE_zero_wrong_optimizer)
  struct not_an_optimizer {
    float lr = 0.1f;
  };
  trident::model_spec spec;
  trident::zero::zero_optimizer<1, not_an_optimizer, stand_in<trident::host_space>> z(host_comm, spec, {});
#elif defined(CASE_zero_wrong_precision)
  trident::model_spec spec;
  trident::zero::zero_optimizer<1, trident::optim::sgd, stand_in<trident::host_space>, double> z(host_comm, spec, {});
#else  // the control: the right memory compiles
  host_comm.all_reduce(host_vector);
  device_comm.all_reduce(device_buffer);
  device_comm.all_gather(trident::space_span<const float, trident::cuda_space>(device_buffer.data(), 1), device_buffer);
#endif
}
