// Some kernel paths access 16-byte vectors of swizzled shared-memory tiles with per-thread
// offsets computed once (through CuTe) plus 2048 bytes per iteration. This checks, on the host, that
// the shortcut equals CuTe's layout for every thread and iteration of every tile used; and that
// the tiles compute_out fills with TMA loads put every element where the load puts it.
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

// A TMA load of a box of `width` 16-bit columns (64 with the 128-byte swizzle, 32 with the
// 64-byte one) x `rows` rows writes element (column i, row o) of box `b` at byte
// b * rows * 2 * width + o * 2 * width + 2 * i, with its 16-byte chunk index XORed with bits 7-9
// (128-byte swizzle) or 7-8 (64-byte swizzle). `coord(b, o, i)` is the element's coordinate in
// the layout.
template <class T, class L, class F>
void expect_tma_boxes(const char* name, L layout, int boxes, int rows, F coord, int width = 64) {
  alignas(1024) static T buf[1 << 16];
  auto t = make_tensor(make_smem_ptr(buf), layout);
  for (int b = 0; b < boxes; ++b) {
    for (int o = 0; o < rows; ++o) {
      for (int i = 0; i < width; ++i) {
        const auto c = coord(b, o, i);
        const long off = static_cast<long>(reinterpret_cast<char*>(&t(c.first, c.second)) - reinterpret_cast<char*>(buf));
        const long linear = static_cast<long>(b) * rows * 2 * width + o * 2 * width + 2 * i;
        const long swizzled = linear ^ (((linear >> 7) & (width == 64 ? 7 : 3)) << 4);
        ASSERT_EQ(off, swizzled) << name << " box " << b << " row " << o << " column " << i;
      }
    }
  }
}

template <class T>
void check_tma() {
  // compute_out: K-major tiles (row, column): C_m and B_j slices (64 rows), H slices (P rows).
  auto k_major = [](int, int o, int i) { return std::make_pair(o, i); };
  expect_tma_boxes<T>("C/B 64x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, _64>{}), 1, 64, k_major);
  expect_tma_boxes<T>("H 128x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_128, _64>{}), 1, 128, k_major);
  // compute_out: X_j (p, token), MN-major, token mode tiled first: one box per 64 p.
  auto mn = [](int b, int o, int i) { return std::make_pair(64 * b + i, o); };
  expect_tma_boxes<T>("X P=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}, Step<_2, _1>{}), 1,
                      64, mn);
  expect_tma_boxes<T>("X P=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_128, _64>{}, Step<_2, _1>{}),
                      2, 64, mn);
  // fwd_pass_state: X^T (64 p x KS tokens) and B (NT x KS), MN-major, one box each.
  expect_tma_boxes<T>("pass X KS=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _128>{}), 1, 128, mn);
  expect_tma_boxes<T>("pass X KS=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}), 1, 64, mn);
  expect_tma_boxes<T>("pass B64 KS=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _128>{}), 1, 128, mn);
  expect_tma_boxes<T>("pass B32 KS=128", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _128>{}), 1, 128, mn,
                      32);
  expect_tma_boxes<T>("pass B32 KS=64", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _64>{}), 1, 64, mn, 32);
}

template <class T>
void check_all() {
  // compute_out, previous states converted from another dtype: K-major H slices (64 or 128
  // rows), v -> (row v / 8, column 8 * (v % 8)).
  auto k_rows = [](int v) { return std::make_pair(v / 8, (v % 8) * 8); };
  expect_constant_stride<T>("H 64x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, _64>{}), 4, k_rows);
  expect_constant_stride<T>("H 128x64", tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_128, _64>{}), 8, k_rows);
  // fwd_pass_state, scaling B (NT x KS, MN-major) in place: v -> (8 * (v % (NT/8)), token v / (NT/8)).
  auto mn8 = [](int v) { return std::make_pair((v % 8) * 8, v / 8); };
  auto mn4 = [](int v) { return std::make_pair((v % 4) * 8, v / 4); };
  expect_constant_stride<T>("pass B64 KS=128", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _128>{}), 8, mn8);
  expect_constant_stride<T>("pass B64 KS=64", tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}), 4, mn8);
  expect_constant_stride<T>("pass B32 KS=128", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _128>{}), 4, mn4);
  expect_constant_stride<T>("pass B32 KS=64", tile_to_shape(GMMA::Layout_MN_SW64_Atom<T>{}, Shape<_32, _64>{}), 2, mn4);
}

TEST(TileLayouts, Bf16OffsetsAdvanceBy2048BytesPerIteration) { check_all<cutlass::bfloat16_t>(); }
TEST(TileLayouts, Fp16OffsetsAdvanceBy2048BytesPerIteration) { check_all<cutlass::half_t>(); }
TEST(TileLayouts, Bf16TmaBoxesLandWhereWgmmaReads) { check_tma<cutlass::bfloat16_t>(); }
TEST(TileLayouts, Fp16TmaBoxesLandWhereWgmmaReads) { check_tma<cutlass::half_t>(); }

}  // namespace
