// One chunk's decay quantities for one head, computed by one warp, each lane kPerLane = Q / 32
// consecutive slots: dt' = clamp(softplus?(dt + dt_bias), dt_min, dt_max) (0 on padding slots),
// the running sum of A * dt' from the chunk's start times log2(e) (flat over padding, so slot
// Q-1 holds the chunk's total), the state weight exp2(min(cum_last - cum, 0)) * dt' (0 for tokens
// of another sequence than the chunk's last token) and the carry exp2(cum_last) of the state
// entering the chunk (0 when the chunk's last token starts a new sequence).
// chunk_cumsum stores them for every chunk; the segment sums compute them for their own chunks
// where they take chunk_cumsum's place (SsdParams::sums_cumsum).
#pragma once

#include "kernels/common.cuh"

namespace mamba2_ssd::kernels {

__device__ __forceinline__ float softplus_thresholded(float v) {
  return v <= 20.0f ? log1pf(__expf(v)) : v;
}

template <int kPerLane>
struct ChunkDecay {
  float cum[kPerLane], dtp[kPerLane], wst[kPerLane];  // slots lane * kPerLane ..
  float carry;                                         // the same in every lane
};

// A and dt_bias of head h (loaded once for all of a warp's chunks: between chunks, its stores
// would make the compiler load them again).
struct HeadDecay {
  float a, bias;
};
__device__ __forceinline__ HeadDecay head_decay(const SsdParams& p, int h) {
  return {p.A[h * p.A_s], p.dt_bias != nullptr ? p.dt_bias[h * p.dt_bias_s] : 0.0f};
}

// dt + dt_bias of this lane's slots (0 past the chunk's tokens). Apart from chunk_decay so that a
// warp can have several chunks' loads in flight before it uses them.
template <int kPerLane>
__device__ __forceinline__ void load_chunk_dt(const SsdParams& p, const ChunkInfo& ci, int h, float bias, int lane,
                                              float (&v)[kPerLane]) {
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int t = lane * kPerLane + e;
    v[e] = t < ci.count ? load_any(p.dt, p.dt_dtype, ci.row * p.dt_sb + (ci.tok0 + t) * p.dt_st + h * p.dt_sh) + bias
                        : 0.0f;
  }
}

// The chunk's quantities from load_chunk_dt's values: a serial sum per lane, then a warp scan of
// the lane totals.
template <int kPerLane>
__device__ __forceinline__ ChunkDecay<kPerLane> chunk_decay(const SsdParams& p, const ChunkInfo& ci, float a_h,
                                                            int lane, const float (&dt_biased)[kPerLane]) {
  // seq_idx (batched only): the chunk's tokens, its last token's sequence, and whether the
  // state entering the chunk belongs to that sequence (the sequence before chunk 0 is 0).
  const int32_t* seq = p.seq_idx != nullptr ? p.seq_idx + ci.row * p.seq_sb + ci.tok0 * p.seq_st : nullptr;
  int32_t seq_last = 0;
  bool carries = true;
  if (seq != nullptr) {
    seq_last = seq[(ci.count - 1) * p.seq_st];
    const int32_t seq_prev = ci.local > 0 ? seq[-p.seq_st] : 0;
    carries = seq_last == seq_prev;
  }
  ChunkDecay<kPerLane> d;
  float run[kPerLane];
  float total = 0.0f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    float v = 0.0f;
    if (lane * kPerLane + e < ci.count) {
      v = dt_biased[e];
      if (p.dt_softplus) v = softplus_thresholded(v);
      v = fminf(fmaxf(v, p.dt_min), p.dt_max);
    }
    d.dtp[e] = v;
    total += a_h * v;
    run[e] = total;
  }
  // Exclusive prefix of the lane totals.
  float incl = total;
#pragma unroll
  for (int s = 1; s < 32; s <<= 1) {
    const float o = __shfl_up_sync(0xffffffffu, incl, s);
    if (lane >= s) incl += o;
  }
  const float base = incl - total;
  const float last = __shfl_sync(0xffffffffu, incl, 31) * kLog2e;  // cum at slot Q-1
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const float c = (base + run[e]) * kLog2e;
    const int t = lane * kPerLane + e;
    const bool same = seq == nullptr || (t < ci.count && seq[t * p.seq_st] == seq_last);
    d.cum[e] = c;
    d.wst[e] = same ? fast_exp2(fminf(last - c, 0.0f)) * d.dtp[e] : 0.0f;
  }
  d.carry = carries ? fast_exp2(last) : 0.0f;
  return d;
}

// Stores a lane's kN consecutive slots with 16-byte (or 8-byte) stores: a warp then writes its
// chunk's slots in whole sectors with each instruction.
template <int kN>
__device__ __forceinline__ void store_slots(float* dst, const float (&v)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
    static_assert(kN % 2 == 0, "slots per lane");
#pragma unroll
    for (int i = 0; i < kN; i += 2) *reinterpret_cast<float2*>(dst + i) = make_float2(v[i], v[i + 1]);
  }
}

// Loads kN consecutive floats (16-byte aligned where kN % 4 == 0, else 8-byte) with vector loads.
template <int kN>
__device__ __forceinline__ void load_slots(float (&v)[kN], const float* src) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + i);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  } else {
    static_assert(kN % 2 == 0, "slots per lane");
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const float2 f = *reinterpret_cast<const float2*>(src + i);
      v[i] = f.x;
      v[i + 1] = f.y;
    }
  }
}

// Stores chunk g of (row, head h) to cum, dtp and carry, and to wst and wst_pairs where asked for;
// kWalkMeta (chunk_cumsum) with SsdParams::walk_meta (chunks of 64 x 2 tokens): e in dtp's place
// and the specialised fused_walk's weights in wst's (a_h: A of head h).
template <int kPerLane, bool kWalkMeta = false>
__device__ __forceinline__ void store_chunk_decay(const SsdParams& p, const ChunkDecay<kPerLane>& d, float a_h,
                                                  int64_t row, int h, int64_t g, int lane) {
  const int64_t off = cum_offset(p, row, h, g) + lane * kPerLane;  // (16-byte aligned)
  store_slots(p.cum + off, d.cum);
  auto store_pairs = [&](float* dst, const float (&w)[kPerLane]) {
    float pairs[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; e += 2) {
      const float2 hl = weight_pair(w[e], w[e + 1]);
      pairs[e] = hl.x;
      pairs[e + 1] = hl.y;
    }
    store_slots(dst, pairs);
  };
  if (kWalkMeta && p.walk_meta) {
    // (the same operations as the kernel's state warpgroup, so the same bits; block 0 ends at
    // slot kMid)
    constexpr int kMid = 16 * kPerLane - 1;
    const float cum_mid = __shfl_sync(0xffffffffu, d.cum[kMid % kPerLane], kMid / kPerLane);
    const bool grows = a_h > 0.0f;
    float e_s[kPerLane], w[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      e_s[i] = (grows ? 0.0f : d.cum[i]) - fast_log2(d.dtp[i]);
      w[i] = !grows && lane * kPerLane + i <= kMid ? fast_exp2(cum_mid - e_s[i]) : d.wst[i];
    }
    store_slots(p.dtp + off, e_s);
    if (p.walk_pairs) store_pairs(p.wst + off, w);
    else store_slots(p.wst + off, w);
  } else {
    store_slots(p.dtp + off, d.dtp);
    if (p.wst != nullptr) store_slots(p.wst + off, d.wst);
  }
  if (p.wst_pairs != nullptr) store_pairs(p.wst_pairs + off, d.wst);
  if (lane == 0) p.carry[carry_offset(p, row, h, g)] = d.carry;
}

}  // namespace mamba2_ssd::kernels
