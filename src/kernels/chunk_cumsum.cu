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
// One CTA per (chunk, row, 4 heads), which stages the chunk's dt of its heads in shared memory a
// token per thread; then a warp per head (chunk_decay.cuh). Not launched where fused_walk's
// segment sums compute these for their own chunks (SsdParams::sums_cumsum).
#include "kernels/chunk_decay.cuh"
#include "kernels/kernels.hpp"

namespace mamba2_ssd::kernels {

namespace {

constexpr int kWarps = 4;

// The chunk's dt of heads h0 .. h0 + heads - 1 into dt_s[head][slot], a token per thread: a warp's
// load then reads 32 consecutive tokens, a few lines where dt is [row][token][head], not one
// head's slots spread over the whole chunk (16 lines per instruction at 8 heads). With four heads
// contiguous and aligned, one 8- or 16-byte load per token (ncu, anchor: 0.6-0.9 us less).
template <int kQ>
__device__ __forceinline__ void stage_chunk_dt(const SsdParams& p, const ChunkInfo& ci, int h0, int heads,
                                               float (&dt_s)[kWarps][kQ]) {
  const int es = dtype_size_dev(p.dt_dtype);
  const bool vec = heads == kWarps && p.dt_sh == 1 && p.dt_st % kWarps == 0 && p.dt_sb % kWarps == 0 &&
                   reinterpret_cast<uintptr_t>(p.dt) % (kWarps * es) == 0;
  for (int t = threadIdx.x; t < ci.count; t += kWarps * 32) {
    const int64_t i0 = ci.row * p.dt_sb + (ci.tok0 + t) * p.dt_st + h0 * p.dt_sh;
    if (vec && p.dt_dtype == DType::kFloat32) {
      const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(p.dt) + i0);
      dt_s[0][t] = v.x;
      dt_s[1][t] = v.y;
      dt_s[2][t] = v.z;
      dt_s[3][t] = v.w;
    } else if (vec) {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.dt) + i0);
      const bool bf = p.dt_dtype == DType::kBFloat16;
      auto half_bits_to_float = [bf](uint32_t bits) {
        const auto b = static_cast<unsigned short>(bits);
        return bf ? __bfloat162float(__ushort_as_bfloat16(b)) : __half2float(__ushort_as_half(b));
      };
      dt_s[0][t] = half_bits_to_float(u.x);
      dt_s[1][t] = half_bits_to_float(u.x >> 16);
      dt_s[2][t] = half_bits_to_float(u.y);
      dt_s[3][t] = half_bits_to_float(u.y >> 16);
    } else {
      for (int j = 0; j < heads; ++j) dt_s[j][t] = load_any(p.dt, p.dt_dtype, i0 + j * p.dt_sh);
    }
  }
}

// (8 CTAs per SM: without a minimum ptxas held the 128-slot form to 32 registers and spilled)
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32, 8) chunk_cumsum_kernel(const SsdParams p, bool early_dependent) {
  constexpr int kQ = kPerLane * 32;
  __shared__ __align__(16) float dt_s[kWarps][kQ];
  const int64_t g = blockIdx.x;
  const int64_t row = blockIdx.y;
  pdl_wait_primary();  // (launched early behind the stream's previous kernel: see launch_kernel)
  // The next kernel waits for this one's end before it reads anything; with early_dependent it
  // launches now and sets up (its mbarriers, D) under this kernel.
  if (early_dependent) pdl_launch_dependents();
  if (p.ready != nullptr) {
    // Reset the progress counters of fwd_pass_state (every CTA takes a share).
    const int64_t n = (p.varlen ? p.nseq : p.batch) * p.nheads * p.nseg * p.ready_tiles;
    const int64_t ctas = static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z;
    const int64_t cta = (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    for (int64_t i = cta * blockDim.x + threadIdx.x; i < n; i += ctas * blockDim.x) p.ready[i] = 0;
  }
  const ChunkInfo ci = chunk_info(p, row, g);
  if (ci.count == 0) return;  // unused varlen chunk slot (the whole CTA)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = blockIdx.z * kWarps, h = h0 + warp;
  const HeadDecay hd = head_decay(p, h < p.nheads ? h : h0);  // (issued before the staging's wait)
  stage_chunk_dt(p, ci, h0, min(kWarps, p.nheads - h0), dt_s);
  __syncthreads();
  if (h >= p.nheads) return;
  float staged[kPerLane], dt[kPerLane];
  load_slots(staged, &dt_s[warp][lane * kPerLane]);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) dt[e] = lane * kPerLane + e < ci.count ? staged[e] + hd.bias : 0.0f;
  store_chunk_decay<kPerLane, true>(p, chunk_decay(p, ci, hd.a, lane, dt), hd.a, ci.row, h, g, lane);
}

}  // namespace

void launch_chunk_cumsum(const SsdParams& p, bool early_dependent, cudaStream_t stream) {
  if (p.nchunks > 0x7fffffffLL || p.batch > 65535) {
    throw_launch_error("chunk_cumsum: grid too large (" + std::to_string(p.nchunks) + " chunks x " +
                       std::to_string(p.batch) + " rows)");
  }
  // One warp per (chunk, row, head): enough CTAs to fill the GPU even for a single row.
  dim3 grid(static_cast<unsigned>(p.nchunks), static_cast<unsigned>(p.batch),
            static_cast<unsigned>((p.nheads + kWarps - 1) / kWarps));
  auto kernel = p.chunk == 64 ? chunk_cumsum_kernel<2> : p.chunk == 128 ? chunk_cumsum_kernel<4> : chunk_cumsum_kernel<8>;
  launch_kernel(kernel, grid, dim3(kWarps * 32), 0, stream, true, 1, "launch chunk_cumsum", p, early_dependent);
}

}  // namespace mamba2_ssd::kernels
