// The kernels copy 16-byte vectors into swizzled shared-memory tiles with per-thread offsets
// computed once (through CuTe) plus 2048 bytes per iteration. This checks, on the host, that
// the shortcut equals CuTe's layout for every thread and iteration of every tile used.
#include <gtest/gtest.h>

#include <cute/tensor.hpp>

#include <utility>

namespace {

using namespace cute;

template <class T, class L, class F>
void expect_constant_stride(const char* name, L layout, int iters, F coord) {
  alignas(1024) static T buf[1 << 16];
  auto t = make_tensor(make_smem_ptr(buf), layout);
  for (int tid = 0; tid < 128; ++tid) {
    const auto c0 = coord(tid);
    const long off0 = static_cast<long>(reinterpret_cast<char*>(&t(c0.first, c0.second)) - reinterpret_cast<char*>(buf));
    for (int it = 1; it < iters; ++it) {
      const auto c = coord(tid + it * 128);
      const long off = static_cast<long>(reinterpret_cast<char*>(&t(c.first, c.second)) - reinterpret_cast<char*>(buf));
      ASSERT_EQ(off, off0 + 2048L * it) << name << " thread " << tid << " iteration " << it;
    }
  }
}

template <class T>
void check_all() {
  // compute_out: K-major 64-column tiles (C_m, B_j slices: 64 rows; H slices: 64 or 128 rows),
  // v -> (row v / 8, column 8 * (v % 8)).
  auto k_rows = [](int v) { return std::make_pair(v / 8, (v % 8) * 8); };
  expect_constant_stride<T>("C/B 64x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, _64>{}), 4, k_rows);
  expect_constant_stride<T>("H 128x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_128, _64>{}), 8, k_rows);
  // compute_out: X_j (p, token) MN-major, v -> (p 8 * (v % (P/8)), token v / (P/8)).
  expect_constant_stride<T>("X P=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}), 4,
                            [](int v) { return std::make_pair((v % 8) * 8, v / 8); });
  expect_constant_stride<T>("X P=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_128, _64>{}), 8,
                            [](int v) { return std::make_pair((v % 16) * 8, v / 16); });
  // fwd_pass_state: X^T (64 p x KS tokens) and B (NT x KS), MN-major.
  auto mn8 = [](int v) { return std::make_pair((v % 8) * 8, v / 8); };
  auto mn4 = [](int v) { return std::make_pair((v % 4) * 8, v / 4); };
  expect_constant_stride<T>("pass X KS=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _128>{}), 8, mn8);
  expect_constant_stride<T>("pass X KS=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}), 4, mn8);
  expect_constant_stride<T>("pass B64 KS=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _128>{}), 8, mn8);
  expect_constant_stride<T>("pass B64 KS=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}), 4, mn8);
  expect_constant_stride<T>("pass B32 KS=128", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _128>{}), 4, mn4);
  expect_constant_stride<T>("pass B32 KS=64", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _64>{}), 2, mn4);
}

TEST(TileLayouts, Bf16OffsetsAdvanceBy2048BytesPerIteration) { check_all<cutlass::bfloat16_t>(); }
TEST(TileLayouts, Fp16OffsetsAdvanceBy2048BytesPerIteration) { check_all<cutlass::half_t>(); }

}  // namespace
