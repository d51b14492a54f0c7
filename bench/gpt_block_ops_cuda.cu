// One GPT-2 block's operations on the GPU, each timed alone: where bench/gpt_cuda's "blocks
// forward" and "blocks backward" go. GPT-2 124M's block by default (B = 16, T = 1024, 768 wide,
// 12 heads, MLP 3072), the nn::cuda layers the flagship's blocks run (tensor::cuda's block with
// t = 1 calls exactly these), in FP32, TF32 and bf16 GEMM math (bf16: each GEMM rounds its float
// operands to bf16 first; also the rounding alone and a GEMM on operands already in bf16):
//
//   ./gpt_block_ops_cuda [batch] [seq]
//
// Each line: the op, its time per call (CUDA events around 10 calls after 3 warm-up calls on the
// default stream), and what it moves or computes at that time: GB/s for the memory-bound ops
// (the bytes an op must read and write at least) and TFLOP/s for the GEMMs. "bias gradient" is a
// linear's backward with its bias less the same without it. Inputs are constants: the times do
// not depend on the values.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <vector>

#include "cuda_timing.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/cuda/attention.cuh"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/flash_attention.cuh"
#include "trident/nn/cuda/flash_bf16.cuh"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/cuda/norm.cuh"

using bench::time_ms;
using trident::buffer;
using trident::cuda_space;
namespace nn = trident::nn;

namespace {

buffer<float, cuda_space> filled(std::size_t n, float value) {
  buffer<float, cuda_space> b(n);
  std::vector<float> host(n, value);
  trident::copy(std::span<const float>(host), b);
  return b;
}

void line(const char* op, float ms, double bytes, double flops) {
  std::printf("  %-34s %8.3f ms", op, static_cast<double>(ms));
  if (bytes > 0) std::printf("  %7.0f GB/s", bytes / (ms * 1e-3) / 1e9);
  if (flops > 0) std::printf("  %7.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (trident::cuda_device_count() == 0) {
      std::puts("gpt_block_ops_cuda: no CUDA device");
      return 77;
    }
    const std::size_t batch = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16, seq = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
    const std::size_t h = 768, heads = 12, ffn = 4 * h, n = batch * seq;
    const int reps = 10;
    const double f4 = 4.0;  // bytes per float
    auto x = filled(n * h, 0.5f), ln_out = filled(n * h, 0.25f), mean = filled(n, 0.0f), rstd = filled(n, 1.0f);
    auto qkv = filled(n * 3 * h, 0.01f), attn = filled(n * h, 0.1f), fc1 = filled(n * ffn, 0.1f), gelu = filled(n * ffn, 0.1f);
    auto y = filled(n * h, 0.0f), dy = filled(n * h, 0.01f), dx = filled(n * h, 0.0f), dffn = filled(n * ffn, 0.01f);
    auto dqkv = filled(n * 3 * h, 0.0f);
    auto gamma = filled(h, 1.0f), beta = filled(h, 0.0f), dgamma = filled(h, 0.0f), dbeta = filled(h, 0.0f);
    auto w_qkv = filled(3 * h * h, 0.02f), b_qkv = filled(3 * h, 0.0f), w_proj = filled(h * h, 0.02f), b_proj = filled(h, 0.0f);
    auto w_fc1 = filled(ffn * h, 0.02f), b_fc1 = filled(ffn, 0.0f), w_fc2 = filled(h * ffn, 0.02f), b_fc2 = filled(h, 0.0f);
    auto gw_qkv = filled(3 * h * h, 0.0f), gb_qkv = filled(3 * h, 0.0f), gw_fc1 = filled(ffn * h, 0.0f), gb_fc1 = filled(ffn, 0.0f);
    const nn::cuda::causal_attention core{.seq = seq, .batch = batch, .heads = heads, .head_dim = h / heads};
    auto probs = filled(core.probs_size(), 0.0f), ds = filled(core.probs_size(), 0.0f);
    const nn::cuda::layer_norm ln{h, 1e-5f};
    const nn::cuda::linear qkv_layer{h, 3 * h}, fc1_layer{h, ffn}, fc2_layer{ffn, h};
    std::printf("one GPT block's operations on the GPU: B = %zu, T = %zu, hidden %zu, %zu heads, MLP %zu (rows n = %zu)\n", batch, seq, h,
                heads, ffn, n);
    const double nh = static_cast<double>(n * h), nf = static_cast<double>(n * ffn), pp = static_cast<double>(core.probs_size());
    const double dn = static_cast<double>(n), dh = static_cast<double>(h), df = static_cast<double>(ffn);
    line("LayerNorm forward", time_ms([&] {
           ln.forward(nullptr, n, x.device_handle(), gamma.device_handle(), beta.device_handle(), ln_out.device_handle(),
                      mean.device_handle(), rstd.device_handle());
         }, reps), 2 * nh * f4, 0);
    line("LayerNorm backward (dx, dgamma, dbeta)", time_ms([&] {
           ln.backward(nullptr, n, x.device_handle(), gamma.device_handle(), mean.device_handle(), rstd.device_handle(),
                       dy.device_handle(), dx.device_handle(), dgamma.device_handle(), dbeta.device_handle());
         }, reps), 3 * nh * f4, 0);
    // ... with a scratch: the parameter sums over chunks of 256 rows (what the block runs)
    trident::buffer<double, trident::cuda_space> ln_sums(ln.backward_scratch_size(n));
    line("LayerNorm backward, chunked parameter sums", time_ms([&] {
           ln.backward(nullptr, n, x.device_handle(), gamma.device_handle(), mean.device_handle(), rstd.device_handle(),
                       dy.device_handle(), dx.device_handle(), dgamma.device_handle(), dbeta.device_handle(),
                       ln_sums.device_handle());
         }, reps), 3 * nh * f4, 0);
    line("GELU forward (fc1's width)", time_ms([&] {
           nn::cuda::activation_forward<nn::gelu>(fc1.device_handle(), gelu.device_handle(), nullptr);
         }, reps), 2 * nf * f4, 0);
    line("GELU backward", time_ms([&] {
           nn::cuda::activation_backward<nn::gelu>(fc1.device_handle(), dffn.device_handle(), gelu.device_handle(), nullptr);
         }, reps), 3 * nf * f4, 0);
    line("residual add", time_ms([&] { nn::cuda::add_to(dy.device_handle(), y.device_handle(), nullptr); }, reps), 3 * nh * f4, 0);
    for (const nn::gemm_math math : {nn::gemm_math::fp32, nn::gemm_math::tf32, nn::gemm_math::bf16}) {
      nn::cublas_handle blas;
      if (math == nn::gemm_math::bf16) nn::cuda::use_bf16_gemm(blas);  // each call rounds its operands first
      else blas.set_math(math);
      std::printf(" %s GEMMs\n", nn::name(math));
      if (math == nn::gemm_math::bf16) {
        // What the rounding costs, and the GEMM it feeds with its operands already bf16 in memory
        // (activations kept in bf16 would skip the rounding).
        buffer<trident::bf16, cuda_space> x16(n * h), w16(ffn * h), y16(n * ffn);
        trident::fill_zero(x16);
        trident::fill_zero(w16);
        line("rounding fc1's output to bf16", time_ms([&] { nn::cuda::round_to_bf16(fc1.data(), y16.data(), n * ffn, nullptr); }, reps),
             nf * (f4 + 2), 0);
        line("fc1 forward on bf16 operands in memory, no bias", time_ms([&] {
               nn::cuda::gemm(blas, nullptr, nn::op::n, nn::op::t, n, ffn, h, 1.0f, x16.data(), h, w16.data(), h, 0.0f, fc1.data(), ffn);
             }, reps), 0, 2 * dn * dh * df);
      }
      line("QKV forward (GEMM + bias)", time_ms([&] {
             qkv_layer.forward(blas, nullptr, n, ln_out.device_handle(), w_qkv.device_handle(), b_qkv.device_handle(), qkv.device_handle());
           }, reps), 0, 2 * dn * dh * 3 * dh);
      line("QKV forward, no bias", time_ms([&] {
             qkv_layer.forward(blas, nullptr, n, ln_out.device_handle(), w_qkv.device_handle(), {}, qkv.device_handle());
           }, reps), 0, 2 * dn * dh * 3 * dh);
      line("fc1 forward (GEMM + bias)", time_ms([&] {
             fc1_layer.forward(blas, nullptr, n, ln_out.device_handle(), w_fc1.device_handle(), b_fc1.device_handle(), fc1.device_handle());
           }, reps), 0, 2 * dn * dh * df);
      line("fc2 forward (GEMM + bias)", time_ms([&] {
             fc2_layer.forward(blas, nullptr, n, gelu.device_handle(), w_fc2.device_handle(), b_fc2.device_handle(), y.device_handle());
           }, reps), 0, 2 * dn * dh * df);
      const float with_bias = time_ms([&] {
        fc1_layer.backward(blas, nullptr, n, ln_out.device_handle(), w_fc1.device_handle(), dffn.device_handle(), dx.device_handle(),
                           gw_fc1.device_handle(), gb_fc1.device_handle());
      }, reps);
      const float without = time_ms([&] {
        fc1_layer.backward(blas, nullptr, n, ln_out.device_handle(), w_fc1.device_handle(), dffn.device_handle(), dx.device_handle(),
                           gw_fc1.device_handle(), {});
      }, reps);
      line("fc1 backward (dx, dW, db)", with_bias, 0, 4 * dn * dh * df);
      line("  of which the bias gradient", with_bias - without, nf * f4, 0);
      line("attention: scores + softmax", time_ms([&] {
             core.probabilities(blas, nullptr, qkv.device_handle(), probs.device_handle());
           }, reps), 0, 0);
      line("attention: scores GEMM alone", time_ms([&] {
             nn::cuda::gemm_strided_batched(blas, nullptr, nn::op::n, nn::op::t, seq, seq, h / heads, 1.0f, qkv.data(), batch * heads * 3 * (h / heads),
                                            3 * (h / heads), qkv.data() + h / heads, batch * heads * 3 * (h / heads), 3 * (h / heads), 0.0f,
                                            probs.data(), seq, seq * seq, batch * heads);
           }, reps), pp * f4, 2 * pp * static_cast<double>(h / heads));
      line("attention forward (+ P v)", time_ms([&] {
             core.forward(blas, nullptr, qkv.device_handle(), attn.device_handle(), probs.device_handle());
           }, reps), 0, 0);
      line("attention backward", time_ms([&] {
             core.backward(blas, nullptr, qkv.device_handle(), probs.device_handle(), attn.device_handle(), dqkv.device_handle(),
                           ds.device_handle());
           }, reps), 0, 0);
    }
    std::printf("  (the softmax alone: scores + softmax less the scores GEMM; its floor: the [B, H, T, T] probabilities written once, %.0f MB)\n",
                pp * f4 / 1e6);
    // The tiled attention (TF32 tensor cores, whatever the GEMM math above): the same work
    // without the probabilities; TFLOP/s of the causal products it must do (forward q k^T and
    // P v; backward those recomputed and dP, dq, dk, dv: 2 and 5 products of B H T^2 d / 2 MACs).
    int device = 0, major = 0;
    TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major >= 8 && nn::flash::supported_head_dim(h / heads)) {
      const nn::cuda::flash_attention fa{.seq = seq, .batch = batch, .heads = heads, .head_dim = h / heads};
      auto lse = filled(fa.lse_size(), 0.0f), delta = filled(fa.lse_size(), 0.0f);
      const double causal = static_cast<double>(batch * heads) * static_cast<double>(seq) * static_cast<double>(seq) *
                            static_cast<double>(h / heads);  // 2 B H T^2 d / 2: one causal product's FLOPs
      std::printf(" flash attention (TF32 tiles, lse [B, H, T] kept instead of the probabilities)\n");
      line("flash attention forward", time_ms([&] {
             fa.forward(nullptr, qkv.device_handle(), attn.device_handle(), lse.device_handle());
           }, reps), 0, 2 * causal);
      line("flash attention backward", time_ms([&] {
             fa.backward(nullptr, qkv.device_handle(), attn.device_handle(), lse.device_handle(), dy.device_handle(),
                         delta.device_handle(), dqkv.device_handle());
           }, reps), 0, 5 * causal);
      // The bf16 tiles with the scores in registers, on the same inputs.
      const nn::cuda::flash_attention_bf16 fb{.seq = seq, .batch = batch, .heads = heads, .head_dim = h / heads};
      std::printf(" flash attention, bf16 tiles with the scores in registers (mma.sync)\n");
      line("flash attention bf16 forward", time_ms([&] {
             fb.forward(nullptr, qkv.device_handle(), attn.device_handle(), lse.device_handle());
           }, reps), 0, 2 * causal);
      line("flash attention bf16 backward", time_ms([&] {
             fb.backward(nullptr, qkv.device_handle(), attn.device_handle(), lse.device_handle(), dy.device_handle(),
                         delta.device_handle(), dqkv.device_handle());
           }, reps), 0, 5 * causal);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_block_ops_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
