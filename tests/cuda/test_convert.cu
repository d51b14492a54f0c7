// The device conversions (hardware instructions) against the host ones (bit-exact software):
// every fp16 and bf16 bit pattern decoded, a sweep of float bit patterns encoded, and __half /
// __nv_bfloat16 interoperability. Skipped without a device.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/core/cuda/convert.cuh"

using trident::bf16;
using trident::fp16;

namespace {

std::string hex(std::uint64_t bits) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(bits));
  return text;
}

template <class Half>
void check_decode_all() {
  std::vector<Half> all(1 << 16);
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = Half::from_bits(static_cast<std::uint16_t>(i));
  trident::buffer<Half, trident::cuda_space> d_in(all.size());
  trident::buffer<float, trident::cuda_space> d_out(all.size());
  trident::copy(all, d_in);
  trident::cuda::convert<Half, float>(d_in.device_handle(), d_out.device_handle());
  const std::vector<float> out = trident::to_vector(d_out);
  int mismatches = 0;
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    const float host = all[i];
    const bool ok = std::isnan(host) ? std::isnan(out[i]) : std::bit_cast<std::uint32_t>(host) == std::bit_cast<std::uint32_t>(out[i]);
    if (!ok && ++mismatches <= 5) FAIL_CHECK("bits " << hex(i) << ": device " << out[i] << ", host " << host);
  }
  CHECK(mismatches == 0);
}

template <class Half>
void check_encode_sweep() {
  std::vector<float> floats;
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  trident::buffer<float, trident::cuda_space> d_in(floats.size());
  trident::buffer<Half, trident::cuda_space> d_out(floats.size());
  trident::copy(floats, d_in);
  // Aligned buffers take the four-at-a-time path (and its tail: the sweep's size is 2 mod 4);
  // from the second element on, the source is not 16-byte aligned: one at a time.
  for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    const std::size_t count = floats.size() - offset;
    trident::cuda::convert<float, Half>(d_in.device_handle().subspan(offset, count), d_out.device_handle().subspan(0, count));
    const std::vector<Half> out = trident::to_vector(d_out);
    int mismatches = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const float f = floats[i + offset];
      const Half host{f};
      const bool ok = std::isnan(f) ? std::isnan(static_cast<float>(out[i])) : host.bits() == out[i].bits();
      if (!ok && ++mismatches <= 5)
        FAIL_CHECK("offset " << offset << ", float " << f << ": device " << hex(out[i].bits()) << ", host " << hex(host.bits()));
    }
    CHECK(mismatches == 0);
  }
}

__global__ void through_cuda_types(trident::device_span<fp16> h, trident::device_span<bf16> b) {
  const __half x = h[threadIdx.x];                 // trident -> CUDA type
  h[threadIdx.x] = __hadd(x, x);                   // CUDA type -> trident
  const __nv_bfloat16 y = b[threadIdx.x];
  b[threadIdx.x] = __float2bfloat16_rn(__bfloat162float(y) * 4.0f);
}

}  // namespace

TEST_CASE("device and host decode every fp16 and bf16 bit pattern identically") {
  check_decode_all<fp16>();
  check_decode_all<bf16>();
}

TEST_CASE("device and host round a sweep of floats identically") {
  check_encode_sweep<fp16>();
  check_encode_sweep<bf16>();
}

TEST_CASE("fp16 and bf16 buffers are read and written as __half and __nv_bfloat16") {
  std::vector<fp16> h{fp16{1.5f}, fp16{-3.0f}};
  std::vector<bf16> b{bf16{0.25f}, bf16{-8.0f}};
  trident::buffer<fp16, trident::cuda_space> dh(2);
  trident::buffer<bf16, trident::cuda_space> db(2);
  trident::copy(h, dh);
  trident::copy(b, db);
  through_cuda_types<<<1, 2>>>(dh.device_handle(), db.device_handle());
  TRIDENT_CUDA_CHECK(cudaGetLastError());
  const auto rh = trident::to_vector(dh);
  const auto rb = trident::to_vector(db);
  CHECK(static_cast<float>(rh[0]) == 3.0f);
  CHECK(static_cast<float>(rh[1]) == -6.0f);
  CHECK(static_cast<float>(rb[0]) == 1.0f);
  CHECK(static_cast<float>(rb[1]) == -32.0f);
}

TEST_CASE("convert rejects mismatched sizes before launching") {
  trident::buffer<float, trident::cuda_space> a(4);
  trident::buffer<bf16, trident::cuda_space> b(3);
  CHECK_THROWS_AS((trident::cuda::convert<float, bf16>(a.device_handle(), b.device_handle())), trident::usage_error);
}
