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
// One warp per (chunk, row, head) (chunk_decay.cuh). Not launched where fused_walk's segment sums
// compute these for their own chunks (SsdParams::sums_cumsum).
#include "kernels/chunk_decay.cuh"
#include "kernels/kernels.hpp"

namespace mamba2_ssd::kernels {

namespace {

constexpr int kWarps = 4;

template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) chunk_cumsum_kernel(const SsdParams p, bool early_dependent) {
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
  if (ci.count == 0) return;  // unused varlen chunk slot
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.z * kWarps + warp;
  if (h >= p.nheads) return;
  const HeadDecay hd = head_decay(p, h);
  float dt[kPerLane];
  load_chunk_dt(p, ci, h, hd.bias, lane, dt);
  store_chunk_decay(p, chunk_decay(p, ci, hd.a, lane, dt), ci.row, h, g, lane);
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
