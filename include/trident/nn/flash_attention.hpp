// trident/nn/flash_attention.hpp — causal attention in tiles that never store the [seq, seq]
// probabilities (FlashAttention-2's algorithm), written once for the GPU's thread blocks and for
// a host emulation of them.
//
// Synopsis (namespace trident::nn::flash)
//   tile, threads, warps                 64 x 64 tiles, 4 warps of 32 threads per block
//   struct problem { qkv, out, lse, dout, delta, dqkv, seq, batch, heads, head_dim, scale }
//   template <int D> struct layout       a block's shared memory, in floats
//   struct host_exec                     runs a block's threads one after another on the host
//   template <int D, class Exec> void forward_block(ex, p, smem, qt, bh)
//   template <int D, class Exec> void delta_rows(ex, p, first_row)   delta = rowsum(dout * out)
//   template <int D, class Exec> void backward_kv_block(ex, p, smem, kt, bh)   dk, dv of key tile kt
//   template <int D, class Exec> void backward_q_block(ex, p, smem, qt, bh)    dq of query tile qt
//   forward_problem(who, shape, qkv, out, lse), backward_problem(...)   sizes checked, pointers set
//   void emulate_forward(...) / emulate_backward(...)   every block of the grid on the host, for tests
//
// nn::causal_attention's contract and layouts (nn/attention.hpp: qkv [seq, batch, heads, 3,
// head_dim], out and dout [seq, batch, heads, head_dim], dqkv overwritten), except that forward
// saves lse [batch, heads, seq] (each row's log-sum-exp of the scaled scores) instead of the
// probabilities: 4 bytes per row instead of 4 * seq. Backward recomputes the probabilities from
// q, k and lse, tile by tile.
//
// The algorithm. Forward, per (64-query tile, batch x head): for each key tile up to the
// diagonal, S = q k^T * scale (masked above the diagonal and past seq), the running row maximum
// m and sum l (online softmax: o and l rescaled by exp(m_old - m_new)), o += P v; at the end
// o / l and lse = m + log l. Backward, two passes without atomics, so deterministic: per key
// tile, dv += P^T dout and dk += dS^T q over the query tiles at or below it; per query tile,
// dq += dS k over the key tiles up to it; with P = exp(S - lse) and dS = P * (dP - delta) *
// scale, dP = dout v^T, delta = rowsum(dout * out) (which equals rowsum(P * dP)).
//
// How a block is written. A kernel is a sequence of phases separated by barriers; a phase is
// `ex.each(f)` (f(t) for every thread t of the block) or `ex.warps(f)` (f(w) for every warp w,
// whose 32 threads together run ex.mma on 16 x 16 tiles), and `ex.sync()` is the barrier.
// Inside a warp's f, `ex.lanes(g)` runs g(lane) on its 32 lanes and `ex.sync_warp()` is the
// warp's barrier; such a warp phase touches only rows the warp owns (16w to 16w + 15 of a tile)
// and reads what others wrote before the last block barrier, so warps never wait for each other
// there (forward: 2 block barriers per key tile, not 7). Nothing a thread computes lives past
// a barrier except in shared memory and in the Exec's panels (a warp's accumulators: registers
// on the GPU, an array per warp on the host), so the host can run a block as plain loops
// (host_exec: warp after warp, lane after lane) and the GPU as threads (nn/cuda/flash_attention.cuh's
// device_exec: wmma TF32 tiles, __syncthreads, __syncwarp): the tiling, masking, online softmax and
// gradients are tested on any machine (nn.host, against nn::causal_attention), and only the
// device's tile products and barriers need a GPU.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/attention.hpp"

namespace trident::nn::flash {

inline constexpr int tile = 64;  // query rows and key columns per tile
inline constexpr int warps = 4;  // each owns 16 of a tile's 64 rows
inline constexpr int threads = warps * 32;
// Floats after each shared row. Rows 4 banks apart (68 or 36 floats) instead of 8 halve the bank
// conflicts of the softmax phases (two threads per row); wmma's needs still hold: every tile
// starts 16 rows (a multiple of 32 bytes) and 8 columns apart, and ldm is a multiple of 4.
inline constexpr int pad = 4;

//! The tensors of one attention call and its shape. Pointers a kernel does not use may be null.
struct problem {
  const float* qkv = nullptr;
  float* out = nullptr;  // forward writes out and lse [batch * heads, seq]
  float* lse = nullptr;
  const float* saved_out = nullptr;  // backward reads them
  const float* saved_lse = nullptr;
  const float* dout = nullptr;
  float* delta = nullptr;  // [batch * heads, seq], backward's rowsum(dout * out)
  float* dqkv = nullptr;
  int seq = 0, batch = 0, heads = 0, head_dim = 0;
  float scale = 0;

  // Offsets of position i of (batch x head) bh: its q (which 0), k (1) or v (2) in qkv; its row in out.
  TRIDENT_HOST_DEVICE std::size_t qkv_at(int i, int bh, int which) const {
    return ((static_cast<std::size_t>(i) * batch * heads + bh) * 3 + which) * head_dim;
  }
  TRIDENT_HOST_DEVICE std::size_t out_at(int i, int bh) const {
    return (static_cast<std::size_t>(i) * batch * heads + bh) * head_dim;
  }
  TRIDENT_HOST_DEVICE std::size_t row_at(int i, int bh) const { return static_cast<std::size_t>(bh) * seq + i; }
};

//! A block's shared memory for head_dim D: [64, D] matrices (q, k, v, o, dout, dq, dk, dv) with
//! rows D + pad apart, [64, 64] ones (S, dP) with rows 68 apart, and per-row values.
template <int D>
struct layout {
  static_assert(D % 16 == 0 && D >= 16, "flash attention tiles need head_dim a multiple of 16");
  static constexpr int ld = D + pad;
  static constexpr int lds = tile + pad;  // 68
  static constexpr std::size_t mat = static_cast<std::size_t>(tile) * ld;
  static constexpr std::size_t square = static_cast<std::size_t>(tile) * lds;
  static constexpr std::size_t rows = tile;
  // forward: q, k, v, o; S; m, l, alpha; two per-thread partials
  static constexpr std::size_t forward_floats = 4 * mat + square + 3 * rows + 2 * threads;
  // backward: two matrices held, two streamed, S and dP, lse and delta of the streamed rows
  // (the gradients it accumulates are in registers)
  static constexpr std::size_t backward_floats = 4 * mat + 2 * square + 2 * rows;
};

namespace detail {

TRIDENT_HOST_DEVICE inline float exp_(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
TRIDENT_HOST_DEVICE inline float log_(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// Exec's warp-level calls, for use inside ex.warps's lambdas (which nvcc compiles for host and
// device: the check that a host-device function calls only host-device ones is off here, as for
// the kernels' functions, since each Exec is used on its side only).
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class G>
TRIDENT_HOST_DEVICE void lanes(Exec& ex, G&& g) {
  ex.lanes(g);
}
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec>
TRIDENT_HOST_DEVICE void sync_warp(Exec& ex) {
  ex.sync_warp();
}
TRIDENT_EXEC_CHECK_DISABLE
template <bool ARow, bool BRow, class Exec, class Panel>
TRIDENT_HOST_DEVICE void mma_panel(Exec& ex, Panel& acc, int w, const float* a, int lda, const float* b, int ldb, int k) {
  ex.template mma_panel<ARow, BRow>(acc, w, a, lda, b, ldb, k);
}
TRIDENT_EXEC_CHECK_DISABLE
template <class Exec, class Panel>
TRIDENT_HOST_DEVICE void store_panel(Exec& ex, const Panel& acc, int w, float* c, int ldc) {
  ex.store_panel(acc, w, c, ldc);
}

// Four floats, moved as one 16-byte access on the GPU (every row the tiles read or write starts
// 16-byte aligned: head_dim is a multiple of 16 and forward_problem checks the pointers).
struct quad {
  float v[4];
};
TRIDENT_HOST_DEVICE inline quad load_quad(const float* src) {
#if defined(__CUDA_ARCH__)
  const float4 f = *reinterpret_cast<const float4*>(src);
  return {{f.x, f.y, f.z, f.w}};
#else
  return {{src[0], src[1], src[2], src[3]}};
#endif
}
TRIDENT_HOST_DEVICE inline void store_quad(float* dst, const quad& q) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(dst) = make_float4(q.v[0], q.v[1], q.v[2], q.v[3]);
#else
  for (int e = 0; e < 4; ++e) dst[e] = q.v[e];
#endif
}

// Rows [row0, row0 + 64) of a tensor whose row i starts at src + at(i) into a [64, D] shared
// matrix; zeros past seq. Each thread issues all its loads (D / 8 quads) before its first store,
// so they are in flight together: one load at a time left the tiles waiting on memory.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec, class At>
TRIDENT_HOST_DEVICE void load_tile(Exec& ex, const problem& p, const float* src, At at, float* dst, int row0) {
  constexpr int per_row = D / 4, n = tile * per_row / threads;
  static_assert(tile * per_row % threads == 0, "every thread moves the same number of quads");
  ex.each([&](int t) {
    quad v[n];
    for (int it = 0; it < n; ++it) {
      const int idx = it * threads + t, i = row0 + idx / per_row;
      v[it] = i < p.seq ? load_quad(src + at(i) + 4 * (idx % per_row)) : quad{};
    }
    for (int it = 0; it < n; ++it) {
      const int idx = it * threads + t;
      store_quad(dst + (idx / per_row) * layout<D>::ld + 4 * (idx % per_row), v[it]);
    }
  });
}
// Rows [row0, row0 + 64) of q, k or v (which) of bh.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void load_qkv(Exec& ex, const problem& p, float* dst, int row0, int bh, int which) {
  load_tile<D>(ex, p, p.qkv, [&](int i) { return p.qkv_at(i, bh, which); }, dst, row0);
}
// The same for rows of a [seq, batch, heads, D] tensor (out, dout).
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void load_rows(Exec& ex, const problem& p, const float* src, float* dst, int row0, int bh) {
  load_tile<D>(ex, p, src, [&](int i) { return p.out_at(i, bh); }, dst, row0);
}
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void zero(Exec& ex, float* dst) {
  ex.each([&](int t) {
    for (int idx = t; idx < tile * layout<D>::ld; idx += threads) dst[idx] = 0.0f;
  });
}
// Rows of a [64, D] shared matrix into q, k or v (which) of dqkv, rows below seq only.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void store_qkv(Exec& ex, const problem& p, const float* src, int row0, int bh, int which) {
  constexpr int per_row = D / 4;
  ex.each([&](int t) {
    for (int idx = t; idx < tile * per_row; idx += threads) {
      const int r = idx / per_row, c = 4 * (idx % per_row), i = row0 + r;
      if (i < p.seq) store_quad(p.dqkv + p.qkv_at(i, bh, which) + c, load_quad(src + r * layout<D>::ld + c));
    }
  });
}

// The tile products a warp runs: a [16, 16N] panel of C (row-major, ldc) over k, A's fragments
// loaded once per panel (not once per 16 x 16 tile: shared memory's bandwidth is what the
// tensor cores wait for):
//   scores:   C[16w.., 0:64]  = A[16w.., 0:D] B[0:64, 0:D]^T       (q k^T, dout v^T)
//   rows:     C[16w.., 0:D]  += A[16w.., 0:64] B[0:64, 0:D]        (P v, dS k)
//   columns:  C[16w.., 0:D]  += A[0:64, 16w..]^T B[0:64, 0:D]      (P^T dout, dS^T q)
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void scores(Exec& ex, int w, const float* a, const float* b, float* c) {
  constexpr int ld = layout<D>::ld, lds = layout<D>::lds;
  ex.template mma<true, false, tile / 16>(c + 16 * w * lds, lds, a + 16 * w * ld, ld, b, ld, D, false);
}
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void rows_times(Exec& ex, int w, const float* a, const float* b, float* c) {
  constexpr int ld = layout<D>::ld, lds = layout<D>::lds;
  ex.template mma<true, true, D / 16>(c + 16 * w * ld, ld, a + 16 * w * lds, lds, b, ld, tile, true);
}
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void columns_times(Exec& ex, int w, const float* a, const float* b, float* c) {
  constexpr int ld = layout<D>::ld, lds = layout<D>::lds;
  ex.template mma<false, true, D / 16>(c + 16 * w * ld, ld, a + 16 * w, lds, b, ld, tile, true);
}

}  // namespace detail

//! Forward for query tile qt of (batch x head) bh: out's rows and lse; smem holds
//! layout<D>::forward_floats.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void forward_block(Exec& ex, const problem& p, float* smem, int qt, int bh) {
  using L = layout<D>;
  float* q = smem;
  float* k = q + L::mat;
  float* v = k + L::mat;
  float* o = v + L::mat;
  float* s = o + L::mat;
  float* m = s + L::square;
  float* l = m + L::rows;
  float* alpha = l + L::rows;
  float* part_max = alpha + L::rows;
  float* part_sum = part_max + threads;
  const int q0 = qt * tile;
  detail::load_qkv<D>(ex, p, q, q0, bh, 0);
  detail::zero<D>(ex, o);
  ex.each([&](int t) {
    if (t < tile) {
      m[t] = -INFINITY;
      l[t] = 0.0f;
    }
  });
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * tile;
    detail::load_qkv<D>(ex, p, k, k0, bh, 1);
    detail::load_qkv<D>(ex, p, v, k0, bh, 2);
    ex.sync();
    // Warp w owns rows [16w, 16w + 16) of S, m, l, alpha and o: from the scores to o += P v it
    // needs no other warp's results, so its phases are separated by warp barriers only.
    ex.warps([&](int w) {
      detail::scores<D>(ex, w, q, k, s);
      detail::sync_warp(ex);
      // Two lanes per row, 32 columns each (thread t = 32w + lane has row t / 2): scale, mask,
      // and each half's maximum.
      detail::lanes(ex, [&](int lane) {
        const int t = 32 * w + lane, r = t / 2, c0 = (t % 2) * (tile / 2);
        float mx = -INFINITY;
        for (int c = c0; c < c0 + tile / 2; ++c) {
          const bool keep = k0 + c <= q0 + r && k0 + c < p.seq;
          const float x = keep ? s[r * L::lds + c] * p.scale : -INFINITY;
          s[r * L::lds + c] = x;
          mx = x > mx ? x : mx;
        }
        part_max[t] = mx;
      });
      detail::sync_warp(ex);
      detail::lanes(ex, [&](int lane) {
        const int t = 32 * w + lane, r = t / 2, c0 = (t % 2) * (tile / 2);
        const float mx = part_max[2 * r] > part_max[2 * r + 1] ? part_max[2 * r] : part_max[2 * r + 1];
        const float m_new = m[r] > mx ? m[r] : mx;
        float sum = 0.0f;
        for (int c = c0; c < c0 + tile / 2; ++c) {
          // A row with nothing unmasked yet (only rows past seq) keeps P = 0, not exp(-inf + inf).
          const float e = m_new == -INFINITY ? 0.0f : detail::exp_(s[r * L::lds + c] - m_new);
          s[r * L::lds + c] = e;
          sum += e;
        }
        part_sum[t] = sum;
      });
      detail::sync_warp(ex);
      detail::lanes(ex, [&](int lane) {
        if (lane < 16) {
          const int r = 16 * w + lane;
          const float mx = part_max[2 * r] > part_max[2 * r + 1] ? part_max[2 * r] : part_max[2 * r + 1];
          const float m_new = m[r] > mx ? m[r] : mx;
          const float a = m_new == -INFINITY ? 1.0f : detail::exp_(m[r] - m_new);
          alpha[r] = a;
          l[r] = l[r] * a + (part_sum[2 * r] + part_sum[2 * r + 1]);
          m[r] = m_new;
        }
      });
      detail::sync_warp(ex);
      detail::lanes(ex, [&](int lane) {
        for (int idx = lane; idx < 16 * D; idx += 32) {
          const int r = 16 * w + idx / D, d = idx % D;
          o[r * L::ld + d] *= alpha[r];
        }
      });
      detail::sync_warp(ex);
      detail::rows_times<D>(ex, w, s, v, o);
    });
    ex.sync();  // every warp is done with this k and v before the next tile's overwrite them
  }
  ex.each([&](int t) {
    for (int idx = t; idx < tile * D; idx += threads) {
      const int r = idx / D, d = idx % D, i = q0 + r;
      if (i < p.seq) p.out[p.out_at(i, bh) + d] = o[r * L::ld + d] / l[r];
    }
    if (t < tile && q0 + t < p.seq) p.lse[p.row_at(q0 + t, bh)] = m[t] + detail::log_(l[t]);
  });
}

//! delta[bh, i] = sum_d dout[i, bh, d] out[i, bh, d] for the `threads` rows (i, bh) from
//! first_row on (row index bh * seq + i), one thread each.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void delta_rows(Exec& ex, const problem& p, std::size_t first_row) {
  ex.each([&](int t) {
    const std::size_t row = first_row + static_cast<std::size_t>(t);
    if (row >= static_cast<std::size_t>(p.batch) * p.heads * p.seq) return;
    const int bh = static_cast<int>(row / p.seq), i = static_cast<int>(row % p.seq);
    const float* g = p.dout + p.out_at(i, bh);
    const float* y = p.saved_out + p.out_at(i, bh);
    float sum = 0.0f;
    for (int d = 0; d < D; ++d) sum += g[d] * y[d];
    p.delta[row] = sum;
  });
}

namespace detail {

// Rows [16w, 16w + 16) of S (holding q k^T) become P = exp(S scale - lse) and those of dP
// (holding dout v^T) dS = P (dP - delta) scale, both zero where masked: above the diagonal, past
// seq. Warp w's lanes, inside ex.warps.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void probabilities_and_ds(Exec& ex, int w, const problem& p, float* s, float* dp, const float* lse,
                                              const float* delta, int q0, int k0) {
  constexpr int lds = layout<D>::lds;
  detail::lanes(ex, [&](int lane) {
    for (int idx = lane; idx < 16 * tile; idx += 32) {
      const int r = 16 * w + idx / tile, c = idx % tile;
      const bool keep = k0 + c <= q0 + r && k0 + c < p.seq && q0 + r < p.seq;
      const float pr = keep ? exp_(s[r * lds + c] * p.scale - lse[r]) : 0.0f;
      s[r * lds + c] = pr;
      dp[r * lds + c] = pr * (dp[r * lds + c] - delta[r]) * p.scale;
    }
  });
}

TRIDENT_EXEC_CHECK_DISABLE
template <class Exec>
TRIDENT_HOST_DEVICE void load_row_values(Exec& ex, const problem& p, float* lse, float* delta, int row0, int bh) {
  ex.each([&](int t) {
    if (t < tile) {
      const int i = row0 + t;
      lse[t] = i < p.seq ? p.saved_lse[p.row_at(i, bh)] : 0.0f;
      delta[t] = i < p.seq ? p.delta[p.row_at(i, bh)] : 0.0f;
    }
  });
}

}  // namespace detail

//! Backward for key tile kt of bh: its rows of dk and dv in dqkv; smem holds
//! layout<D>::backward_floats; lse from forward and delta from delta_rows. dk and dv accumulate
//! in registers (Exec's panels), not in shared memory: two blocks fit an SM.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void backward_kv_block(Exec& ex, const problem& p, float* smem, int kt, int bh) {
  using L = layout<D>;
  float* k = smem;
  float* v = k + L::mat;
  float* q = v + L::mat;
  float* g = q + L::mat;  // dout's rows
  float* s = g + L::mat;
  float* dp = s + L::square;
  float* lse = dp + L::square;
  float* delta = lse + L::rows;
  const int k0 = kt * tile;
  detail::load_qkv<D>(ex, p, k, k0, bh, 1);
  detail::load_qkv<D>(ex, p, v, k0, bh, 2);
  auto dk = ex.template make_panel<D / 16>();  // warp w: rows [16w, 16w + 16) of dk and dv
  auto dv = ex.template make_panel<D / 16>();
  for (int q0 = k0; q0 < p.seq; q0 += tile) {
    detail::load_qkv<D>(ex, p, q, q0, bh, 0);
    detail::load_rows<D>(ex, p, p.dout, g, q0, bh);
    detail::load_row_values(ex, p, lse, delta, q0, bh);
    ex.sync();
    // Warp w's rows of S and dP need only its own products; dv and dk need every warp's rows.
    ex.warps([&](int w) {
      detail::scores<D>(ex, w, q, k, s);
      detail::scores<D>(ex, w, g, v, dp);
      detail::sync_warp(ex);
      detail::probabilities_and_ds<D>(ex, w, p, s, dp, lse, delta, q0, k0);
    });
    ex.sync();
    ex.warps([&](int w) {
      detail::mma_panel<false, true>(ex, dv, w, s + 16 * w, L::lds, g, L::ld, tile);   // dv += P^T dout
      detail::mma_panel<false, true>(ex, dk, w, dp + 16 * w, L::lds, q, L::ld, tile);  // dk += dS^T q
    });
    ex.sync();
  }
  // Through shared memory (q's and dout's, free now) to coalesced rows of dqkv.
  ex.warps([&](int w) {
    detail::store_panel(ex, dk, w, q + 16 * w * L::ld, L::ld);
    detail::store_panel(ex, dv, w, g + 16 * w * L::ld, L::ld);
  });
  ex.sync();
  detail::store_qkv<D>(ex, p, q, k0, bh, 1);
  detail::store_qkv<D>(ex, p, g, k0, bh, 2);
}

//! Backward for query tile qt of bh: its rows of dq in dqkv; smem as backward_kv_block's, dq in
//! registers.
TRIDENT_EXEC_CHECK_DISABLE
template <int D, class Exec>
TRIDENT_HOST_DEVICE void backward_q_block(Exec& ex, const problem& p, float* smem, int qt, int bh) {
  using L = layout<D>;
  float* q = smem;
  float* g = q + L::mat;
  float* k = g + L::mat;
  float* v = k + L::mat;
  float* s = v + L::mat;
  float* dp = s + L::square;
  float* lse = dp + L::square;
  float* delta = lse + L::rows;
  const int q0 = qt * tile;
  detail::load_qkv<D>(ex, p, q, q0, bh, 0);
  detail::load_rows<D>(ex, p, p.dout, g, q0, bh);
  detail::load_row_values(ex, p, lse, delta, q0, bh);
  auto dq = ex.template make_panel<D / 16>();
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * tile;
    detail::load_qkv<D>(ex, p, k, k0, bh, 1);
    detail::load_qkv<D>(ex, p, v, k0, bh, 2);
    ex.sync();
    // Warp w owns rows [16w, 16w + 16) of S, dP and dq: warp barriers between its phases.
    ex.warps([&](int w) {
      detail::scores<D>(ex, w, q, k, s);
      detail::scores<D>(ex, w, g, v, dp);
      detail::sync_warp(ex);
      detail::probabilities_and_ds<D>(ex, w, p, s, dp, lse, delta, q0, k0);
      detail::sync_warp(ex);
      detail::mma_panel<true, true>(ex, dq, w, dp + 16 * w * L::lds, L::lds, k, L::ld, tile);  // dq += dS k
    });
    ex.sync();  // before the next tile's k and v overwrite these
  }
  ex.warps([&](int w) { detail::store_panel(ex, dq, w, k + 16 * w * L::ld, L::ld); });
  ex.sync();
  detail::store_qkv<D>(ex, p, k, q0, bh, 0);
}

//! A block's threads run one after another: each(f) is a loop over the 128 threads, warps(f)
//! over the 4 warps, lanes(f) over a warp's 32 lanes, and mma the panel product in float (the GPU's rounds operands to TF32).
struct host_exec {
  bool tf32 = false;  // round mma's operands to TF32 first, as the GPU's tensor cores take them

  template <class F>
  void each(F&& f) const {
    for (int t = 0; t < threads; ++t) f(t);
  }
  template <class F>
  void warps(F&& f) const {
    for (int w = 0; w < flash::warps; ++w) f(w);
  }
  //! Inside warps(f): g(lane) for the warp's 32 lanes.
  template <class G>
  void lanes(G&& g) const {
    for (int lane = 0; lane < 32; ++lane) g(lane);
  }
  void sync() const noexcept {}
  void sync_warp() const noexcept {}
  //! A [16, 16N] accumulator per warp, zeros, that lives across barriers (the GPU's: wmma
  //! fragments in registers); mma_panel adds to warp w's, store_panel writes it to C.
  template <int N>
  struct panel {
    float values[flash::warps * 16 * 16 * N] = {};  // no std::vector: nvcc compiles it as host-device code
  };
  template <int N>
  panel<N> make_panel() const {
    return {};
  }
  template <bool ARow, bool BRow, int N>
  void mma_panel(panel<N>& acc, int w, const float* a, int lda, const float* b, int ldb, int k) const {
    mma<ARow, BRow, N>(acc.values + static_cast<std::size_t>(w) * 16 * 16 * N, 16 * N, a, lda, b, ldb, k, true);
  }
  template <int N>
  void store_panel(const panel<N>& acc, int w, float* c, int ldc) const {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16 * N; ++j) c[i * ldc + j] = acc.values[(static_cast<std::size_t>(w) * 16 + i) * 16 * N + j];
  }
  //! C[16, 16N] (+)= A[16, k] B[k, 16N]; A(i, j) at a[i * lda + j] when ARow, else
  //! a[j * lda + i]; B(i, j) at b[i * ldb + j] when BRow, else b[j * ldb + i].
  template <bool ARow, bool BRow, int N>
  void mma(float* c, int ldc, const float* a, int lda, const float* b, int ldb, int k, bool accumulate) const {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16 * N; ++j) {
        float sum = accumulate ? c[i * ldc + j] : 0.0f;
        for (int x = 0; x < k; ++x)
          sum += round(ARow ? a[i * lda + x] : a[x * lda + i]) * round(BRow ? b[x * ldb + j] : b[j * ldb + x]);
        c[i * ldc + j] = sum;
      }
  }
  //! To TF32 as cvt.rna.tf32.f32 (the wmma conversion): nearest, ties away from zero, 10 bits.
  float round(float v) const noexcept {
    if (!tf32 || !std::isfinite(v)) return v;
    const auto bits = std::bit_cast<std::uint32_t>(v);
    return std::bit_cast<float>((bits + 0x1000u) & 0xffffe000u);
  }
};

//! The head dimensions the tiles are compiled for (shared memory per block at 64: forward
//! 87 KiB, backward 103 KiB: two blocks per H100 SM); another gives an error naming these.
inline constexpr bool supported_head_dim(std::size_t d) noexcept { return d == 32 || d == 64; }

inline problem make_problem(const causal_attention& shape) {
  TRIDENT_EXPECT(supported_head_dim(shape.head_dim), "flash attention: head_dim ", shape.head_dim,
                 " is not supported; expected 32 or 64 (the unfused nn::cuda::causal_attention takes any)");
  problem p;
  p.seq = static_cast<int>(shape.seq);
  p.batch = static_cast<int>(shape.batch);
  p.heads = static_cast<int>(shape.heads);
  p.head_dim = static_cast<int>(shape.head_dim);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  return p;
}

namespace detail {
// The problem of shape with the sizes of qkv, out (or dout) and lse checked against it.
inline problem checked_problem(const char* who, const causal_attention& shape, std::size_t qkv, std::size_t out,
                               std::size_t lse) {
  shape.check(who, qkv, out, shape.probs_size());
  const std::size_t rows = shape.batch * shape.heads * shape.seq;
  TRIDENT_EXPECT(lse == rows, who, ": lse has ", lse, " elements, expected [batch=", shape.batch, ", heads=", shape.heads,
                 ", seq=", shape.seq, "] = ", rows);
  // The tiles index with int (positions up to seq + 64) and the GPU's grid has batch x heads rows.
  TRIDENT_EXPECT(shape.seq <= static_cast<std::size_t>(0x7fffffff - tile) && shape.batch * shape.heads <= 65535u, who,
                 ": seq ", shape.seq, " and batch x heads ", shape.batch * shape.heads,
                 " exceed the tiles' limits (at most 2^31 - 65 and 65535)");
  return make_problem(shape);
}
// The tiles move rows as 16-byte quads: each tensor must start 16-byte aligned (any allocation
// does; a span that starts at an odd float of one does not).
inline void check_aligned(const char* who, const char* name, const void* ptr) {
  TRIDENT_EXPECT(reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0, who, ": ", name, " at ", ptr,
                 " is not 16-byte aligned; the tiles read and write rows of 4 floats at a time");
}
}  // namespace detail

//! A forward call's problem from spans (std::span or device_span: .data() and .size()): every
//! size checked against the shape (usage_error naming `who` and what was expected). The host
//! emulation and nn::cuda::flash_attention both make theirs here.
template <class In, class Out>
problem forward_problem(const char* who, const causal_attention& shape, In qkv, Out out, Out lse) {
  problem p = detail::checked_problem(who, shape, qkv.size(), out.size(), lse.size());
  detail::check_aligned(who, "qkv", qkv.data());
  p.qkv = qkv.data();
  p.out = out.data();
  p.lse = lse.data();
  return p;
}

//! A backward call's problem: forward's qkv, out and lse, the gradient dout, delta (scratch of
//! lse's size) and dqkv (overwritten), checked likewise.
template <class In, class Out>
problem backward_problem(const char* who, const causal_attention& shape, In qkv, In out, In lse, In dout, Out delta,
                         Out dqkv) {
  problem p = detail::checked_problem(who, shape, qkv.size(), out.size(), lse.size());
  TRIDENT_EXPECT(dout.size() == out.size() && delta.size() == lse.size() && dqkv.size() == qkv.size(), who,
                 ": expected dout as out (", out.size(), "), delta as lse (", lse.size(), ") and dqkv as qkv (", qkv.size(),
                 "); got ", dout.size(), ", ", delta.size(), " and ", dqkv.size());
  detail::check_aligned(who, "qkv", qkv.data());
  detail::check_aligned(who, "dout", dout.data());
  detail::check_aligned(who, "dqkv", dqkv.data());
  p.qkv = qkv.data();
  p.saved_out = out.data();
  p.saved_lse = lse.data();
  p.dout = dout.data();
  p.delta = delta.data();
  p.dqkv = dqkv.data();
  return p;
}

namespace detail {
template <int D>
void emulate_forward(const problem& p, bool tf32) {
  std::vector<float> smem(layout<D>::forward_floats);
  host_exec ex{tf32};
  for (int bh = 0; bh < p.batch * p.heads; ++bh)
    for (int qt = 0; qt * tile < p.seq; ++qt) forward_block<D>(ex, p, smem.data(), qt, bh);
}
template <int D>
void emulate_backward(const problem& p, bool tf32) {
  std::vector<float> smem(layout<D>::backward_floats);
  host_exec ex{tf32};
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.heads * p.seq;
  for (std::size_t r = 0; r < rows; r += threads) delta_rows<D>(ex, p, r);
  for (int bh = 0; bh < p.batch * p.heads; ++bh)
    for (int t = 0; t * tile < p.seq; ++t) {
      backward_kv_block<D>(ex, p, smem.data(), t, bh);
      backward_q_block<D>(ex, p, smem.data(), t, bh);
    }
}
}  // namespace detail

//! The whole grid on the host, block after block, in float: out and lse [batch, heads, seq]
//! from qkv; with tf32, the products' operands rounded as the GPU's are. For tests of the tiles
//! and of the GPU's results; nn::causal_attention is the host's attention for training.
inline void emulate_forward(const causal_attention& shape, std::span<const float> qkv, std::span<float> out,
                            std::span<float> lse, bool tf32 = false) {
  const problem p = forward_problem("flash::emulate_forward", shape, qkv, out, lse);
  shape.head_dim == 32 ? detail::emulate_forward<32>(p, tf32) : detail::emulate_forward<64>(p, tf32);
}

//! dqkv (overwritten) from forward's qkv, out and lse and from dout; delta is scratch of lse's size.
inline void emulate_backward(const causal_attention& shape, std::span<const float> qkv, std::span<const float> out,
                             std::span<const float> lse, std::span<const float> dout, std::span<float> delta,
                             std::span<float> dqkv, bool tf32 = false) {
  const problem p = backward_problem("flash::emulate_backward", shape, qkv, out, lse, dout, delta, dqkv);
  shape.head_dim == 32 ? detail::emulate_backward<32>(p, tf32) : detail::emulate_backward<64>(p, tf32);
}

}  // namespace trident::nn::flash
