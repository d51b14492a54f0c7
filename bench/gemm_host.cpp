// nn/gemm.hpp's own kernel on each x86 path (portable SSE2, AVX2, AVX-512F) beside OpenBLAS's
// sgemm, one thread, in one run, on the flagship CPU race's products (bench/gpt_vs_torch.sh's
// speed model: 8 x 128 tokens, hidden 128, MLP 512; the attention's 64-row blocks):
//
//   g++ -std=c++20 -O2 -DNDEBUG -Iinclude bench/gemm_host.cpp -DTRIDENT_HAS_CBLAS=1 -lopenblas -o build/gemm_host
//   OPENBLAS_NUM_THREADS=1 build/gemm_host
//
// (Without -DTRIDENT_HAS_CBLAS=1 -lopenblas, only trident's paths.) GFLOP/s = 2 m n k per call,
// over repeated calls for half a second each. Paths this CPU lacks are skipped.
#include <chrono>
#include <cstdio>
#include <vector>

#include "trident/nn/gemm.hpp"
#include "trident/optim/host_simd.hpp"

namespace {

namespace nn = trident::nn;
namespace simd = trident::optim::detail;

struct shape {
  std::size_t m, n, k;
  nn::op a, b;
  const char* name;
};

template <class F>
double gflops(const shape& s, F&& call) {
  int reps = 0;
  double seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    call();
    ++reps;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (seconds < 0.5);
  return 2.0 * static_cast<double>(s.m * s.n * s.k) * reps / seconds / 1e9;
}

}  // namespace

int main() {
  const shape shapes[] = {{1024, 384, 128, nn::op::n, nn::op::t, "qkv forward (x W^T)"},
                          {1024, 512, 128, nn::op::n, nn::op::t, "fc1 forward"},
                          {1024, 128, 512, nn::op::n, nn::op::t, "fc2 forward"},
                          {1024, 128, 384, nn::op::n, nn::op::n, "qkv dx (dy W)"},
                          {384, 128, 1024, nn::op::t, nn::op::n, "qkv dW (dy^T x)"},
                          {64, 128, 32, nn::op::n, nn::op::t, "attention scores, a row block"}};
  const struct {
    simd::host_isa isa;
    const char* name;
  } paths[] = {{simd::host_isa::portable, "SSE2"}, {simd::host_isa::avx2, "AVX2"}, {simd::host_isa::avx512, "AVX-512"}};
  std::printf("%-32s %16s", "GFLOP/s, one thread", "m x n x k");
  for (const auto& p : paths) std::printf(" %9s", p.name);
#if TRIDENT_HAS_CBLAS
  std::printf(" %9s", "OpenBLAS");
#endif
  std::printf("\n");
  for (const auto& s : shapes) {
    std::vector<float> a(s.m * s.k, 0.5f), b(s.k * s.n, 0.25f), c(s.m * s.n);
    const std::size_t lda = s.a == nn::op::n ? s.k : s.m, ldb = s.b == nn::op::n ? s.n : s.k;
    std::printf("%-32s %5zu x %4zu x %4zu", s.name, s.m, s.n, s.k);
    for (const auto& p : paths) {
      if (!simd::force_host_isa(p.isa)) {
        std::printf(" %9s", "-");
        continue;
      }
      std::printf(" %9.1f", gflops(s, [&] {
                    nn::detail::gemm_dispatch(s.a, s.b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
                  }));
      simd::unforce_host_isa();
    }
#if TRIDENT_HAS_CBLAS
    std::printf(" %9.1f", gflops(s, [&] { nn::gemm(s.a, s.b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n); }));
#endif
    std::printf("\n");
  }
  return 0;
}
