// One tensor-parallel transformer block's step (forward + backward) on the GPU over NCCL, with the
// input gradient's all-reduce overlapped with the weight-gradient GEMM and without, and with
// sequence parallelism (t > 1), in one run:
//   mpirun -np 1 tensor_block_cuda [seq] [batch] [hidden] [heads] [repeats]   (t = 1)
//   mpirun -np 2 tensor_block_cuda ...                                        (t = 2)
// Defaults 1024 8 768 12 20: GPT-2 small's block at T = 1024, B = 8, fp32. Every rank drives GPU 0
// (ranks told apart by NCCL_HOSTID, as scripts/gpu_check.sh runs it), so with t = 2 two ranks
// share one GPU's SMs: the figure shows what the tensor-parallel block and its communication
// cost on one device, not the speed-up of t devices. Times are CUDA events on rank 0's compute
// stream, between barriers, the mean of `repeats` steps after two warm-up steps.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "trident/comm/nccl.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/parallel/tensor/cuda/block.cuh"

namespace {

std::vector<float> filled(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

trident::buffer<float, trident::cuda_space> upload(const std::vector<float>& v) {
  trident::buffer<float, trident::cuda_space> b(v.size());
  trident::copy(std::span<const float>(v), b);
  return b;
}

std::size_t arg(int argc, char** argv, int i, std::size_t fallback) {
  return argc > i ? static_cast<std::size_t>(std::strtoull(argv[i], nullptr, 10)) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = 0;
  try {
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    TRIDENT_CUDA_CHECK(cudaSetDevice(0));
    auto tp = trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.host_id_per_rank = true});
    trident::tensor::block_config config{.seq = arg(argc, argv, 1, 1024), .batch = arg(argc, argv, 2, 8),
                                         .hidden = arg(argc, argv, 3, 768), .heads = arg(argc, argv, 4, 12)};
    const int repeats = static_cast<int>(arg(argc, argv, 5, 20));
    trident::cuda_context ctx;
    trident::nn::cublas_handle blas;
    const double tokens = static_cast<double>(config.seq * config.batch);
    // Model FLOPs per step (forward + backward): 6 x the block's 12 hidden^2 weights x tokens,
    // plus attention's six seq x seq x hidden products (two forward, four backward) at 2 FLOPs
    // per multiply-add, halved for the causal mask (our GEMMs compute the whole square: the
    // masked half is work we do but do not count).
    const double h = static_cast<double>(config.hidden), s = static_cast<double>(config.seq);
    const double flops = tokens * (6.0 * 12.0 * h * h) + 6.0 * s * s * h * static_cast<double>(config.batch);
    for (const bool sp : {false, true}) {
      if (sp && tp.size() == 1) continue;  // the same block
      config.sequence_parallel = sp;
      trident::tensor::cuda::transformer_block block(tp, config, "h0");
      std::vector<trident::buffer<float, trident::cuda_space>> w, g;
      std::uint64_t seed = 1;
      for (const auto& p : block.shape().parameters()) {
        w.push_back(upload(filled(p.split.local_numel(), ++seed, 0.1f)));
        g.push_back(upload(std::vector<float>(p.split.local_numel(), 0.0f)));
      }
      const std::size_t n = block.shape().local_rows() * config.hidden;
      auto x = upload(filled(n, 100, 1.0f)), dy = upload(filled(n, 101, 1.0f));
      trident::buffer<float, trident::cuda_space> y(n), dx(n);
      auto saved = block.make_activations();
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      const auto weights = trident::tensor::block_tensors<const float, trident::cuda_space>::over(w);
      const auto grads = trident::tensor::block_tensors<float, trident::cuda_space>::over(g);
      for (const bool overlap : {true, false}) {
        block.set_overlap(overlap);
        trident::cuda_event start(true), stop(true);
        const auto step = [&] {
          block.forward(ctx, blas, tp, weights, x.device_handle(), y.device_handle(), saved);
          block.backward(ctx, blas, tp, weights, saved, dy.device_handle(), dx.device_handle(), grads);
        };
        for (int i = 0; i < 2; ++i) step();
        ctx.synchronize();
        MPI_Barrier(MPI_COMM_WORLD);
        start.record(ctx.stream());
        for (int i = 0; i < repeats; ++i) step();
        stop.record(ctx.stream());
        stop.synchronize();
        const double ms = static_cast<double>(stop.elapsed_ms(start)) / repeats;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
          std::printf("tensor block on the GPU: t = %d%s, seq %zu, batch %zu, hidden %zu, heads %zu, overlap %-3s: %8.3f "
                      "ms/step, %9.0f tokens/s, %6.1f TFLOP/s (model FLOPs, fp32)\n",
                      tp.size(), sp ? " + sequence parallel" : "", config.seq, config.batch, config.hidden, config.heads,
                      overlap ? "on" : "off", ms, tokens / (ms / 1e3), flops / (ms / 1e3) / 1e12);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    failed = 1;
  }
  MPI_Finalize();
  return failed;
}
