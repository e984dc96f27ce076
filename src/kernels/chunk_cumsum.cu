// chunk_cumsum: dt' = clamp(softplus?(dt + dt_bias), dt_min, dt_max) and the running sum of
// A * dt' from each chunk's start, for every slot of every chunk (padding slots: dt' = 0, so the
// sum stays flat and slot Q-1 holds the chunk's total). The sum is stored times log2(e) so the
// next kernels use exp2. Layout [row][head][chunk][Q], contiguous per chunk.
// It also folds in what fwd_pass_state needs per token and per chunk, so that kernel does no
// exponentials and no sequence logic: the state weight exp(min(cum_last - cum, 0)) * dt' (zero
// for tokens of another sequence than the chunk's last token) and the carry factor of the state
// entering the chunk, exp(cum_last) (zero when the chunk's last token starts a new sequence).
//
// It also zeroes fwd_pass_state's progress counters (SsdParams::ready).
//
// One warp per (chunk, row, head), each lane Q/32 consecutive slots: a serial sum per lane, then
// a warp scan of the lane totals.
#include "kernels/kernels.hpp"

namespace mamba2_ssd::kernels {

namespace {

constexpr int kWarps = 4;

__device__ __forceinline__ float softplus_thresholded(float v) {
  return v <= 20.0f ? log1pf(__expf(v)) : v;
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

template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) chunk_cumsum_kernel(const SsdParams p) {
  const int64_t g = blockIdx.x;
  const int64_t row = blockIdx.y;
  if (p.ready != nullptr) {
    // Reset the progress counters of fwd_pass_state (every CTA takes a share).
    const int64_t n = (p.varlen ? p.nseq : p.batch) * p.nheads * p.nseg * p.ready_tiles;
    const int64_t ctas = static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z;
    const int64_t cta = (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    for (int64_t i = cta * blockDim.x + threadIdx.x; i < n; i += ctas * blockDim.x) p.ready[i] = 0;
  }
  const ChunkInfo ci = chunk_info(p, row, g);
  if (ci.count == 0) return;  // unused varlen chunk slot
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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
  {
    const int h = blockIdx.z * kWarps + warp;
    if (h >= p.nheads) return;
    const float a_h = p.A[h * p.A_s];
    const float bias = p.dt_bias != nullptr ? p.dt_bias[h * p.dt_bias_s] : 0.0f;
    float dtp[kPerLane], run[kPerLane];
    float total = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int t = lane * kPerLane + e;
      float v = 0.0f;
      if (t < ci.count) {
        v = load_any(p.dt, p.dt_dtype, ci.row * p.dt_sb + (ci.tok0 + t) * p.dt_st + h * p.dt_sh) + bias;
        if (p.dt_softplus) v = softplus_thresholded(v);
        v = fminf(fmaxf(v, p.dt_min), p.dt_max);
      }
      dtp[e] = v;
      total += a_h * v;
      run[e] = total;
    }
    // Exclusive prefix of the lane totals.
    float incl = total;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    const float base = incl - total;
    const float last = __shfl_sync(0xffffffffu, incl, 31) * kLog2e;  // cum at slot Q-1
    const int64_t off = cum_offset(p, ci.row, h, g) + lane * kPerLane;  // (16-byte aligned)
    float cum[kPerLane], wst[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const float c = (base + run[e]) * kLog2e;
      const int t = lane * kPerLane + e;
      const bool same = seq == nullptr || (t < ci.count && seq[t * p.seq_st] == seq_last);
      cum[e] = c;
      wst[e] = same ? fast_exp2(fminf(last - c, 0.0f)) * dtp[e] : 0.0f;
    }
    store_slots(p.cum + off, cum);
    store_slots(p.dtp + off, dtp);
    store_slots(p.wst + off, wst);
    if (lane == 0) p.carry[carry_offset(p, ci.row, h, g)] = carries ? fast_exp2(last) : 0.0f;
  }
}

}  // namespace

void launch_chunk_cumsum(const SsdParams& p, cudaStream_t stream) {
  if (p.nchunks > 0x7fffffffLL || p.batch > 65535) {
    throw_launch_error("chunk_cumsum: grid too large (" + std::to_string(p.nchunks) + " chunks x " +
                       std::to_string(p.batch) + " rows)");
  }
  // One warp per (chunk, row, head): enough CTAs to fill the GPU even for a single row.
  dim3 grid(static_cast<unsigned>(p.nchunks), static_cast<unsigned>(p.batch),
            static_cast<unsigned>((p.nheads + kWarps - 1) / kWarps));
  switch (p.chunk) {
    case 64: chunk_cumsum_kernel<2><<<grid, kWarps * 32, 0, stream>>>(p); break;
    case 128: chunk_cumsum_kernel<4><<<grid, kWarps * 32, 0, stream>>>(p); break;
    default: chunk_cumsum_kernel<8><<<grid, kWarps * 32, 0, stream>>>(p); break;
  }
  check_cuda(cudaGetLastError(), "launch chunk_cumsum");
}

}  // namespace mamba2_ssd::kernels
