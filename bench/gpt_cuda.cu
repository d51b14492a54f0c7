// The flagship GPT's training step on one GPU (examples/01_flagship/gpt_cuda.cuh): GPT-2 124M by
// default (12 layers, 768 wide, 12 heads, T = 1024, vocabulary 50304), B = 16, fp32, ZeRO-0, one
// NCCL rank; forward, backward and the fused AdamW step with clipping, as flagship::train runs
// them. Against bench/gpt_torch_gpu.py, the same model in PyTorch on the same GPU
// (scripts/gpu_check.sh runs both):
//   mpirun -np 1 gpt_cuda [batch] [layers] [steps] [--tf32 | --bf16] [--gemm-bf16] [--flash | --flash-bf16] [--profile]
// Tokens are random (speed does not depend on them). The time is wall time per step over
// `steps` steps after two warm-up steps; each step ends with the host reading the loss, as the
// trainer does. --tf32 switches the model's GEMMs to TF32 tensor cores (not bitwise reproducible
// against the host; the library's default is FP32). --bf16 trains in bf16 as the flagship's
// --precision bf16 does on the GPU (mixed_precision<bf16>: bf16 working weights and gradients,
// TF32 GEMMs; activations still float), the mode torch.compile's bf16 autocast is compared with.
// --gemm-bf16 runs the GEMMs on operands rounded to bf16 instead (gemm_math::bf16, the
// flagship's --gemm bf16: bf16 tensor cores, float results, autocast's arithmetic).
// --flash runs the attention as nn::cuda::flash_attention (TF32 tiles, no [T, T] probabilities;
// the flagship's --attention flash); --flash-bf16 as nn::cuda::flash_attention_bf16 (bf16 tiles,
// scores in registers; --attention flash_bf16). Then the time of each phase of forward and backward (CUDA
// events on the compute stream: gpt_cuda.cuh's gpu_phases) and the rest, and the host's time to
// enqueue a step (forward_backward and step() return before the GPU is done: when it nears the
// step's time, the GPU waits on the host, and CUDA graphs are the cure, not faster kernels).
// --profile brackets one more step, after the timed ones, with cudaProfilerStart/Stop, so that
// `ncu --profile-from-start off` times each of its kernels alone (bench/ncu_summary.py groups
// them; scripts/gpu_check.sh's "profile gpt 124M kernels" step).
#include <cuda_profiler_api.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "01_flagship/gpt_cuda.cuh"
#include "trident/comm/nccl.hpp"
#include "trident/core/cuda_runtime.hpp"

namespace {

template <class Precision>
void run(trident::nccl_comm& world, std::size_t batch, std::size_t layers, std::size_t steps, trident::nn::gemm_math math, bool flash,
         bool flash_bf16, bool profile) {
  const flagship::gpt_config c{.vocab = 50304, .seq = 1024, .hidden = 768, .heads = 12, .layers = layers, .flash_attention = flash,
                               .flash_bf16 = flash_bf16};
  trident::process_grid grid(world, 1, 1);
  flagship::optimizer_type opt;
  opt.opt = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  opt.schedule.f = [](std::int64_t) { return 6e-4; };
  trident::zero::zero_options zo;
  zo.max_grad_norm = 1.0f;
  flagship::cuda::gpt_cuda_rank<0, flagship::optimizer_type, Precision> model(grid, c, 1, 1, batch, opt, zo, 1234);  // one stage, one micro-batch
  model.set_gemm_math(math);
  flagship::step_batches b;
  b.inputs.assign(1, std::vector<std::int32_t>(c.seq * batch));
  b.targets = b.inputs;
  std::uint64_t z = 7;
  for (auto* list : {&b.inputs[0], &b.targets[0]})
    for (auto& v : *list) v = static_cast<std::int32_t>((z = trident::detail::splitmix64(z)) % c.vocab);
  double loss = 0, enqueue_fb = 0, enqueue_step = 0;
  auto step = [&] {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    model.forward_backward(b);
    const auto t1 = clock::now();
    (void)model.step();
    const auto t2 = clock::now();
    enqueue_fb += std::chrono::duration<double, std::milli>(t1 - t0).count();
    enqueue_step += std::chrono::duration<double, std::milli>(t2 - t1).count();
    loss = model.loss();  // waits for the GPU
  };
  step();
  step();
  model.phases().enabled = true;  // CUDA events between the phases of forward and backward
  enqueue_fb = enqueue_step = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < steps; ++s) {
    step();
    model.phases().collect();
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(steps);
  const double tokens = static_cast<double>(c.seq * batch);
  const bool full = std::is_same_v<Precision, trident::full_precision>;
  std::printf("trident gpt on the GPU: %zu layers, B = %zu, T = %zu, %s weights, %s GEMMs%s: %8.2f ms/step  %9.0f tokens/s  %6.1f TFLOP/s  (loss %.4f)\n",
              layers, batch, c.seq, full ? "fp32" : "bf16", trident::nn::name(math),
              flash_bf16 ? ", flash attention (bf16 tiles)" : flash ? ", flash attention" : "", ms, tokens / ms * 1e3,
              c.flops_per_token() * tokens / ms * 1e-9, loss);
  // Where the step's time went: the compute stream's phases, and the rest of the wall time
  // (the optimizer's step on the data communicator's stream, reading the loss, host gaps).
  double phased = 0;
  for (const auto& [name, total] : model.phases().totals()) {
    const double per_step = total / static_cast<double>(steps);
    phased += per_step;
    std::printf("  %-32s %8.2f ms/step  %5.1f%%\n", name.c_str(), per_step, 100.0 * per_step / ms);
  }
  std::printf("  %-32s %8.2f ms/step  %5.1f%%\n", "the rest (optimizer step, loss)", ms - phased, 100.0 * (ms - phased) / ms);
  const double fb = enqueue_fb / static_cast<double>(steps), st = enqueue_step / static_cast<double>(steps);
  std::printf("  host time in forward_backward() %8.2f ms/step, in step() %8.2f ms/step (%5.1f%% of the step; "
              "near 100%%: the GPU waits on the host)\n", fb, st, 100.0 * (fb + st) / ms);
  if (profile) {  // one more step, alone between the profiler's start and stop
    model.phases().enabled = false;
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    TRIDENT_CUDA_CHECK(cudaProfilerStart());
    step();
    TRIDENT_CUDA_CHECK(cudaProfilerStop());
    std::printf("profiled one step (cudaProfilerStart/Stop): loss %.4f\n", loss);
  }
  std::printf("%s\n", trident::current_ledger()->report().c_str());  // bytes by space and category
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  try {
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    TRIDENT_CUDA_CHECK(cudaSetDevice(0));
    bool tf32 = false, bf16 = false, gemm_bf16 = false, flash = false, flash_bf16 = false, profile = false;
    std::vector<std::size_t> positional;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--tf32") == 0) tf32 = true;
      else if (std::strcmp(argv[i], "--bf16") == 0) bf16 = true;
      else if (std::strcmp(argv[i], "--gemm-bf16") == 0) gemm_bf16 = true;
      else if (std::strcmp(argv[i], "--flash") == 0) flash = true;
      else if (std::strcmp(argv[i], "--flash-bf16") == 0) flash = flash_bf16 = true;
      else if (std::strcmp(argv[i], "--profile") == 0) profile = true;
      else if (argv[i][0] == '-') throw trident::usage_error(std::string("gpt_cuda: unknown option ") + argv[i]);
      else positional.push_back(static_cast<std::size_t>(std::strtoull(argv[i], nullptr, 10)));
    }
    TRIDENT_EXPECT(!(tf32 && bf16), "gpt_cuda: --tf32 or --bf16, not both");
    TRIDENT_EXPECT(!(tf32 && gemm_bf16), "gpt_cuda: --tf32 or --gemm-bf16 (the GEMMs' math), not both");
    auto arg = [&](std::size_t i, std::size_t fallback) { return positional.size() > i ? positional[i] : fallback; };
    const std::size_t batch = arg(0, 16), layers = arg(1, 12), steps = arg(2, 5);
    auto world = trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.host_id_per_rank = true});
    TRIDENT_EXPECT(world.size() == 1, "gpt_cuda: one rank (mpirun -np 1); got ", world.size());
    using trident::nn::gemm_math;
    const gemm_math math = gemm_bf16 ? gemm_math::bf16 : tf32 || bf16 ? gemm_math::tf32 : gemm_math::fp32;
    if (bf16) run<trident::mixed_precision<trident::bf16>>(world, batch, layers, steps, math, flash, flash_bf16, profile);
    else run<trident::full_precision>(world, batch, layers, steps, math, flash, flash_bf16, profile);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_cuda: %s\n", e.what());
    failed = 1;
  }
  MPI_Finalize();
  return failed;
}
