// One CTA (one warpgroup, 128 threads) owns a 64 x NT slice of one head's state (headdim rows
// p0..p0+63, dstate columns n0..n0+NT-1) as a wgmma accumulator in registers, and adds chunks
// to it:  H = carry * H + X^T (B * w),  X: (tokens x 64), B: (tokens x NT), w per token.
// Shared by fwd_pass_state (every chunk of a walk) and varlen_states (one partial chunk).
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common.cuh"

namespace mamba2_ssd::kernels::state_tile {

using namespace cute;

constexpr int kThreads = 128;
constexpr int kP = 64;    // headdim rows per CTA (wgmma M)
constexpr int kK = 64;    // tokens per step (wgmma K = 4 x 16)

template <class T, int NT>
struct Tiles {
  // X^T tile: (p, token), p contiguous in memory -> MN-major A operand.
  using LayoutX = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<kP>, Int<kK>>{}));
  // B tile: (n, token), n contiguous -> MN-major B operand.
  using AtomB = std::conditional_t<NT == 32, GMMA::Layout_MN_SW64_Atom<T>, GMMA::Layout_MN_SW128_Atom<T>>;
  using LayoutB = decltype(tile_to_shape(AtomB{}, Shape<Int<NT>, Int<kK>>{}));
  using Mma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<_64, Int<NT>, Int<kK>>, GMMA::Major::MN, GMMA::Major::MN>()));

  static constexpr int kXBytes = kP * kK * 2;
  static constexpr int kBBytes = NT * kK * 2;
  // One pipeline stage: X tile, B tile, then per-token metadata (cum, dt', seq_idx) and two
  // per-chunk scalars (cum and seq_idx of the chunk's last token). 1024-byte aligned tiles.
  static constexpr int kMetaOffset = kXBytes + kBBytes;
  static constexpr int kStageBytes = ((kMetaOffset + 3 * kK * 4 + 64) + 1023) / 1024 * 1024;
};

// Per-stage metadata pointers.
struct StageMeta {
  float* cum;      // [kK] cum * log2(e) of the step's tokens
  float* dtp;      // [kK] dt'
  int32_t* seq;    // [kK] seq_idx (only when present)
  float* cum_last; // [1]
  int32_t* seq_last;  // [1]
};
template <class T, int NT>
__device__ __forceinline__ StageMeta stage_meta(char* stage) {
  using Tl = Tiles<T, NT>;
  float* base = reinterpret_cast<float*>(stage + Tl::kMetaOffset);
  StageMeta m;
  m.cum = base;
  m.dtp = base + kK;
  m.seq = reinterpret_cast<int32_t*>(base + 2 * kK);
  m.cum_last = base + 3 * kK;
  m.seq_last = reinterpret_cast<int32_t*>(base + 3 * kK + 4);
  return m;
}

__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}

// Issues the async copies of one step: tokens [t0, t0 + kK) of a chunk (t0 relative to the
// chunk, `count` valid tokens), headdim rows p0.., dstate columns n0...
// cum/dtp point at slot 0 of the chunk in the workspace; seq at the chunk's first token.
template <class T, int NT>
__device__ __forceinline__ void issue_step(const SsdParams& p, char* stage, const ChunkInfo& ci, int t0,
                                           int64_t h, int p0, int n0, const float* cum, const float* dtp,
                                           const int32_t* seq, int last_slot) {
  using Tl = Tiles<T, NT>;
  const int tid = threadIdx.x;
  T* sx_ptr = reinterpret_cast<T*>(stage);
  T* sb_ptr = reinterpret_cast<T*>(stage + Tl::kXBytes);
  Tensor sX = make_tensor(make_smem_ptr(sx_ptr), typename Tl::LayoutX{});
  Tensor sB = make_tensor(make_smem_ptr(sb_ptr), typename Tl::LayoutB{});
  const T* xg = static_cast<const T*>(p.x) + ci.row * p.x_sb + ci.tok0 * p.x_st + h * p.x_sh + p0;
  const int64_t grp = h / p.heads_per_group;
  const T* bg = static_cast<const T*>(p.B) + ci.row * p.B_sb + ci.tok0 * p.B_st + grp * p.B_sg + n0;
  // X: kK tokens x 64 p = 512 vectors of 8.
#pragma unroll
  for (int it = 0; it < kP * kK / 8 / kThreads; ++it) {
    const int v = tid + it * kThreads;
    const int t = v / (kP / 8), c = (v % (kP / 8)) * 8;
    const bool ok = (t0 + t) < ci.count && (p0 + c) < p.headdim;
    cp_async_16(&sX(c, t), ok ? xg + (t0 + t) * p.x_st + c : xg, ok);
  }
#pragma unroll
  for (int it = 0; it < NT * kK / 8 / kThreads; ++it) {
    const int v = tid + it * kThreads;
    const int t = v / (NT / 8), c = (v % (NT / 8)) * 8;
    const bool ok = (t0 + t) < ci.count && (n0 + c) < p.dstate;
    cp_async_16(&sB(c, t), ok ? bg + (t0 + t) * p.B_st + c : bg, ok);
  }
  StageMeta m = stage_meta<T, NT>(stage);
  if (tid < kK / 4) {
    cp_async_16(m.cum + tid * 4, cum + t0 + tid * 4, true);
  } else if (tid < kK / 2) {
    const int u = tid - kK / 4;
    cp_async_16(m.dtp + u * 4, dtp + t0 + u * 4, true);
  } else if (tid == kK / 2) {
    cp_async_4(m.cum_last, cum + last_slot, true);
  } else if (tid == kK / 2 + 1 && seq != nullptr) {
    cp_async_4(m.seq_last, seq + (int64_t)(ci.count - 1) * p.seq_st, true);
  }
  if (seq != nullptr) {
    // seq_idx of the step's tokens (4-byte copies: its stride is arbitrary).
    if (tid >= 64) {
      const int t = tid - 64;
      const bool ok = (t0 + t) < ci.count;
      cp_async_4(m.seq + t, ok ? seq + (int64_t)(t0 + t) * p.seq_st : seq, ok);
    }
  }
}

// Multiplies the B tile of a landed stage by w_t = exp2(min(c_end - cum_t, 0)) * dt'_t for the
// tokens in [lo, hi] of the chunk (relative to the chunk) that belong to sequence `seq_end`
// (when seq_idx is present), and by 0 elsewhere. t0: the step's first token in the chunk.
template <class T, int NT>
__device__ __forceinline__ void scale_b(char* stage, int t0, int lo, int hi, float c_end, bool use_seq,
                                        int32_t seq_end) {
  using Tl = Tiles<T, NT>;
  StageMeta m = stage_meta<T, NT>(stage);
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage + Tl::kXBytes)), typename Tl::LayoutB{});
  constexpr int kThreadsPerToken = kThreads / kK;           // 2
  constexpr int kVecPerThread = NT / 8 / kThreadsPerToken;  // NT=64: 4, NT=32: 2
  const int t = threadIdx.x / kThreadsPerToken;
  const int part = threadIdx.x % kThreadsPerToken;
  const int tc = t0 + t;
  float w = 0.0f;
  if (tc >= lo && tc <= hi && (!use_seq || m.seq[t] == seq_end)) {
    w = fast_exp2(fminf(c_end - m.cum[t], 0.0f)) * m.dtp[t];
  }
#pragma unroll
  for (int i = 0; i < kVecPerThread; ++i) {
    const int c = (part * kVecPerThread + i) * 8;
    T* ptr = &sB(c, t);
    uint4 raw = *reinterpret_cast<uint4*>(ptr);
    T* vals = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) vals[e] = from_float<T>(to_float<T>(vals[e]) * w);
    *reinterpret_cast<uint4*>(ptr) = raw;
  }
}

// acc += X^T * B for a landed (and scaled, fenced, synchronised) stage.
template <class T, int NT, class Acc>
__device__ __forceinline__ void mma_step(char* stage, Acc& acc) {
  using Tl = Tiles<T, NT>;
  typename Tl::Mma mma;
  auto thr = mma.get_slice(threadIdx.x);
  Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tl::LayoutX{});
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage + Tl::kXBytes)), typename Tl::LayoutB{});
  Tensor tA = thr.partition_fragment_A(sX);
  Tensor tB = thr.partition_fragment_B(sB);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm(mma, tA, tB, acc);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

template <class T, int NT>
__device__ __forceinline__ auto make_acc() {
  using Tl = Tiles<T, NT>;
  return partition_fragment_C(typename Tl::Mma{}, Shape<Int<kP>, Int<NT>>{});
}

// Accumulator element v of this thread <-> (row, col) of the 64 x NT tile (wgmma C layout:
// value modes (column pair, row half, 8-column group)).
// kWarpgroups: of the CTA, each holding its own fragment (the row is that of the warp within
// its warpgroup).
template <int kWarpgroups = 1>
__device__ __forceinline__ int acc_row(int v) {
  const int warp = kWarpgroups == 1 ? threadIdx.x / 32 : (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  return warp * 16 + lane / 4 + 8 * ((v >> 1) & 1);
}
__device__ __forceinline__ int acc_col(int v) {
  const int lane = threadIdx.x % 32;
  return 2 * (lane % 4) + (v & 1) + 8 * (v >> 2);
}

template <int kWarpgroups, class E, class Acc>
__device__ __forceinline__ void store_tile_as(const Acc& acc, E* base, int64_t sp, int p0, int n0, const SsdParams& p) {
  constexpr int kVals = decltype(size(acc))::value;
  E* row0 = base + (int64_t)(p0 + acc_row<kWarpgroups>(0)) * sp + n0;
  E* row1 = base + (int64_t)(p0 + acc_row<kWarpgroups>(2)) * sp + n0;
#pragma unroll
  for (int v = 0; v < kVals; v += 2) {
    const int c = acc_col(v);
    if (n0 + c < p.dstate) {
      E* dst = (((v >> 1) & 1) ? row1 : row0) + c;
      if constexpr (sizeof(E) == 4) {
        *reinterpret_cast<float2*>(dst) = make_float2(acc(v), acc(v + 1));
      } else {
        E pair[2] = {E(acc(v)), E(acc(v + 1))};
        *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(pair);
      }
    }
  }
}

// Stores the tile (rows p0.., cols n0..) to a [p][n] matrix of dtype `t` (row stride sp),
// columns clipped at dstate (headdim is a multiple of 64, so rows never are).
template <int kWarpgroups = 1, class Acc>
__device__ __forceinline__ void store_tile(const Acc& acc, void* base, DType t, int64_t sp, int p0, int n0,
                                           const SsdParams& p) {
  switch (t) {
    case DType::kFloat32: store_tile_as<kWarpgroups>(acc, static_cast<float*>(base), sp, p0, n0, p); break;
    case DType::kBFloat16:
      store_tile_as<kWarpgroups>(acc, static_cast<cutlass::bfloat16_t*>(base), sp, p0, n0, p);
      break;
    default: store_tile_as<kWarpgroups>(acc, static_cast<cutlass::half_t*>(base), sp, p0, n0, p); break;
  }
}

// acc = the tile of a [p][n] matrix of dtype `t`.
template <int kWarpgroups = 1, class Acc>
__device__ __forceinline__ void load_tile(Acc& acc, const void* base, DType t, int64_t sp, int p0, int n0,
                                          const SsdParams& p) {
  constexpr int kVals = decltype(size(acc))::value;
#pragma unroll
  for (int v = 0; v < kVals; v += 2) {
    const int r = acc_row<kWarpgroups>(v), c = acc_col(v);
    float2 val = make_float2(0.f, 0.f);
    if (p0 + r < p.headdim && n0 + c < p.dstate) val = load2_any(base, t, (int64_t)(p0 + r) * sp + n0 + c);
    acc(v) = val.x;
    acc(v + 1) = val.y;
  }
}

}  // namespace mamba2_ssd::kernels::state_tile
