// The CUDA ZeRO step with and without its one host wait (issue 10): zero_optimizer::step(),
// which reads every rank's report back to decide, against step_async(), which decides on the
// device and lets the host queue the next micro-batch at once (last_step() once at the end). One
// NCCL rank, ZeRO-1, bf16 AdamW with clipping, `layers` buckets; each iteration writes the
// gradients (a memset per layer on the communicator's stream), marks the layers ready and steps.
// Small models are launch-bound, where the wait costs most; the figure is the wall time per
// iteration over `steps` iterations after a warm-up, both variants in the same run.
//
//   ./zero_step_cuda [parameters] [layers] [steps]      (defaults 1M, 16, 200; 77 without a device)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"

namespace {

using zero_type =
    trident::zero::zero_optimizer<1, trident::optim::adamw, trident::nccl_comm, trident::mixed_precision<trident::bf16>>;

double ms_per_step(trident::nccl_comm& comm, zero_type& z, int layers, int steps, bool deferred) {
  std::vector<trident::tensor_handle> handles;
  for (int l = 0; l < layers; ++l) handles.push_back(z.handle("layer" + std::to_string(l) + ".weight"));
  auto iteration = [&] {
    for (int l = 0; l < layers; ++l) {
      auto g = z.gradients(handles[static_cast<std::size_t>(l)]);
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(g.data(), 0x3c, g.size() * sizeof(trident::bf16), comm.stream()));
      z.grad_ready(l);
    }
    if (deferred) z.step_async();
    else z.step();
  };
  for (int s = 0; s < 5; ++s) iteration();
  (void)z.last_step();
  comm.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) iteration();
  const auto r = z.last_step();  // waits for the last one
  comm.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!r.applied) std::fprintf(stderr, "zero_step_cuda: a step was skipped\n");
  return ms / steps;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t params = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{1} << 20;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 16;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 200;
  if (trident::cuda_device_count() == 0) {
    std::puts("zero_step_cuda: no CUDA device");
    return 77;
  }
  ncclUniqueId id;
  TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
  auto comm = trident::nccl_comm::init(id, 0, 1);
  trident::model_spec spec;
  for (int l = 0; l < layers; ++l) spec.add("layer" + std::to_string(l) + ".weight", {params / static_cast<std::size_t>(layers)}, l);
  trident::optim::adamw adamw;
  adamw.opt.lr = 1e-4f;
  trident::zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = params / static_cast<std::size_t>(layers) * sizeof(trident::bf16);  // a bucket per layer
  o.max_grad_norm = 1.0f;
  o.check_usage = false;
  double sync = 0, deferred = 0;
  for (int round = 0; round < 2; ++round) {  // alternated, twice: the machine's drift shows
    zero_type a(comm, spec, adamw, o), b(comm, spec, adamw, o);
    const double s = ms_per_step(comm, a, layers, steps, false);
    const double d = ms_per_step(comm, b, layers, steps, true);
    std::printf("zero_step_cuda round %d: step() %.4f ms, step_async() %.4f ms per iteration\n", round, s, d);
    sync = round == 0 ? s : std::min(sync, s);
    deferred = round == 0 ? d : std::min(deferred, d);
  }
  std::printf("zero_step_cuda: %zu parameters, %d layers, ZeRO-1 bf16 AdamW, one NCCL rank: step() %.4f ms, step_async() "
              "%.4f ms per iteration (best round): step_async / step = %.3f\n",
              params, layers, sync, deferred, deferred / sync);
  return 0;
}
