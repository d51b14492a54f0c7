// trident/nn/flash_bf16.hpp — causal attention with the scores in registers: bf16 tensor-core
// tiles (the GPU's mma.sync m16n8k16), written once for a GPU warp and for a host emulation of
// its 32 lanes.
//
// Synopsis (namespace trident::nn::flash_bf16)
//   struct frag_a, frag_b, frag_c         a lane's share of a [16, 16] bf16 A, a [16, 8] bf16 B,
//                                         a [16, 8] float C (PTX's documented fragment layouts)
//   template <int D> struct layout        a block's shared memory: two bf16 tiles of 64 rows
//   struct host_exec                      a block's 128 lanes, one after another, on the host
//   template <int D, class Exec> void forward_block(ex, p, smem, qt, bh)
//   template <int D, class Exec> void backward_kv_block(ex, p, smem, kt, bh)   dk, dv of key tile kt
//   template <int D, class Exec> void backward_q_block(ex, p, smem, qt, bh)    dq of query tile qt
//   void emulate_forward(shape, qkv, out, lse)   every block of the grid on the host, for tests
//   void emulate_backward(shape, qkv, out, lse, dout, delta, dqkv)
//
// nn::flash's problem and contract (nn/flash_attention.hpp: qkv [seq, batch, heads, 3, head_dim]
// in, out [seq, batch, heads, head_dim] and lse [batch, heads, seq] out), and its algorithm
// (FlashAttention-2's forward: per 64-query tile, the key tiles up to the diagonal, an online
// softmax). What differs is where the scores live. nn::flash keeps S and P in shared memory,
// because wmma's fragments have no documented layout; there its best was 21 TFLOP/s on an
// H200, below the unfused attention. Here each warp owns 16 query rows and keeps, in
// registers, its q fragments, its [16, 64] scores (8 C fragments), its [16, D] output and each
// row's running maximum and sum; the softmax runs on the C fragments where mma left them (a lane
// holds 2 columns of rows g and g + 8, g = lane / 4; a row's 4 lanes combine their maxima and
// sums with two shuffles), and P goes from the C fragments straight into A fragments for P v (the
// layouts line up: C columns 2t, 2t + 1 of two adjacent n-tiles are A's columns of one k-step).
// Only K and V go through shared memory, once per key tile, as bf16 rows; V's B fragments, whose
// pairs run down a column, come from ldmatrix .trans. FlashAttention-2's own kernels work this way.
//
// Backward is nn::flash's two deterministic passes with the same registers-first design: per key
// tile, each warp holds 16 keys' k and v as A fragments and computes S^T = k q^T and dP^T =
// v dout^T for each query tile, then dv += P^T dout and dk += dS^T q from those C fragments (q
// and dout go through shared memory as rows, read both ways); per query tile, S = q k^T and
// dP = dout v^T, then dq += dS k. P = exp(S scale - lse) as forward saved it, dS = P (dP -
// delta) scale, delta = rowsum(dout * out) (flash::delta_rows).
//
// Numerics: q, k, v, dout, P and dS are rounded to bf16 (round to nearest even) before their
// products, which are exact in float; sums are in float; the row sums l add P before its
// rounding. So out is the attention of the bf16-rounded q, k, v within P's rounding (about
// 2^-9 relative per term), lse is the log-sum-exp of the bf16 scores within float rounding, and
// dqkv is the exact gradient of the rounded inputs within P's and dS's rounding.
//
// How it is written. As nn::flash: phases on a block's threads (`ex.each`), block barriers
// (`ex.sync`), and warp programs (`ex.warps`) whose lane code runs in `ex.lanes`. A lane's state
// (fragments, row statistics) lives in `ex`'s per-lane storage across barriers: on the GPU the
// thread's registers, on the host an array of 128. The warp-collective operations are Exec's:
// `ex.mma(w, c, a, b)` (D = A B + C on one warp's fragments, each given per lane) and
// `ex.quad_max` / `ex.quad_sum` (a value combined over each 4 consecutive lanes, as two
// shfl_xor steps do it). host_exec implements them on the fragments' documented layouts, so the
// fragment bookkeeping, masking and softmax are tested on any machine (nn.host, against the
// exact attention of the rounded inputs); nn/cuda/flash_bf16.cuh's device_exec issues
// mma.sync and __shfl_xor_sync.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/half.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_attention.hpp"

namespace trident::nn::flash_bf16 {

using flash::problem;
using flash::threads;
using flash::tile;
using flash::warps;

//! A lane's share of a [16, 16] bf16 A (row-major): bf16 pairs (low half first) at rows g, g + 8,
//! g, g + 8 and columns 2t, 2t, 2t + 8, 2t + 8 (g = lane / 4, t = lane % 4).
struct frag_a {
  std::uint32_t r[4];
};
//! A lane's share of a [16, 8] bf16 B (k rows, n columns): pairs along k at k = 2t and 2t + 8, column g.
struct frag_b {
  std::uint32_t r[2];
};
//! A lane's share of a [16, 8] float C: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
struct frag_c {
  float v[4];
};

//! A block's shared memory for head_dim D, in bf16 elements: two tiles of 64 rows [64, D] (K and
//! V; q and dout; k and v), rows padded by 8 elements (16 bytes): the 8 rows a fragment's loads
//! (or an ldmatrix) touch then fall 4 banks apart, so a warp's 32 loads of 4 bytes hit 32 banks.
//! No tile is stored transposed: a B operand that runs along a tile's rows (V for P v, dout and
//! q for dv and dk, k for dq) is read with b_cols (ldmatrix .trans on the GPU); transposed
//! stores of 2 bytes were 5-way bank conflicts, 80% of the kernels' shared-store wavefronts
//! (ncu on an H200).
template <int D>
struct layout {
  static_assert(D % 16 == 0 && D >= 16 && D <= 128, "bf16 flash tiles need head_dim a multiple of 16, at most 128");
  static constexpr int ldk = D + 8;
  static constexpr std::size_t k_elems = static_cast<std::size_t>(tile) * ldk;
  static constexpr std::size_t forward_bytes = 2 * (2 * k_elems);
  // dk, dv: q and dout, and lse and delta of 64 rows; dq: k and v, within the same bytes.
  static constexpr std::size_t backward_bytes = 2 * (2 * k_elems) + 2 * tile * sizeof(float);
};

//! A lane's state across a forward block's barriers.
template <int D>
struct lane_state {
  frag_a q[D / 16];       // the warp's 16 query rows, k-steps of 16 columns
  frag_c s[tile / 8];     // scores of the current key tile, then P
  frag_c o[D / 8];        // the unnormalised output
  float m[2], l[2];       // rows g and g + 8: running maximum, this lane's part of the running sum
  float part[2];          // scratch for the quad reductions
};

namespace detail {

TRIDENT_HOST_DEVICE inline std::uint16_t lo16(std::uint32_t x) { return static_cast<std::uint16_t>(x & 0xffffu); }
TRIDENT_HOST_DEVICE inline std::uint16_t hi16(std::uint32_t x) { return static_cast<std::uint16_t>(x >> 16); }
TRIDENT_HOST_DEVICE inline std::uint32_t join(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}
// Two adjacent bf16 of shared memory as one register, the first in the low half: one 4-byte load
// on the GPU (every pair a fragment reads starts at an even element of a 16-byte aligned row).
TRIDENT_HOST_DEVICE inline std::uint32_t load_pair(const std::uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const std::uint32_t*>(p);
#else
  return join(p[0], p[1]);
#endif
}
// A float rounded to bf16 (nearest even), as bits: the same on both sides (trident::bf16).
TRIDENT_HOST_DEVICE inline std::uint16_t bf16_bits(float x) { return bf16(x).bits(); }
TRIDENT_HOST_DEVICE inline std::uint32_t pack(float lo, float hi) { return join(bf16_bits(lo), bf16_bits(hi)); }

// Exec's calls, for use inside ex.warps's lambdas (nvcc compiles them as host-device code; each
// Exec is used on its own side only).
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class G>
TRIDENT_HOST_DEVICE void lanes(Exec& ex, G&& g) {
  ex.lanes(g);
}
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class C, class A, class B>
TRIDENT_HOST_DEVICE void mma(Exec& ex, C&& c, A&& a, B&& b) {
  ex.mma(c, a, b);
}
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class F>
TRIDENT_HOST_DEVICE void quad_max(Exec& ex, F&& f) {
  ex.quad_max(f);
}
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class F>
TRIDENT_HOST_DEVICE void quad_sum(Exec& ex, F&& f) {
  ex.quad_sum(f);
}

TRIDENT_HOST_DEVICE inline float exp_(float x) { return flash::detail::exp_(x); }
TRIDENT_HOST_DEVICE inline float log_(float x) { return flash::detail::log_(x); }

// Four floats rounded to bf16 at dst (8-byte aligned): one 8-byte store on the GPU.
TRIDENT_HOST_DEVICE inline void store_bf16x4(std::uint16_t* dst, const flash::detail::quad& q) {
  const std::uint32_t lo = pack(q.v[0], q.v[1]), hi = pack(q.v[2], q.v[3]);
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
#else
  dst[0] = lo16(lo);
  dst[1] = hi16(lo);
  dst[2] = lo16(hi);
  dst[3] = hi16(hi);
#endif
}
// Two floats at dst (8-byte aligned): one 8-byte store on the GPU (a quad of lanes then fills
// whole 32-byte sectors; two 4-byte stores used half of each).
TRIDENT_HOST_DEVICE inline void store_pair(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float2*>(dst) = make_float2(x, y);
#else
  dst[0] = x;
  dst[1] = y;
#endif
}

// Rows [row0, row0 + 64) of two tensors, row i at src_a(i) and src_b(i) (zeros past seq), rounded
// to bf16 into shared memory as rows [64, ldk] (a, b). Each thread issues its loads before its
// stores.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec, class SrcA, class SrcB>
TRIDENT_HOST_DEVICE void load_tiles(Exec& ex, const problem& p, int row0, SrcA src_a, std::uint16_t* a, SrcB src_b,
                                    std::uint16_t* b) {
  using L = layout<D>;
  ex.each([&](int th) {
    constexpr int per_row = D / 4, n = tile * per_row / threads;
    static_assert(tile * per_row % threads == 0, "every thread moves the same number of quads");
    flash::detail::quad qa[n], qb[n];
    for (int it = 0; it < n; ++it) {
      const int idx = it * threads + th, i = row0 + idx / per_row, c = 4 * (idx % per_row);
      qa[it] = i < p.seq ? flash::detail::load_quad(src_a(i) + c) : flash::detail::quad{};
      qb[it] = i < p.seq ? flash::detail::load_quad(src_b(i) + c) : flash::detail::quad{};
    }
    for (int it = 0; it < n; ++it) {
      const int idx = it * threads + th, r = idx / per_row, c = 4 * (idx % per_row);
      store_bf16x4(a + r * L::ldk + c, qa[it]);
      store_bf16x4(b + r * L::ldk + c, qb[it]);
    }
  });
}

// A lane's B fragment of columns n0..n0+7 and k-step k0..k0+15 from a shared tile whose row n
// holds B's column n along k (B is the tile transposed: K's rows for q k^T, v's for dout v^T...).
TRIDENT_HOST_DEVICE inline frag_b b_from(const std::uint16_t* tile_rows, int ld, int n0, int k0, int lane) {
  const std::uint16_t* row = tile_rows + (n0 + lane / 4) * ld + k0 + 2 * (lane % 4);
  return frag_b{{load_pair(row), load_pair(row + 8)}};
}
// A lane's B fragment of columns n0..n0+7 and k-step k0..k0+15 from a shared tile whose row k
// holds B's row k (B is the tile itself: V for P v, dout and q for dv and dk, k for dq): the pairs
// along k are a column's, 2 rows apart. On the GPU one ldmatrix .x2 .trans, whose documented
// result is this (thread l: matrix rows 2(l % 4), 2(l % 4) + 1 of column l / 4; lanes 0-15
// address rows k0..k0+15 at column n0); on the host, the elements themselves.
TRIDENT_HOST_DEVICE inline frag_b b_cols(const std::uint16_t* tile_rows, int ld, int n0, int k0, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const std::uint16_t* row = tile_rows + (k0 + lane % 16) * ld + n0;
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));
  frag_b b;
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b.r[0]), "=r"(b.r[1]) : "r"(addr));
  return b;
#else
  const int g = lane / 4, t = lane % 4;
  const std::uint16_t* col = tile_rows + n0 + g;
  const int r = k0 + 2 * t;
  return frag_b{{join(col[r * ld], col[(r + 1) * ld]), join(col[(r + 8) * ld], col[(r + 9) * ld])}};
#endif
}
// A lane's A fragment of k-step k (columns 16k..16k+15) from C fragments c[2k], c[2k + 1] (the
// same rows, columns 8 apart), rounded to bf16: P or dS feeding the next product.
TRIDENT_HOST_DEVICE inline frag_a a_from(const frag_c* c, int k) {
  const frag_c& x = c[2 * k];
  const frag_c& y = c[2 * k + 1];
  return frag_a{{pack(x.v[0], x.v[1]), pack(x.v[2], x.v[3]), pack(y.v[0], y.v[1]), pack(y.v[2], y.v[3])}};
}
// A lane's A fragments of 16 rows [row0, row0 + 16) of a float tensor (row i at src(i), zeros
// past seq), over all D columns.
template <int D, class Src>
TRIDENT_HOST_DEVICE void a_rows(frag_a (&a)[D / 16], const problem& p, int row0, Src src, int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {
    const int i = row0 + g + 8 * half;
    const float* row = i < p.seq ? src(i) : nullptr;
    for (int k = 0; k < D / 16; ++k)
      for (int hi = 0; hi < 2; ++hi) {  // columns 2t (registers 0, 1) and 2t + 8 (2, 3)
        const int c = 16 * k + 2 * t + 8 * hi;
        a[k].r[2 * hi + half] = row ? pack(row[c], row[c + 1]) : 0u;
      }
  }
}
// C fragments' rows [row0, row0 + 16) times `factor` into a float tensor (row i at dst(i)),
// rows below seq only.
template <int D, class Dst>
TRIDENT_HOST_DEVICE void store_rows(const frag_c (&c)[D / 8], const problem& p, int row0, Dst dst, float factor, int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {
    const int i = row0 + g + 8 * half;
    if (i >= p.seq) continue;
    float* row = dst(i);
    for (int n = 0; n < D / 8; ++n) store_pair(row + 8 * n + 2 * t, c[n].v[2 * half] * factor, c[n].v[2 * half + 1] * factor);
  }
}

}  // namespace detail

//! Forward for query tile qt of (batch x head) bh: out's rows and lse; smem holds
//! layout<D>::forward_bytes.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void forward_block(Exec& ex, const problem& p, std::uint16_t* smem, int qt, int bh) {
  using L = layout<D>;
  constexpr int ksteps = D / 16, ntiles = tile / 8, dtiles = D / 8;
  std::uint16_t* ks = smem;
  std::uint16_t* vs = smem + L::k_elems;
  const int q0 = qt * tile;
  auto&& st = ex.template state<lane_state<D>>();  // the host's array, or the GPU thread's registers

  // Each lane's q fragments straight from global memory (rows past seq are zeros), and the
  // statistics' starting values.
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      lane_state<D>& s = st.at(w, lane);
      detail::a_rows<D>(s.q, p, q0 + 16 * w, [&](int i) { return p.qkv + p.qkv_at(i, bh, 0); }, lane);
      for (int half = 0; half < 2; ++half) {
        s.m[half] = -INFINITY;
        s.l[half] = 0.0f;
      }
      for (int n = 0; n < dtiles; ++n)
        for (int e = 0; e < 4; ++e) s.o[n].v[e] = 0.0f;
    });
  });

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * tile;
    // K's and V's rows, rounded to bf16; zeros past seq.
    detail::load_tiles<D>(
        ex, p, k0, [&](int i) { return p.qkv + p.qkv_at(i, bh, 1); }, ks, [&](int i) { return p.qkv + p.qkv_at(i, bh, 2); }, vs);
    ex.sync();
    ex.warps([&](int w) {
      // S = q k^T: B's column n is key 8j + g, its k the head dimension, so a lane's pairs are
      // adjacent in K's row.
      detail::lanes(ex, [&](int lane) {
        for (int j = 0; j < ntiles; ++j)
          for (int e = 0; e < 4; ++e) st.at(w, lane).s[j].v[e] = 0.0f;
      });
      for (int k = 0; k < ksteps; ++k)
        for (int j = 0; j < ntiles; ++j)
          detail::mma(
              ex, [&](int lane) -> frag_c& { return st.at(w, lane).s[j]; },
              [&](int lane) -> const frag_a& { return st.at(w, lane).q[k]; },
              [&](int lane) { return detail::b_from(ks, L::ldk, 8 * j, 16 * k, lane); });
      // Scale and mask; each lane's maximum of its columns of rows g and g + 8.
      detail::lanes(ex, [&](int lane) {
        lane_state<D>& s = st.at(w, lane);
        const int g = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; ++half) {
          const int i = q0 + 16 * w + g + 8 * half;
          float mx = -INFINITY;
          for (int j = 0; j < ntiles; ++j)
            for (int e = 0; e < 2; ++e) {
              const int key = k0 + 8 * j + 2 * t + e;
              float& x = s.s[j].v[2 * half + e];
              x = key <= i && key < p.seq ? x * p.scale : -INFINITY;
              mx = x > mx ? x : mx;
            }
          s.part[half] = mx;
        }
      });
      for (int half = 0; half < 2; ++half) detail::quad_max(ex, [&](int lane) -> float& { return st.at(w, lane).part[half]; });
      // The online softmax on the fragments: new maxima, P = exp(S - m), o and l rescaled.
      detail::lanes(ex, [&](int lane) {
        lane_state<D>& s = st.at(w, lane);
        for (int half = 0; half < 2; ++half) {
          const float m_new = s.m[half] > s.part[half] ? s.m[half] : s.part[half];
          // A row with nothing unmasked yet keeps P = 0, not exp(-inf + inf).
          const float alpha = m_new == -INFINITY ? 1.0f : detail::exp_(s.m[half] - m_new);
          float sum = 0.0f;
          for (int j = 0; j < ntiles; ++j)
            for (int e = 0; e < 2; ++e) {
              float& x = s.s[j].v[2 * half + e];
              x = m_new == -INFINITY ? 0.0f : detail::exp_(x - m_new);
              sum += x;
            }
          s.l[half] = s.l[half] * alpha + sum;
          s.m[half] = m_new;
          for (int n = 0; n < dtiles; ++n)
            for (int e = 0; e < 2; ++e) s.o[n].v[2 * half + e] *= alpha;
        }
      });
      // o += P v, k-step k over keys 16k..16k+15: P's A fragment is the C fragments of key
      // n-tiles 2k and 2k + 1; B is V's rows (k the key, n the dimension).
      for (int k = 0; k < tile / 16; ++k)
        for (int n = 0; n < dtiles; ++n)
          detail::mma(
              ex, [&](int lane) -> frag_c& { return st.at(w, lane).o[n]; },
              [&](int lane) { return detail::a_from(st.at(w, lane).s, k); },
              [&](int lane) { return detail::b_cols(vs, L::ldk, 8 * n, 16 * k, lane); });
    });
    ex.sync();  // the next tile's loads overwrite K and V
  }

  // Each row's sum over its 4 lanes, then out = o / l and lse = m + log l (rows below seq).
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      for (int half = 0; half < 2; ++half) st.at(w, lane).part[half] = st.at(w, lane).l[half];
    });
    for (int half = 0; half < 2; ++half) detail::quad_sum(ex, [&](int lane) -> float& { return st.at(w, lane).part[half]; });
    detail::lanes(ex, [&](int lane) {
      const lane_state<D>& s = st.at(w, lane);
      const int g = lane / 4, t = lane % 4;
      for (int half = 0; half < 2; ++half) {
        const int i = q0 + 16 * w + g + 8 * half;
        if (i >= p.seq) continue;
        const float l = s.part[half];
        float* row = p.out + p.out_at(i, bh);
        for (int n = 0; n < dtiles; ++n) detail::store_pair(row + 8 * n + 2 * t, s.o[n].v[2 * half] / l, s.o[n].v[2 * half + 1] / l);
        if (t == 0) p.lse[p.row_at(i, bh)] = s.m[half] + detail::log_(l);
      }
    });
  });
}

//! A lane's state across a backward block's barriers: the warp's 16 rows of two operands held
//! as A fragments (k and v for dk, dv; q and dout for dq), two [16, 64] products of the current
//! tile (S then P, dP then dS) and its accumulated gradients.
template <int D>
struct backward_state {
  frag_a x[D / 16], y[D / 16];
  frag_c s[tile / 8], dp[tile / 8];
  frag_c g1[D / 8], g2[D / 8];  // dk and dv, or dq
  float lse[2], delta[2];       // the rows' own, for the dq pass
};

namespace detail {

// The products the backward passes share. With x, y this warp's 16 rows (as A fragments) and
// `a`, `b` shared tiles of 64 rows (row-major, ldk: B's column n is row n): s = x a^T and dp = y b^T.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec, class St>
TRIDENT_HOST_DEVICE void two_products(Exec& ex, St& st, int w, const std::uint16_t* a, const std::uint16_t* b) {
  using L = layout<D>;
  lanes(ex, [&](int lane) {
    for (int j = 0; j < tile / 8; ++j)
      for (int e = 0; e < 4; ++e) st.at(w, lane).s[j].v[e] = st.at(w, lane).dp[j].v[e] = 0.0f;
  });
  for (int k = 0; k < D / 16; ++k)
    for (int j = 0; j < tile / 8; ++j) {
      mma(
          ex, [&](int lane) -> frag_c& { return st.at(w, lane).s[j]; },
          [&](int lane) -> const frag_a& { return st.at(w, lane).x[k]; },
          [&](int lane) { return b_from(a, L::ldk, 8 * j, 16 * k, lane); });
      mma(
          ex, [&](int lane) -> frag_c& { return st.at(w, lane).dp[j]; },
          [&](int lane) -> const frag_a& { return st.at(w, lane).y[k]; },
          [&](int lane) { return b_from(b, L::ldk, 8 * j, 16 * k, lane); });
    }
}
// acc[n] += A B over the tile's 64 rows: A's k-steps from the C fragments c (P or dS), B the
// shared tile's rows [64, ldk] (k the tile's row, n its column).
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec, class Acc, class C>
TRIDENT_HOST_DEVICE void accumulate(Exec& ex, Acc&& acc, C&& c, const std::uint16_t* rows) {
  using L = layout<D>;
  for (int k = 0; k < tile / 16; ++k)
    for (int n = 0; n < D / 8; ++n)
      mma(
          ex, [&](int lane) -> frag_c& { return acc(lane)[n]; }, [&](int lane) { return a_from(c(lane), k); },
          [&](int lane) { return b_cols(rows, L::ldk, 8 * n, 16 * k, lane); });
}

}  // namespace detail

//! dk and dv of key tile kt of (batch x head) bh, over the query tiles at or below the diagonal
//! (warp w owns keys 16w..16w+15 of the tile: S^T = k q^T, dP^T = v dout^T, then dv += P^T dout,
//! dk += dS^T q); delta holds rowsum(dout * out) (flash::delta_rows); smem holds
//! layout<D>::backward_bytes.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void backward_kv_block(Exec& ex, const problem& p, std::uint16_t* smem, int kt, int bh) {
  using L = layout<D>;
  constexpr int ntiles = tile / 8, dtiles = D / 8;
  std::uint16_t* q = smem;
  std::uint16_t* g = q + L::k_elems;  // dout
  float* lse = reinterpret_cast<float*>(g + L::k_elems);
  float* delta = lse + tile;
  const int k0 = kt * tile;
  auto&& st = ex.template state<backward_state<D>>();
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      backward_state<D>& s = st.at(w, lane);
      detail::a_rows<D>(s.x, p, k0 + 16 * w, [&](int i) { return p.qkv + p.qkv_at(i, bh, 1); }, lane);
      detail::a_rows<D>(s.y, p, k0 + 16 * w, [&](int i) { return p.qkv + p.qkv_at(i, bh, 2); }, lane);
      for (int n = 0; n < dtiles; ++n)
        for (int e = 0; e < 4; ++e) s.g1[n].v[e] = s.g2[n].v[e] = 0.0f;
    });
  });
  for (int qt = kt; qt * tile < p.seq; ++qt) {
    const int q0 = qt * tile;
    detail::load_tiles<D>(
        ex, p, q0, [&](int i) { return p.qkv + p.qkv_at(i, bh, 0); }, q, [&](int i) { return p.dout + p.out_at(i, bh); }, g);
    ex.each([&](int th) {
      if (th < tile) {
        const int i = q0 + th;
        lse[th] = i < p.seq ? p.saved_lse[p.row_at(i, bh)] : 0.0f;
        delta[th] = i < p.seq ? p.delta[p.row_at(i, bh)] : 0.0f;
      }
    });
    ex.sync();
    ex.warps([&](int w) {
      detail::two_products<D>(ex, st, w, q, g);  // S^T = k q^T, dP^T = v dout^T
      // P^T = exp(S^T scale - lse[query]) where key <= query < seq, else 0; dS^T = P^T (dP^T -
      // delta[query]) scale.
      detail::lanes(ex, [&](int lane) {
        backward_state<D>& s = st.at(w, lane);
        const int gr = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; ++half) {
          const int key = k0 + 16 * w + gr + 8 * half;
          for (int j = 0; j < ntiles; ++j)
            for (int e = 0; e < 2; ++e) {
              const int c = 8 * j + 2 * t + e, query = q0 + c;
              float& x = s.s[j].v[2 * half + e];
              float& d = s.dp[j].v[2 * half + e];
              const float pr = key <= query && query < p.seq ? detail::exp_(x * p.scale - lse[c]) : 0.0f;
              x = pr;
              d = pr * (d - delta[c]) * p.scale;
            }
        }
      });
      detail::accumulate<D>(
          ex, [&](int lane) -> frag_c* { return st.at(w, lane).g2; }, [&](int lane) -> const frag_c* { return st.at(w, lane).s; },
          g);  // dv += P^T dout
      detail::accumulate<D>(
          ex, [&](int lane) -> frag_c* { return st.at(w, lane).g1; }, [&](int lane) -> const frag_c* { return st.at(w, lane).dp; },
          q);  // dk += dS^T q
    });
    ex.sync();  // the next query tile's loads overwrite these
  }
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      const backward_state<D>& s = st.at(w, lane);
      detail::store_rows<D>(s.g1, p, k0 + 16 * w, [&](int i) { return p.dqkv + p.qkv_at(i, bh, 1); }, 1.0f, lane);
      detail::store_rows<D>(s.g2, p, k0 + 16 * w, [&](int i) { return p.dqkv + p.qkv_at(i, bh, 2); }, 1.0f, lane);
    });
  });
}

//! dq of query tile qt of (batch x head) bh over the key tiles up to the diagonal (warp w owns
//! queries 16w..16w+15: S = q k^T, dP = dout v^T, then dq += dS k); smem holds
//! layout<D>::backward_bytes.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void backward_q_block(Exec& ex, const problem& p, std::uint16_t* smem, int qt, int bh) {
  using L = layout<D>;
  constexpr int ntiles = tile / 8, dtiles = D / 8;
  std::uint16_t* k = smem;
  std::uint16_t* v = k + L::k_elems;
  const int q0 = qt * tile;
  auto&& st = ex.template state<backward_state<D>>();
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      backward_state<D>& s = st.at(w, lane);
      detail::a_rows<D>(s.x, p, q0 + 16 * w, [&](int i) { return p.qkv + p.qkv_at(i, bh, 0); }, lane);
      detail::a_rows<D>(s.y, p, q0 + 16 * w, [&](int i) { return p.dout + p.out_at(i, bh); }, lane);
      for (int half = 0; half < 2; ++half) {
        const int i = q0 + 16 * w + lane / 4 + 8 * half;
        s.lse[half] = i < p.seq ? p.saved_lse[p.row_at(i, bh)] : 0.0f;
        s.delta[half] = i < p.seq ? p.delta[p.row_at(i, bh)] : 0.0f;
      }
      for (int n = 0; n < dtiles; ++n)
        for (int e = 0; e < 4; ++e) s.g1[n].v[e] = 0.0f;
    });
  });
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * tile;
    detail::load_tiles<D>(
        ex, p, k0, [&](int i) { return p.qkv + p.qkv_at(i, bh, 1); }, k, [&](int i) { return p.qkv + p.qkv_at(i, bh, 2); }, v);
    ex.sync();
    ex.warps([&](int w) {
      detail::two_products<D>(ex, st, w, k, v);  // S = q k^T, dP = dout v^T
      detail::lanes(ex, [&](int lane) {
        backward_state<D>& s = st.at(w, lane);
        const int gr = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; ++half) {
          const int query = q0 + 16 * w + gr + 8 * half;
          for (int j = 0; j < ntiles; ++j)
            for (int e = 0; e < 2; ++e) {
              const int key = k0 + 8 * j + 2 * t + e;
              float& x = s.s[j].v[2 * half + e];
              float& d = s.dp[j].v[2 * half + e];
              const float pr = key <= query && query < p.seq ? detail::exp_(x * p.scale - s.lse[half]) : 0.0f;
              d = pr * (d - s.delta[half]) * p.scale;
            }
        }
      });
      detail::accumulate<D>(
          ex, [&](int lane) -> frag_c* { return st.at(w, lane).g1; }, [&](int lane) -> const frag_c* { return st.at(w, lane).dp; },
          k);  // dq += dS k
    });
    ex.sync();
  }
  ex.warps([&](int w) {
    detail::lanes(ex, [&](int lane) {
      detail::store_rows<D>(st.at(w, lane).g1, p, q0 + 16 * w, [&](int i) { return p.dqkv + p.qkv_at(i, bh, 0); }, 1.0f, lane);
    });
  });
}

//! A block's execution on the host: threads and lanes one after another, and the warp-collective
//! operations on the fragments' documented layouts (PTX ISA, mma.m16n8k16 with .bf16).
struct host_exec {
  //! Per-lane storage of the block's 128 lanes (on the GPU: the thread's registers).
  template <class T>
  struct lanes_of {
    T values[threads];
    // Host-device only so that forward_block's lambdas (host-device under nvcc) may call it.
    TRIDENT_HOST_DEVICE T& at(int w, int lane) { return values[32 * w + lane]; }
  };
  template <class T>
  lanes_of<T>& state() {
    // One block at a time per thread on the host, so one state per T, reused between blocks; on
    // the heap (40-80 KiB), not in every thread's static TLS block.
    static thread_local std::vector<lanes_of<T>> store(1);
    return store[0];
  }

  template <class F>
  void each(F&& f) const {
    for (int t = 0; t < threads; ++t) f(t);
  }
  template <class F>
  void warps(F&& f) const {
    for (int w = 0; w < flash::warps; ++w) f(w);
  }
  template <class G>
  void lanes(G&& g) const {
    for (int lane = 0; lane < 32; ++lane) g(lane);
  }
  void sync() const noexcept {}

  static float unpack(std::uint16_t bits) { return static_cast<float>(bf16::from_bits(bits)); }

  //! D = A B + C over one warp: c(lane), a(lane), b(lane) give each lane's fragments. Products
  //! of bf16 values are exact in float; each element's sum runs over k in order.
  template <class C, class A, class B>
  void mma(C&& c, A&& a, B&& b) const {
    float am[16][16], bm[16][8], cm[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      const frag_a fa = a(lane);
      const frag_b fb = b(lane);
      const frag_c& fc = c(lane);
      for (int hi = 0; hi < 2; ++hi)      // columns 2t (registers 0, 1) or 2t + 8 (2, 3)
        for (int half = 0; half < 2; ++half) {  // rows g (registers 0, 2) or g + 8 (1, 3)
          const std::uint32_t r = fa.r[2 * hi + half];
          am[g + 8 * half][2 * t + 8 * hi] = unpack(detail::lo16(r));
          am[g + 8 * half][2 * t + 8 * hi + 1] = unpack(detail::hi16(r));
        }
      for (int hi = 0; hi < 2; ++hi) {
        bm[2 * t + 8 * hi][g] = unpack(detail::lo16(fb.r[hi]));
        bm[2 * t + 8 * hi + 1][g] = unpack(detail::hi16(fb.r[hi]));
      }
      for (int e = 0; e < 4; ++e) cm[g + 8 * (e / 2)][2 * t + e % 2] = fc.v[e];
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      frag_c& fc = c(lane);
      for (int e = 0; e < 4; ++e) {
        const int i = g + 8 * (e / 2), j = 2 * t + e % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) sum += am[i][k] * bm[k][j];
        fc.v[e] = cm[i][j] + sum;
      }
    }
  }
  //! f(lane) = the maximum (sum) over the 4 lanes of its quad, combined as shfl_xor 1 then 2 does.
  template <class F>
  void quad_max(F&& f) const {
    quad(f, [](float x, float y) { return y > x ? y : x; });
  }
  template <class F>
  void quad_sum(F&& f) const {
    quad(f, [](float x, float y) { return x + y; });
  }

 private:
  template <class F, class Op>
  static void quad(F& f, Op op) {
    for (int q = 0; q < 32; q += 4) {
      float v[4], u[4];
      for (int i = 0; i < 4; ++i) v[i] = f(q + i);
      for (int i = 0; i < 4; ++i) u[i] = op(v[i], v[i ^ 1]);
      for (int i = 0; i < 4; ++i) f(q + i) = op(u[i], u[i ^ 2]);
    }
  }
};

namespace detail {
template <int D>
void emulate_forward(const problem& p) {
  std::vector<std::uint16_t> smem(layout<D>::forward_bytes / 2);
  host_exec ex;
  for (int bh = 0; bh < p.batch * p.heads; ++bh)
    for (int qt = 0; qt * tile < p.seq; ++qt) forward_block<D>(ex, p, smem.data(), qt, bh);
}
template <int D>
void emulate_backward(const problem& p) {
  std::vector<std::uint16_t> smem(layout<D>::backward_bytes / 2);
  host_exec ex;
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.heads * p.seq;
  for (std::size_t r = 0; r < rows; r += threads) flash::delta_rows<D>(ex, p, r);
  for (int bh = 0; bh < p.batch * p.heads; ++bh)
    for (int t = 0; t * tile < p.seq; ++t) {
      backward_kv_block<D>(ex, p, smem.data(), t, bh);
      backward_q_block<D>(ex, p, smem.data(), t, bh);
    }
}
}  // namespace detail

//! The whole grid on the host, block after block: out and lse [batch, heads, seq] from qkv, with
//! the GPU's bf16 roundings. For tests of the tiles and of the GPU's results.
inline void emulate_forward(const causal_attention& shape, std::span<const float> qkv, std::span<float> out,
                            std::span<float> lse) {
  const problem p = flash::forward_problem("flash_bf16::emulate_forward", shape, qkv, out, lse);
  shape.head_dim == 32 ? detail::emulate_forward<32>(p) : detail::emulate_forward<64>(p);
}

//! dqkv (overwritten) from forward's qkv, out and lse and from dout; delta is scratch of lse's
//! size. The GPU's bf16 roundings: q, k, v, dout, P and dS before their products.
inline void emulate_backward(const causal_attention& shape, std::span<const float> qkv, std::span<const float> out,
                             std::span<const float> lse, std::span<const float> dout, std::span<float> delta,
                             std::span<float> dqkv) {
  const problem p = flash::backward_problem("flash_bf16::emulate_backward", shape, qkv, out, lse, dout, delta, dqkv);
  shape.head_dim == 32 ? detail::emulate_backward<32>(p) : detail::emulate_backward<64>(p);
}

}  // namespace trident::nn::flash_bf16
