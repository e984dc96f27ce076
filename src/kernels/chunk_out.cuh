// The output side of a chunk, shared by compute_out and fused_walk: the shared-memory tile
// layouts and wgmma shapes of C H^T, C B^T and S X for 64-token blocks, and the epilogue
// out = (acc + D x) * silu(z) with coalesced stores, or by TMA stores of whole blocks (fused_walk).
#pragma once

#include <cute/tensor.hpp>

#include <string>

#include "kernels/common.cuh"
#include "kernels/state_tile.cuh"
#include "kernels/tensor_map.hpp"
#include "kernels/tma.cuh"

namespace mamba2_ssd::kernels::chunk_out {

using namespace cute;
using state_tile::acc_col;
using state_tile::acc_row;

constexpr int kThreads = 128;
constexpr int kM = 64;  // output tokens per block
constexpr int kN = 64;  // dstate slice and source-token block

// Shared-memory tile layouts: the 128-byte-swizzled canonical wgmma layouts, which are also
// where a TMA box of 64 columns x rows with the 128-byte swizzle puts its elements (for X,
// headdim 128 is two such boxes one after the other: the token mode is tiled first).
template <class T, int P>
struct Traits {
  using LayoutC = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kM>, Int<kN>>{}));  // (t, n)
  using LayoutH = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<P>, Int<kN>>{}));   // (p, n)
  using LayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kN>, Int<kN>>{}));  // (s, n)
  using LayoutX = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<P>, Int<kN>>{},
                                         Step<_2, _1>{}));                                             // (p, s)
  using MmaCB = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<Int<kM>, Int<kN>, Int<kN>>, GMMA::Major::K, GMMA::Major::K>()));
  using MmaCH = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<Int<kM>, Int<P>, Int<kN>>, GMMA::Major::K, GMMA::Major::K>()));
  using MmaSX = decltype(make_tiled_mma(
      GMMA::rs_op_selector<T, T, float, Shape<Int<kM>, Int<P>, Int<kN>>, GMMA::Major::K, GMMA::Major::MN>()));
  static constexpr int kSliceBytes = kM * kN * 2;   // one 64 x 64 slice of C_m
  static constexpr int kStageBytes = P * kN * 2;    // the largest streamed tile (H slice or X tile)
};

// The TMA maps of a chunk's inputs (host): C and B as (n, token, group, row), x as (p, token,
// head, row), boxes of 64 x 64 (headdim 128: x in two loads); `kernel` names them in errors.
struct ChunkInputMaps {
  CUtensorMap C, B, x;
  // C and B as (64 columns, tokens, 64-column slices, groups, rows), boxes of 4 slices: one TMA
  // load brings a 64-token block's 4 slices, which the 4-D maps bring in 4 loads. fused_walk's
  // block slots issue their refills on the walk's chain, where each load instruction counted
  // (design log v53); only their launch builds these (add_slice_maps). Only where dstate is a
  // multiple of 64 (has_slice_maps): else the last slice's missing columns would be read from
  // the next token instead of being zero-filled.
  CUtensorMap C_slices, B_slices;
  // fused_walk's specialised kernel only (one rank): chunk_cumsum's cum, dt' and the weights it
  // reads as (a chunk's values, (row, head, chunk), the three arrays), fp32, boxes of one chunk's
  // three arrays: a chunk's meta in one TMA load instead of three bulk copies (add_meta_map).
  CUtensorMap meta;
};
__host__ __device__ inline bool has_slice_maps(const SsdParams& p) { return p.dstate % 64 == 0; }
inline void add_slice_maps(ChunkInputMaps& maps, const SsdParams& p, const std::string& kernel) {
  if (!has_slice_maps(p)) return;
  const uint32_t box[5] = {64, 64, 4, 1, 1};
  const int64_t dims[5] = {64, p.seqlen, p.dstate / 64, p.ngroups, p.batch};
  const int64_t strides_b[4] = {2 * p.B_st, 128, 2 * p.B_sg, 2 * p.B_sb};
  maps.B_slices = make_tile_map_16bit(p.B, 5, dims, strides_b, box, (kernel + " B slices").c_str());
  const int64_t strides_c[4] = {2 * p.C_st, 128, 2 * p.C_sg, 2 * p.C_sb};
  maps.C_slices = make_tile_map_16bit(p.C, 5, dims, strides_c, box, (kernel + " C slices").c_str());
}
inline ChunkInputMaps make_chunk_input_maps(const SsdParams& p, const std::string& kernel) {
  ChunkInputMaps maps{};
  const uint32_t box[4] = {64, 64, 1, 1};
  const int64_t dims_bc[4] = {p.dstate, p.seqlen, p.ngroups, p.batch};
  const int64_t strides_b[3] = {2 * p.B_st, 2 * p.B_sg, 2 * p.B_sb};
  maps.B = make_tile_map_16bit(p.B, 4, dims_bc, strides_b, box, (kernel + " B").c_str());
  const int64_t strides_c[3] = {2 * p.C_st, 2 * p.C_sg, 2 * p.C_sb};
  maps.C = make_tile_map_16bit(p.C, 4, dims_bc, strides_c, box, (kernel + " C").c_str());
  const int64_t dims_x[4] = {p.headdim, p.seqlen, p.nheads, p.batch};
  const int64_t strides_x[3] = {2 * p.x_st, 2 * p.x_sh, 2 * p.x_sb};
  maps.x = make_tile_map_16bit(p.x, 4, dims_x, strides_x, box, (kernel + " x").c_str());
  return maps;
}

// Two packed 16-bit values of type T as floats.
template <class T>
__device__ __forceinline__ float2 to_float2(uint32_t w, T) {
  const T* v = reinterpret_cast<const T*>(&w);
  return make_float2(to_float(v[0]), to_float(v[1]));
}

// The wgmma instructions of acc (+)= A B over all k-blocks of the operands, inside an open batch.
// `overwrite`: the first k-block replaces the accumulator instead of adding to it (wgmma's
// scale-d predicate), which saves a register clear per batch.
template <class Mma, class TA, class TB, class Acc>
__device__ __forceinline__ void wgmma_k(Mma& mma, TA const& a, TB const& b, Acc& acc, bool overwrite) {
  mma.accumulate_ = overwrite ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}
// Issues one wgmma batch of them (no wait).
template <class Mma, class TA, class TB, class Acc>
__device__ __forceinline__ void wgmma_issue(Mma& mma, TA const& a, TB const& b, Acc& acc, bool overwrite) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  wgmma_k(mma, a, b, acc, overwrite);
  warpgroup_commit_batch();
}

// With seq_idx, for the rows t0 and t1 of a chunk (s_seq: the chunk's seq_idx, non-decreasing;
// slots past its `count` tokens hold 0, so rows there are clamped to the last token): the first
// token of the row's sequence in the chunk (lo, by binary search) and whether the row belongs to
// the sequence of the state entering the chunk (sees; seq_prev: the sequence of the token before).
struct RowSequences {
  int lo0 = 0, lo1 = 0;
  bool sees0 = true, sees1 = true;
};
__device__ __forceinline__ RowSequences row_sequences(const int32_t* s_seq, int count, int t0, int t1,
                                                      int32_t seq_prev) {
  const int last = count - 1;
  auto first_of = [&](int t) {
    const int32_t v = s_seq[min(t, last)];
    int lo = 0, hi = min(t, last);
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (s_seq[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  RowSequences r;
  r.lo0 = first_of(t0);
  r.lo1 = first_of(t1);
  r.sees0 = s_seq[min(t0, last)] == seq_prev;
  r.sees1 = s_seq[min(t1, last)] == seq_prev;
  return r;
}

// Four values of type T (8 bytes) or float (16 bytes) as floats.
template <class T>
__device__ __forceinline__ float4 load4_16(const void* ptr) {
  const uint2 w = *static_cast<const uint2*>(ptr);
  const float2 a = to_float2(w.x, T{}), b = to_float2(w.y, T{});
  return make_float4(a.x, a.y, b.x, b.y);
}

// The epilogue of a CTA's heads: out = (acc_h + D x) * silu(z) for the rows t < count.
// Run by one warpgroup (`s_y` its own; kWarpgroups: of the CTA). Each warp owns rows
// 16 w .. 16 w + 15 of every accumulator. For every (head, 64-column half) the warp stages
// those rows in `s_y` (fp32, 64 x 64; element (row, col) at row * 64 + (col ^ 4 (row % 8)):
// conflict-free float2 writes and float4 reads), then reads
// them back four columns per lane, 16 lanes per row, so x, z and out move as 8- or 16-byte
// vectors along a row (coalesced). The staging selects the head's registers; the reading code
// exists once for all heads.
// x for D x (16-bit inputs): from the X_hm tile in shared memory at x_tile(h) where x_in_smem(h),
// else from global memory; fp32 inputs: the original fp32 x. (Two functions, the address always
// computed: a pointer that is null where the tile is gone made compute_out spill.)
// kReadsFirst: in the common case (16-bit, no z, x in shared memory) a warp's reads of all its
// rows come before their stores, one shared-memory latency per pass (fused_walk: 1.5-3% faster
// on the H200); otherwise one row at a time (compute_out: 1% slower with the reads first).
template <class T, int P, int HB, int kWarpgroups = 1, bool kReadsFirst = false, class AccFrag, class XTile,
          class XInSmem>
__device__ __forceinline__ void epilogue_heads(const SsdParams& p, AccFrag (&acc)[HB], float* s_y, const float* s_d,
                                               XTile x_tile, XInSmem x_in_smem, const ChunkInfo& ci, int m,
                                               int64_t h0, int nh) {
  constexpr int kHalves = P / 64;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warp = kWarpgroups == 1 ? tid / 32 : (tid / 32) % 4;  // (within the warpgroup)
  const bool io16 = p.io_dtype != DType::kFloat32;
  // Staging: rows ra = 16 w + lane / 4 and ra + 8 (both = lane / 4 mod 8), columns 8 k + 2 (lane % 4).
  const int ra = acc_row<kWarpgroups>(0), rb = acc_row<kWarpgroups>(2);
  const int swz_w = ((lane / 4) & 7) << 2;
  float* y_ra = s_y + ra * 64;
  float* y_rb = s_y + rb * 64;
  // Reading: lane -> columns 4 c4 .. 4 c4 + 3 of rows 16 w + 2 i + lane / 16, i = 0..7.
  const int c4 = lane % 16;
  const int row_first = 16 * warp + lane / 16;  // item 0's row within the block
#pragma unroll 1
  for (int hh = 0; hh < nh * kHalves; ++hh) {
    const int h = hh / kHalves, half = hh % kHalves;
    __syncwarp();  // the previous pass's reads are done
#pragma unroll
    for (int hc = 0; hc < HB; ++hc) {
#pragma unroll
      for (int hf = 0; hf < kHalves; ++hf) {
        if (hc == h && hf == half) {
          warpgroup_fence_operand(acc[hc]);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int col = (8 * k + 2 * (lane % 4)) ^ swz_w;
            const int v = 4 * (8 * hf + k);
            *reinterpret_cast<float2*>(y_ra + col) = make_float2(acc[hc](v), acc[hc](v + 1));
            *reinterpret_cast<float2*>(y_rb + col) = make_float2(acc[hc](v + 2), acc[hc](v + 3));
          }
        }
      }
    }
    __syncwarp();
    const int64_t hg = h0 + h;
    const int pcol = 64 * half + 4 * c4;
    const bool has_d = p.D != nullptr, has_z = p.z != nullptr;
    const float4 d = has_d ? *reinterpret_cast<const float4*>(s_d + h * P + pcol) : make_float4(0.f, 0.f, 0.f, 0.f);
    const bool x_smem = io16 && x_in_smem(h);
    // (headdim 128: the second 64-column box of X starts 8 KB into the tile)
    const char* x_tile_h = x_tile(h) + half * (64 * kN * 2) + ((c4 & 1) << 3);
    const int64_t tok = ci.tok0 + m * kM + row_first;  // item 0's token in the row
    const int64_t x_off = ci.row * p.x_sb + tok * p.x_st + hg * p.x_sh + pcol;
    const int64_t xf_off = ci.row * p.xf_sb + tok * p.xf_st + hg * p.xf_sh + pcol;
    const int64_t z_off = ci.row * p.z_sb + tok * p.z_st + hg * p.z_sh + pcol;
    const int64_t o_off = ci.row * p.out_sb + tok * p.out_st + hg * p.out_sh + pcol;
    const int rows_left = ci.count - m * kM - row_first;  // item i is a token of the chunk if 2 i < rows_left
    if (io16 && !has_z && x_smem) {
      // The common case, without per-item dtype branches: rows 2 i apart share the swizzle
      // phase (row_first + 2 i) % 8, with row_first % 8 = lane / 16.
      const char* x_row = x_tile_h + 128 * row_first;
      const float* y_row = s_y + row_first * 64;
      T* o_row = static_cast<T*>(p.out) + o_off;
      const int64_t o_step = 2 * p.out_st;
      const int r8 = lane / 16;
      if constexpr (kReadsFirst) {
        // (rows past the chunk's tokens are read too: finite values, not stored)
        auto pass = [&](auto with_d) {
          float4 y[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int sw = (r8 + 2 * i) & 7;
            y[i] = *reinterpret_cast<const float4*>(y_row + 128 * i + ((4 * c4) ^ (sw << 2)));
            if constexpr (decltype(with_d)::value) {
              const float4 x = load4_16<T>(x_row + 256 * i + (((c4 >> 1) ^ sw) << 4));
              y[i].x += d.x * x.x;
              y[i].y += d.y * x.y;
              y[i].z += d.z * x.z;
              y[i].w += d.w * x.w;
            }
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            if (2 * i < rows_left) {
              T q[4] = {from_float<T>(y[i].x), from_float<T>(y[i].y), from_float<T>(y[i].z), from_float<T>(y[i].w)};
              *reinterpret_cast<uint2*>(o_row + i * o_step) = *reinterpret_cast<const uint2*>(q);
            }
          }
        };
        if (has_d) pass(std::true_type{});
        else pass(std::false_type{});
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int sw = (r8 + 2 * i) & 7;
          if (2 * i < rows_left) {
            float4 y = *reinterpret_cast<const float4*>(y_row + 128 * i + ((4 * c4) ^ (sw << 2)));
            if (has_d) {
              const float4 x = load4_16<T>(x_row + 256 * i + (((c4 >> 1) ^ sw) << 4));
              y.x += d.x * x.x;
              y.y += d.y * x.y;
              y.z += d.z * x.z;
              y.w += d.w * x.w;
            }
            T q[4] = {from_float<T>(y.x), from_float<T>(y.y), from_float<T>(y.z), from_float<T>(y.w)};
            *reinterpret_cast<uint2*>(o_row) = *reinterpret_cast<const uint2*>(q);
          }
          o_row += o_step;
        }
      }
      continue;
    }
#pragma unroll 1
    for (int i0 = 0; i0 < 8; i0 += 4) {
      // All loads of four items first, then their math and stores: one memory latency per four
      // items (the compiler would not move a load above a store that may alias it).
      float4 xv[4], zv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u;
        const int tl = row_first + 2 * i;
        const bool ok = 2 * i < rows_left;
        xv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        zv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok && has_d) {
          if (x_smem) xv[u] = load4_16<T>(x_tile_h + 128 * tl + (((c4 >> 1) ^ (tl & 7)) << 4));
          else if (io16) xv[u] = load4_16<T>(static_cast<const T*>(p.x) + x_off + 2 * i * p.x_st);
          else xv[u] = *reinterpret_cast<const float4*>(p.x_f32 + xf_off + 2 * i * p.xf_st);
        }
        if (ok && has_z) {
          if (io16) zv[u] = load4_16<T>(static_cast<const T*>(p.z) + z_off + 2 * i * p.z_st);
          else zv[u] = *reinterpret_cast<const float4*>(static_cast<const float*>(p.z) + z_off + 2 * i * p.z_st);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u;
        const int tl = row_first + 2 * i;
        if (2 * i >= rows_left) continue;
        float4 y = *reinterpret_cast<const float4*>(s_y + tl * 64 + ((4 * c4) ^ ((tl & 7) << 2)));
        y.x += d.x * xv[u].x;
        y.y += d.y * xv[u].y;
        y.z += d.z * xv[u].z;
        y.w += d.w * xv[u].w;
        if (has_z) {
          y.x *= silu(zv[u].x);
          y.y *= silu(zv[u].y);
          y.z *= silu(zv[u].z);
          y.w *= silu(zv[u].w);
        }
        if (io16) {
          T q[4] = {from_float<T>(y.x), from_float<T>(y.y), from_float<T>(y.z), from_float<T>(y.w)};
          *reinterpret_cast<uint2*>(static_cast<T*>(p.out) + o_off + 2 * i * p.out_st) = *reinterpret_cast<const uint2*>(q);
        } else {
          *reinterpret_cast<float4*>(static_cast<float*>(p.out) + o_off + 2 * i * p.out_st) = y;
        }
      }
    }
  }
}

// Four 8 x 8 matrices of 16-bit values between shared memory and the mma fragment layout (thread
// L: row L / 4, columns 2 (L % 4) and + 1 of each); lanes 8 j .. 8 j + 7 give the row addresses
// of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// A 64 x 64 tile of 16-bit values in 128-byte rows with the 128-byte swizzle (the X tile's
// layout) against a warpgroup's 64-row accumulator fragment, through ldmatrix / stmatrix x4:
// x4 number i of a warp (its rows 16 w .. 16 w + 15) moves register r as the pair of fragment
// values v = 8 i + 2 r, + 1 of the tile's 64 columns. Matrix j = lane / 8 of each x4: rows
// 8 (j & 1) + lane % 8 of the warp's 16, 8-column group 2 i + (j >> 1).
struct FragRows {
  uint32_t row;  // shared address of the thread's row in `tile`
  int cg_hi, sw;
  template <int kWarpgroups>
  __device__ __forceinline__ static FragRows at(const char* tile) {
    const int lane = threadIdx.x % 32;
    const int warp = kWarpgroups == 1 ? threadIdx.x / 32 : (threadIdx.x / 32) % 4;  // (within the warpgroup)
    const int t = 16 * warp + 8 * ((lane >> 3) & 1) + (lane & 7);
    return {tma::smem_addr(tile) + t * 128, lane >> 4, lane & 7};
  }
  __device__ __forceinline__ uint32_t chunk(int i) const {
    return row + static_cast<uint32_t>(((2 * i + cg_hi) ^ sw) << 4);
  }
};

// The epilogue of one 64-token block by TMA store, where out is 16-bit, without z, and the
// block's rows are all the caller's to write (rows past the tensor's end are not written):
// out = acc + D x in registers (x read from the X tile in the accumulator's fragment layout),
// rounded into `stage` (64 x 64, the X tile's swizzled layout, 1024-byte aligned) and stored by
// each warp's lane 0 as its 16 rows. No shared-memory round trip of the fp32 values and no
// per-row stores; the caller waits for the stores' reads (tma::bulk_wait_all) before `stage` is
// written again, and for their writes before the CTA exits.
template <class T, int kWarpgroups, class AccFrag>
__device__ __forceinline__ void epilogue_tma_store(AccFrag& acc, char* stage, const char* x_tile, const float* s_d,
                                                   bool has_d, const CUtensorMap* out_map, int tok, int h, int row) {
  const int lane = threadIdx.x % 32;
  const int warp = kWarpgroups == 1 ? threadIdx.x / 32 : (threadIdx.x / 32) % 4;  // (within the warpgroup)
  const FragRows xs = FragRows::at<kWarpgroups>(x_tile), st = FragRows::at<kWarpgroups>(stage);
  warpgroup_fence_operand(acc);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t xr[4];
    ldmatrix_x4(xs.chunk(i), xr);
    uint32_t o[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int v = 8 * i + 2 * r;  // (r: 0/1 block 2 i, rows a/b; 2/3 block 2 i + 1)
      const int col = 8 * (2 * i + (r >> 1)) + 2 * (lane % 4);
      float y0 = acc(v), y1 = acc(v + 1);
      if (has_d) {
        const float2 d = *reinterpret_cast<const float2*>(s_d + col);
        const float2 x = to_float2(xr[r], T{});
        y0 = fmaf(d.x, x.x, y0);
        y1 = fmaf(d.y, x.y, y1);
      }
      const T pair[2] = {from_float<T>(y0), from_float<T>(y1)};
      o[r] = *reinterpret_cast<const uint32_t*>(pair);
    }
    stmatrix_x4(st.chunk(i), o);
  }
  fence_async_shared();
  __syncwarp();
  if (lane == 0) {
    tma::store_4d(out_map, stage + warp * 16 * 128, 0, tok + 16 * warp, h, row);
    tma::bulk_commit();
  }
}

}  // namespace mamba2_ssd::kernels::chunk_out
