// trident/nn/cuda/cublas.hpp — cuBLAS for the CUDA reference layers: errors, a handle, a row-major GEMM.
//
// Synopsis (only with TRIDENT_HAS_CUDA: link trident::cuda, or compile with nvcc)
//   TRIDENT_CUBLAS_CHECK(call)             throws cublas_error naming the call when it fails
//   enum class gemm_math { fp32, tf32, bf16 }
//                                          what a GEMM on float matrices computes in
//   class cublas_handle;                   RAII cublasHandle_t, a cublasLtHandle_t and its 32 MiB
//                                          workspace (`other` memory): move-only, FP32 math
//     get(), operator cublasHandle_t(), lt(), workspace(), workspace_bytes(), math(),
//     set_math(m), set_math(gemm_math::bf16, rounding), bf16_scratch_bytes(), reserve_bf16_scratch(n)
//   struct blas_ref { handle; math; lt; workspace; workspace_bytes; bf16; }
//                                          what the layers take: a handle and its GEMMs' math
//                                          (from a cublas_handle: its math, cuBLASLt handle,
//                                          workspace and bf16 operand scratch; a raw handle:
//                                          fp32, no cuBLASLt)
//   namespace trident::nn::cuda
//     void gemm(blas_ref, cudaStream_t, op op_a, op op_b, m, n, k, float alpha,
//               const float* a, lda, const float* b, ldb, float beta, float* c, ldc)
//         row-major C[m, n] = alpha op(A) op(B) + beta C on the stream: nn::gemm's contract
//     void gemm(blas_ref, cudaStream_t, op_a, op_b, m, n, k, alpha, const bf16* a, lda,
//               const bf16* b, ldb, beta, float* c, ldc)
//         the same on bf16 operands in memory: bf16 tensor cores, FP32 sums, a float C
//     void gemm_strided_batched(blas_ref, stream, op_a, op_b, m, n, k, alpha, a, lda, stride_a,
//               b, ldb, stride_b, beta, c, ldc, stride_c, count)
//         the same for `count` problems, the i-th at a + i stride_a, b + i stride_b, c + i stride_c
//         (one strided batched cuBLAS call: attention's products over every (batch, head))
//     bool gemm_bias(blas_ref, stream, m, n, k, x, w, bias, y)         x: float, or bf16 under gemm_math::bf16
//         row-major y[m, n] = x W^T + bias, the bias in cuBLASLt's epilogue; false: not done
//
// Host code: this header needs the CUDA toolkit's headers and cuBLAS, not nvcc, so a plain C++
// translation unit linking trident::cuda can use it; without CUDA it declares gemm_math alone
// (so that host options can name it) and nothing of cuBLAS. The kernels of the CUDA layers are in nn/cuda/layers.cuh (nvcc only).
//
// cuBLAS is column-major; a row-major matrix is its column-major transpose, so
// C = op(A) op(B) (row-major) is computed as C^T = op(B)^T op(A)^T (column-major): the operands
// swap places and keep their op flags. The handle's math mode is CUBLAS_DEFAULT_MATH, so SGEMM
// runs in true FP32 (never TF32), and results are bitwise reproducible run to run on one GPU
// model as long as a handle is used from one stream at a time (see cuBLAS "Results
// reproducibility").
//
// Faster math is asked for, not defaulted: gemm_math::tf32 keeps float matrices in memory and
// runs cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32, the operands rounded to TF32 on the
// tensor cores and FP32 accumulation (PyTorch's allow_tf32). gemm_math::fp32 is plain
// cublasSgemm. CUBLAS_COMPUTE_32F_FAST_16BF on float matrices gave an H100 TF32's results (the
// same errors to the last digit) at TF32's speed (bench/RESULTS.md, 2026-11-26): bf16 tensor
// cores at their speed need bf16 operands in memory. So gemm_math::bf16 rounds both float
// operands to bf16 (to nearest, ties to even: core/half.hpp's rounding) into the handle's scratch
// (a linear layer's backward rounds x, W and dy once for its two GEMMs: nn::cuda::linear)
// and runs cublasGemmEx on them with FP32 sums and a float C, what PyTorch's autocast to bf16
// does to a matmul's inputs. Rounding is a kernel, and this header is host code, so the kernel
// comes from a translation unit compiled with nvcc: nn::cuda::use_bf16_gemm(handle) in
// nn/cuda/layers.cuh passes it to set_math. The scratch grows to the most operands rounded at
// once (`other` memory) at first use, keeping what it outgrew (a queued GEMM may read it), or is
// sized once by reserve_bf16_scratch: run a step, or reserve, before capturing a graph. Rounded
// copies serve work on the stream that rounded them: one handle, one stream at a time.
// Attention's strided batched products (gemm_strided_batched) stay TF32 under bf16: their
// operands are strided views into a larger buffer, not worth rounding whole.
#pragma once

#include "trident/core/config.hpp"

namespace trident::nn {

//! What a GEMM on float matrices computes in: fp32 (cublasSgemm: FP32 products and sums), tf32
//! (tensor cores on operands rounded to TF32, FP32 accumulation) or bf16 (the operands rounded to
//! bf16 in memory, bf16 tensor cores, FP32 accumulation, a float result).
enum class gemm_math { fp32, tf32, bf16 };

//! The name of a gemm_math ("fp32", "tf32", "bf16").
inline const char* name(gemm_math m) noexcept {
  return m == gemm_math::tf32 ? "tf32" : m == gemm_math::bf16 ? "bf16" : "fp32";
}

}  // namespace trident::nn

#if TRIDENT_HAS_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <source_location>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/nn/gemm.hpp"

namespace trident {

namespace detail {

inline void cublas_check(cublasStatus_t status, const char* operation,
                         std::source_location where = std::source_location::current()) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  throw cublas_error(static_cast<int>(status), concat(cublasGetStatusName(status), ": ", cublasGetStatusString(status)),
                     operation, where);
}

}  // namespace detail

}  // namespace trident

//! Wraps one cuBLAS call: `TRIDENT_CUBLAS_CHECK(cublasSetStream(handle, stream));`
#define TRIDENT_CUBLAS_CHECK(...) ::trident::detail::cublas_check((__VA_ARGS__), #__VA_ARGS__)

namespace trident::nn {

//! Rounds `count` floats to bf16 (to nearest, ties to even) into `out`, enqueued on `stream`: a
//! CUDA kernel's launch, which gemm_math::bf16 needs and host code cannot compile
//! (nn::cuda::round_to_bf16 in nn/cuda/layers.cuh is one).
using bf16_rounding = void (*)(const float* in, bf16* out, std::size_t count, cudaStream_t stream);

namespace detail {

// gemm_math::bf16's operands: the rounding kernel and device memory for the most operands
// rounded at once so far (a GEMM's two, a linear backward's three: x, W and dy). Owned by a
// cublas_handle (at a stable address: blas_refs point to it).
struct bf16_operands {
  bf16_rounding round = nullptr;
  buffer<bf16, cuda_space> scratch;
  // Outgrown scratch, kept until the handle goes: a GEMM queued earlier may still read it, and
  // freeing device memory (cudaFree) would wait for the whole device, collectives of other
  // ranks' streams included, in the middle of a step. A step's growth is its GEMMs' sizes, once.
  std::vector<buffer<bf16, cuda_space>> retired;

  // At least `count` elements, made on the host's first call that needs them (not while the
  // stream is captured into a graph: a graph would keep the address of memory later retired).
  bf16* reserve(std::size_t count, cudaStream_t stream) {
    if (scratch.size() < count) {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      TRIDENT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
      TRIDENT_EXPECT(capturing == cudaStreamCaptureStatusNone, "nn::cuda::gemm: gemm_math::bf16 needs ", count,
                     " elements of operand scratch and has ", scratch.size(), " while the stream is captured into a "
                     "graph; run the step once before capturing it, or reserve_bf16_scratch() first");
      if (!scratch.empty()) retired.push_back(std::move(scratch));
      scratch = buffer<bf16, cuda_space>(count, mem_category::other);
    }
    return scratch.data();
  }
};

}  // namespace detail

//! An owned cuBLAS handle on the current device, in FP32 math mode; converts to cublasHandle_t.
//!
//!   trident::nn::cublas_handle blas;               // throws cublas_error without a usable GPU
//!   trident::nn::cuda::gemm(blas, stream, op::n, op::t, m, n, k, 1, x, k, w, k, 0, y, n);
//!   blas.set_math(trident::nn::gemm_math::tf32);   // later GEMMs through `blas` on TF32 tensor cores
//!   trident::nn::cuda::use_bf16_gemm(blas);        // (nvcc, nn/cuda/layers.cuh) or on bf16 operands
class cublas_handle {
 public:
  cublas_handle() {
    TRIDENT_CUBLAS_CHECK(cublasCreate(&handle_));
    cublasStatus_t status = cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH);
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtCreate(&lt_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      reset();
      TRIDENT_CUBLAS_CHECK(status);
    }
    // cuBLASLt's best Hopper kernels need a workspace (cuBLAS keeps one of this size itself);
    // accounted as `other` memory.
    workspace_ = buffer<std::byte, cuda_space>(lt_workspace_bytes, mem_category::other);
    bf16_ = std::make_unique<detail::bf16_operands>();
  }
  //! The cuBLASLt workspace each handle holds (32 MiB).
  static constexpr std::size_t lt_workspace_bytes = std::size_t{32} << 20;
  cublas_handle(cublas_handle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)),
        lt_(std::exchange(other.lt_, nullptr)),
        workspace_(std::move(other.workspace_)),
        bf16_(std::move(other.bf16_)),
        math_(other.math_) {}
  cublas_handle& operator=(cublas_handle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
      lt_ = std::exchange(other.lt_, nullptr);
      workspace_ = std::move(other.workspace_);
      bf16_ = std::move(other.bf16_);
      math_ = other.math_;
    }
    return *this;
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() { reset(); }

  cublasHandle_t get() const noexcept { return handle_; }
  operator cublasHandle_t() const noexcept { return handle_; }
  //! Its cuBLASLt handle (the GEMMs with a fused bias: cuda::gemm_bias).
  cublasLtHandle_t lt() const noexcept { return lt_; }
  //! cuBLASLt's workspace (device memory, lt_workspace_bytes).
  void* workspace() const noexcept { return workspace_.data(); }
  std::size_t workspace_bytes() const noexcept { return workspace_.size(); }
  //! The math of the GEMMs run through this handle as a blas_ref (fp32 unless set).
  gemm_math math() const noexcept { return math_; }
  //! fp32 or tf32; bf16 once a rounding kernel is known (set_math(bf16, rounding) before), else
  //! a usage_error.
  void set_math(gemm_math m) {
    TRIDENT_EXPECT(m != gemm_math::bf16 || (bf16_ && bf16_->round != nullptr),
                   "cublas_handle::set_math(bf16): bf16 GEMMs round their float operands with a CUDA kernel; call "
                   "trident::nn::cuda::use_bf16_gemm(handle) (nn/cuda/layers.cuh) from a translation unit compiled "
                   "with nvcc, or set_math(gemm_math::bf16, rounding)");
    math_ = m;
  }
  //! `m` with the kernel that rounds operands to bf16 for gemm_math::bf16 (kept for later).
  void set_math(gemm_math m, bf16_rounding rounding) {
    TRIDENT_EXPECT(rounding != nullptr, "cublas_handle::set_math: a null bf16 rounding function");
    TRIDENT_EXPECT(bf16_ != nullptr, "cublas_handle::set_math on a moved-from handle");
    bf16_->round = rounding;
    set_math(m);
  }
  //! The device memory that gemm_math::bf16's rounded operands took so far (`other` memory),
  //! outgrown scratch included.
  std::size_t bf16_scratch_bytes() const noexcept {
    if (!bf16_) return 0;
    std::size_t elements = bf16_->scratch.size();
    for (const auto& old : bf16_->retired) elements += old.size();
    return elements * sizeof(bf16);
  }
  //! Makes gemm_math::bf16's scratch `elements` long now, so that no GEMM grows it later: before
  //! capturing a graph, or to keep outgrown scratch from piling up. Enough is the most rounded
  //! at once, each operand rounded up to 128 elements: a GEMM's two, or a linear layer's
  //! backward's x + W + dy (nn::cuda::linear::round_for_backward). Call it while no GEMM through
  //! the handle is queued.
  void reserve_bf16_scratch(std::size_t elements) {
    TRIDENT_EXPECT(bf16_ != nullptr, "cublas_handle::reserve_bf16_scratch on a moved-from handle");
    if (bf16_->scratch.size() < elements) {
      bf16_->scratch = buffer<bf16, cuda_space>();
      bf16_->scratch = buffer<bf16, cuda_space>(elements, mem_category::other);
    }
    bf16_->retired.clear();
  }
  detail::bf16_operands* bf16_operands() const noexcept { return bf16_.get(); }

 private:
  void reset() noexcept {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);  // a destructor cannot throw
    if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
    handle_ = nullptr;
    lt_ = nullptr;
  }
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  mutable buffer<std::byte, cuda_space> workspace_;  // scratch that GEMMs through a const handle use
  std::unique_ptr<detail::bf16_operands> bf16_;      // gemm_math::bf16's kernel and scratch
  gemm_math math_ = gemm_math::fp32;
};

//! A cuBLAS handle and the math its GEMMs run in: what the CUDA layers take. A raw handle
//! converts with fp32 math; a cublas_handle with its own.
//!
//!   layer.forward(blas, stream, ...);                                   // blas.math()
//!   layer.forward(trident::nn::blas_ref{h, trident::nn::gemm_math::tf32}, stream, ...);
struct blas_ref {
  cublasHandle_t handle = nullptr;
  gemm_math math = gemm_math::fp32;
  cublasLtHandle_t lt = nullptr;  // from a cublas_handle: GEMMs with a bias fuse it (gemm_bias)
  void* workspace = nullptr;      // and its workspace
  std::size_t workspace_bytes = 0;
  detail::bf16_operands* bf16 = nullptr;  // gemm_math::bf16's rounding and scratch (a cublas_handle's)

  blas_ref() = default;
  blas_ref(cublasHandle_t h, gemm_math m = gemm_math::fp32) noexcept : handle(h), math(m) {}  // NOLINT: implicit by design
  blas_ref(const cublas_handle& h) noexcept  // NOLINT: implicit by design
      : handle(h.get()),
        math(h.math()),
        lt(h.lt()),
        workspace(h.workspace()),
        workspace_bytes(h.workspace_bytes()),
        bf16(h.bf16_operands()) {}
};

namespace cuda {

namespace detail {

inline void check_int_range(std::size_t m, std::size_t n, std::size_t k, std::size_t lda, std::size_t ldb, std::size_t ldc,
                            const char* call) {
  constexpr auto limit = static_cast<std::size_t>(std::numeric_limits<int>::max());
  TRIDENT_EXPECT(m <= limit && n <= limit && k <= limit && lda <= limit && ldb <= limit && ldc <= limit,
                 "nn::cuda::gemm: sizes beyond int range (", m, " x ", n, " x ", k, ") for ", call);
}

// The elements that a row-major op(X) of [rows, cols] with leading dimension ld spans in memory:
// its stored rows times ld, less the last one's tail (the gaps between rows are rounded too:
// they lie inside the matrix's memory, and nothing reads them).
inline std::size_t stored_extent(op o, std::size_t rows, std::size_t cols, std::size_t ld) noexcept {
  const std::size_t stored_rows = o == op::n ? rows : cols, stored_cols = o == op::n ? cols : rows;
  return (stored_rows - 1) * ld + stored_cols;
}

// gemm_math::bf16: each operand's first `count` elements rounded to bf16 into the handle's
// scratch, one after the other, each 256-byte aligned, on `stream` (an empty one: nullptr). The
// copies are valid for work queued on the same stream until the next rounding through the same
// handle (a rounding on another stream may overwrite them before that work runs).
template <std::size_t N>
std::array<const bf16*, N> round_all(const blas_ref& blas, cudaStream_t stream,
                                     const std::array<std::pair<const float*, std::size_t>, N>& operands) {
  TRIDENT_EXPECT(blas.bf16 != nullptr && blas.bf16->round != nullptr,
                 "nn::cuda::gemm: gemm_math::bf16 needs a cublas_handle's rounding kernel and scratch "
                 "(nn::cuda::use_bf16_gemm(handle)); this blas_ref has none (made from a raw cublasHandle_t?)");
  constexpr std::size_t align = 256 / sizeof(bf16);
  std::array<std::size_t, N> at{};
  std::size_t total = 0;
  for (std::size_t i = 0; i < N; ++i) {
    at[i] = total;
    total += (operands[i].second + align - 1) / align * align;
  }
  bf16* scratch = blas.bf16->reserve(total, stream);
  std::array<const bf16*, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    if (operands[i].second == 0) continue;
    blas.bf16->round(operands[i].first, scratch + at[i], operands[i].second, stream);
    out[i] = scratch + at[i];
  }
  return out;
}

inline std::pair<const bf16*, const bf16*> round_operands(const blas_ref& blas, cudaStream_t stream, const float* a,
                                                          std::size_t a_count, const float* b, std::size_t b_count) {
  const auto r = round_all<2>(blas, stream, {{{a, a_count}, {b, b_count}}});
  return {r[0], r[1]};
}

}  // namespace detail

//! Row-major C[m, n] = alpha op(A) op(B) + beta C on bf16 operands in device memory: bf16 tensor
//! cores (compute capability 8.0+), FP32 sums, C in float, whatever blas.math
//! says (it is about float operands). k = 0 is refused (gemm on floats handles it).
//!
//!   nn::cuda::gemm(blas, stream, nn::op::n, nn::op::t, m, n, k, 1.0f, x16, k, w16, k, 0.0f, y, n);
inline void gemm(blas_ref blas, cudaStream_t stream, op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const bf16* a, std::size_t lda, const bf16* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  detail::check_int_range(m, n, k, lda, ldb, ldc, "cublasGemmEx on bf16");
  if (m == 0 || n == 0) return;
  TRIDENT_EXPECT(k > 0, "nn::cuda::gemm on bf16 operands: k = 0 (an empty inner dimension) is not supported");
  const cublasHandle_t handle = blas.handle;
  TRIDENT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  TRIDENT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  const auto to_blas = [](op o) { return o == op::n ? CUBLAS_OP_N : CUBLAS_OP_T; };
  // Row-major as column-major transposes (see the header comment): B and A swap places.
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(handle, to_blas(op_b), to_blas(op_a), static_cast<int>(n), static_cast<int>(m),
                                    static_cast<int>(k), &alpha, b, CUDA_R_16BF, static_cast<int>(ldb), a, CUDA_R_16BF,
                                    static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

//! Row-major C[m, n] = alpha op(A) op(B) + beta C with device pointers, enqueued on `stream`
//! (the handle's stream is set to it). Same contract as trident::nn::gemm.
inline void gemm(blas_ref blas, cudaStream_t stream, op op_a, op op_b, std::size_t m, std::size_t n,
                 std::size_t k, float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                 float beta, float* c, std::size_t ldc) {
  detail::check_int_range(m, n, k, lda, ldb, ldc, "cublasSgemm");
  if (m == 0 || n == 0) return;
  const cublasHandle_t handle = blas.handle;
  TRIDENT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  TRIDENT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  if (k == 0) {  // cuBLAS rejects k == 0 with a leading dimension of 0; C = beta C by hand
    TRIDENT_EXPECT(beta == 0.0f || beta == 1.0f, "nn::cuda::gemm: k == 0 supports beta 0 or 1, got ", beta);
    if (beta == 0.0f) {
      if (ldc == n) {
        TRIDENT_CUDA_CHECK(cudaMemsetAsync(c, 0, m * n * sizeof(float), stream));
      } else {
        TRIDENT_CUDA_CHECK(cudaMemset2DAsync(c, ldc * sizeof(float), 0, n * sizeof(float), m, stream));
      }
    }
    return;
  }
  const auto to_blas = [](op o) { return o == op::n ? CUBLAS_OP_N : CUBLAS_OP_T; };
  if (blas.math == gemm_math::bf16) {
    const auto [a16, b16] = detail::round_operands(blas, stream, a, detail::stored_extent(op_a, m, k, lda), b,
                                                   detail::stored_extent(op_b, k, n, ldb));
    gemm(blas, stream, op_a, op_b, m, n, k, alpha, a16, lda, b16, ldb, beta, c, ldc);
  } else if (blas.math == gemm_math::fp32) {
    TRIDENT_CUBLAS_CHECK(cublasSgemm(handle, to_blas(op_b), to_blas(op_a), static_cast<int>(n), static_cast<int>(m),
                                     static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a, static_cast<int>(lda),
                                     &beta, c, static_cast<int>(ldc)));
  } else {
    TRIDENT_CUBLAS_CHECK(cublasGemmEx(handle, to_blas(op_b), to_blas(op_a), static_cast<int>(n), static_cast<int>(m),
                                      static_cast<int>(k), &alpha, b, CUDA_R_32F, static_cast<int>(ldb), a, CUDA_R_32F,
                                      static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                                      CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
  }
}

namespace detail {
// Owns cuBLASLt's descriptors for one call (they are cheap to make: microseconds of host time).
struct lt_call {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  lt_call() = default;
  lt_call(const lt_call&) = delete;
  lt_call& operator=(const lt_call&) = delete;
  ~lt_call() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
  }
};
}  // namespace detail

//! Row-major y[m, n] = x[m, k] W[n, k]^T + bias[n] (a linear layer's forward) as one cuBLASLt
//! matmul with the bias in its epilogue, in blas.math, on `stream`: the separate pass over y that
//! adding the bias costs (0.10 ms of a 0.24 ms TF32 QKV projection at GPT-2 124M's size on an
//! H200) is gone. Under gemm_math::bf16, x and W are rounded to bf16 first, as gemm's operands.
//! Returns false, having done nothing, when blas carries no cuBLASLt handle (a raw
//! cublasHandle_t) or cuBLASLt offers no algorithm for the shape; the caller then runs gemm and
//! adds the bias itself. The bias is added to the product in float before y is rounded once.
//! x may already be in bf16 (under gemm_math::bf16 only: a producer that wrote its output
//! rounded, as a LayerNorm feeding a projection can); then W alone is rounded.
template <class X>
  requires std::is_same_v<X, float> || std::is_same_v<X, bf16>
inline bool gemm_bias(blas_ref blas, cudaStream_t stream, std::size_t m, std::size_t n, std::size_t k, const X* x,
                      const float* w, const float* bias, float* y) {
  constexpr bool x_bf16 = std::is_same_v<X, bf16>;
  TRIDENT_EXPECT(!x_bf16 || blas.math == gemm_math::bf16, "nn::cuda::gemm_bias: x in bf16 needs gemm_math::bf16; the blas_ref "
                 "is in ", name(blas.math));
  constexpr auto limit = static_cast<std::size_t>(std::numeric_limits<int>::max());
  if (blas.lt == nullptr || m == 0 || n == 0 || k == 0 || m > limit || n > limit || k > limit) return false;
  // Column-major, as gemm: y^T [n, m] = W [n, k] (W's row-major storage read transposed) x^T [k, m].
  detail::lt_call c;
  const bool bf16_math = blas.math == gemm_math::bf16;
  if (bf16_math && (blas.bf16 == nullptr || blas.bf16->round == nullptr)) return false;  // gemm says why
  const cublasComputeType_t compute = blas.math == gemm_math::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // bf16: x and W rounded to bf16 (after the heuristic has found an algorithm), y in float.
  const cudaDataType_t operand = bf16_math ? CUDA_R_16BF : CUDA_R_32F;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.a, operand, k, n, static_cast<int64_t>(k)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.b, operand, k, m, static_cast<int64_t>(k)));
  TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.d, CUDA_R_32F, n, m, static_cast<int64_t>(n)));
  // The handle's workspace: without one, cuBLASLt's TF32 kernels on an H200 were slower than
  // cublasGemmEx plus the bias's own pass (0.293 against 0.236 ms for GPT-2's QKV projection).
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  const std::size_t workspace = blas.workspace == nullptr ? 0 : blas.workspace_bytes;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                            sizeof(workspace)));
  // The operands' alignment as it is (the heuristic assumes 256 bytes unless told: a view into
  // an arena, or a caller's bf16 x, may be less, and an algorithm that needs more would fail).
  // The rounded copies are 256-byte aligned; for aligned pointers this is the default.
  const auto alignment = [](const void* p) {
    std::uint32_t a = 256;
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const std::uint32_t align_w = bf16_math ? 256 : alignment(w), align_x = bf16_math && !x_bf16 ? 256 : alignment(x);
  const std::uint32_t align_y = alignment(y);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}};
  for (const auto& [attribute, bytes] : alignments)
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, attribute, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(blas.lt, c.op, c.a, c.b, c.d, c.d, c.pref, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  const float one = 1.0f, zero = 0.0f;
  const void *w_in = w, *x_in = x;
  if constexpr (x_bf16) w_in = detail::round_all<1>(blas, stream, {{{w, n * k}}})[0];
  else if (bf16_math) std::tie(w_in, x_in) = detail::round_operands(blas, stream, w, n * k, x, m * k);
  TRIDENT_CUBLAS_CHECK(cublasLtMatmul(blas.lt, c.op, &one, w_in, c.a, x_in, c.b, &zero, y, c.d, y, c.d, &result.algo,
                                      blas.workspace, workspace, stream));
  return true;
}

//! `count` row-major GEMMs C_i = alpha op(A_i) op(B_i) + beta C_i, where X_i = x + i stride_x
//! (elements), in one cublasSgemmStridedBatched on `stream` (TF32 under gemm_math::bf16: see the
//! header comment). The C_i must not overlap each other; they may interleave (attention writes
//! each head's columns of rows shared by every head).
inline void gemm_strided_batched(blas_ref blas, cudaStream_t stream, op op_a, op op_b, std::size_t m, std::size_t n,
                                 std::size_t k, float alpha, const float* a, std::size_t lda, std::size_t stride_a,
                                 const float* b, std::size_t ldb, std::size_t stride_b, float beta, float* c,
                                 std::size_t ldc, std::size_t stride_c, std::size_t count) {
  constexpr auto limit = static_cast<std::size_t>(std::numeric_limits<int>::max());
  TRIDENT_EXPECT(m <= limit && n <= limit && k <= limit && lda <= limit && ldb <= limit && ldc <= limit && count <= limit,
                 "nn::cuda::gemm_strided_batched: sizes beyond int range (", count, " x ", m, " x ", n, " x ", k,
                 ") for cublasSgemmStridedBatched");
  if (m == 0 || n == 0 || count == 0) return;
  TRIDENT_EXPECT(k > 0, "nn::cuda::gemm_strided_batched: k = 0 (an empty inner dimension) is not supported, unlike gemm");
  const cublasHandle_t handle = blas.handle;
  TRIDENT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  TRIDENT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  const auto to_blas = [](op o) { return o == op::n ? CUBLAS_OP_N : CUBLAS_OP_T; };
  // Row-major as column-major transposes (see the header comment): B and A swap places.
  if (blas.math == gemm_math::fp32) {
    TRIDENT_CUBLAS_CHECK(cublasSgemmStridedBatched(
        handle, to_blas(op_b), to_blas(op_a), static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
        static_cast<int>(ldb), static_cast<long long>(stride_b), a, static_cast<int>(lda), static_cast<long long>(stride_a), &beta,
        c, static_cast<int>(ldc), static_cast<long long>(stride_c), static_cast<int>(count)));
  } else {
    TRIDENT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, to_blas(op_b), to_blas(op_a), static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
        CUDA_R_32F, static_cast<int>(ldb), static_cast<long long>(stride_b), a, CUDA_R_32F, static_cast<int>(lda),
        static_cast<long long>(stride_a), &beta, c, CUDA_R_32F, static_cast<int>(ldc), static_cast<long long>(stride_c),
        static_cast<int>(count), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace cuda

}  // namespace trident::nn

#endif  // TRIDENT_HAS_CUDA
