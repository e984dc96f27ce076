// What fused_walk's kernels share (fused_walk.cu: one, two and cluster warpgroup kernels;
// fused_walk_ws.cu: the warp-specialised one): the state's operand types, the chunk buffer's
// layout, and the launcher of the specialised kernel for launch_fused_walk.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/chunk_out.cuh"
#include "kernels/state_tile.cuh"
#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::kernels::fused_walk_parts {

using namespace cute;
using namespace chunk_out;

// Byte offset of the pair of columns (8 k + 2 (lane % 4), + 1) of row t in a 64 x 64 16-bit tile
// of 128-byte rows with the 128-byte swizzle (H_s's slices): the 16-byte chunk index is xor-ed
// with t % 8, which is lane / 4 for both rows of a thread's fragment.
__device__ __forceinline__ uint32_t pair_offset(int t, int k, int lane) {
  return static_cast<uint32_t>(t * 128 + ((k ^ (lane / 4)) << 4) + (lane % 4) * 4);
}

// The output partial of a block that the other CTA of a cluster (dstate above 256, 256 state
// columns each) finishes: send_partial writes this thread's share of the 64 x 64 fp32 fragment
// (fragment order, 16 bytes per store) by st.async into the receiver's buffer at cluster address
// `dst`, completing on its mbarrier `bar`; the receiver adds it with add_partial from its buffer.
template <class Acc>
__device__ __forceinline__ void send_partial(const Acc& acc, uint32_t dst, uint32_t bar, int wtid) {
  constexpr int kVals = decltype(size(acc))::value;
#pragma unroll
  for (int v = 0; v < kVals; v += 4) {
    tma::cluster_store_async(dst + ((v / 4) * kThreads + wtid) * 16,
                             make_float4(acc(v), acc(v + 1), acc(v + 2), acc(v + 3)), bar);
  }
}
template <class Acc>
__device__ __forceinline__ void add_partial(Acc& acc, const float* buffer, int wtid) {
  constexpr int kVals = decltype(size(acc))::value;
#pragma unroll
  for (int v = 0; v < kVals; v += 4) {
    const float4 o = reinterpret_cast<const float4*>(buffer)[(v / 4) * kThreads + wtid];
    acc(v) += o.x;
    acc(v + 1) += o.y;
    acc(v + 2) += o.z;
    acc(v + 3) += o.w;
  }
}

// NK: 64-column dstate slices (1, 2 or 4); kWGs: warpgroups, 2 with NK = 4 and in a variant with
// NK = 2. With two, warpgroup w holds state columns 128 w .. 128 w + 127 (NK = 2: 64 w ..; the
// update's share of the chunk's tokens, all its blocks) and computes the output of block m = w
// (C_m H_s^T over the whole H_s in shared memory, which both write). A 64 x 256 state per
// warpgroup would take 128 more registers per thread.
template <class T, int NK, int kWGs>
struct Fused {
  using Tr = Traits<T, 64>;
  static constexpr int kWarpgroups = kWGs;
  static constexpr int kThreadsAll = kThreads * kWarpgroups;
  static constexpr int kStateSlices = NK / kWarpgroups;  // per warpgroup
  static constexpr int kN_state = kStateSlices * kN;
  // The update's operands: X_m * w as (p, token) in registers (A, loaded from the X tile with
  // transposing ldmatrix and scaled there), and B_m as (n, token) over the warpgroup's slices,
  // the same bytes as the (token, n) slices of C B^T (MN-major B).
  using LayoutBn = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<kN_state>, Int<kM>>{},
                                          Step<_2, _1>{}));
  using MmaUpd = decltype(make_tiled_mma(
      GMMA::rs_op_selector<T, T, float, Shape<_64, Int<kN_state>, Int<kM>>, GMMA::Major::K, GMMA::Major::MN>()));
  static constexpr int kSlice = kM * kN * 2;                 // one 64 x 64 tile: 8 KB
  static constexpr int kBlockBytes = (2 * NK + 1) * kSlice;  // block m: C_m slices, B_m slices, X_m
  static constexpr int kAccVals = 64 * kN_state / kThreads;
};

// kCtas: CTAs per SM. Two of one warpgroup (dstate 128: 248 registers; dstate 64: also three,
// see launch_fused_walk), one of two warpgroups (NK = 4: its shared memory). Three at dstate 64
// take at most 168 registers and 75 KB of shared memory each: the state weights w come from cum
// and e (see load_xw), not as a third array, and the decays are computed once C_m B_j^T has
// landed, not under its wgmma (kLateDecay). Each CTA is then slower (dstate 64, 4K tokens in 8
// segments: 42.6 us against 40.5 with two per SM, H200 2026-11-30), the SM's throughput higher.
template <int kCtas>
constexpr int weight_arrays = kCtas == 3 ? 2 : 3;

// The chunk buffer: [block m: C_m, B_m, X_m] for m < q / 64, then cum, dt' and w (q floats each),
// in two slots (chunks of even and odd rank in the walk) with two warpgroups: block 0's tiles
// and the weights of the next chunk land while this chunk's block 1 still reads its weights.
template <int kWG, int kCtas>
__host__ __device__ constexpr int buffer_bytes(int block_bytes, int q) {
  return ((q / kM) * block_bytes + kWG * weight_arrays<kCtas> * q * 4 + 1023) / 1024 * 1024;
}

// The state after the first `seg` > 0 segment sums (seg x SsdParams::sum_split for the state
// entering segment seg), from fwd_pass_state's segment sums (64 x 64 tiles in fragment order;
// value v of a warpgroup's fragment is value v % 32 of its tile tile0 + v / 32):
// T_1 = sum_0, T_k = carry_{k-1} T_{k-1} + sum_{k-1}. kGuard: tiles from p.ready_tiles on (columns
// past dstate) have no sums and read as 0; kUnroll: of the loop over the segments.
template <bool kGuard, int kUnroll, class Acc>
__device__ __forceinline__ void state_from_sums(Acc& hacc, const SsdParams& p, int64_t base, int seg, int tile0,
                                                int wtid) {
  constexpr int kVals = decltype(size(hacc))::value;
  auto sum_at = [&](int k, int v) {
    const int tile = tile0 + (v >> 5);
    return !kGuard || tile < p.ready_tiles
               ? p.seg_sums[(((base + k) * p.ready_tiles + tile) * 32 + (v & 31)) * kThreads + wtid]
               : 0.0f;
  };
#pragma unroll
  for (int v = 0; v < kVals; ++v) hacc(v) = sum_at(0, v);
#pragma unroll(kUnroll)
  for (int k = 1; k < seg; ++k) {
    const float f = p.seg_carry[base + k];
#pragma unroll
    for (int v = 0; v < kVals; ++v) hacc(v) = fmaf(f, hacc(v), sum_at(k, v));
  }
}

// H_s = H in the compute type T: (p, n) per 64-column slice from `slices` (Traits::LayoutH: rows
// p of 128 bytes, swizzled). Value v is at row acc_row(v), column acc_col(v) of slice v / 32.
// kStmatrix: by stmatrix x4 (FragRows), 8 per thread at dstate 128 where 32-bit stores take 32:
// 1-3% faster in the specialised kernel, 0.4-1% slower in the one-warpgroup ones at dstate 64
// and 256, which keep the 32-bit stores (H200, v26).
template <class T, int kWG, bool kStmatrix = false, class Acc>
__device__ __forceinline__ void store_state_copy(const Acc& hacc, char* slices, int lane) {
  constexpr int kVals = decltype(size(hacc))::value;
  auto pair_at = [&](int v) {
    const T pair[2] = {from_float<T>(hacc(v)), from_float<T>(hacc(v + 1))};
    return *reinterpret_cast<const uint32_t*>(pair);
  };
  if constexpr (kStmatrix) {
#pragma unroll
    for (int s = 0; s < kVals / 32; ++s) {
      const FragRows st = FragRows::at<kWG>(slices + s * (kM * kN * 2));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t o[4] = {pair_at(32 * s + 8 * i), pair_at(32 * s + 8 * i + 2), pair_at(32 * s + 8 * i + 4),
                               pair_at(32 * s + 8 * i + 6)};
        stmatrix_x4(st.chunk(i), o);
      }
    }
  } else {
#pragma unroll
    for (int v = 0; v < kVals; v += 2) {
      char* slice = slices + (v >> 5) * (kM * kN * 2);
      *reinterpret_cast<uint32_t*>(slice + pair_offset(state_tile::acc_row<kWG>(v), (v >> 2) & 7, lane)) = pair_at(v);
    }
  }
}

// acc (=) A B^T over NK 64-column slices of 16-bit T, `a` and `b` NK consecutive 8 KB tiles of
// layouts LayoutA and LayoutB (C_m and B_j, or C_m and H_s), inside an open wgmma batch.
template <class T, int NK, class LayoutA, class LayoutB, class Mma, class Thr, class Acc>
__device__ __forceinline__ void wgmma_slices(Mma& mma, Thr& thr, const char* a, const char* b, Acc& acc) {
#pragma unroll
  for (int ks = 0; ks < NK; ++ks) {
    Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(a) + ks * kM * kN * 2)), LayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(b) + ks * kM * kN * 2)), LayoutB{});
    wgmma_k(mma, thr.partition_fragment_A(sA), thr.partition_fragment_B(sB), acc, ks == 0);
  }
}

// The update's A operand xw = X^T (p, token) of a block's X tile (Traits::LayoutX) in registers,
// by transposing ldmatrix (`mma`: the update's tiled MMA, whose A fragment xw is; `wtid`: the
// thread in the warpgroup).
template <class T, class Mma, class XFrag>
__device__ __forceinline__ void load_xt(const Mma& mma, int wtid, XFrag& xw, const char* x_tile) {
  auto x_copy = make_tiled_copy_A(Copy_Atom<SM75_U16x8_LDSM_T, T>{}, mma);
  auto thr = x_copy.get_slice(wtid);
  Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(x_tile)), typename Traits<T, 64>::LayoutX{});
  Tensor dst = thr.retile_D(xw);
  copy(x_copy, thr.partition_S(sX), dst);
}

// xw *= w[token] per value (x_tok: the (p, token) of each of xw's values; w: the block's state
// weights).
template <class T, class XFrag, class XTok>
__device__ __forceinline__ void scale_xt(XFrag& xw, const XTok& x_tok, const float* w) {
#pragma unroll
  for (int e = 0; e < decltype(size(xw))::value; ++e) xw(e) = from_float<T>(to_float<T>(xw(e)) * w[get<1>(x_tok(e))]);
}

// H += xw^T B over the update's operands, issued as one wgmma batch (xw, in registers, is read
// until it completes; the caller waits).
template <class Mma, class Thr, class XFrag, class SB, class Acc>
__device__ __forceinline__ void issue_update_wgmma(Mma& mma, Thr& thr, XFrag& xw, const SB& sB, Acc& hacc) {
  warpgroup_fence_operand(xw);
  warpgroup_fence_operand(hacc);
  warpgroup_arrive();
  wgmma_k(mma, xw, thr.partition_fragment_B(sB), hacc, false);
  warpgroup_commit_batch();
}

// The decays of S_mj = C_m B_j^T * exp2(cum_t - e_s) at a thread's values (rows t0, t1; the 16
// columns 8 k + 2 (lane % 4), + 1 of block j, whose e_s start at e_j), handed to f(v, l_v,
// l_v+1) for each pair of fragment values: where kMasked, 0 outside lw <= s <= hi (column
// indices within block j; kLower: the lower bound applies, with seq_idx). a_grows: cum_t taken as
// 0 (A > 0, see fused_walk_kernel).
template <bool kMasked, bool kLower, class F>
__device__ __forceinline__ void for_each_decay(const float* e_j, bool a_grows, float ct0, float ct1, int hi0, int hi1,
                                               int lw0, int lw1, int lane, F&& f) {
#pragma unroll
  for (int k = 0; k < kN / 8; ++k) {
    const int col = 8 * k + 2 * (lane % 4);
    const float2 es = *reinterpret_cast<const float2*>(e_j + col);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float ct = a_grows ? 0.0f : r ? ct1 : ct0;
      const float l0 = fast_exp2(ct - es.x), l1 = fast_exp2(ct - es.y);
      if constexpr (kMasked) {
        const int hi = r ? hi1 : hi0, lw = r ? lw1 : lw0;
        f(4 * k + 2 * r, col <= hi && (!kLower || col >= lw) ? l0 : 0.0f,
          col + 1 <= hi && (!kLower || col + 1 >= lw) ? l1 : 0.0f);
      } else {
        f(4 * k + 2 * r, l0, l1);
      }
    }
  }
}

// The decays into an array (fragment order), computed while the wgmma that gives C_m B_j^T runs.
template <bool kMasked, bool kLower, int kVals>
__device__ __forceinline__ void s_decays(float (&decay)[kVals], const float* e_j, bool a_grows, float ct0, float ct1,
                                         int hi0, int hi1, int lw0, int lw1, int lane) {
  for_each_decay<kMasked, kLower>(e_j, a_grows, ct0, ct1, hi0, hi1, lw0, lw1, lane, [&](int v, float l0, float l1) {
    decay[v] = l0;
    decay[v + 1] = l1;
  });
}

// S = C B^T * decay straight into the 16-bit A fragment sf, once C B^T has landed (no array of
// decays: 32 registers fewer live beside C B^T, S and the accumulator; the block-slot
// specialised kernel's output warpgroups, fused_walk_ws.cu).
template <bool kMasked, class T, class SFrag, class CbFrag>
__device__ __forceinline__ void s_from_cb(SFrag& sf, const CbFrag& cb, const float* e_j, bool a_grows, float ct0,
                                          float ct1, int hi0, int hi1, int lane) {
  for_each_decay<kMasked, false>(e_j, a_grows, ct0, ct1, hi0, hi1, 0, 0, lane, [&](int v, float l0, float l1) {
    sf(v) = from_float<T>(cb(v) * l0);
    sf(v + 1) = from_float<T>(cb(v + 1) * l1);
  });
}

// FusedWalkVariant::kSpecialized (fused_walk_ws.cu); the caller checked
// fused_walk_specialized_supported and built the maps (out_map: 16-bit output, boxes of 64 x 16).
void launch_fused_walk_specialized(const SsdParams& p, const ChunkInputMaps& maps, const CUtensorMap& out_map,
                                   int64_t walks, cudaStream_t stream);

}  // namespace mamba2_ssd::kernels::fused_walk_parts
